"""Convergence of the operator's children and its cost at rest (split from test_lifecycle.py; being ported)."""

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
# ---------------------------------------------------------------------------------------------------------
async def test_two_resources_sharing_a_cache_build_once(cluster: Cluster, operator: Operator, kubectl: Any) -> None:
    apply(kubectl, example("svc-a"))
    apply(kubectl, example("svc-b"))
    await until(lambda: len(cluster.jobs()) >= 2, what="Jobs")
    await quiesce(cluster, operator, "svc-a", "svc-b")
    assert len(cluster.jobs()) == 2, cluster.job_names()  # one per engine, not per resource
    cluster.complete_all()
    for name in ("svc-a", "svc-b"):
        await until(lambda: cluster.status(name).get("phase") == "Serving", what=f"{name} Serving")
        await until(
            lambda: all(e["state"] in ("Ready", "Cached") for e in cluster.status(name)["engines"].values()),
            what=f"{name} engines",
        )
    # a third resource arriving after the builds reuses the cache too
    apply(kubectl, example("svc-c"))
    await until(lambda: cluster.status("svc-c").get("phase") == "Serving", what="svc-c Serving")
    assert len(cluster.jobs()) == 2
    assert {e["state"] for e in cluster.status("svc-c")["engines"].values()} == {"Cached"}
    assert {e["sizeBytes"] for e in cluster.status("svc-c")["engines"].values()} == {BUILT.size_bytes}
    # deleting the resource that owns the Jobs does not rebuild for the others (status keeps the facts)
    kubectl("delete", "rdd", "svc-a", "--wait=false", check=True)
    await until(lambda: cluster.emu.find_object(API_VERSION, KIND, "svc-a", NS) is None, what="svc-a gone")
    await until(lambda: (NS, "svc-a") not in operator.controller.bodies, what="svc-a's deletion watched")
    await quiesce(cluster, operator, "svc-b", "svc-c")
    assert cluster.running_jobs() == []  # svc-a's Jobs went with it; nothing rebuilds for b and c
    for name in ("svc-b", "svc-c"):
        assert cluster.status(name)["phase"] == "Serving"


async def idle_after_settling(cluster: Cluster, op: Operator) -> None:
    """Children in sync again: once the cluster is at rest, a reconcile writes nothing."""
    await settle(cluster)
    mark = len(cluster.emu.request_log)
    await quiesce(cluster, op)
    assert cluster.operator_writes(mark) == [], "in sync again: idle"


