"""The speculation evaluator's shell around the pure policy: against a fake controller and a real metrics endpoint.

No API server: the controller's client is a fake that lists pods and applies status merge patches the way
the API server does (null deletes). The pod's metrics come from a local aiohttp server; the policy clock is
injected, so dwell, cooldown and interval gates are exact.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from aiohttp import web

from engine_jobs import contract as c
from redrafter_operator.controller import resource_io
from redrafter_operator.controller import speculation as sp
from redrafter_operator.controller.apply import ApiError
from redrafter_operator.controller.metrics import OperatorMetrics
from redrafter_operator.controller.plan_types import ServingTargets
from redrafter_operator.controller.speculation import (
    SpeculationEvaluator,
    newer_state,
    status_fragment,
    status_patch,
    stored_state,
)
from redrafter_operator.policy import PolicyState
from redrafter_operator.render import names

NS, NAME = "default", "chat"
T0 = 1_800_000_000.0


def merge(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge(out.get(k), v)
    return out


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
            "labels": {names.LABEL_VARIANT: variant, names.LABEL_TRAFFIC: pool or variant},
        },
        "status": {"podIP": "127.0.0.1", "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


class FakeClient:
    def __init__(self, ctl: "FakeController") -> None:
        self.ctl, self.requests, self.fail_list = ctl, [], False

    async def request(self, method: str, path: str, body: Any = None, **kw: Any) -> dict[str, Any]:
        self.requests.append((method, path, copy.deepcopy(body), kw))
        if method == "GET":
            if self.fail_list:
                raise ApiError(403, "Forbidden", "pods is forbidden")
            return {"items": copy.deepcopy(self.ctl.pods)}
        obj = self.ctl.bodies[(NS, NAME)]
        obj["status"] = merge(obj.get("status") or {}, body["status"])
        return copy.deepcopy(obj)

    def patches(self) -> list[dict[str, Any]]:
        return [b["status"] for m, _, b, _ in self.requests if m == "PATCH"]


class FakeController:
    def __init__(self, obj: dict[str, Any]) -> None:
        self.bodies = {(NS, NAME): obj}
        self.written: dict[Any, Any] = {}
        self.indexes: dict[str, Any] = {}
        self.posting_vars: list[Any] = []
        self.metrics = OperatorMetrics()
        self.pods = [pod("chat-redrafter-0")]
        self.client = FakeClient(self)
        self.targets: list[ServingTargets] = []

    def set_targets(self, ns: str, name: str, targets: ServingTargets) -> None:
        self.targets.append(targets)

    @property
    def status(self) -> dict[str, Any]:
        return self.bodies[(NS, NAME)]["status"]


class Metrics:
    """The pod's metrics endpoint: counters the test advances; ``down`` answers 503."""

    def __init__(self) -> None:
        self.n = {"requests": 0.0, "draft": 0.0, "accepted": 0.0}
        self.down = False
        self.active: float | None = None  # in-flight requests gauge (exported when set)

    def serve(self, requests: int, acceptance: float) -> None:
        self.n["requests"] += requests
        self.n["draft"] += 10 * requests
        self.n["accepted"] += round(10 * requests * acceptance)

    async def handle(self, _: web.Request) -> web.Response:
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


@pytest.fixture
def events(monkeypatch):
    posted: list[tuple[str, str, str]] = []
    monkeypatch.setattr(resource_io, "post_event", lambda b, t, r, msg: posted.append((t, r, msg)))
    return posted


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


def evaluator(endpoint: Metrics, clock: Clock) -> SpeculationEvaluator:
    return SpeculationEvaluator(metrics_port=endpoint.port, clock=clock)


