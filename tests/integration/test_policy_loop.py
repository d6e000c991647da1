"""The speculation policy end to end: emulated API over HTTP, serving metrics over HTTP, the operator in-process.

Every serving Pod the sim controllers create gets a loopback podIP (127.x.y.z) with a small HTTP server on the
Triton metrics port serving the metering model's counters. A traffic loop advances the counters of the Ready
pods the stable Service selects (a ReDrafter canary in the base pool included) with the acceptance the test
sets per engine. Spec timings are short (interval 1s, failureLimit/successLimit 2, minDwell/cooldown 3s).
Assertions count evaluations, never wall time (the machine is shared); the times are printed.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from test_lifecycle import (  # noqa: I001
    INFERENCE_POOL_CRD,
    NAME,
    NS,
    Cluster,
    Operator,
    apply,
    differing,
    example,
    rendered,
    routed,
    running,  # (same dir)
    until,
)

from engine_jobs import contract as c
from redrafter_operator.controller.speculation import SpeculationMonitor
from redrafter_operator.policy import Evaluation
from redrafter_operator.render import names
from redrafter_sim import controllers
from redrafter_sim.server import EmulatorHandle

pytestmark = pytest.mark.timeout(240)

DRAFT_PER_REQUEST = 20  # draft tokens proposed per request
OUTPUT_PER_REQUEST = 16
STEPS_PER_REQUEST = 8


def policy_doc(**speculation: Any) -> dict[str, Any]:
    doc = example()
    doc["spec"]["autoscaling"] = {"mode": "Disabled"}
    doc["spec"]["serving"]["replicas"] = 2
    doc["spec"]["validation"] = {"enabled": False}
    doc["spec"]["speculation"] = {
        "mode": "Auto",
        "interval": "1s",
        "failureLimit": 2,
        "successLimit": 2,
        "minSamples": 5,
        "minAcceptanceRate": 0.35,
        "acceptanceHysteresis": 0.05,
        "cooldown": "3s",
        "minDwell": "3s",
        "loadAware": False,
        "canaryReplicas": 1,
        "consecutiveErrorLimit": 2,
        **speculation,
    }
    return doc


@dataclass
class FakePod:
    """One serving pod's metrics endpoint and cumulative counters."""

    name: str
    variant: str
    ip: str
    runner: web.AppRunner
    counters: dict[str, float] = field(
        default_factory=lambda: dict.fromkeys(("requests", "draft", "accepted", "output", "steps"), 0.0)
    )

    def exposition(self, deployment: str) -> str:
        labels = f'model="{deployment}",variant="{self.variant}"'
        lines = []
        for metric, key in (
            (c.METRIC_REQUESTS, "requests"),
            (c.METRIC_OUTPUT_TOKENS, "output"),
            (c.METRIC_STEPS, "steps"),
            (c.METRIC_DRAFT_TOKENS, "draft"),
            (c.METRIC_ACCEPTED_DRAFT_TOKENS, "accepted"),
        ):
            if self.variant == "base" and key in ("draft", "accepted"):
                continue
            lines += [f"# TYPE {metric} counter", f"{metric}{{{labels}}} {self.counters[key]}"]
        lines += [
            f"# TYPE {c.METRIC_TRTLLM_REQUESTS} gauge",
            f'{c.METRIC_TRTLLM_REQUESTS}{{model="{c.ENGINE_MODEL}",request_type="active",version="1"}} 1',
        ]
        return "\n".join(lines) + "\n"


