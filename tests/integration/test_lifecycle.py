"""The operator's lifecycle against the emulated API server over HTTP, as a user sees it through kubectl.

The operator runs in-process (kopf in a task of the test's loop); the emulator runs in its own thread
with the built-in controller stand-ins (Deployments -> Ready Pods -> Endpoints, CronJobs -> Jobs on a
clock the test moves) ticking in the background; tests finish build Jobs explicitly (complete or fail,
with a termination message).
"""

from __future__ import annotations

import asyncio
import copy
import json
import re
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from engine_jobs.contract import BuildResult
from harness.operator import InProcessOperator
from redrafter_operator.api import API_VERSION, KIND
from redrafter_operator.api import engine_key as api_engine_key
from redrafter_operator.api.spec import ReDrafterDeploymentSpec
from redrafter_operator.controller import engines
from redrafter_operator.controller.plan_types import ServingTargets
from redrafter_operator.controller.reconciler import Controller
from redrafter_operator.render import cache_refs, names
from redrafter_sim import controllers
from redrafter_sim.cronjobs import CronJobController, ManualClock
from redrafter_sim.failures import Fault
from redrafter_sim.server import EmulatorHandle


def table_rows(text: str) -> list[dict[str, str]]:
    """``kubectl get``'s table as one dict per row, cut at the header's column offsets (a column a row has
    no value for prints blank, so splitting on whitespace would shift the cells after it)."""
    header, *lines = text.splitlines()
    starts = [(m.start(), m.group()) for m in re.finditer(r"\S+", header)]
    bounds = [*(start for start, _ in starts[1:]), None]
    return [{name: line[start:end].strip() for (start, name), end in zip(starts, bounds)} for line in lines]


ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "llama3-8b.yaml"
BUILT = BuildResult(size_bytes=17_179_869_184, built_at="2026-12-01T10:00:00Z")  # what build Pods report
NS = "default"
NAME = "llama3-8b"
RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}
INFERENCE_POOL_CRD = ROOT / "tests" / "fixtures" / "crds" / "inference.networking.k8s.io_inferencepools.yaml"
INFERENCE_POOL_API = "inference.networking.k8s.io/v1"

pytestmark = pytest.mark.timeout(120)


def example(name: str = NAME, **spec: Any) -> dict[str, Any]:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"]["name"] = name
    for dotted, value in spec.items():
        node = doc["spec"]
        *parents, leaf = dotted.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return doc


class Operator(InProcessOperator):
    """The operator in a task of the test's loop, watching NS; ``policy=False`` drives ServingTargets from the test
    instead of the speculation policy."""

    def __init__(self, kubeconfig: Path, resync: float = 300.0, policy: bool = True, clock: Any = None) -> None:
        def keep(c: Controller) -> None:
            if not policy:
                c.monitors.clear()

        super().__init__(kubeconfig, [NS], resync=resync, clock=clock, on_controller=keep, workers=4)


def contained(rendered: Any, stored: Any) -> bool:
    """Every field the render sets is set so on the stored object (the API server adds defaults and status)."""
    if isinstance(rendered, dict):
        return isinstance(stored, dict) and all(contained(v, stored.get(k)) for k, v in rendered.items())
    if isinstance(rendered, list):
        return isinstance(stored, list) and len(rendered) == len(stored) and all(map(contained, rendered, stored))
    return rendered == stored


def differing(cl: Cluster, rendered: list[dict[str, Any]], kinds: set[str]) -> list[str]:
    """The rendered children of these kinds that the cluster does not hold as rendered (by kind/name)."""
    out = []
    for doc in rendered:
        if doc["kind"] not in kinds:
            continue
        stored = cl.emu.find_object(doc["apiVersion"], doc["kind"], doc["metadata"]["name"], NS)
        fields = {k: v for k, v in doc.items() if k not in ("apiVersion", "kind", "metadata")}
        meta = {k: doc["metadata"][k] for k in ("labels", "annotations", "ownerReferences") if k in doc["metadata"]}
        if stored is None or not contained({**fields, "metadata": meta}, stored):
            out.append(f"{doc['kind']}/{doc['metadata']['name']}")
    return out


def rendered(cl: Cluster, doc: dict[str, Any], **kw: Any) -> list[dict[str, Any]]:
    """What `render` prints for the applied resource (uid and generation as the cluster gave them)."""
    from redrafter_operator.controller.preview import planned_children

    live = cl.rdd()
    body = {
        **doc,
        "metadata": {
            **doc["metadata"],
            "namespace": NS,
            "uid": live["metadata"]["uid"],
            "generation": live["metadata"]["generation"],
        },
    }
    return planned_children(body, **kw)


