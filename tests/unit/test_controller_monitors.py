"""The speculation monitor's shell around the pure policy: against a fake host and a real metrics endpoint.

No API server: the host holds the resource, the serving-pod index and a fake clock, and applies each report
it is handed the way the reconciler folds it into status (the report's fields, its condition), so dwell,
cooldown and interval gates are exact. The monitor writes nothing: a report handed over is what would be
worth a status write.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from aiohttp import web

from engine_jobs import contract as c
from redrafter_operator.api.spec import parse_spec
from redrafter_operator.api.status import Condition, PromotedEngines, ReDrafterDeploymentStatus, ValidationStatus
from redrafter_operator.controller import speculation as sp
from redrafter_operator.controller.conditions import merge_conditions
from redrafter_operator.controller.facts import ServingPodFact
from redrafter_operator.controller.metrics import OperatorMetrics
from redrafter_operator.controller.plan_types import ServingTargets
from redrafter_operator.controller.reports import SpeculationReport
from redrafter_operator.controller.speculation import SpeculationMonitor, changed, stored_state
from redrafter_operator.render import names
from redrafter_sim.clock import FakeClock

S = ReDrafterDeploymentStatus.from_wire  # the status as the API server stores it


def V(status: dict[str, Any]) -> ValidationStatus | None:
    """``status.validation``, typed, of a status in wire form."""
    return S(status).validation


NS, NAME = "default", "chat"
T0 = 1_800_000_000.0


def body(**speculation: Any) -> dict[str, Any]:
    spec = {
        "model": {"base": {"source": "hf://org/base"}, "drafter": {"source": "pvc://drafters/d"}},
        "autoscaling": {"mode": "Disabled"},
        "speculation": {
            "interval": "1s",
            "failureLimit": 1,
            "successLimit": 1,
            "minSamples": 1,
            "minDwell": "1s",
            "cooldown": "1s",
            "loadAware": False,
            "consecutiveErrorLimit": 2,
            **speculation,
        },
    }
    return {
        "apiVersion": "redrafter.dev/v1alpha1",
        "kind": "ReDrafterDeployment",
        "metadata": {"name": NAME, "namespace": NS, "uid": "uid-1", "generation": 1},
        "spec": spec,
        "status": {
            "activeEngine": "redrafter",
            "phase": "Serving",
            "engines": {"redrafter": {"key": "r", "state": "Ready"}, "base": {"key": "b", "state": "Ready"}},
            "validation": {"redrafterKey": "r", "baseKey": "b", "state": "Passed"},
            "conditions": [
                {
                    "type": "SpecValid",
                    "status": "True",
                    "reason": "Valid",
                    "message": "",
                    "lastTransitionTime": "2027-01-15T00:00:00Z",
                    "observedGeneration": 1,
                }
            ],
        },
    }


def pod(name: str, variant: str = "redrafter", pool: str | None = None, ready: bool = True) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "labels": {
                names.LABEL_VARIANT: variant,
                names.LABEL_TRAFFIC: pool or variant,
                names.LABEL_DEPLOYMENT: names.label_value(NAME),
                names.LABEL_COMPONENT: "serving",
            },
        },
        "status": {"podIP": "127.0.0.1", "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


class FakeHost:
    """What a monitor sees of the controller (``resource_io.Host``); reports fold into status as the planner
    folds them, and every report handed over is kept."""

    def __init__(self, obj: dict[str, Any]) -> None:
        self.bodies = {(NS, NAME): obj}
        self.written: dict[Any, Any] = {}
        self.clock = FakeClock(epoch=T0)
        self.reports: list[SpeculationReport] = []
        self.pods = [pod("chat-redrafter-0")]

    @property
    def indexes(self) -> dict[str, Any]:
        return {
            "rdd_serving_pods": {
                ("owner", NS, names.label_value(NAME)): [ServingPodFact.from_body(p) for p in self.pods]
            }
        }

    def spec_of(self, key: Any) -> Any:
        return parse_spec(copy.deepcopy(self.bodies[key]["spec"]))[0]

    def hand_over(self, key: Any, report: SpeculationReport) -> None:
        self.reports.append(report)
        status = self.bodies[key]["status"]
        status.update(report.status.wire())
        if report.condition is not None:
            old = [Condition.from_wire(c) for c in status["conditions"]]
            now = sp.rfc3339(self.clock.time())
            status["conditions"] = [c.wire() for c in merge_conditions(old, [report.condition], generation=1, now=now)]

    @property
    def status(self) -> dict[str, Any]:
        return self.bodies[(NS, NAME)]["status"]

    @property
    def targets(self) -> list[ServingTargets]:
        return [r.targets for r in self.reports]

    @property
    def events(self) -> list[tuple[str, str, str]]:
        return [(e.type, e.reason, e.message) for r in self.reports for e in r.events]

    async def run(self, monitor: SpeculationMonitor, seconds: float = 0.0) -> None:
        """Move the clock, then one run of the monitor (what the ticker does when the slot is due)."""
        await self.clock.advance(seconds, turns=0)
        await monitor.run(self, (NS, NAME))


class Metrics:
    """The pod's metrics endpoint: counters the test advances; ``down`` answers 503."""

    def __init__(self) -> None:
        self.n = {"requests": 0.0, "draft": 0.0, "accepted": 0.0}
        self.down = False
        self.active: float | None = None  # in-flight requests gauge (exported when set)
        self.scrapes = 0

    def serve(self, requests: int, acceptance: float) -> None:
        self.n["requests"] += requests
        self.n["draft"] += 10 * requests
        self.n["accepted"] += round(10 * requests * acceptance)

    async def handle(self, _: web.Request) -> web.Response:
        self.scrapes += 1
        if self.down:
            return web.Response(status=503)
        labels = f'model="{NAME}",variant="redrafter"'
        gauge = (
            f"# TYPE {c.METRIC_TRTLLM_REQUESTS} gauge\n"
            f'{c.METRIC_TRTLLM_REQUESTS}{{model="{c.ENGINE_MODEL}",request_type="active"}} {self.active}\n'
            if self.active is not None
            else ""
        )
        return web.Response(
            text="".join(
                f"# TYPE {m} counter\n{m}{{{labels}}} {self.n[k]}\n"
                for m, k in (
                    (c.METRIC_REQUESTS, "requests"),
                    (c.METRIC_DRAFT_TOKENS, "draft"),
                    (c.METRIC_ACCEPTED_DRAFT_TOKENS, "accepted"),
                )
            )
            + gauge
        )