class MeteredCluster(Cluster):
    """The lifecycle tests' cluster, plus loopback pod IPs with metrics servers and a traffic loop."""

    def __init__(self, handle: EmulatorHandle) -> None:
        super().__init__(handle)
        self.acceptance = {"redrafter": 0.8}
        self.outage = False  # every metrics endpoint answers 503
        self.fake: dict[str, FakePod] = {}  # pod uid -> fake
        self.selected_ready: list[tuple[float, str, int]] = []  # (time, pool, Ready pods the Service selects)
        self._net = f"127.{random.randint(100, 250)}.{random.randint(0, 250)}."
        self._next_host = 2

    async def _serve(self, pod: FakePod | None, variant: str, name: str) -> FakePod:
        async def metrics(_: web.Request) -> web.Response:
            if self.outage:
                return web.Response(status=503, text="metrics unavailable")
            return web.Response(text=fake.exposition(NAME), content_type="text/plain")

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        while True:
            ip = f"{self._net}{self._next_host}"
            self._next_host += 1
            try:
                await web.TCPSite(runner, ip, c.METRICS_PORT).start()
                break
            except OSError:
                if self._next_host > 250:
                    raise
        fake = FakePod(name, variant, ip, runner)
        return fake

    async def _sync_pods(self) -> None:
        pods = self.emu.list_objects("v1", "Pod", NS, label_selector=f"{names.LABEL_COMPONENT}=serving")
        seen = set()
        for pod in pods:
            uid = pod["metadata"]["uid"]
            seen.add(uid)
            if uid not in self.fake:
                self.fake[uid] = await self._serve(
                    None, pod["metadata"]["labels"][names.LABEL_VARIANT], pod["metadata"]["name"]
                )
            ip = self.fake[uid].ip
            if (pod.get("status") or {}).get("podIP") and pod["status"]["podIP"] != ip:
                self.emu.patch_object(
                    "v1",
                    "Pod",
                    pod["metadata"]["name"],
                    NS,
                    {"status": {"podIP": ip, "podIPs": [{"ip": ip}]}},
                    subresource="status",
                )
        for uid in [u for u in self.fake if u not in seen]:
            await self.fake.pop(uid).runner.cleanup()

    def _traffic(self, svc: dict[str, Any] | None) -> None:
        """One tick of traffic: each Ready pod the stable Service selects finishes a request."""
        if not svc:
            return
        selector = svc["spec"]["selector"]
        for pod in self.emu.list_objects("v1", "Pod", NS, label_selector=names.selector_string(selector)):
            fake = self.fake.get(pod["metadata"]["uid"])
            if fake is None or not controllers.is_pod_ready(pod):
                continue
            n = fake.counters
            n["requests"] += 1
            n["output"] += OUTPUT_PER_REQUEST
            n["steps"] += STEPS_PER_REQUEST
            if fake.variant == "redrafter":
                n["draft"] += DRAFT_PER_REQUEST
                n["accepted"] += round(DRAFT_PER_REQUEST * self.acceptance["redrafter"])

    async def run(self, stop: asyncio.Event) -> None:
        try:
            while not stop.is_set():
                controllers.reconcile_once(self.emu, NS, pods_ready=self.pods_ready)
                await self._sync_pods()
                svc = self.emu.find_object("v1", "Service", NAME, NS)
                if svc:
                    pool = svc["spec"]["selector"].get(names.LABEL_TRAFFIC, "")
                    now = time.monotonic()
                    self.samples.append((now, pool, len(set(controllers.ready_endpoint_ips(self.emu, NAME, NS)))))
                    selected = self.emu.list_objects(
                        "v1", "Pod", NS, label_selector=names.selector_string(svc["spec"]["selector"])
                    )
                    self.selected_ready.append((now, pool, sum(controllers.is_pod_ready(p) for p in selected)))
                self.sample_inference_pool()
                self._traffic(svc)
                await asyncio.sleep(0.05)
        finally:
            for fake in self.fake.values():
                await fake.runner.cleanup()

    def pool(self) -> str | None:
        svc = self.emu.find_object("v1", "Service", NAME, NS)
        return svc["spec"]["selector"].get(names.LABEL_TRAFFIC) if svc else None


@pytest.fixture
async def cluster(apiserver: EmulatorHandle) -> AsyncIterator[MeteredCluster]:
    async for cl in running(apiserver, MeteredCluster):
        yield cl


