"""Serving pods with metrics, for the tests of the speculation policy: the lifecycle cluster
(:mod:`harness.lifecycle`) whose serving pods expose Triton's metrics on their pod IP, with counters that a
traffic loop advances.

* Each serving pod a node holds (:class:`MeteredPods`) serves ``/metrics`` on its status.podIP (a loopback
  127.244.x.y address: all of 127/8 is local on Linux) at the Triton metrics port, from before it reports
  Running until it is gone from the API; the operator scrapes it as it would scrape a cluster's pod.
* The traffic loop (:class:`MeteredCluster`) finishes one request per tick on each Ready pod the stable Service
  selects (a ReDrafter canary in the base pool included), at the acceptance the test sets per engine.
* ``outage``: every metrics endpoint answers 503.
* :class:`WatchedOperator` records each speculation evaluation, so the tests count evaluations, never wall time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import urllib.error
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from engine_jobs import contract as c
from redrafter_operator.controller.reconciler import Controller
from redrafter_operator.controller.speculation import SpeculationMonitor
from redrafter_operator.policy import Evaluation
from redrafter_operator.render import names
from redrafter_sim import objects
from redrafter_sim.controlplane import ControlPlane
from redrafter_sim.kwokstages import Report
from redrafter_sim.node import SimNode

from .lifecycle import NAME, Cluster, HeldPods, LifecycleOperator, example, is_ready, running_cluster, running_operator

log = logging.getLogger("harness.metered")

DRAFT_PER_REQUEST = 20  # draft tokens proposed per request
OUTPUT_PER_REQUEST = 16
STEPS_PER_REQUEST = 8
TRAFFIC_TICK = 0.05


def policy_doc(**speculation: Any) -> dict[str, Any]:
    """The example with short policy timings (interval 1s, limits 2, minDwell/cooldown 3s), two replicas, no
    autoscaling and no validation."""
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
class Meter:
    """One serving pod's cumulative counters, as its Triton exposes them."""

    variant: str
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

    def finish_request(self, acceptance: float) -> None:
        n = self.counters
        n["requests"] += 1
        n["output"] += OUTPUT_PER_REQUEST
        n["steps"] += STEPS_PER_REQUEST
        if self.variant == "redrafter":
            n["draft"] += DRAFT_PER_REQUEST
            n["accepted"] += round(DRAFT_PER_REQUEST * acceptance)


def is_serving_pod(pod: dict[str, Any]) -> bool:
    return (pod["metadata"].get("labels") or {}).get(names.LABEL_COMPONENT) == "serving"


@dataclass
class MeteredServer:
    meter: Meter
    runner: web.AppRunner
    started: float  # time.monotonic() when it listened


@dataclass
class MeteredPods(HeldPods):
    """Held pods whose serving pods serve metrics on their pod IP; ``processes`` picks the pods a node runs as it
    would without held pods (their real programs: a build Job's prepare, say).

    A pod's metrics server listens before the pod reports its IP (the first scrape finds it) and outlives the
    pod's task: an in-process operator that stops cancels every task started after it (kopf's clean-up), the
    held pods' included, and a pod that keeps its Ready status must keep answering. :meth:`forget` stops the
    servers of pods that are gone."""

    acceptance: dict[str, float] = field(default_factory=lambda: {"redrafter": 0.8})
    outage: bool = False  # every metrics endpoint answers 503
    servers: dict[str, MeteredServer] = field(default_factory=dict)  # by pod uid
    processes: Callable[[dict[str, Any]], bool] = field(default=lambda pod: False)
    nodes: dict[str, SimNode] = field(default_factory=dict)

    @property
    def meters(self) -> dict[str, Meter]:
        return {uid: s.meter for uid, s in self.servers.items()}

    async def run(self, pod: dict[str, Any], report: Report) -> None:
        if self.processes(pod):
            await self.nodes[pod["spec"]["nodeName"]]._run(pod)
            return
        if is_serving_pod(pod) and pod["metadata"]["uid"] not in self.servers:
            await self._serve(pod)
        await super().run(pod, report)

    async def _serve(self, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        meter = Meter(pod["metadata"]["labels"][names.LABEL_VARIANT])

        async def metrics(_: web.Request) -> web.Response:
            if self.outage:
                return web.Response(status=503, text="metrics unavailable")
            return web.Response(text=meter.exposition(NAME), content_type="text/plain")

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, objects.pod_ip(uid), c.METRICS_PORT).start()
        except BaseException:
            await runner.cleanup()
            raise
        self.servers[uid] = MeteredServer(meter, runner, time.monotonic())

    async def forget(self, live: set[str], listed_at: float) -> None:
        """Stop the servers of the pods absent from a list of the serving pods begun at ``listed_at``."""
        for uid in [u for u, s in self.servers.items() if u not in live and s.started < listed_at]:
            await self.servers.pop(uid).runner.cleanup()

    async def close(self) -> None:
        for server in self.servers.values():
            await server.runner.cleanup()
        self.servers.clear()