async def test_children_converge_deleted_edited_and_removed_fields(
    cluster: Cluster, kubeconfig: Path, kubectl: Any
) -> None:
    """Server-side apply with drift repair, measured as a user sees it through kubectl. The resync interval
    is 300 s: every repair below is driven by the child's own watch event."""
    op = Operator(kubeconfig)
    await op.start()
    try:
        apply(kubectl, example(serving__nodeSelector={"pool": "gpu-a"}, validation__enabled=False))
        await to_serving(cluster)
        dep_name = names.serving_deployment_name(NAME, "redrafter")

        def selector() -> dict[str, str]:
            return (cluster.deployment("redrafter") or {}).get("spec", {}).get("template", {}).get("spec", {}).get(
                "nodeSelector"
            ) or {}

        assert selector()["pool"] == "gpu-a"
        owners = {e["manager"]: e["operation"] for e in cluster.deployment("redrafter")["metadata"]["managedFields"]}
        assert owners[names.MANAGED_BY] == "Apply"
        await settle(cluster)

        # 1. deleted: back within 5 s (a new object: another uid)
        uid = cluster.deployment("redrafter")["metadata"]["uid"]
        started = time.monotonic()
        kubectl("delete", "deployment", dep_name, "--wait=false", check=True)
        await until(
            lambda: (cluster.deployment("redrafter") or {}).get("metadata", {}).get("uid") not in (None, uid),
            timeout=10,
            what="the deleted Deployment back",
        )
        back_after = time.monotonic() - started
        print(f"deleted Deployment back after {back_after:.2f} s")
        assert back_after < 5.0
        assert selector()["pool"] == "gpu-a"
        await settle(cluster)

        # 2. a hand edit of a field the operator owns: reverted by the reconcile the edit's event starts
        assert op.controller is not None
        reconciles = op.controller.metrics.reconciles.labels("ok")
        applier = op.controller.applier
        ensure = applier.ensure
        done_at_revert: list[float] = []  # reconciles completed when the reverting apply was sent

        async def recording(manifest: dict[str, Any]) -> bool:
            sent = await ensure(manifest)
            if sent and manifest["kind"] == "Deployment" and manifest["metadata"]["name"] == dep_name:
                done_at_revert.append(reconciles._value.get())
            return sent

        applier.ensure = recording  # type: ignore[method-assign]
        before = reconciles._value.get()
        kubectl(
            "patch",
            "deployment",
            dep_name,
            "--type=merge",
            "-p",
            json.dumps({"spec": {"template": {"spec": {"nodeSelector": {"pool": "hijacked"}}}}}),
            check=True,
        )
        edited = time.monotonic()
        await until(lambda: selector().get("pool") == "gpu-a", timeout=10, what="the hand edit reverted")
        applier.ensure = ensure  # type: ignore[method-assign]
        # at most one reconcile may have been running already when the edit arrived; the next one reverted it
        # (the serving Pods' events start more reconciles afterwards: they are not counted). Where that running
        # reconcile's apply was already on its way, it landed after the edit and reverted it: no apply was sent
        # through the recorder, and no reconcile completed in between.
        completed = (done_at_revert[0] if done_at_revert else reconciles._value.get()) - before
        print(f"hand edit reverted after {time.monotonic() - edited:.2f} s, {completed:.0f} reconcile(s) before it")
        assert completed <= 1 if done_at_revert else completed <= 2
        await settle(cluster)

        # 3. spec.serving.nodeSelector removed from the resource: gone from the Deployment
        apply(kubectl, example(validation__enabled=False))
        await until(lambda: "pool" not in selector(), timeout=10, what="the removed nodeSelector gone")
        await idle_after_settling(cluster, op)
    finally:
        await op.stop()


async def test_network_policies_converge_like_every_child(cluster: Cluster, kubeconfig: Path, kubectl: Any) -> None:
    """NetworkPolicies are server-side applied too: a deleted one is back at once, a hand edit of a field the
    operator owns is reverted, driven by their own watch events (the resync interval is 300 s)."""
    op = Operator(kubeconfig)
    await op.start()
    try:
        apply(kubectl, example(serving__networkPolicy={"enabled": True}, validation__enabled=False))
        await to_serving(cluster)
        np_name = names.safe_name(NAME, "serving")

        def policy() -> dict[str, Any]:
            return cluster.emu.find_object("networking.k8s.io/v1", "NetworkPolicy", np_name, NS) or {}

        wanted = policy()["spec"]
        assert {e["manager"]: e["operation"] for e in policy()["metadata"]["managedFields"]}[
            names.MANAGED_BY
        ] == "Apply"
        await settle(cluster)

        uid = policy()["metadata"]["uid"]
        started = time.monotonic()
        kubectl("delete", "networkpolicy", np_name, "-n", NS, "--wait=false", check=True)
        await until(
            lambda: policy().get("metadata", {}).get("uid") not in (None, uid),
            timeout=10,
            what="the deleted NetworkPolicy back",
        )
        print(f"deleted NetworkPolicy back after {time.monotonic() - started:.2f} s")
        assert time.monotonic() - started < 5.0 and policy()["spec"] == wanted
        await settle(cluster)

        kubectl(
            "patch",
            "networkpolicy",
            np_name,
            "-n",
            NS,
            "--type=merge",
            "-p",
            json.dumps({"spec": {"ingress": [{}]}}),
            check=True,
        )  # allow everything: a hole, reverted
        await until(lambda: policy().get("spec") == wanted, timeout=10, what="the hand edit reverted")
        await idle_after_settling(cluster, op)
    finally:
        await op.stop()