class Watched(Operator):
    """The operator, with every speculation evaluation recorded as (monotonic time, evaluation)."""

    def __init__(self, kubeconfig: Path) -> None:
        super().__init__(kubeconfig, resync=2.0)
        self.evaluations: list[tuple[float, Evaluation]] = []

    def _keep(self, ctl: Any) -> None:
        super()._keep(ctl)
        for ev in ctl.monitors:
            if isinstance(ev, SpeculationMonitor):
                ev.observers.append(lambda key, e: self.evaluations.append((time.monotonic(), e)))


@pytest.fixture
async def operator(cluster: MeteredCluster, kubeconfig: Path) -> AsyncIterator[Watched]:
    op = Watched(kubeconfig)
    await op.start()
    try:
        yield op
    finally:
        await op.stop()


async def serving_with_measurements(cluster: MeteredCluster) -> None:
    await until(lambda: len(cluster.running_jobs()) == 2, what="build Jobs")
    cluster.complete_all()
    await until(lambda: cluster.status().get("phase") == "Serving", timeout=60, what="phase Serving")
    await until(
        lambda: (
            (cluster.status().get("speculation") or {}).get("samples", 0) > 0
            and cluster.condition("SpeculationHealthy")["status"] == "True"
        ),
        timeout=60,
        what="a successful measurement in status",
    )


def since(evals: list[tuple[float, Evaluation]], t0: float) -> list[Evaluation]:
    return [e for t, e in evals if t >= t0]


async def past_dwell(cluster: MeteredCluster) -> None:
    """Wait until minDwell/cooldown (3s) no longer hold a switch (policy time is epoch seconds)."""

    def ok() -> bool:
        s = (cluster.status().get("policy") or {}).get("speculation") or {}
        last = max(s.get("since") or 0, s.get("last_switch") or 0)
        return bool(last) and time.time() - last > 3.5

    await until(ok, timeout=30, what="minDwell/cooldown elapsed")


def first_switch(evals: list[Evaluation], action: str) -> tuple[int, Evaluation]:
    for i, e in enumerate(evals):
        if e.speculation.action == action:
            return i, e
    raise AssertionError(f"no {action} in {[e.speculation.action for e in evals]}")