# ---------------------------------------------------------------------------------------------------------
async def test_collapse_switches_with_status_history_event_counter_and_targets(endpoint, events) -> None:
    ctl, clock = FakeController(body()), Clock()
    ev = evaluator(endpoint, clock)
    endpoint.serve(20, 0.8)
    await ev.evaluate(ctl, ctl.bodies[(NS, NAME)])  # first reading: baseline only
    st = ctl.status
    assert st["speculation"]["reason"].startswith("NoData") and st["policy"]["speculation"]["engine"] == "redrafter"
    assert next(x for x in st["conditions"] if x["type"] == "SpeculationHealthy")["status"] == "Unknown"
    assert ctl.targets[-1] == ServingTargets(active="redrafter", replicas={"redrafter": 1, "base": 0}, canary=0)
    assert ctl.written[(NS, NAME)] == st  # the reconciler plans from the status just written

    endpoint.serve(20, 0.1)
    clock.t += 2
    await ev.evaluate(ctl, ctl.bodies[(NS, NAME)])
    st = ctl.status
    assert st["speculation"]["decision"] == "SwitchToBase" and st["speculation"]["acceptanceRate"] == pytest.approx(0.1)
    assert st["speculation"]["samples"] == 20
    assert st["history"] == [
        {"time": sp.rfc3339(clock.t), "from": "redrafter", "to": "base", "reason": st["history"][0]["reason"]}
    ]
    assert st["history"][0]["reason"].startswith("LowAcceptance: 1 consecutive failed measurements")
    cond = next(x for x in st["conditions"] if x["type"] == "SpeculationHealthy")
    assert (cond["status"], cond["reason"]) == ("False", "LowAcceptance")
    assert ctl.targets[-1] == ServingTargets(active="base", replicas={"base": 1, "redrafter": 0}, canary=1)
    assert events == [("Warning", "SwitchToBase", events[0][2])] and "LowAcceptance" in events[0][2]
    assert ctl.metrics.speculation_switches.labels("base", "LowAcceptance")._value.get() == 1
    assert ctl.metrics.speculation_evaluations.labels("Failed")._value.get() == 1


async def test_an_evaluation_that_changes_nothing_writes_nothing(endpoint, events) -> None:
    ctl, clock = FakeController(body()), Clock()
    ev = evaluator(endpoint, clock)
    endpoint.serve(20, 0.8)
    await ev.evaluate(ctl, ctl.bodies[(NS, NAME)])
    endpoint.serve(20, 0.8)
    clock.t += 1
    await ev.evaluate(ctl, ctl.bodies[(NS, NAME)])
    assert len(ctl.client.patches()) == 2
    for _ in range(12):  # no traffic: empty windows pool up (the message counts them) until ACCUMULATE_MAX
        clock.t += 1
        await ev.evaluate(ctl, ctl.bodies[(NS, NAME)])
    n = len(ctl.client.patches())
    for _ in range(3):  # then only timestamps change
        clock.t += 1
        await ev.evaluate(ctl, ctl.bodies[(NS, NAME)])
    assert len(ctl.client.patches()) == n
    stamped = ctl.status["speculation"]["lastEvaluated"]
    clock.t += 3600  # an hour at rest: still nothing but timestamps, so still no write
    await ev.evaluate(ctl, ctl.bodies[(NS, NAME)])
    assert len(ctl.client.patches()) == n and ctl.status["speculation"]["lastEvaluated"] == stamped
    endpoint.serve(20, 0.8)  # traffic again: a measurement to record, with its time
    clock.t += 1
    await ev.evaluate(ctl, ctl.bodies[(NS, NAME)])
    assert len(ctl.client.patches()) == n + 1
    assert ctl.status["speculation"]["lastEvaluated"] == sp.rfc3339(clock.t)
    assert events == []


async def test_not_due_and_not_serving_and_invalid_do_nothing(endpoint, events) -> None:
    ctl, clock = FakeController(body()), Clock()
    ev = evaluator(endpoint, clock)
    await ev.evaluate(ctl, ctl.bodies[(NS, NAME)])
    n = len(ctl.client.requests)
    clock.t += 0.5  # < 0.9 x interval
    await ev.evaluate(ctl, ctl.bodies[(NS, NAME)])
    assert len(ctl.client.requests) == n

    fresh = FakeController(body())
    del fresh.status["activeEngine"]  # nothing serves yet
    await evaluator(endpoint, clock).evaluate(fresh, fresh.bodies[(NS, NAME)])
    invalid = FakeController(body(failureLimit=0))
    await evaluator(endpoint, clock).evaluate(invalid, invalid.bodies[(NS, NAME)])
    assert fresh.client.requests == [] and invalid.client.requests == []
    assert fresh.targets == [] and invalid.targets == []