class MeteredCluster(Cluster):
    """The lifecycle cluster with metered serving pods and the traffic loop."""

    pods: MeteredPods

    def __init__(self, cp: ControlPlane, workdir: Path) -> None:
        super().__init__(cp, workdir)
        self.pods = MeteredPods()
        self._traffic: asyncio.Task[None] | None = None

    @property
    def acceptance(self) -> dict[str, float]:
        return self.pods.acceptance

    @property
    def outage(self) -> bool:
        return self.pods.outage

    @outage.setter
    def outage(self, value: bool) -> None:
        self.pods.outage = value

    async def start(self) -> MeteredCluster:
        await super().start()
        self._traffic = asyncio.create_task(self._traffic_loop())
        return self

    async def close(self) -> None:
        if self._traffic is not None:
            self._traffic.cancel()
            await asyncio.gather(self._traffic, return_exceptions=True)
        await super().close()
        await self.pods.close()

    async def add_node(self, name: str, product: str | None, gpus: int = 8) -> SimNode:
        node = await super().add_node(name, product, gpus)
        self.pods.nodes[name] = node
        return node

    def pool(self) -> str | None:
        """The traffic pool the stable Service selects (None before it exists)."""
        svc = self.find("v1", "Service", NAME)
        return svc["spec"]["selector"].get(names.LABEL_TRAFFIC) if svc else None

    def selected_pods(self) -> list[dict[str, Any]]:
        svc = self.find("v1", "Service", NAME)
        return self.list("v1", "Pod", names.selector_string(svc["spec"]["selector"])) if svc else []

    def _serving(self) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        return self.find("v1", "Service", NAME), self.list("v1", "Pod", f"{names.LABEL_COMPONENT}=serving")

    async def _traffic_loop(self) -> None:
        """Each tick, one request finished on each Ready pod the Service selects; servers of gone pods stop."""
        while True:
            listed_at = time.monotonic()
            try:
                svc, pods = await asyncio.to_thread(self._serving)
            except (urllib.error.URLError, OSError):
                await asyncio.sleep(TRAFFIC_TICK)
                continue
            await self.pods.forget({p["metadata"]["uid"] for p in pods}, listed_at)
            selector = (svc or {}).get("spec", {}).get("selector") or {}
            for pod in pods:
                labels = pod["metadata"].get("labels") or {}
                server = self.pods.servers.get(pod["metadata"]["uid"])
                if svc and server and is_ready(pod) and all(labels.get(k) == v for k, v in selector.items()):
                    server.meter.finish_request(self.acceptance.get(server.meter.variant, 0.0))
            await asyncio.sleep(TRAFFIC_TICK)


class WatchedOperator(LifecycleOperator):
    """The operator (resync 2s), with every speculation evaluation recorded as (monotonic time, evaluation);
    ``after_evaluation`` callbacks run once each, right after the next evaluation, before the monitor scrapes
    again (a test changes the pods between two evaluations, never during one's scrape)."""

    def __init__(self, cluster: Cluster, **options: Any) -> None:
        super().__init__(cluster, **{"resync": 2.0, **options})
        self.evaluations: list[tuple[float, Evaluation]] = []
        self._once: list[Callable[[], None]] = []

    def _keep(self, ctl: Controller) -> None:
        super()._keep(ctl)
        for monitor in ctl.monitors:
            if isinstance(monitor, SpeculationMonitor):
                monitor.observers.append(self._observe)

    def _observe(self, key: Any, ev: Evaluation) -> None:
        self.evaluations.append((time.monotonic(), ev))
        once, self._once = self._once, []
        for callback in once:
            callback()

    def since(self, t0: float) -> list[Evaluation]:
        return [e for t, e in self.evaluations if t >= t0]

    def after(self, index: int) -> list[Evaluation]:
        return [e for _, e in self.evaluations[index:]]

    def recent(self, n: int = 6) -> str:
        """The last ``n`` evaluations, one line each (for a timed-out wait's message)."""
        lines = [
            f"{e.speculation.action} ({e.speculation.reason}: {e.speculation.message}; canary {e.canary})"
            for _, e in self.evaluations[-n:]
        ]
        return f"{len(self.evaluations)} evaluations, the last {len(lines)}: " + " | ".join(lines)

    async def between_evaluations(self, change: Callable[[], None]) -> int:
        """Run ``change`` right after the next evaluation; the index in ``evaluations`` from which every
        evaluation read the pods as changed (:meth:`after`)."""
        done: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        def run() -> None:
            change()
            done.set_result(len(self.evaluations))

        self._once.append(run)
        async with asyncio.timeout(60):
            return await done


def metered_cluster(cp: ControlPlane, workdir: Path) -> contextlib.AbstractAsyncContextManager[MeteredCluster]:
    return running_cluster(cp, workdir, MeteredCluster)


def watched_operator(cluster: Cluster, **options: Any) -> contextlib.AbstractAsyncContextManager[WatchedOperator]:
    return running_operator(cluster, WatchedOperator, **options)


__all__ = [
    "Meter",
    "MeteredCluster",
    "MeteredPods",
    "WatchedOperator",
    "metered_cluster",
    "policy_doc",
    "watched_operator",
]