# ---------------------------------------------------------------------------------------------------------
async def test_collapse_falls_back_to_base_and_recovery_returns_across_a_restart(
    cluster: MeteredCluster, operator: Watched, kubectl: Any, kubeconfig: Path
) -> None:
    # with the InferencePool on (the upstream v1 CRD installed): it follows the fallback and the return
    cluster.emu.create_object(yaml.safe_load(INFERENCE_POOL_CRD.read_text()))
    doc = policy_doc()
    doc["spec"]["routing"] = routed()["spec"]["routing"]
    apply(kubectl, doc)
    await serving_with_measurements(cluster)
    st = cluster.status()
    assert st["speculation"]["decision"] == "Stay" and st["speculation"]["acceptanceRate"] == pytest.approx(0.8)
    assert st["policy"]["speculation"]["engine"] == "redrafter"  # the state to resume from is in status
    assert cluster.pool() == "redrafter"
    await past_dwell(cluster)

    # ---- acceptance collapses: failureLimit (2) failed measurements => SwitchToBase => Service on base
    t0 = time.monotonic()
    cluster.acceptance["redrafter"] = 0.1
    await until(
        lambda: any(e.speculation.switched for e in since(operator.evaluations, t0)),
        timeout=60,
        what="the policy's switch decision",
    )
    t_decided = time.monotonic()
    evals = since(operator.evaluations, t0)
    i, switch = first_switch(evals, "SwitchToBase")
    assert switch.speculation.reason == "LowAcceptance"
    assert [e.speculation.measurement.outcome for e in evals[: i + 1]].count("Failed") == 2  # failureLimit
    # + at most one evaluation in flight at the collapse and one window straddling it; inconclusive
    # windows (a starved traffic loop on a loaded machine) do not count
    assert len([e for e in evals[: i + 1] if e.speculation.measurement.outcome != "Inconclusive"]) <= 2 + 2
    await until(lambda: cluster.pool() == "base", timeout=60, what="Service on the base pool")
    t_base = time.monotonic()
    print(
        f"\ncollapse -> decision {t_decided - t0:.1f}s, -> Service on base {t_base - t0:.1f}s "
        f"(readiness/rollout {t_base - t_decided:.1f}s)"
    )
    await until(lambda: cluster.status().get("activeEngine") == "base", what="status.activeEngine base")
    st = cluster.status()
    assert [(h["from"], h["to"]) for h in st["history"]] == [("redrafter", "base")]
    assert st["history"][0]["reason"].startswith("LowAcceptance: 2 consecutive failed measurements")
    cond = cluster.condition("SpeculationHealthy")
    assert cond["status"] == "False"
    await until(
        lambda: (
            cluster.deployment("base")["spec"]["replicas"] == 2
            and cluster.deployment("redrafter")["spec"]["replicas"] == 0
        ),
        what="old pool scaled down",
    )
    canary = cluster.emu.find_object("apps/v1", "Deployment", names.canary_deployment_name(NAME), NS)
    assert canary and canary["spec"]["replicas"] == 1  # recovery stays observable on base
    # `render --active base --canary` prints the fallback's serving children as the operator applied them
    assert not differing(
        cluster,
        rendered(cluster, doc, active="base", canary=True),
        {"Deployment", "Service", "ConfigMap", "InferencePool"},
    )
    await until(lambda: {"SwitchToBase", "Switched"} <= {r for r, _, _ in cluster.events()}, what="switch Events")
    event = next(e for e in cluster.events() if e[0] == "SwitchToBase")
    assert event[1] == "Warning" and "LowAcceptance" in event[2]
    m = operator.controller.metrics
    assert m.speculation_switches.labels("base", "LowAcceptance")._value.get() == 1
    assert m.switches.labels(NS, NAME, "redrafter", "base")._value.get() == 1
    assert m.active_engine.labels(NS, NAME, "base")._value.get() == 1 and m.fallback.labels(NS, NAME)._value.get() == 1

    # ---- the canary keeps measuring low acceptance on base: no return; an operator restart resumes the state
    await until(
        lambda: (cluster.status().get("speculation") or {}).get("reason", "").startswith("CanaryLowAcceptance"),
        timeout=30,
        what="canary measurements on base",
    )
    await operator.stop()
    before = cluster.status()["policy"]["speculation"]
    await operator.start()
    t1 = time.monotonic()
    await until(lambda: len(since(operator.evaluations, t1)) >= 3, timeout=60, what="evaluations after restart")
    assert all(e.speculation.engine == "base" for e in since(operator.evaluations, t1))
    after = cluster.status()["policy"]["speculation"]
    assert after["last_switch"] == before["last_switch"] and after["fallback_reason"] == "LowAcceptance"
    assert cluster.pool() == "base"

    # ---- recovery: canary acceptance high => successLimit (2) successes => back on ReDrafter
    t2 = time.monotonic()
    cluster.acceptance["redrafter"] = 0.8
    await until(
        lambda: any(e.speculation.switched for e in since(operator.evaluations, t2)),
        timeout=60,
        what="the recovery decision",
    )
    evals = since(operator.evaluations, t2)
    i, back = first_switch(evals, "SwitchToRedrafter")
    assert back.speculation.reason == "CanaryRecovered"
    assert [e.speculation.measurement.outcome for e in evals[: i + 1]].count("Successful") >= 2
    await until(lambda: cluster.pool() == "redrafter", timeout=60, what="Service back on ReDrafter")
    print(f"recovery -> Service on ReDrafter {time.monotonic() - t2:.1f}s")
    await until(lambda: cluster.status().get("activeEngine") == "redrafter", what="status.activeEngine redrafter")
    st = cluster.status()
    assert [(h["from"], h["to"]) for h in st["history"]] == [("redrafter", "base"), ("base", "redrafter")]
    assert st["history"][1]["reason"].startswith("CanaryRecovered")
    await until(
        lambda: (
            cluster.emu.find_object("apps/v1", "Deployment", names.canary_deployment_name(NAME), NS)["spec"]["replicas"]
            == 0
        ),
        what="canary scaled down",
    )
    await until(
        lambda: any(r == "SwitchToRedrafter" and t == "Normal" for r, t, _ in cluster.events()), what="recovery Event"
    )

    # ---- the Service never selected a pool without Ready pods, at any sample after serving began
    serving = [s for s in cluster.selected_ready if s[1]]
    first = next(i for i, s in enumerate(serving) if s[2] > 0)
    assert all(n >= 1 for _, _, n in serving[first:]), [s for s in serving[first:] if s[2] < 1][:5]
    endpoints = [s for s in cluster.samples if s[1]]
    first = next(i for i, s in enumerate(endpoints) if s[2] > 0)
    assert all(n >= 1 for _, _, n in endpoints[first:])
    assert {p for _, p, _ in serving[first:]} == {"redrafter", "base"}
    # ... and neither did the InferencePool, which followed both switches (once the sampler saw the return)
    await until(lambda: cluster.pool_samples[-1][1] == "redrafter", what="a sample of the pool back on ReDrafter")
    pooled = [s for s in cluster.pool_samples if s[1]]
    first = next(i for i, s in enumerate(pooled) if s[2] > 0)
    assert all(n >= 1 for _, _, n in pooled[first:]), [s for s in pooled[first:] if s[2] < 1][:5]
    moves = [b[1] for a, b in zip(pooled[first:], pooled[first + 1 :]) if a[1] != b[1]]
    assert pooled[first][1] == "redrafter" and moves == ["base", "redrafter"], moves
    await until(lambda: cluster.condition("InferencePoolReady")["status"] == "True", what="the pool observed back")