class Cluster:
    """The emulator plus the background built-in controllers and an Endpoints sampler."""

    def __init__(self, handle: EmulatorHandle) -> None:
        self.emu = handle.emulator
        self.samples: list[tuple[float, str, int]] = []  # (time, service pool, ready endpoint IPs)
        self.pool_samples: list[
            tuple[float, str, int]
        ] = []  # (time, InferencePool's traffic pool, Ready pods it selects)
        self.pods_ready = True
        self.faults: dict[str, Fault] = {}  # by Deployment name: what the scheduler/kubelet/admission does to its Pods
        self.deadline_seconds: float | None = None  # the Deployments' progress deadline, shortened
        self.clock = ManualClock()  # the CronJob controller's: a test moves it past a start time
        self.cronjobs = CronJobController(self.emu, self.clock, NS)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            controllers.reconcile_once(
                self.emu,
                NS,
                pods_ready=self.pods_ready,
                faults=self.faults,
                deadline_seconds=self.deadline_seconds,
                cronjobs=self.cronjobs,
            )
            svc = self.emu.find_object("v1", "Service", NAME, NS)
            if svc:
                pool = svc["spec"]["selector"].get(names.LABEL_TRAFFIC, "")
                self.samples.append(
                    (time.monotonic(), pool, len(set(controllers.ready_endpoint_ips(self.emu, NAME, NS))))
                )
            self.sample_inference_pool()
            await asyncio.sleep(0.05)  # not wait_for(stop.wait()): kopf cancels tasks spawned while it runs

    def sample_inference_pool(self) -> None:
        """Which pool the InferencePool selects now, and how many Ready pods that is (if the CRD is served)."""
        ipool = self.emu.find_object(INFERENCE_POOL_API, "InferencePool", NAME, NS)  # None without the CRD too
        if ipool:
            match = ipool["spec"]["selector"]["matchLabels"]
            pods = self.emu.list_objects("v1", "Pod", NS, label_selector=names.selector_string(match))
            self.pool_samples.append(
                (
                    time.monotonic(),
                    match.get(names.LABEL_TRAFFIC, ""),
                    sum(1 for p in pods if controllers.is_pod_ready(p)),
                )
            )

    # -- views --
    def rdd(self, name: str = NAME) -> dict[str, Any]:
        return self.emu.get_object(API_VERSION, KIND, name, NS)

    def status(self, name: str = NAME) -> dict[str, Any]:
        return self.rdd(name).get("status") or {}

    def condition(self, type_: str, name: str = NAME) -> dict[str, Any]:
        return next(c for c in self.status(name).get("conditions", []) if c["type"] == type_)

    def jobs(self) -> list[dict[str, Any]]:
        """Engine build Jobs (not other Jobs the operator may run, e.g. validation)."""
        return sorted(
            self.emu.list_objects("batch/v1", "Job", NS, label_selector=f"{names.LABEL_COMPONENT}=engine-build"),
            key=lambda j: j["metadata"]["name"],
        )

    def job_names(self) -> list[str]:
        return [j["metadata"]["name"] for j in self.jobs()]

    def running_jobs(self) -> list[str]:
        return [
            j["metadata"]["name"]
            for j in self.jobs()
            if not any(c.get("status") == "True" for c in (j.get("status") or {}).get("conditions") or [])
        ]

    def events(self) -> list[tuple[str, str, str]]:
        return [
            (e["reason"], e.get("type", ""), e.get("message", "")) for e in self.emu.list_objects("v1", "Event", NS)
        ]

    def deployment(self, variant: str, name: str = NAME) -> dict[str, Any] | None:
        return self.emu.find_object("apps/v1", "Deployment", names.serving_deployment_name(name, variant), NS)

    def operator_writes(self, since: int) -> list[Any]:
        return [r for r in self.emu.writes(since) if not r.user_agent.startswith("kubectl")]

    def complete_all(self) -> list[str]:
        done = self.running_jobs()
        for job in done:  # a build Pod reports what it built as engine_jobs' build does
            message = BUILT.message(f"OK: engine built by {job}") if "-build-" in job else '{"result": "ok"}'
            controllers.complete_job(self.emu, job, NS, message=message)
        return done