async def test_validated_resources_at_rest_cost_only_watches_over_five_minutes(
    cluster: Cluster, kubeconfig: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Several resources built, validated (the validation Job's pod leaves the verdict a passing `evaluate
    validate` writes) and serving ReDrafter. At rest, five minutes on the operator's clock (a fake one: no
    waiting) with a resync every 30 s and the policy evaluating each resource every second cost no request
    but the watches: no status or child write, no Job GET, no Pod LIST."""
    from redrafter_operator.evaluate import outcome as oc
    from redrafter_sim.clock import FakeClock

    passed = oc.format_termination_message(
        oc.ValidationOutcome(oc.PASSED, "12 requests per engine (chat): 12 greedy outputs identical, no errors")
    )
    names_ = [f"idle-{i}" for i in range(3)]
    clock = FakeClock(epoch=time.time())
    op = Operator(kubeconfig, resync=30.0, clock=clock)
    await op.start()
    ctl = op.controller
    assert ctl is not None
    stop = asyncio.Event()

    async def background() -> None:  # the Job controller (every build and validation Job succeeds); time moves
        while not stop.is_set():
            for job in cluster.emu.list_objects("batch/v1", "Job", NS):
                component = job["metadata"]["labels"].get(names.LABEL_COMPONENT)
                if component in ("engine-build", "validation") and not (job.get("status") or {}).get("conditions"):
                    controllers.complete_job(
                        cluster.emu,
                        job["metadata"]["name"],
                        NS,
                        message=(passed if component == "validation" else BUILT.message("OK: engine built")),
                    )
            await clock.advance(1.0)
            await asyncio.sleep(0.02)

    helper = asyncio.create_task(background())
    try:
        for name in names_:
            cluster.emu.create_object(example(name, speculation__interval="1s"))

        def at_rest(name: str) -> bool:
            st = cluster.status(name)
            conds = {c["type"]: c for c in st.get("conditions") or []}
            return (
                st.get("phase") == "Serving"
                and st.get("activeEngine") == "redrafter"
                and conds.get("Validated", {}).get("status") == "True"
                and conds.get("Progressing", {}).get("reason") == "Complete"  # base scaled down
                and (st.get("policy") or {}).get("serving") == "redrafter"
            )

        await until(lambda: all(at_rest(n) for n in names_), timeout=90, what="validated, serving ReDrafter")
        stop.set()
        await helper
        await until(ctl.idle, what="the operator at rest")
        await settle(cluster)
        mark = len(cluster.emu.request_log)
        reconciles = ctl.metrics.reconciles.labels("ok")._value.get()
        runs = sum(
            s.value
            for m in ctl.metrics.speculation_evaluations.collect()
            for s in m.samples
            if s.name.endswith("_total")
        )
        parses = count_calls(monkeypatch, ReDrafterDeploymentSpec, "model_validate")
        keys = [count_calls(monkeypatch, m, "engine_key") for m in (api_engine_key, engines, cache_refs)]
        for _ in range(300):  # five minutes: 10 resyncs of each resource, 300 policy evaluations of each
            await clock.advance(1.0)
            await until(ctl.idle, what="the operator at rest")
        # work done once: an unchanged spec is parsed and keyed once, not per reconcile or monitor run
        assert (parses(), [k() for k in keys]) == (0, [0, 0, 0])
        retention = ctl.metrics.monitor_runs.labels("RetentionMonitor")._value.get()
        assert retention >= 5  # every minute, over every resource
        requests = cluster.emu.requests(mark)
        assert [(r.method, r.path) for r in requests if r.kind != "watch"] == [], "at rest: only watches"
        assert cluster.emu.requests(0, method="PATCH", path=r"/status$"), "the log sees the operator's writes"
        assert ctl.metrics.reconciles.labels("ok")._value.get() - reconciles >= 10 * len(names_)
        assert sum(
            s.value
            for m in ctl.metrics.speculation_evaluations.collect()
            for s in m.samples
            if s.name.endswith("_total")
        ) - runs >= 250 * len(names_)
    finally:
        stop.set()
        await helper
        await op.stop()


async def test_events_name_this_operator_and_its_pod(
    cluster: Cluster, kubeconfig: Path, kubectl: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POD_NAME", "redrafter-operator-7d9f-abcde")  # the chart's downward API
    op = Operator(kubeconfig)
    await op.start()
    try:
        apply(kubectl, example())
        await until(lambda: any(r == "BuildStarted" for r, _, _ in cluster.events()), what="an Event")
    finally:
        await op.stop()
    ours = [e for e in cluster.emu.list_objects("v1", "Event", NS) if e["involvedObject"].get("kind") == KIND]
    assert ours and {(e["reportingComponent"], e["reportingInstance"], e["source"]["component"]) for e in ours} == {
        ("redrafter-operator", "redrafter-operator-7d9f-abcde", "redrafter-operator")
    }
    assert all(e["metadata"]["name"].startswith("redrafter-operator-") for e in ours)
    listed = json.loads(kubectl("get", "events.v1.events.k8s.io", "-n", NS, "-o", "json", check=True).stdout)
    assert {e["reportingController"] for e in listed["items"] if e["regarding"].get("kind") == KIND} == {
        "redrafter-operator"
    }


async def test_deletion_is_never_blocked_and_children_are_collected(
    cluster: Cluster, operator: Operator, kubectl: Any
) -> None:
    apply(kubectl, example())
    await to_serving(cluster)
    assert "finalizers" not in cluster.rdd()["metadata"] or not cluster.rdd()["metadata"]["finalizers"]
    kubectl("delete", "rdd", NAME, "--timeout=20s", check=True)
    await until(lambda: cluster.deployment("redrafter") is None, what="Deployments garbage-collected")
    assert cluster.emu.find_object("v1", "Service", NAME, NS) is None
    assert operator.controller is not None
    await until(lambda: (NS, NAME) not in operator.controller.bodies, what="the operator forgot the resource")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_run_command_serves_metrics_and_liveness(cluster: Cluster, kubeconfig: Path, kubectl: Any) -> None:
    """`redrafter-operator run` as a process: JSON logs, /metrics, kopf's liveness probe, clean SIGTERM."""
    import os
    import signal
    import subprocess
    import sys
    import urllib.request

    metrics_port, health_port = _free_port(), _free_port()
    exe = Path(sys.executable).parent / "redrafter-operator"
    proc = subprocess.Popen(
        [
            str(exe),
            "run",
            "--kubeconfig",
            str(kubeconfig),
            "--namespace",
            NS,
            "--standalone",
            f"--liveness=http://127.0.0.1:{health_port}/healthz",
            f"--metrics-port={metrics_port}",
            "--log-format=json",
            "--log-level=INFO",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ},
    )
    try:
        kubectl("apply", "-f", str(EXAMPLE), check=True)
        await until(
            lambda: len(cluster.jobs()) == 2 and cluster.status().get("phase") == "Building",
            what="the process to start the builds",
        )

        def get(url: str) -> tuple[int, str]:
            with urllib.request.urlopen(url, timeout=5) as resp:
                return resp.status, resp.read().decode()

        status, text = await asyncio.to_thread(get, f"http://127.0.0.1:{metrics_port}/metrics")
        assert status == 200
        assert 'redrafter_operator_engine_builds_total{result="started",variant="redrafter"} 1.0' in text
        assert 'redrafter_operator_resource_phase{name="llama3-8b",namespace="default",phase="Building"} 1.0' in text
        assert 'redrafter_operator_reconciles_total{result="ok"}' in text
        status, _ = await asyncio.to_thread(get, f"http://127.0.0.1:{health_port}/healthz")
        assert status == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = await asyncio.to_thread(proc.communicate, timeout=30)
    assert proc.returncode == 0, out[-2000:]
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert any("BuildStarted" in (rec.get("message") or "") for rec in lines), out[-2000:]