@pytest.fixture
async def endpoint():
    m = Metrics()
    app = web.Application()
    app.router.add_get("/metrics", m.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    m.port = site._server.sockets[0].getsockname()[1]
    yield m
    await runner.cleanup()


def monitor(endpoint: Metrics | None = None) -> SpeculationMonitor:
    kw = {"metrics_port": endpoint.port} if endpoint is not None else {}
    return SpeculationMonitor(metrics=OperatorMetrics(), **kw)


# ---------------------------------------------------------------------------------------------------------
async def test_collapse_switches_with_status_history_event_counter_and_targets(endpoint) -> None:
    host = FakeHost(body())
    ev = monitor(endpoint)
    endpoint.serve(20, 0.8)
    await host.run(ev)  # first reading: baseline only
    st = host.status
    assert st["speculation"]["reason"].startswith("NoData") and st["policy"]["speculation"]["engine"] == "redrafter"
    assert next(x for x in st["conditions"] if x["type"] == "SpeculationHealthy")["status"] == "Unknown"
    assert host.targets[-1] == ServingTargets(active="redrafter", replicas={"redrafter": 1, "base": 0}, canary=0)

    endpoint.serve(20, 0.1)
    await host.run(ev, 2)
    st = host.status
    assert st["speculation"]["decision"] == "SwitchToBase" and st["speculation"]["acceptanceRate"] == pytest.approx(0.1)
    assert st["speculation"]["samples"] == 20
    assert st["history"] == [
        {"time": sp.rfc3339(host.clock.time()), "from": "redrafter", "to": "base", "reason": st["history"][0]["reason"]}
    ]
    assert st["history"][0]["reason"].startswith("LowAcceptance: 1 consecutive failed measurements")
    cond = next(x for x in st["conditions"] if x["type"] == "SpeculationHealthy")
    assert (cond["status"], cond["reason"]) == ("False", "LowAcceptance")
    assert host.targets[-1] == ServingTargets(active="base", replicas={"base": 1, "redrafter": 0}, canary=1)
    assert host.events == [("Warning", "SwitchToBase", host.events[0][2])] and "LowAcceptance" in host.events[0][2]
    assert ev.metrics.speculation_switches.labels("base", "LowAcceptance")._value.get() == 1
    assert ev.metrics.speculation_evaluations.labels("Failed")._value.get() == 1


async def test_an_evaluation_that_changes_nothing_hands_over_nothing(endpoint) -> None:
    host = FakeHost(body())
    ev = monitor(endpoint)
    endpoint.serve(20, 0.8)
    await host.run(ev)
    endpoint.serve(20, 0.8)
    await host.run(ev, 1)
    assert len(host.reports) == 2
    for _ in range(12):  # no traffic: empty windows pool up (the message counts them) until ACCUMULATE_MAX
        await host.run(ev, 1)
    n = len(host.reports)
    for _ in range(3):  # then only timestamps change
        await host.run(ev, 1)
    assert len(host.reports) == n
    stamped = host.status["speculation"]["lastEvaluated"]
    await host.run(ev, 3600)  # an hour at rest: still nothing but timestamps, so still nothing handed over
    assert len(host.reports) == n and host.status["speculation"]["lastEvaluated"] == stamped
    endpoint.serve(20, 0.8)  # traffic again: a measurement to record, with its time
    await host.run(ev, 1)
    assert len(host.reports) == n + 1
    assert host.status["speculation"]["lastEvaluated"] == sp.rfc3339(host.clock.time())
    assert host.events == []
    runs = sum(
        s.value for m in ev.metrics.speculation_evaluations.collect() for s in m.samples if s.name.endswith("_total")
    )
    assert runs == 2 + 12 + 3 + 1 + 1  # every evaluation still counts


async def test_not_due_and_not_serving_and_invalid_do_nothing(endpoint) -> None:
    host = FakeHost(body())
    ev = monitor(endpoint)
    await host.run(ev)
    scrapes, reports = endpoint.scrapes, len(host.reports)
    await host.run(ev, 0.5)  # < 0.9 x interval
    assert (endpoint.scrapes, len(host.reports)) == (scrapes, reports)

    fresh = FakeHost(body())
    del fresh.status["activeEngine"]  # nothing serves yet
    await fresh.run(monitor(endpoint))
    invalid = FakeHost(body(failureLimit=0))
    await invalid.run(monitor(endpoint))
    assert endpoint.scrapes == scrapes and fresh.reports == [] and invalid.reports == []


async def test_prometheus_failure_is_an_error_input_never_a_crash_or_switch() -> None:
    obj = body(failureLimit=1)
    obj["spec"]["metrics"] = {"source": "Prometheus", "prometheusUrl": "http://127.0.0.1:9", "scrapeTimeoutSeconds": 1}
    host = FakeHost(obj)
    ev = monitor()
    for i in range(3):
        await host.run(ev, 1 if i else 0)
    st = host.status
    assert st["speculation"]["reason"].startswith("MetricsUnavailable: ")
    assert "POST http://127.0.0.1:9/api/v1/query" in st["speculation"]["reason"]
    assert st["policy"]["speculation"]["errors"] == 3 and not st.get("history")
    cond = next(x for x in st["conditions"] if x["type"] == "SpeculationHealthy")
    assert (cond["status"], cond["reason"]) == ("Unknown", "MetricsUnavailable")  # consecutiveErrorLimit 2
    assert all(t.active == "redrafter" for t in host.targets) and host.events == []
    assert ev.metrics.speculation_evaluations.labels("Error")._value.get() == 3


async def test_no_serving_pod_in_the_index_is_no_data_and_costs_no_request(endpoint) -> None:
    host = FakeHost(body())
    host.pods = []
    await host.run(monitor(endpoint))
    assert endpoint.scrapes == 0
    assert host.status["speculation"]["reason"].startswith("NoData")
    assert host.targets[-1].active == "redrafter"


async def collapsed(host: FakeHost, ev: SpeculationMonitor, endpoint: Metrics) -> None:
    """A baseline at high acceptance, then a collapse: the policy switches to base (failureLimit 1)."""
    endpoint.serve(20, 0.8)
    await host.run(ev)
    endpoint.serve(20, 0.1)
    await host.run(ev, 2)


async def test_a_restarted_operator_resumes_from_status_policy(endpoint) -> None:
    host = FakeHost(body(cooldown="1h"))
    ev = monitor(endpoint)
    await collapsed(host, ev, endpoint)
    assert host.status["policy"]["speculation"]["engine"] == "base"
    host.status["activeEngine"] = "base"
    host.pods = [pod("chat-redrafter-canary-0", "redrafter", "base"), pod("chat-base-0", "base", ready=False)]

    restarted = monitor(endpoint)  # no memory: the state comes from status.policy
    for _ in range(3):
        endpoint.serve(20, 0.9)
        await host.run(restarted, 1)
    st = host.status
    assert st["policy"]["speculation"]["engine"] == "base"  # cooldown 1h still holds the recovery
    assert st["speculation"]["decision"] == "Hold" and st["speculation"]["reason"].startswith("Cooldown")
    assert host.targets[-1] == ServingTargets(active="base", replicas={"base": 1, "redrafter": 0}, canary=1)
    assert [h["to"] for h in st["history"]] == ["base"]


async def test_mode_never_leaves_the_condition_to_the_planner(endpoint) -> None:
    host = FakeHost(body(mode="Never"))
    host.status["activeEngine"] = "base"  # what the planner serves a new resource pinned to base
    await host.run(monitor(endpoint))
    assert host.reports[0].condition is None
    assert host.targets[-1].active == "base" and host.status["policy"]["speculation"]["engine"] == "base"
    assert host.events == []  # a new resource pinned to base starts there: no switch

    # an operator that took over before the first evaluation was stored, with the Service still on the
    # engine the pin moves away from: the pin is a switch, in history like any other
    took_over = FakeHost(body(mode="Never"))
    await took_over.run(monitor(endpoint))
    assert [(h["from"], h["to"]) for h in took_over.status["history"]] == [("redrafter", "base")]


async def test_a_newly_pinned_mode_is_followed_at_once_not_at_the_interval(endpoint) -> None:
    host = FakeHost(body())
    ev = monitor(endpoint)
    endpoint.serve(20, 0.8)
    await host.run(ev)  # evaluated just now: the next one is not due for an interval
    host.bodies[(NS, NAME)]["spec"]["speculation"]["mode"] = "Never"
    await host.run(ev, 0.5)
    assert host.targets[-1].active == "base" and host.status["policy"]["speculation"]["engine"] == "base"
    assert [(h["from"], h["to"]) for h in host.status["history"]] == [("redrafter", "base")]
    assert host.status["history"][0]["reason"] == "Pinned: mode Never pins base"
    reports = len(host.reports)
    await host.run(ev, 0.5)  # pinned and already there: back to the interval
    assert len(host.reports) == reports
    host.bodies[(NS, NAME)]["spec"]["speculation"]["mode"] = "Always"
    await host.run(ev, 0.5)
    assert [(h["from"], h["to"]) for h in host.status["history"]] == [("redrafter", "base"), ("base", "redrafter")]


async def test_a_report_for_a_replaced_resource_is_not_mixed_with_the_new_one(endpoint) -> None:
    """Deleted and created again under the same name: the new uid starts from its own status."""
    host = FakeHost(body(cooldown="1h"))
    ev = monitor(endpoint)
    await collapsed(host, ev, endpoint)
    assert host.reports[-1].uid == "uid-1" and host.status["policy"]["speculation"]["engine"] == "base"
    replaced = body(cooldown="1h")
    replaced["metadata"]["uid"] = "uid-2"
    host.bodies[(NS, NAME)] = replaced
    endpoint.serve(20, 0.8)
    await host.run(ev, 2)
    assert host.reports[-1].uid == "uid-2" and host.status["policy"]["speculation"]["engine"] == "redrafter"


def test_pure_helpers() -> None:
    assert stored_state(S({"policy": {"speculation": {"engine": "nope"}}})) is None
    assert stored_state(S({})) is None
    assert stored_state(S({"policy": {"speculation": {"engine": "base", "since": 5.0}}})).speculation.engine == "base"
    old = {"speculation": {"lastEvaluated": sp.rfc3339(100.0), "samples": 0}, "policy": {"window": {"t": 1.0}}}
    same_but_later = {
        "speculation": {"lastEvaluated": sp.rfc3339(101.0), "samples": 0},
        "policy": {"window": {"t": 2.0}},
    }
    assert not changed(S(old), S(same_but_later), now=101.0)
    assert not changed(S(old), S(same_but_later), now=100_000.0)  # no timestamp heartbeat, however long at rest
    assert changed(S(old), S({**same_but_later, "speculation": {"samples": 3}}), now=101.0)


def test_an_expired_settle_window_is_not_worth_a_write_alone() -> None:
    """The autoscaler treats a settle window that has expired as none: clearing it is no change by itself
    (else every resource writes once, minutes after a switch, with nothing else to say)."""

    def status(settle: list[float] | None, t: float) -> ReDrafterDeploymentStatus:
        autoscaler = {"recommendations": [], **({"settle": settle} if settle else {})}
        return S(
            {
                "speculation": {"lastEvaluated": sp.rfc3339(t), "samples": 0},
                "policy": {"autoscaler": autoscaler, "window": {"t": t}},
            }
        )

    old = status([150.0, 2], 100.0)
    assert not changed(old, status(None, 200.0), now=200.0)  # expired at 150
    assert changed(old, status(None, 120.0), now=120.0)  # still running
    assert changed(old, status([300.0, 3], 200.0), now=200.0)  # a new one
    assert not changed(old, status(None, 5000.0), now=5000.0)  # long after: still nothing to say


# ---- the validation gate's pure parts -------------------------------------------------------------------
from redrafter_operator.api.spec import ReDrafterDeploymentSpec  # noqa: E402
from redrafter_operator.controller.targets import default_targets  # noqa: E402
from redrafter_operator.controller.validation import (  # noqa: E402
    Gate,
    engine_pair,
    gate_from_status,
    gate_of,
    gated_targets,
    validated_engines,
)

PAIR_STATUS = {"engines": {"redrafter": {"key": "r1", "state": "Ready"}, "base": {"key": "b1", "state": "Cached"}}}
POLICY = ServingTargets(active="redrafter", replicas={"redrafter": 3, "base": 0}, canary=0)


def test_engine_pair_and_gate_of() -> None:
    assert engine_pair(S(PAIR_STATUS)) == ("r1", "b1")
    assert (
        engine_pair(
            S({"engines": {"redrafter": {"key": "r1", "state": "Ready"}, "base": {"key": "b1", "state": "Building"}}})
        )
        is None
    )
    assert gate_of(V(PAIR_STATUS), ("r1", "b1")) == Gate(False, "Pending")
    passed = {**PAIR_STATUS, "validation": {"redrafterKey": "r1", "baseKey": "b1", "state": "Passed"}}
    assert gate_of(V(passed), ("r1", "b1")) == Gate(True, "Passed")
    assert gate_of(V(passed), ("r2", "b1")) == Gate(False, "Pending")  # a new pair is validated again


def test_gated_targets() -> None:
    assert (
        gated_targets(POLICY, None, "redrafter") is POLICY
        and gated_targets(POLICY, Gate(True, "Passed"), None) is POLICY
    )
    # validating: the Service stays where it is, both variants up, no canary
    assert gated_targets(POLICY, Gate(False, "Running"), "redrafter") == ServingTargets(
        "redrafter", {"redrafter": 3, "base": 1}, 0
    )
    assert gated_targets(POLICY, Gate(False, "Running"), "base") == ServingTargets(
        "base", {"base": 3, "redrafter": 1}, 0
    )
    assert gated_targets(POLICY, Gate(False, "Pending"), None).active == "base"  # nothing serves yet: the reference
    # a fallback to base (the reference engine) is never held by a validation in progress
    fallback = ServingTargets(active="base", replicas={"base": 3, "redrafter": 0}, canary=1)
    assert gated_targets(fallback, Gate(False, "Running"), "redrafter") == ServingTargets(
        "base", {"base": 3, "redrafter": 1}, 0
    )
    # failed: base serves at the policy's size, ReDrafter scales away, no canary
    on_base = ServingTargets(active="base", replicas={"base": 2, "redrafter": 0}, canary=1)
    assert gated_targets(on_base, Gate(False, "Failed"), "base") == ServingTargets(
        "base", {"base": 2, "redrafter": 0}, 0
    )
    assert gated_targets(POLICY, Gate(False, "Failed"), "redrafter") == ServingTargets(
        "base", {"base": 3, "redrafter": 0}, 0
    )


def test_planner_defaults_keep_the_canary_and_the_gate_from_status() -> None:
    spec = ReDrafterDeploymentSpec.model_validate(body()["spec"])
    assert default_targets(spec, S({"activeEngine": "base"})).canary == 1  # no canary flap on restart
    # ... nor one started for an interval after a load-caused fallback, which runs none (status.policy)
    load_fallback = {
        "speculation": {
            "engine": "base",
            "since": 0,
            "fallback_reason": "NoSpeedupAtLoad",
            "last_acceptance": 0.6,
            "last_tokens_per_step": 4.0,
        }
    }
    aware = ReDrafterDeploymentSpec.model_validate(body(loadAware=True)["spec"])
    assert default_targets(aware, S({"activeEngine": "base", "policy": load_fallback})).canary == 0
    assert default_targets(spec, S({"activeEngine": "base", "policy": load_fallback})).canary == 1  # not load-aware
    running = {
        **PAIR_STATUS,
        "activeEngine": "redrafter",
        "validation": {"redrafterKey": "r1", "baseKey": "b1", "state": "Running"},
    }
    assert default_targets(spec, S(running)).replicas == {"redrafter": 1, "base": 1}
    failed = {**running, "validation": {**running["validation"], "state": "Failed"}}
    assert default_targets(spec, S(failed)) == ServingTargets("base", {"base": 1, "redrafter": 0}, 0)
    off = ReDrafterDeploymentSpec.model_validate({**body()["spec"], "validation": {"enabled": False}})
    assert gate_from_status(POLICY, off, S(failed)) is POLICY


def test_the_planner_gates_the_policys_targets_from_status() -> None:
    """No gate state outside status: a restarted operator gates the policy's first targets at once."""
    spec = ReDrafterDeploymentSpec.model_validate(body()["spec"])
    pending = {**PAIR_STATUS, "activeEngine": "redrafter"}
    assert gate_from_status(POLICY, spec, S(pending)) == ServingTargets("redrafter", {"redrafter": 3, "base": 1}, 0)
    failed = {**pending, "validation": {"redrafterKey": "r1", "baseKey": "b1", "state": "Failed"}}
    assert gate_from_status(POLICY, spec, S(failed)) == ServingTargets("base", {"base": 3, "redrafter": 0}, 0)
    passed = {**pending, "validation": {"redrafterKey": "r1", "baseKey": "b1", "state": "Passed"}}
    assert gate_from_status(POLICY, spec, S(passed)) is POLICY


def test_the_policy_may_switch_to_redrafter_only_once_validated() -> None:
    spec = ReDrafterDeploymentSpec.model_validate(body()["spec"])
    both = frozenset({"redrafter", "base"})
    assert validated_engines(spec, S({})) == both  # nothing built: nothing to validate yet
    assert validated_engines(spec, S(PAIR_STATUS)) == {"base"}  # pending
    running = {**PAIR_STATUS, "validation": {"redrafterKey": "r1", "baseKey": "b1", "state": "Running"}}
    assert validated_engines(spec, S(running)) == {"base"}
    passed = {**PAIR_STATUS, "validation": {"redrafterKey": "r1", "baseKey": "b1", "state": "Passed"}}
    assert validated_engines(spec, S(passed)) == both
    off = ReDrafterDeploymentSpec.model_validate({**body()["spec"], "validation": {"enabled": False}})
    assert validated_engines(off, S(running)) == both


# ---- a promoted ReDrafter engine keeps serving while a newer one is validated ---------------------------
PROMOTED = {"redrafterKey": "r0", "baseKey": "b1"}


def test_a_promoted_engine_is_stable_until_the_new_pair_passes() -> None:
    from redrafter_operator.controller.validation import ValidationStep, validation_after

    pending = {
        **PAIR_STATUS,
        "validation": {"redrafterKey": "r0", "baseKey": "b1", "state": "Passed", "promoted": PROMOTED},
    }
    assert gate_of(V(pending), ("r1", "b1")) == Gate(False, "Pending", stable="r0")
    assert gate_of(V(pending), ("r0", "b1")) == Gate(True, "Passed")  # the promoted pair itself: nothing stable
    failed = {
        **PAIR_STATUS,
        "validation": {"redrafterKey": "r1", "baseKey": "b1", "state": "Failed", "promoted": PROMOTED},
    }
    assert gate_of(V(failed), ("r1", "b1")) == Gate(False, "Failed", stable="r0")
    # validating: the policy's targets stand (the promoted engine is validated), base kept up as the reference
    assert gated_targets(POLICY, Gate(False, "Running", "r0"), "redrafter") == ServingTargets(
        "redrafter", {"redrafter": 3, "base": 1}, 0
    )
    on_base = ServingTargets(active="base", replicas={"base": 2, "redrafter": 1}, canary=1)
    assert gated_targets(on_base, Gate(False, "Running", "r0"), "base") == on_base  # canary of the promoted engine kept
    # failed: the promoted engine keeps serving as the policy says, not base
    assert gated_targets(POLICY, Gate(False, "Failed", "r0"), "redrafter") is POLICY
    # status: promoted survives the record of a newer pair, and a pass replaces it
    running = ValidationStep(
        False, 0, ValidationStatus.from_wire({"redrafterKey": "r1", "baseKey": "b1", "attempt": 0, "state": "Running"})
    )
    out = validation_after(V(pending), running).wire()
    assert out["promoted"] == PROMOTED and out["state"] == "Running"
    passed = ValidationStep(
        False, 0, ValidationStatus.from_wire({"redrafterKey": "r1", "baseKey": "b1", "attempt": 0, "state": "Passed"})
    )
    assert validation_after(V(pending), passed).wire()["promoted"] == {
        "redrafterKey": "r1",
        "baseKey": "b1",
    }


def test_the_policy_may_choose_a_promoted_engine_while_a_newer_one_is_validated() -> None:
    spec = ReDrafterDeploymentSpec.model_validate(body()["spec"])
    running = {
        **PAIR_STATUS,
        "validation": {"redrafterKey": "r1", "baseKey": "b1", "state": "Running", "promoted": PROMOTED},
    }
    assert validated_engines(spec, S(running)) == {"redrafter", "base"}
    failed = {
        **PAIR_STATUS,
        "validation": {"redrafterKey": "r1", "baseKey": "b1", "state": "Failed", "promoted": PROMOTED},
    }
    assert validated_engines(spec, S(failed)) == {"redrafter", "base"}


def test_gating_twice_changes_nothing() -> None:
    """The planner gates whatever targets it gets: gating is idempotent."""
    on_base = ServingTargets(active="base", replicas={"base": 2, "redrafter": 0}, canary=1)
    for gate in (
        Gate(False, "Pending"),
        Gate(False, "Running"),
        Gate(False, "Failed"),
        Gate(False, "Running", "r0"),
        Gate(False, "Failed", "r0"),
        Gate(True, "Passed"),
    ):
        for pool in ("redrafter", "base", None):
            for targets in (POLICY, on_base):
                once = gated_targets(targets, gate, pool)
                assert gated_targets(once, gate, pool) == once, (gate, pool, targets)


async def test_the_autoscaler_counts_the_pods_still_starting(endpoint) -> None:
    """The evaluator passes every serving pod's readiness to the autoscaler. Two Ready pods with 1 request in
    flight each, target 4, two pods still loading their engine (not Ready, not scraped): on a scale-down
    those count at the target, (2 + 2 x 4) / 4 pods / 4 -> ceil(0.625 x 4) = 3, where the Ready pods alone
    would say ceil(2 x 1/4) = 1 and take away the pods that are about to serve."""
    obj = body()
    obj["spec"]["autoscaling"] = {
        "mode": "Operator",
        "minReplicas": 1,
        "maxReplicas": 16,
        "targetQueuePerReplica": 4,
        "scaleDownStabilization": "0s",
    }
    obj["spec"]["serving"] = {"replicas": 4}
    host = FakeHost(obj)
    host.pods = [pod(f"chat-redrafter-{i}", ready=i < 2) for i in range(4)]
    endpoint.active = 1.0
    ev = monitor(endpoint)
    await host.run(ev)
    assert host.targets[-1].replicas["redrafter"] == 3
    assert [e for e in host.events if e[1] == "Scaling"] and "2 missing" in host.events[-1][2]
    # the load rises to 16 in flight on the 2 Ready pods while the third replica still loads: the starting
    # pod counts as idle, 16 / 3 pods / 4 -> ceil(1.33 x 3) = 4 = what the load needs (not 3 x 8/4 = 6)
    host.pods = [pod(f"chat-redrafter-{i}", ready=i < 2) for i in range(3)]
    endpoint.active = 8.0
    await host.run(ev, 1)
    assert host.targets[-1].replicas["redrafter"] == 4


def test_a_serving_pods_new_address_is_a_new_index_value() -> None:
    """kopf keeps an index value only when it differs from the stored one: a Pod that got its IP (or restarted)
    must give a different fact, or the monitor would scrape the address the Pod had when first indexed."""
    first = pod("chat-redrafter-0")
    moved = copy.deepcopy(first)
    moved["status"]["podIP"] = "127.0.0.2"
    assert ServingPodFact.from_body(first) != ServingPodFact.from_body(moved)
    assert ServingPodFact.from_body(first) == ServingPodFact.from_body(copy.deepcopy(first))
    assert len({ServingPodFact.from_body(first), ServingPodFact.from_body(moved)}) >= 1  # still hashable


def test_the_promoted_pair_keeps_the_crossover_its_validation_measured() -> None:
    """The PyTorch backend's speculative engine drafts only up to the promoted pair's measured crossover
    (max_concurrency); a newer pair under validation neither changes nor loses it until it passes itself."""
    from redrafter_operator.controller.validation import ValidationStep, validation_after
    from redrafter_operator.render.common import in_engine_concurrency

    first = {"redrafterKey": "r0", "baseKey": "b1", "attempt": 0, "state": "Passed"}
    out = validation_after(None, ValidationStep(False, 0, ValidationStatus.from_wire(first), crossover=6.7))
    assert out.wire()["promoted"] == {**PROMOTED, "crossoverConcurrency": 6.7}
    assert in_engine_concurrency(out.promoted) == 6
    # later reconciles of the same pass (no new measurement) keep it
    again = validation_after(out, ValidationStep(False, 0, ValidationStatus.from_wire(first)))
    assert again.wire()["promoted"]["crossoverConcurrency"] == 6.7
    # a newer pair runs: the promoted engine keeps its limit
    running = ValidationStep(
        False, 0, ValidationStatus.from_wire({"redrafterKey": "r1", "baseKey": "b1", "attempt": 0, "state": "Running"})
    )
    assert in_engine_concurrency(validation_after(again, running).promoted) == 6
    # it passes without a measurement (measureCrossover off): no limit is carried over from another pair
    passed = ValidationStep(
        False, 0, ValidationStatus.from_wire({"redrafterKey": "r1", "baseKey": "b1", "attempt": 0, "state": "Passed"})
    )
    assert in_engine_concurrency(validation_after(again, passed).promoted) is None
    # a crossover below one request, or none, is no limit
    assert in_engine_concurrency(PromotedEngines.from_wire({**PROMOTED, "crossoverConcurrency": 0.4})) is None
    assert in_engine_concurrency(None) is None