async def until(predicate: Callable[[], Any], timeout: float = 60, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def settle(cluster: Cluster, seconds: float = 1.0) -> None:
    """Wait until no write happened for ``seconds`` (the operator and the cluster are at rest)."""
    last, mark = time.monotonic(), len(cluster.emu.request_log)
    while time.monotonic() - last < seconds:
        await asyncio.sleep(0.1)
        now = len(cluster.emu.writes(mark))
        if now:
            mark, last = len(cluster.emu.request_log), time.monotonic()


def count_calls(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> Callable[[], int]:
    """Wrap ``owner.name`` (a function or classmethod) to count its calls from now on."""
    calls = [0]
    original = getattr(owner, name)

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, counting)
    return lambda: calls[0]


async def quiesce(cluster: Cluster, op: Operator, *names_: str) -> None:
    """A deterministic settle instead of a sleep: the operator's watch caught up with each named resource
    (default: the one), each reconciled once more from now, and the controller idle (nothing queued,
    reconciling or monitoring)."""
    ctl = op.controller
    assert ctl is not None
    keys = [(NS, n) for n in names_ or (NAME,)]

    def caught_up(key: tuple[str, str]) -> bool:
        seen = ctl.bodies.get(key)
        return (
            seen is not None
            and seen["metadata"]["resourceVersion"] == cluster.rdd(key[1])["metadata"]["resourceVersion"]
        )

    await until(lambda: all(caught_up(k) for k in keys), what="the operator's watch caught up")
    done = ctl.metrics.reconciles.labels("ok")._value.get()
    for key in keys:
        ctl.queue.add(key)
    await until(
        lambda: ctl.idle() and ctl.metrics.reconciles.labels("ok")._value.get() >= done + len(keys),
        what="the operator at rest",
    )


async def running(apiserver: EmulatorHandle, make: Callable[[EmulatorHandle], Any]) -> AsyncIterator[Any]:
    """The CRD installed and ``make(apiserver)``'s cluster loop running until the test ends (shared by fixtures)."""
    apiserver.emulator.create_object(
        yaml.safe_load((ROOT / "crds" / "redrafter.dev_redrafterdeployments.yaml").read_text())
    )
    # as a hardened cluster: the API server rejects Pods that do not meet the restricted profile
    apiserver.emulator.patch_object("v1", "Namespace", NS, None, {"metadata": {"labels": RESTRICTED}})
    c = make(apiserver)
    stop = asyncio.Event()
    task = asyncio.create_task(c.run(stop))
    try:
        yield c
    finally:
        stop.set()
        await task


@pytest.fixture
async def cluster(apiserver: EmulatorHandle) -> AsyncIterator[Cluster]:
    async for c in running(apiserver, Cluster):
        yield c


@pytest.fixture
async def operator(cluster: Cluster, kubeconfig: Path) -> AsyncIterator[Operator]:
    op = Operator(kubeconfig, resync=1.0)
    await op.start()
    try:
        yield op
    finally:
        await op.stop()


def apply(kubectl: Any, doc: dict[str, Any]) -> None:
    kubectl("apply", "-f", "-", input=yaml.safe_dump(doc), check=True)


async def to_serving(cluster: Cluster, name: str = NAME) -> None:
    await until(lambda: len(cluster.running_jobs()) >= 1, what="build Jobs")
    await until(lambda: cluster.status(name).get("phase") == "Building", what="phase Building")
    cluster.complete_all()
    await until(lambda: cluster.status(name).get("phase") == "Serving", what="phase Serving")


# ---------------------------------------------------------------------------------------------------------
async def test_apply_to_serving_with_conditions_events_and_printer_columns(
    cluster: Cluster, operator: Operator, kubectl: Any
) -> None:
    from redrafter_sim.apiserver import ApiError

    with pytest.raises(ApiError, match='violates PodSecurity "restricted:latest"'):  # the namespace enforces it
        cluster.emu.create_object(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "bare", "namespace": NS},
                "spec": {"containers": [{"name": "app", "image": "busybox:1.36"}]},
            }
        )
    kubectl("apply", "-f", str(EXAMPLE), check=True)
    await until(lambda: len(cluster.jobs()) == 2, what="two build Jobs")
    await until(lambda: cluster.status().get("phase") == "Building", what="Building")
    assert {j["metadata"]["labels"][names.LABEL_VARIANT] for j in cluster.jobs()} == {"redrafter", "base"}
    assert cluster.deployment("redrafter") is None  # nothing to serve before the engine exists
    assert cluster.condition("EnginesReady")["reason"] == "Building"

    # ReDrafter engine done => serving starts without waiting for the base engine
    redrafter_job = next(j for j in cluster.running_jobs() if "redrafter" in j)
    controllers.complete_job(cluster.emu, redrafter_job, NS, message=BUILT.message("OK: engine built"))
    await until(lambda: cluster.status().get("phase") == "Serving", what="Serving before base is built")
    assert cluster.condition("EnginesReady")["status"] == "False"
    cluster.complete_all()
    await until(lambda: cluster.condition("EnginesReady")["status"] == "True", what="EnginesReady")
    # spec.validation is on by default and nothing here completes the validation Job: the rollout is not
    # complete until the (ReDrafter, base) pair is validated (test_validation_gate.py plays the Job)
    await until(lambda: cluster.condition("Progressing")["reason"] == "Validating", what="Progressing Validating")
    # the build Pod's termination message (size, build time) may reach the watch after its Job's Complete
    await until(
        lambda: all("sizeBytes" in cluster.status()["engines"][v] for v in ("redrafter", "base")),
        what="both engines' sizes from their build Pods",
    )

    kubectl("wait", f"rdd/{NAME}", "--for=jsonpath={.status.phase}=Serving", "--timeout=20s", check=True)
    kubectl("wait", f"rdd/{NAME}", "--for=condition=Available", "--timeout=20s", check=True)
    st = cluster.status()
    assert st["activeEngine"] == "redrafter" and st["observedGeneration"] == 1
    assert st["serving"]["readyReplicas"] == 1 and st["serving"]["replicas"] == 1
    conditions = {c["type"]: c for c in st["conditions"]}
    lifecycle = {
        "SpecValid": "True",
        "EnginesReady": "True",
        "Available": "True",
        "Progressing": "True",
        "SpeculationHealthy": "Unknown",
    }
    assert {t: conditions[t]["status"] for t in lifecycle} == lifecycle  # (other components may add more)
    assert all(conditions[t]["observedGeneration"] == 1 and conditions[t]["lastTransitionTime"] for t in lifecycle)
    for variant in ("redrafter", "base"):
        assert st["engines"][variant]["state"] == "Ready" and st["engines"][variant]["attempts"] == 1
        assert (st["engines"][variant]["sizeBytes"], st["engines"][variant]["builtAt"]) == (
            BUILT.size_bytes,
            BUILT.built_at,
        )
    svc = cluster.emu.get_object("v1", "Service", NAME, NS)
    assert svc["spec"]["selector"][names.LABEL_TRAFFIC] == "redrafter"
    assert svc["metadata"]["ownerReferences"][0]["kind"] == KIND
    # spec.validation is on by default: the base engine stays at one replica until the (ReDrafter, base)
    # pair is validated (nothing runs the validation Job here, so it is still pending)
    await until(lambda: cluster.deployment("base")["spec"]["replicas"] == 1, what="base kept up for validation")
    assert conditions.get("Validated", {}).get("status") != "True"
    await until(
        lambda: {"BuildStarted", "EngineReady", "PhaseBuilding", "PhaseServing"} <= {r for r, _, _ in cluster.events()},
        what="transition Events",
    )
    # the scale subresource's selector picks the active pods
    pods = cluster.emu.list_objects("v1", "Pod", NS, label_selector=st["serving"]["selector"])
    assert len(pods) == 1

    (row,) = table_rows(kubectl("get", "rdd", check=True).stdout)
    assert list(row)[:5] == ["NAME", "PHASE", "ENGINE", "DRAFTER", "READY"]
    assert row["DRAFTER"] == ""  # a drafter from a source: nothing trains
    assert [row[c] for c in ("NAME", "PHASE", "ENGINE", "READY")] == [NAME, "Serving", "redrafter", "1"]

    # re-applying the same spec, and idling through several resync intervals => zero writes
    await settle(cluster)
    mark = len(cluster.emu.request_log)
    kubectl("apply", "-f", str(EXAMPLE), check=True)
    await quiesce(cluster, operator)
    assert cluster.operator_writes(mark) == []
    assert operator.controller is not None and operator.controller.metrics.reconciles.labels("ok")._value.get() > 3