async def test_prometheus_failure_is_an_error_input_never_a_crash_or_switch(events) -> None:
    obj = body(failureLimit=1)
    obj["spec"]["metrics"] = {"source": "Prometheus", "prometheusUrl": "http://127.0.0.1:9", "scrapeTimeoutSeconds": 1}
    ctl, clock = FakeController(obj), Clock()
    ev = SpeculationEvaluator(clock=clock)
    for i in range(3):
        await ev.evaluate(ctl, ctl.bodies[(NS, NAME)])
        clock.t += 1
    st = ctl.status
    assert st["speculation"]["reason"].startswith("MetricsUnavailable: ")
    assert "POST http://127.0.0.1:9/api/v1/query" in st["speculation"]["reason"]
    assert st["policy"]["speculation"]["errors"] == 3 and not st.get("history")
    cond = next(x for x in st["conditions"] if x["type"] == "SpeculationHealthy")
    assert (cond["status"], cond["reason"]) == ("Unknown", "MetricsUnavailable")  # consecutiveErrorLimit 2
    assert all(t.active == "redrafter" for t in ctl.targets) and events == []
    assert ctl.metrics.speculation_evaluations.labels("Error")._value.get() == 3


async def test_pod_list_failure_skips_the_evaluation(endpoint, events) -> None:
    ctl, clock = FakeController(body()), Clock()
    ctl.client.fail_list = True
    await evaluator(endpoint, clock).evaluate(ctl, ctl.bodies[(NS, NAME)])
    assert ctl.client.patches() == [] and ctl.targets == []


async def test_a_restarted_operator_resumes_from_status_policy(endpoint, events) -> None:
    ctl, clock = FakeController(body(cooldown="1h")), Clock()
    ev = evaluator(endpoint, clock)
    endpoint.serve(20, 0.8)
    await ev.evaluate(ctl, ctl.bodies[(NS, NAME)])
    endpoint.serve(20, 0.1)
    clock.t += 2
    await ev.evaluate(ctl, ctl.bodies[(NS, NAME)])
    assert ctl.status["policy"]["speculation"]["engine"] == "base"
    ctl.status["activeEngine"] = "base"
    ctl.pods = [pod("chat-redrafter-canary-0", "redrafter", "base"), pod("chat-base-0", "base", ready=False)]

    restarted = evaluator(endpoint, clock)  # no memory: the state comes from status.policy
    for _ in range(3):
        endpoint.serve(20, 0.9)
        clock.t += 1
        await restarted.evaluate(ctl, ctl.bodies[(NS, NAME)])
    st = ctl.status
    assert st["policy"]["speculation"]["engine"] == "base"  # cooldown 1h still holds the recovery
    assert st["speculation"]["decision"] == "Hold" and st["speculation"]["reason"].startswith("Cooldown")
    assert ctl.targets[-1] == ServingTargets(active="base", replicas={"base": 1, "redrafter": 0}, canary=1)
    assert [h["to"] for h in st["history"]] == ["base"]


async def test_mode_never_leaves_the_condition_to_the_reconciler(endpoint, events) -> None:
    ctl, clock = FakeController(body(mode="Never")), Clock()
    await evaluator(endpoint, clock).evaluate(ctl, ctl.bodies[(NS, NAME)])
    assert "conditions" not in ctl.client.patches()[0]
    assert ctl.targets[-1].active == "base" and ctl.status["policy"]["speculation"]["engine"] == "base"
    assert events == []  # a new resource pinned to base starts there: no switch


def test_pure_helpers() -> None:
    spec_state = PolicyState.model_validate({"speculation": {"since": 5.0, "last_evaluated": 10.0}})
    later = PolicyState.model_validate({"speculation": {"since": 5.0, "last_evaluated": 20.0}})
    assert newer_state(spec_state, later) is later and newer_state(later, spec_state) is later
    assert newer_state(None, later) is later and newer_state(later, None) is later
    assert stored_state({"policy": {"speculation": {"engine": "nope"}}}) is None
    assert stored_state({}) is None
    old = {"speculation": {"lastEvaluated": sp.rfc3339(100.0), "samples": 0}, "policy": {"window": {"t": 1.0}}}
    same_but_later = {
        "speculation": {"lastEvaluated": sp.rfc3339(101.0), "samples": 0},
        "policy": {"window": {"t": 2.0}},
    }
    assert status_patch(old, same_but_later, now=101.0) is None
    assert status_patch(old, same_but_later, now=100_000.0) is None  # no timestamp heartbeat, however long at rest
    assert status_patch(old, {**same_but_later, "speculation": {"samples": 3}}, now=101.0)
    assert status_fragment  # exercised through the evaluator above