async def test_metric_outage_is_inconclusive_and_never_switches(
    cluster: MeteredCluster, operator: Watched, kubectl: Any
) -> None:
    apply(kubectl, policy_doc())
    await serving_with_measurements(cluster)
    await past_dwell(cluster)
    writes_before = len(cluster.emu.request_log)
    t0 = time.monotonic()
    cluster.outage = True
    cluster.acceptance["redrafter"] = 0.05  # collapsed, but nobody can see it
    await until(lambda: len(since(operator.evaluations, t0)) >= 6, timeout=60, what="evaluations during the outage")
    evals = since(operator.evaluations, t0)
    assert not any(e.speculation.switched for e in evals)
    assert all(e.speculation.measurement.outcome in ("Inconclusive", "Successful") for e in evals)
    assert evals[-1].speculation.reason == "NoData"
    st = cluster.status()
    assert st["activeEngine"] == "redrafter" and cluster.pool() == "redrafter" and not st.get("history")
    assert st["speculation"]["reason"].startswith("NoData")
    assert st["policy"]["speculation"]["failures"] == 0
    assert cluster.condition("SpeculationHealthy")["status"] == "Unknown"
    # an unchanged inconclusive evaluation writes nothing (timestamps alone do not count)
    status_writes = [
        r for r in cluster.emu.writes(writes_before) if r.path.endswith("/status") and "redrafterdeployments" in r.path
    ]
    assert len(status_writes) <= 2, status_writes  # the first NoData evaluation (+ the Unknown condition)

    # the outage ends with acceptance back up: measurements resume, still no switch
    cluster.acceptance["redrafter"] = 0.8
    cluster.outage = False
    await until(lambda: cluster.condition("SpeculationHealthy")["status"] == "True", timeout=60, what="healthy again")
    assert cluster.pool() == "redrafter" and not cluster.status().get("history")