async def test_invalid_spec_is_reported_not_raised(cluster: Cluster, operator: Operator, kubectl: Any) -> None:
    # accepted by the CRD schema, rejected by the operator's cross-field validation
    apply(kubectl, example(metrics={"source": "Prometheus"}))
    await until(lambda: cluster.status().get("phase") == "Failed", what="Failed")
    cond = cluster.condition("SpecValid")
    assert cond["status"] == "False" and cond["reason"] == "InvalidSpec"
    assert cond["message"] == "spec.metrics: prometheusUrl is required when source is Prometheus"
    assert cluster.jobs() == []
    await until(lambda: ("InvalidSpec", "Warning", cond["message"]) in cluster.events(), what="InvalidSpec Event")
    # fixing the spec recovers
    apply(kubectl, example(metrics={"source": "Pods"}))
    await until(lambda: len(cluster.jobs()) == 2, what="Jobs after the fix")
    await until(lambda: cluster.condition("SpecValid")["status"] == "True", what="SpecValid again")
    await until(lambda: any(r == "SpecValid" for r, _, _ in cluster.events()), what="SpecValid Event")


async def test_a_gpu_no_node_offers_waits_pending_until_such_a_node_registers(
    cluster: Cluster, kubeconfig: Path, kubectl: Any
) -> None:
    # no resync to speak of: only the Node watch can wake the resource when the node comes
    op = Operator(kubeconfig, resync=300.0)
    await op.start()
    try:
        apply(kubectl, example(engine__build__gpuProduct="NVIDIA-B200", parallelism__tensor=2))
        await until(lambda: cluster.status().get("engines"), what="first status")
        cond = await until(
            lambda: next((c for c in cluster.status().get("conditions", []) if c["type"] == "Schedulable"), None),
            what="Schedulable",
        )
        missing = (
            "no node offers 2× NVIDIA-B200; nodes: 1× NVIDIA-A100-SXM4-80GB (8 each), 1× NVIDIA-H100-80GB-HBM3 (8 each)"
        )
        assert (cond["status"], cond["reason"]) == ("False", "NoMatchingGPUNodes")
        assert cond["message"] == f"redrafter engine, base engine: {missing}"
        assert cluster.status()["phase"] == "Pending"
        assert cluster.jobs() == [] and cluster.emu.list_objects("v1", "Pod", NS) == []
        await until(lambda: any(r == "NoMatchingGPUNodes" for r, _, _ in cluster.events()), what="Warning Event")
        # a node that changes nothing placement reads (a heartbeat) wakes nothing; one Warning only
        await quiesce(cluster, op)
        cluster.emu.patch_object("v1", "Node", "gpu-a100-0", None, {"metadata": {"annotations": {"beat": "1"}}})
        await quiesce(cluster, op)
        assert [(r, t) for r, t, _ in cluster.events() if r == "NoMatchingGPUNodes"] == [
            ("NoMatchingGPUNodes", "Warning")
        ]
        assert cluster.jobs() == []

        cluster.emu.add_node("b200-0", "NVIDIA-B200", 8)
        await until(lambda: len(cluster.jobs()) == 2, what="build Jobs once a B200 node registered")
        assert all(
            j["spec"]["template"]["spec"]["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-B200"
            for j in cluster.jobs()
        )
        await until(lambda: cluster.condition("Schedulable")["status"] == "True", what="Schedulable True")
        assert cluster.condition("Schedulable")["message"].endswith("1 node(s) offer 2× NVIDIA-B200: b200-0")
        await until(lambda: cluster.status().get("phase") == "Building", what="phase Building")
        await until(lambda: any(r == "GPUNodesFound" for r, _, _ in cluster.events()), what="Normal Event")
    finally:
        await op.stop()


async def test_an_operator_that_may_not_list_nodes_runs_without_the_gpu_node_check(
    cluster: Cluster, kubeconfig: Path, kubectl: Any, caplog: pytest.LogCaptureFixture
) -> None:
    cluster.emu.inject("GET", r"^/api/v1/nodes$", 403, message='nodes is forbidden: User "x" cannot list nodes')
    op = Operator(kubeconfig, resync=300.0)
    await op.start()
    try:
        assert op.controller is not None and "rdd_nodes" not in op.controller.indexes
        assert (
            'GPU node check off: this operator may not list nodes (403: nodes is forbidden: User "x" cannot list'
            in caplog.text
        )
        apply(kubectl, example(engine__build__gpuProduct="NVIDIA-B200"))
        await until(lambda: len(cluster.jobs()) == 2, what="build Jobs, unchecked")
        assert "Schedulable" not in {c["type"] for c in cluster.status().get("conditions", [])}
    finally:
        await op.stop()


async def test_restart_at_each_stage_resumes_without_duplicate_jobs(cluster: Cluster, kubeconfig: Path) -> None:
    op = Operator(kubeconfig)
    await op.start()
    try:
        # validation off: nothing here plays the validation Job, and a rollout waiting on it is not Complete
        cluster.emu.create_object(example(validation__enabled=False))
        await until(lambda: len(cluster.jobs()) == 2 and cluster.status().get("phase") == "Building", what="Jobs")
        jobs = cluster.job_names()
        # 1. killed while building: restart => same Jobs, nothing recreated
        await op.stop()
        await op.start()
        await quiesce(cluster, op)
        assert cluster.job_names() == jobs
        # 2. killed; Jobs finish while it is down => resumes to Serving
        await op.stop()
        cluster.complete_all()
        await op.start()
        await until(lambda: cluster.status().get("phase") == "Serving", what="Serving after restart")
        # 3. killed while serving; restarted => nothing changes, same Jobs: the new process compares each
        # child it serves with the fields its field manager owns there, and sends nothing
        await settle(cluster)
        await op.stop()
        versions = {
            (o["kind"], o["metadata"]["name"]): o["metadata"]["resourceVersion"]
            for o in cluster.emu.iter_objects()
            if o["kind"] != "Event"
        }
        mark = len(cluster.emu.request_log)
        await op.start()
        await quiesce(cluster, op)
        assert cluster.operator_writes(mark) == []
        assert {
            (o["kind"], o["metadata"]["name"]): o["metadata"]["resourceVersion"]
            for o in cluster.emu.iter_objects()
            if o["kind"] != "Event"
        } == versions
        mark = len(cluster.emu.request_log)
        await quiesce(cluster, op)
        assert cluster.operator_writes(mark) == []
        assert cluster.job_names() == jobs
        # 4. killed in the middle of a spec change (new build started) => continues it
        patched = cluster.emu.patch_object(API_VERSION, KIND, NAME, NS, {"spec": {"redrafter": {"numBeams": 4}}})
        assert patched["metadata"]["generation"] == 2
        await until(lambda: len(cluster.jobs()) == 3, what="the new redrafter Job")
        await op.stop()
        await op.start()
        await quiesce(cluster, op)
        assert len(cluster.jobs()) == 3
        cluster.complete_all()
        await until(
            lambda: (
                cluster.status().get("observedGeneration") == 2
                and cluster.condition("Progressing")["reason"] == "Complete"
            ),
            what="new engine served",
        )
    finally:
        await op.stop()


async def test_conflicts_server_errors_and_dropped_watches_still_converge(cluster: Cluster, kubeconfig: Path) -> None:
    emu = cluster.emu
    emu.inject("PATCH", r"/redrafterdeployments/.*/status$", 409, times=3, message="the object has been modified")
    emu.inject("POST", r"/jobs$", 500, times=2)
    emu.inject("POST", r"/deployments$", 503, times=2)
    emu.inject("PATCH", r"/services/", 500, times=1)
    op = Operator(kubeconfig)
    await op.start()
    try:
        # (validation off: nothing here runs its Job, and the pair built at once would serve base until validated)
        emu.create_object(example(autoscaling__mode="Disabled", validation__enabled=False))
        await until(lambda: len(cluster.jobs()) == 2, what="Jobs despite 500s")
        assert emu.drop_watches(abort=True) > 0
        cluster.complete_all()
        await until(lambda: cluster.status().get("phase") == "Serving", what="Serving despite faults")
        emu.drop_watches()
        # a spec change after the watches were dropped is still seen
        emu.patch_object(API_VERSION, KIND, NAME, NS, {"spec": {"serving": {"replicas": 2}}})
        await until(
            lambda: (cluster.deployment("redrafter") or {}).get("spec", {}).get("replicas") == 2,
            what="scale after reconnect",
        )
        await until(lambda: cluster.status()["serving"]["readyReplicas"] == 2, what="2 Ready")
        assert len(cluster.jobs()) == 2
    finally:
        await op.stop()


async def building_redrafter_after_base(cluster: Cluster, kubectl: Any, retries: int) -> str:
    """Apply the example with ``retries``; complete the base build; the running ReDrafter build Job's name."""
    apply(kubectl, example(engine__build__retries=retries))
    await until(lambda: len(cluster.running_jobs()) == 2, what="Jobs")
    base_job = next(j for j in cluster.running_jobs() if "-base-" in j)
    controllers.complete_job(cluster.emu, base_job, NS)
    return next(j for j in cluster.running_jobs() if "redrafter" in j)


async def test_failed_job_reason_bounded_retries_then_retry_annotation(
    cluster: Cluster, operator: Operator, kubectl: Any
) -> None:
    first = await building_redrafter_after_base(cluster, kubectl, retries=1)
    controllers.fail_job(
        cluster.emu,
        first,
        NS,
        reason="BackoffLimitExceeded",
        exit_code=3,
        termination_message="BuildError: trtllm-build exited 1: CUDA out of memory",
    )
    await until(lambda: len(cluster.running_jobs()) == 1, what="retry Job")
    retry = cluster.running_jobs()[0]
    assert retry == first[: len(first)] + "-1"  # same name with the attempt suffix
    await until(lambda: cluster.condition("EnginesReady")["reason"] == "BuildRetrying", what="BuildRetrying")
    assert "CUDA out of memory" in cluster.status()["engines"]["redrafter"]["message"]
    controllers.fail_job(
        cluster.emu,
        retry,
        NS,
        reason="DeadlineExceeded",
        message="Job was active longer than specified deadline",
        termination_message="FetchError: hf://meta-llama/Meta-Llama-3-8B-Instruct: 401 Unauthorized",
    )
    await until(lambda: cluster.status().get("phase") == "Failed", what="Failed")
    st = cluster.status()
    engine = st["engines"]["redrafter"]
    assert engine["state"] == "Failed" and engine["attempts"] == 2 and engine["job"] == retry
    assert "DeadlineExceeded" in engine["message"] and "401 Unauthorized" in engine["message"]
    cond = cluster.condition("EnginesReady")
    assert cond["status"] == "False" and cond["reason"] == "BuildFailed" and "401 Unauthorized" in cond["message"]
    assert cluster.condition("Available")["reason"] == "EngineFailed"
    await until(
        lambda: (
            sum(1 for r, t, m in cluster.events() if r == "BuildFailed" and t == "Warning") == 2
            and any(r == "RetriesExhausted" for r, _, _ in cluster.events())
        ),
        what="failure Events",
    )
    assert any("401 Unauthorized" in m for r, _, m in cluster.events() if r == "BuildFailed")
    # no rebuild loop
    await settle(cluster)
    mark = len(cluster.emu.request_log)
    await quiesce(cluster, operator)
    assert cluster.operator_writes(mark) == [] and len(cluster.jobs()) == 3
    # the user retries with the annotation (any new value)
    kubectl("annotate", f"rdd/{NAME}", f"{names.ANNOTATION_RETRY_BUILD}=try-2", check=True)
    await until(lambda: len(cluster.running_jobs()) == 1, what="Job after the retry annotation")
    assert cluster.running_jobs()[0].endswith("-2")
    cluster.complete_all()
    await until(lambda: cluster.status().get("phase") == "Serving", what="Serving after retry")
    assert cluster.status()["engines"]["redrafter"]["state"] == "Ready"


async def test_bad_input_build_ends_after_one_job_and_status_says_how_to_retry(
    cluster: Cluster, operator: Operator, kubectl: Any
) -> None:
    first = await building_redrafter_after_base(cluster, kubectl, retries=2)
    # the emulated Job controller applies the rendered podFailurePolicy: exit code 2 is FailJob
    controllers.fail_job(
        cluster.emu, first, NS, exit_code=2, termination_message="BAD_INPUT: drafter config.json lacks exit_dim"
    )
    job = cluster.emu.get_object("batch/v1", "Job", first, NS)
    assert next(c for c in job["status"]["conditions"] if c["type"] == "Failed")["reason"] == "PodFailurePolicy"
    await until(lambda: cluster.status().get("phase") == "Failed", what="Failed")
    engine = cluster.status()["engines"]["redrafter"]
    assert engine["state"] == "Failed" and engine["attempts"] == 1 and engine["exitCode"] == 2
    assert engine["message"].startswith("exit code 2 (BAD_INPUT) cannot succeed on retry")
    assert f"kubectl annotate rdd {NAME} {names.ANNOTATION_RETRY_BUILD}=<new value> --overwrite" in engine["message"]
    assert "drafter config.json lacks exit_dim" in engine["message"]
    await until(
        lambda: any(r == "BuildNotRetried" and "exit code 2 (BAD_INPUT)" in m for r, _, m in cluster.events()),
        what="BuildNotRetried Event",
    )
    assert not any(r == "RetriesExhausted" for r, _, _ in cluster.events())
    # one Job, one pod, and no retry however long we wait
    await settle(cluster)
    mark = len(cluster.emu.request_log)
    await quiesce(cluster, operator)
    assert cluster.operator_writes(mark) == []
    redrafter_jobs = [j for j in cluster.jobs() if "-redrafter-" in j["metadata"]["name"]]
    assert [j["metadata"]["name"] for j in redrafter_jobs] == [first]
    assert len(cluster.emu.list_objects("v1", "Pod", NS, label_selector=f"job-name={first}")) == 1


async def test_build_input_change_rolls_to_new_engine_without_gap_and_serving_change_never_rebuilds(
    cluster: Cluster, operator: Operator, kubectl: Any
) -> None:
    # replicas from the spec, not the autoscaler; validation off (tests/integration/test_validation_gate.py
    # covers an engine change under validation: there the promoted engine serves until the new one passes)
    doc = example(autoscaling__mode="Disabled", validation__enabled=False)
    apply(kubectl, doc)
    await to_serving(cluster)
    old_key = cluster.status()["engines"]["redrafter"]["key"]
    base_key = cluster.status()["engines"]["base"]["key"]
    served_from = len(cluster.samples)

    changed = copy.deepcopy(doc)
    changed["spec"]["redrafter"]["numBeams"] = 4
    apply(kubectl, changed)
    await until(lambda: len(cluster.jobs()) == 3, what="one new Job (redrafter only: base inputs unchanged)")
    await until(lambda: cluster.status().get("observedGeneration") == 2, what="generation 2 observed")
    st = cluster.status()
    assert st["engines"]["redrafter"]["state"] == "Building" and st["engines"]["base"]["key"] == base_key
    assert st["phase"] == "Serving"  # still serving the previous engine meanwhile
    assert cluster.deployment("redrafter")["metadata"]["labels"][names.LABEL_ENGINE_KEY] == old_key
    cluster.complete_all()
    new_key = st["engines"]["redrafter"]["key"]
    await until(
        lambda: cluster.deployment("redrafter")["metadata"]["labels"][names.LABEL_ENGINE_KEY] == new_key,
        what="Deployment on the new engine",
    )
    await until(lambda: cluster.condition("Progressing")["reason"] == "Complete", what="rollout complete")
    assert cluster.status()["phase"] == "Serving"
    gaps = [s for s in cluster.samples[served_from:] if s[2] == 0]
    assert gaps == [], "the Service lost its Ready endpoints during the engine change"

    # serving-only change: Triton parameter + replicas => Deployments patched, no Job
    jobs = cluster.job_names()
    serving_change = copy.deepcopy(changed)
    serving_change["spec"]["serving"]["triton"] = {"maxQueueDelayMicroseconds": 500}
    serving_change["spec"]["serving"]["replicas"] = 2
    apply(kubectl, serving_change)
    await until(lambda: cluster.deployment("redrafter")["spec"]["replicas"] == 2, what="replicas patched")
    await until(lambda: cluster.status()["serving"]["readyReplicas"] == 2, what="2 Ready")
    assert cluster.job_names() == jobs
    assert cluster.status()["observedGeneration"] == 3


async def test_policy_seam_switches_blue_green_without_gap(cluster: Cluster, kubeconfig: Path) -> None:
    operator = Operator(kubeconfig, resync=1.0, policy=False)
    await operator.start()
    try:
        await _switch_blue_green(cluster, operator)
    finally:
        await operator.stop()


async def _switch_blue_green(cluster: Cluster, operator: Operator) -> None:
    cluster.emu.create_object(example(validation__enabled=False))  # the seam itself, no gate in between
    await to_serving(cluster)
    await until(lambda: cluster.condition("EnginesReady")["status"] == "True", what="both engines")
    start = len(cluster.samples)
    assert operator.controller is not None
    operator.controller.set_targets(NS, NAME, ServingTargets(active="base", replicas={"base": 2, "redrafter": 0}))
    await until(lambda: cluster.status().get("activeEngine") == "base", what="Service on base")
    await until(lambda: cluster.deployment("redrafter")["spec"]["replicas"] == 0, what="redrafter scaled down")
    await until(lambda: cluster.condition("Progressing")["reason"] == "Complete", what="switch complete")
    samples = cluster.samples[start:]
    assert [s for s in samples if s[2] == 0] == [], "the Service lost its Ready endpoints during the switch"
    # the Service moved only after base was up (first base-pool sample already has 2 Ready endpoints)
    first_base = next(s for s in samples if s[1] == "base")
    assert first_base[2] == 2
    await until(
        lambda: ("Switched", "Normal", "Service now selects the base engine (was redrafter)") in cluster.events(),
        what="Switched Event",
    )


def routed(**spec: Any) -> dict[str, Any]:
    return example(
        routing__inferencePool={"enabled": True, "endpointPickerRef": {"name": "llama3-8b-epp", "port": 9002}}, **spec
    )


async def test_inference_pool_follows_every_switch_blue_green(cluster: Cluster, kubeconfig: Path, kubectl: Any) -> None:
    """The upstream v1 CRD installed: the pool is created with the Service, follows it to base and back, never
    selects a pool without Ready pods, and is deleted when the feature is turned off."""
    cluster.emu.create_object(yaml.safe_load(INFERENCE_POOL_CRD.read_text()))
    operator = Operator(kubeconfig, resync=1.0, policy=False)  # switches driven through the policy's seam
    await operator.start()
    try:
        doc = routed(validation__enabled=False, autoscaling__mode="Disabled")
        apply(kubectl, doc)
        await to_serving(cluster)
        await until(lambda: cluster.condition("InferencePoolReady")["status"] == "True", what="pool Ready")
        for target, other in (("base", "redrafter"), ("redrafter", "base")):
            start = len(cluster.pool_samples)
            assert operator.controller is not None
            operator.controller.set_targets(NS, NAME, ServingTargets(active=target, replicas={target: 2, other: 0}))
            await until(lambda: cluster.status().get("activeEngine") == target, what=f"Service on {target}")
            await until(lambda: cluster.deployment(other)["spec"]["replicas"] == 0, what=f"{other} scaled down")
            await until(lambda: cluster.condition("Progressing")["reason"] == "Complete", what="switch complete")
            await until(lambda: cluster.condition("InferencePoolReady")["status"] == "True", what="pool Ready")
            await until(lambda: cluster.pool_samples[-1][1] == target, what="a sample of the pool on the target")
            samples = cluster.pool_samples[start:]
            assert [s for s in samples if s[2] == 0] == [], f"the InferencePool selected no Ready pod: {samples}"
            assert samples[0][1] == other and samples[-1][1] == target  # it moved, within this switch
            # it moved only once the target was up (its first sample on the target already has 2 Ready pods)
            assert next(s for s in samples if s[1] == target)[2] == 2
            pool = cluster.emu.get_object(INFERENCE_POOL_API, "InferencePool", NAME, NS)
            svc = cluster.emu.get_object("v1", "Service", NAME, NS)
            assert pool["spec"]["selector"]["matchLabels"] == svc["spec"]["selector"]
            assert pool["spec"]["targetPorts"] == [{"number": 9000}]
            assert pool["metadata"]["ownerReferences"][0]["uid"] == cluster.rdd()["metadata"]["uid"]
        assert cluster.condition("InferencePoolReady")["reason"] == "Selecting"

        # a deleted pool is seen (the watch-fed index) and recreated
        cluster.emu.delete_object(INFERENCE_POOL_API, "InferencePool", NAME, NS)
        await until(
            lambda: cluster.emu.find_object(INFERENCE_POOL_API, "InferencePool", NAME, NS), what="pool recreated"
        )

        off = copy.deepcopy(doc)
        off["spec"]["routing"]["inferencePool"]["enabled"] = False
        apply(kubectl, off)
        await until(
            lambda: cluster.emu.find_object(INFERENCE_POOL_API, "InferencePool", NAME, NS) is None,
            what="pool deleted once turned off",
        )
        await until(
            lambda: all(c["type"] != "InferencePoolReady" for c in cluster.status().get("conditions", [])),
            what="condition removed",
        )
    finally:
        await operator.stop()


async def test_inference_pool_without_its_crd_is_a_clear_status_error_until_the_crd_is_installed(
    cluster: Cluster, operator: Operator, kubectl: Any
) -> None:
    apply(kubectl, routed(validation__enabled=False))
    await to_serving(cluster)  # the Service serves regardless
    await until(lambda: cluster.condition("InferencePoolReady")["reason"] == "CRDNotInstalled", what="CRD missing")
    cond = cluster.condition("InferencePoolReady")
    assert cond["status"] == "False" and "inferencepools.inference.networking.k8s.io" in cond["message"]
    await until(lambda: [e for e in cluster.events() if e[0] == "InferencePoolCRDMissing"], what="Warning Event")
    assert [e[1] for e in cluster.events() if e[0] == "InferencePoolCRDMissing"] == ["Warning"]
    # once installed, the next reconcile creates the pool and kopf starts watching it
    cluster.emu.create_object(yaml.safe_load(INFERENCE_POOL_CRD.read_text()))
    await until(lambda: cluster.condition("InferencePoolReady")["status"] == "True", what="pool Ready after install")