def test_an_expired_settle_window_is_not_worth_a_write_alone() -> None:
    """The autoscaler treats a settle window that has expired as none: clearing it is no change by itself
    (else every resource writes once, minutes after a switch, with nothing else to say)."""

    def status(settle: list[float] | None, t: float) -> dict[str, Any]:
        autoscaler = {"recommendations": [], **({"settle": settle} if settle else {})}
        return {
            "speculation": {"lastEvaluated": sp.rfc3339(t), "samples": 0},
            "policy": {"autoscaler": autoscaler, "window": {"t": t}},
        }

    old = status([150.0, 2], 100.0)
    assert status_patch(old, status(None, 200.0), now=200.0) is None  # expired at 150
    assert status_patch(old, status(None, 120.0), now=120.0) is not None  # still running
    assert status_patch(old, status([300.0, 3], 200.0), now=200.0) is not None  # a new one
    assert status_patch(old, status(None, 5000.0), now=5000.0) is None  # long after: still nothing to say


# ---- the validation gate's pure parts -------------------------------------------------------------------
from redrafter_operator.api.spec import ReDrafterDeploymentSpec  # noqa: E402
from redrafter_operator.controller.gate import (  # noqa: E402
    Gate,
    engine_pair,
    gate_from_status,
    gate_of,
    gated_targets,
)
from redrafter_operator.controller.targets import default_targets  # noqa: E402
from redrafter_operator.controller.validation import Promotion  # noqa: E402

PAIR_STATUS = {"engines": {"redrafter": {"key": "r1", "state": "Ready"}, "base": {"key": "b1", "state": "Cached"}}}
POLICY = ServingTargets(active="redrafter", replicas={"redrafter": 3, "base": 0}, canary=0)


def test_engine_pair_and_gate_of() -> None:
    assert engine_pair(PAIR_STATUS) == ("r1", "b1")
    assert (
        engine_pair(
            {"engines": {"redrafter": {"key": "r1", "state": "Ready"}, "base": {"key": "b1", "state": "Building"}}}
        )
        is None
    )
    assert gate_of(PAIR_STATUS, ("r1", "b1")) == Gate(False, "Pending")
    passed = {**PAIR_STATUS, "validation": {"redrafterKey": "r1", "baseKey": "b1", "state": "Passed"}}
    assert gate_of(passed, ("r1", "b1")) == Gate(True, "Passed")
    assert gate_of(passed, ("r2", "b1")) == Gate(False, "Pending")  # a new pair is validated again


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
    assert default_targets(spec, {"activeEngine": "base"}).canary == 1  # no canary flap on restart
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
    assert default_targets(aware, {"activeEngine": "base", "policy": load_fallback}).canary == 0
    assert default_targets(spec, {"activeEngine": "base", "policy": load_fallback}).canary == 1  # not load-aware
    running = {
        **PAIR_STATUS,
        "activeEngine": "redrafter",
        "validation": {"redrafterKey": "r1", "baseKey": "b1", "state": "Running"},
    }
    assert default_targets(spec, running).replicas == {"redrafter": 1, "base": 1}
    failed = {**running, "validation": {**running["validation"], "state": "Failed"}}
    assert default_targets(spec, failed) == ServingTargets("base", {"base": 1, "redrafter": 0}, 0)
    off = ReDrafterDeploymentSpec.model_validate({**body()["spec"], "validation": {"enabled": False}})
    assert gate_from_status(POLICY, off, failed) is POLICY


def test_promotion_hub_never_clears_targets_it_did_not_gate() -> None:
    ctl = FakeController(body())
    spec = ReDrafterDeploymentSpec.model_validate(body()["spec"])
    hub = Promotion()
    hub.set_gate(ctl, (NS, NAME), None, spec, {})
    assert ctl.targets == []  # nothing from the policy, nothing gated: the reconciler's defaults stand
    hub.set_gate(ctl, (NS, NAME), Gate(False, "Failed"), spec, {"activeEngine": "redrafter"})
    assert ctl.targets[-1].active == "base"
    hub.set_policy(ctl, (NS, NAME), POLICY, spec, {"activeEngine": "base"})
    assert ctl.targets[-1].active == "base"  # still gated
    hub.set_gate(ctl, (NS, NAME), Gate(True, "Passed"), spec, {"activeEngine": "base"})
    assert ctl.targets[-1] == POLICY


def test_promotion_hub_applies_the_status_gate_before_the_gate_has_run() -> None:
    ctl = FakeController(body())
    spec = ReDrafterDeploymentSpec.model_validate(body()["spec"])
    Promotion().set_policy(ctl, (NS, NAME), POLICY, spec, {**PAIR_STATUS, "activeEngine": "redrafter"})
    assert ctl.targets[-1] == ServingTargets("redrafter", {"redrafter": 3, "base": 1}, 0)  # base kept for validation


# ---- a promoted ReDrafter engine keeps serving while a newer one is validated ---------------------------
PROMOTED = {"redrafterKey": "r0", "baseKey": "b1"}


def test_a_promoted_engine_is_stable_until_the_new_pair_passes() -> None:
    from redrafter_operator.controller.validation import validation_fragment
    from redrafter_operator.evaluate.gate import ValidationStep

    pending = {
        **PAIR_STATUS,
        "validation": {"redrafterKey": "r0", "baseKey": "b1", "state": "Passed", "promoted": PROMOTED},
    }
    assert gate_of(pending, ("r1", "b1")) == Gate(False, "Pending", stable="r0")
    assert gate_of(pending, ("r0", "b1")) == Gate(True, "Passed")  # the promoted pair itself: nothing stable
    failed = {
        **PAIR_STATUS,
        "validation": {"redrafterKey": "r1", "baseKey": "b1", "state": "Failed", "promoted": PROMOTED},
    }
    assert gate_of(failed, ("r1", "b1")) == Gate(False, "Failed", stable="r0")
    # validating: the policy's targets stand (the promoted engine is validated), base kept up as the reference
    assert gated_targets(POLICY, Gate(False, "Running", "r0"), "redrafter") == ServingTargets(
        "redrafter", {"redrafter": 3, "base": 1}, 0
    )
    on_base = ServingTargets(active="base", replicas={"base": 2, "redrafter": 1}, canary=1)
    assert gated_targets(on_base, Gate(False, "Running", "r0"), "base") == on_base  # canary of the promoted engine kept
    # failed: the promoted engine keeps serving as the policy says, not base
    assert gated_targets(POLICY, Gate(False, "Failed", "r0"), "redrafter") is POLICY
    # status: promoted survives the record of a newer pair, and a pass replaces it
    running = ValidationStep(False, False, 0, {"redrafterKey": "r1", "baseKey": "b1", "attempt": 0, "state": "Running"})
    out = validation_fragment(pending, running, generation=1, now="2026-01-01T00:00:00Z")
    assert out["validation"]["promoted"] == PROMOTED and out["validation"]["state"] == "Running"
    passed = ValidationStep(True, False, 0, {"redrafterKey": "r1", "baseKey": "b1", "attempt": 0, "state": "Passed"})
    assert validation_fragment(pending, passed, generation=1, now="2026-01-01T00:00:00Z")["validation"]["promoted"] == {
        "redrafterKey": "r1",
        "baseKey": "b1",
    }


def test_the_policy_may_choose_a_promoted_engine_while_a_newer_one_is_validated() -> None:
    ctl = FakeController(body())
    spec = ReDrafterDeploymentSpec.model_validate(body()["spec"])
    hub = Promotion()
    key = (NS, NAME)
    hub.set_gate(ctl, key, Gate(False, "Running"), spec, {"activeEngine": "base"})
    assert not hub.allows_redrafter(key)
    hub.set_gate(ctl, key, Gate(False, "Failed", "r0"), spec, {"activeEngine": "redrafter"})
    assert hub.allows_redrafter(key)


def test_gating_twice_changes_nothing() -> None:
    """The planner gates whatever targets it gets (some arrive already gated by the promotion hub)."""
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


async def test_the_autoscaler_counts_the_pods_still_starting(endpoint, events) -> None:
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
    ctl, clock = FakeController(obj), Clock()
    ctl.pods = [pod(f"chat-redrafter-{i}", ready=i < 2) for i in range(4)]
    endpoint.active = 1.0
    ev = evaluator(endpoint, clock)
    await ev.evaluate(ctl, ctl.bodies[(NS, NAME)])
    assert ctl.targets[-1].replicas["redrafter"] == 3
    assert [e for e in events if e[1] == "Scaling"] and "2 missing" in events[-1][2]
    # the load rises to 16 in flight on the 2 Ready pods while the third replica still loads: the starting
    # pod counts as idle, 16 / 3 pods / 4 -> ceil(1.33 x 3) = 4 = what the load needs (not 3 x 8/4 = 6)
    ctl.pods = [pod(f"chat-redrafter-{i}", ready=i < 2) for i in range(3)]
    endpoint.active = 8.0
    clock.t += 1
    await ev.evaluate(ctl, ctl.bodies[(NS, NAME)])
    assert ctl.targets[-1].replicas["redrafter"] == 4
