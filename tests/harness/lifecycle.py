"""The lifecycle tests' cluster: the real control plane, two simulated GPU nodes whose pods the test drives, and a
request log of everything the operator sends.

* **Pods are held** (:class:`HeldPods`): the nodes run no process. A Job's pod goes Running and stays so until the
  test gives its Job a verdict (:meth:`Cluster.complete_job`, :meth:`Cluster.fail_job`): the exit code and the
  termination message a build, training or validation program would have written. The real Job controller then
  applies the Job's backoffLimit and podFailurePolicy. A Deployment's pod goes Running and Ready, or not Ready
  (:meth:`Cluster.set_pods_ready`), or fails as the kubelet reports a fault (:meth:`Cluster.set_fault`).
* **The operator talks through a proxy** (:class:`~redrafter_sim.faultproxy.FaultProxy`) under the chart's
  ServiceAccount and RBAC: the proxy's log is what the operator sent (writes counted by :meth:`Cluster.operator_writes`),
  and it injects API errors and cuts watches.
* **Traffic is sampled** from the API: which pool the Service selects and how many Ready pods that is, so a test
  can assert that no switch left the Service without Ready pods.

Everything else is Kubernetes': the scheduler binds the pods, the Job, ReplicaSet, Deployment, CronJob and garbage
collector controllers do the rest, and kube-apiserver validates and admits (Pod Security ``restricted`` enforced
on the test's namespace).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import urllib.error
import urllib.parse
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from engine_jobs.contract import BuildResult
from redrafter_operator.api import API_VERSION, KIND
from redrafter_operator.controller.reconciler import Controller
from redrafter_operator.render import names
from redrafter_sim import failures, nodes, objects
from redrafter_sim.controlplane import ControlPlane
from redrafter_sim.faultproxy import FaultProxy, Request
from redrafter_sim.kwokstages import Report
from redrafter_sim.node import SimNode

from .cluster import ROOT, Kube, new_namespace
from .operator import InProcessOperator, chart_identity
from .waiting import until

EXAMPLE = ROOT / "examples" / "llama3-8b.yaml"
NAME = "llama3-8b"
BUILT = BuildResult(size_bytes=17_179_869_184, built_at="2026-12-01T10:00:00Z")  # what build Pods report
RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}
INFERENCE_POOL_CRD = ROOT / "tests" / "fixtures" / "crds" / "inference.networking.k8s.io_inferencepools.yaml"
INFERENCE_POOL_API = "inference.networking.k8s.io/v1"
#: the example's prerequisites: the engine cache and the drafter's claim, the Hugging Face token
CLAIMS = ("engine-cache", "drafters", "models")
HF_SECRET = "hf-token"
CLUSTER_SCOPED = {
    "Node",
    "PersistentVolume",
    "Namespace",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
    "PriorityClass",
    "StorageClass",
}
#: kinds whose objects the operator writes: at rest, none of them changes
OPERATOR_KINDS = (
    (API_VERSION, KIND),
    ("apps/v1", "Deployment"),
    ("batch/v1", "Job"),
    ("batch/v1", "CronJob"),
    ("v1", "Service"),
    ("v1", "ConfigMap"),
    ("networking.k8s.io/v1", "NetworkPolicy"),
    ("policy/v1", "PodDisruptionBudget"),
)


def example(name: str = NAME, **spec: Any) -> dict[str, Any]:
    """``examples/llama3-8b.yaml`` named ``name``, with ``a__b=value`` setting ``spec.a.b`` (no namespace: the
    test's)."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"] = {"name": name}
    for dotted, value in spec.items():
        node = doc["spec"]
        *parents, leaf = dotted.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return doc


def routed(**spec: Any) -> dict[str, Any]:
    """The example with the Gateway API InferencePool turned on."""
    return example(
        routing__inferencePool={"enabled": True, "endpointPickerRef": {"name": "llama3-8b-epp", "port": 9002}}, **spec
    )


def table_rows(text: str) -> list[dict[str, str]]:
    """``kubectl get``'s table as one dict per row, cut at the header's column offsets (a column a row has
    no value for prints blank, so splitting on whitespace would shift the cells after it)."""
    header, *lines = text.splitlines()
    starts = [(m.start(), m.group()) for m in re.finditer(r"\S+", header)]
    bounds = [*(start for start, _ in starts[1:]), None]
    return [{name: line[start:end].strip() for (start, name), end in zip(starts, bounds)} for line in lines]


def count_calls(monkeypatch: Any, owner: Any, name: str) -> Callable[[], int]:
    """Wrap ``owner.name`` (a function or classmethod) to count its calls from now on."""
    calls = [0]
    original = getattr(owner, name)

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, counting)
    return lambda: calls[0]


def contained(rendered: Any, stored: Any) -> bool:
    """Every field the render sets is set so on the stored object (the API server adds defaults and status)."""
    if isinstance(rendered, dict):
        return isinstance(stored, dict) and all(contained(v, stored.get(k)) for k, v in rendered.items())
    if isinstance(rendered, list):
        return isinstance(stored, list) and len(rendered) == len(stored) and all(map(contained, rendered, stored))
    return rendered == stored


def plural(kind: str) -> str:
    lower = kind.lower()
    if lower.endswith("y"):
        return lower[:-1] + "ies"
    return lower + ("es" if lower.endswith("s") else "s")


def api_path(api_version: str, kind: str, namespace: str | None, name: str | None = None) -> str:
    """The REST path of a kind (``name``: of one object), as kubectl's RESTMapper finds it for the kinds here."""
    root = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    scope = "" if kind in CLUSTER_SCOPED or namespace is None else f"/namespaces/{namespace}"
    return f"{root}{scope}/{plural(kind)}" + (f"/{name}" if name else "")


def is_ready(pod: dict[str, Any]) -> bool:
    return objects.condition_true(pod, "Ready") and not pod["metadata"].get("deletionTimestamp")


def deployment_of(pod: dict[str, Any]) -> str:
    """The Deployment a ReplicaSet's pod belongs to (``<deployment>-<template hash>-<suffix>``)."""
    return pod["metadata"].get("generateName", "").rstrip("-").rsplit("-", 1)[0]


@dataclass
class HeldPods:
    """The nodes' pod stages (:class:`redrafter_sim.kwokstages.Stages`): pods run nothing; the test decides."""

    ready: bool = True  # Deployments' pods Ready
    faults: dict[str, failures.Fault] = field(default_factory=dict)  # by Deployment: what the kubelet reports
    verdicts: dict[str, tuple[int, str]] = field(default_factory=dict)  # by Job: (exit code, termination message)
    init_messages: dict[str, str] = field(default_factory=dict)  # by Job: its init containers' termination message
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    def changed(self) -> None:
        """Wake every held pod to report again (a verdict, readiness or a fault changed)."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def run(self, pod: dict[str, Any], report: Report) -> None:
        meta, first = pod["metadata"], pod["spec"]["containers"][0]
        ip, started = objects.pod_ip(meta["uid"]), objects.now()
        job = (meta.get("labels") or {}).get("job-name")
        last: Any = None
        while True:
            wake = self._changed
            if job is None:
                fault = self.faults.get(deployment_of(pod))
                if fault is not None:
                    status = failures.pod_status(pod, fault, host_ip=objects.HOST_IP, pod_ip=ip)
                    key: Any = ("fault", fault)
                else:
                    status = objects.running_status(first["name"], ip, started, self.ready, 0, first.get("image", ""))
                    key = ("running", self.ready)
            elif job in self.verdicts:
                code, message = self.verdicts[job]
                status = objects.terminated_status(first["name"], ip, started, code, message, first.get("image", ""))
                await report(pod, _all_containers(pod, status, self.init_messages.get(job, "")))
                return
            else:
                status = objects.running_status(first["name"], ip, started, False, 0, first.get("image", ""))
                key = ("running", False)
            if key != last:
                await report(pod, _all_containers(pod, status, self.init_messages.get(job or "", "")))
                last = key
            await wake.wait()


def _all_containers(pod: dict[str, Any], status: dict[str, Any], init_message: str = "") -> dict[str, Any]:
    """The first container's status repeated for each container (the kubelet reports every one), with addresses;
    init containers, where the pod has any, terminated 0 with ``init_message`` (they ran before the others)."""
    if "podIP" in status:
        status = {**status, "podIPs": [{"ip": status["podIP"]}]}
    (first, *_) = status.get("containerStatuses") or [None]
    if first is None:
        return status
    inits = pod["spec"].get("initContainers") or []
    if inits:
        at = status.get("startTime")
        ran = {"exitCode": 0, "reason": "Completed", "message": init_message, "startedAt": at, "finishedAt": at}
        status["initContainerStatuses"] = [
            {**first, "name": c["name"], "image": c.get("image", ""), "ready": True, "state": {"terminated": ran}}
            for c in inits
        ]
    containers = pod["spec"]["containers"]
    status["containerStatuses"] = [
        {**first, "name": c["name"], "image": c.get("image", ""), "state": _replacing(first["state"])}
        if i == 0
        else {**first, "name": c["name"], "image": c.get("image", ""), "state": _replacing(_quiet(first["state"]))}
        for i, c in enumerate(containers)
    ]
    return status


def _replacing(state: dict[str, Any]) -> dict[str, Any]:
    """The state with the others nulled: the strategic merge patch replaces the previous state (waiting after a
    fault, running once it clears), as the kubelet's patch does; merged, the API server refuses two states."""
    return {**dict.fromkeys(("waiting", "running", "terminated")), **state}


def _quiet(state: dict[str, Any]) -> dict[str, Any]:
    """A sidecar's state: the first container's, without its termination message."""
    if "terminated" in state:
        return {"terminated": {**state["terminated"], "message": ""}}
    return state


class LifecycleOperator(InProcessOperator):
    """The operator in a task of the test's loop, watching the test's namespace under the chart's identity through
    the proxy; ``policy=False`` drives ServingTargets from the test instead of the speculation policy."""

    def __init__(
        self, cluster: Cluster, resync: float = 300.0, policy: bool = True, clock: Any = None, **options: Any
    ) -> None:
        def keep(c: Controller) -> None:
            if not policy:
                c.monitors.clear()

        super().__init__(
            cluster.operator_kubeconfig,
            [cluster.ns],
            resync=resync,
            clock=clock,
            on_controller=keep,
            **{"workers": 4, **options},
        )
        self.cluster = cluster

    async def stop(self) -> None:
        """Stop it; then give the nodes back the pods kopf cancelled (see :meth:`Cluster.resume_pods`)."""
        await super().stop()
        await self.cluster.resume_pods()


class Cluster:
    """One test's namespace on the shared control plane, the GPU nodes, the proxy and the traffic sampler."""

    def __init__(self, cp: ControlPlane, workdir: Path) -> None:
        self.cp = cp
        self.workdir = workdir
        self.kube: Kube = None  # type: ignore[assignment]  # set by start()
        self.pods = HeldPods()
        self.nodes: dict[str, SimNode] = {}
        self.proxy = FaultProxy(cp)
        self.operator_kubeconfig = workdir / "operator.kubeconfig"
        self.samples: list[tuple[float, str, int]] = []  # (time, Service's traffic pool, its Ready pods)
        self.pool_samples: list[tuple[float, str, int]] = []  # the same for the InferencePool, where served
        self._sampler: asyncio.Task[None] | None = None

    @property
    def ns(self) -> str:
        return self.kube.namespace

    # -- lifecycle --
    async def start(self) -> Cluster:
        self.workdir.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(self._forget_stale_nodes)
        self.kube = new_namespace(self.cp, self.workdir / "kube", RESTRICTED)
        for name, product, gpus in nodes.DEFAULT_NODES:
            await self.add_node(name, product, gpus)
        for claim in CLAIMS:
            pv, pvc = next(iter(self.nodes.values())).claim_objects(self.ns, claim)
            self.create(pv)
            self.create(pvc)
        secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": HF_SECRET}}
        self.create({**secret, "stringData": {"token": "hf_test-token"}})
        self.proxy.start()
        token = chart_identity(self.kube, [self.ns])
        self.proxy.kubeconfig(token, self.operator_kubeconfig, name="operator")
        self._sampler = asyncio.create_task(self._sample())
        return self

    async def close(self) -> None:
        if self._sampler is not None:
            self._sampler.cancel()
            await asyncio.gather(self._sampler, return_exceptions=True)
        if self.kube is not None:  # None: start() failed before its namespace existed
            with contextlib.suppress(urllib.error.URLError, OSError):
                self.cp.request("DELETE", f"/api/v1/namespaces/{self.ns}")
        for node in self.nodes.values():
            await node.stop()
        self.proxy.stop()
        await asyncio.to_thread(self._forget_stale_nodes)
        for claim in CLAIMS if self.kube is not None else ():
            with contextlib.suppress(urllib.error.URLError, OSError):
                self.cp.request("DELETE", f"/api/v1/persistentvolumes/{self.ns}-{claim}")

    def _forget_stale_nodes(self) -> None:
        """Delete the Nodes no running kubelet keeps (an earlier test's): the operator's GPU check counts Nodes."""
        for node in (self.cp.request("GET", "/api/v1/nodes") or {}).get("items", []):
            name = node["metadata"]["name"]
            if name not in self.nodes or not self.nodes[name]._tasks:
                with contextlib.suppress(urllib.error.HTTPError):
                    self.cp.request("DELETE", f"/api/v1/nodes/{name}")

    async def add_node(self, name: str, product: str | None, gpus: int = 8) -> SimNode:
        """A GPU node registering now (its kubelet starting), its pods held like every other's."""
        node = SimNode(
            self.cp.node_kubeconfig(name),
            name=name,
            product=product,
            gpus=gpus,
            node_dir=self.workdir / "nodes" / name,
            heartbeat_seconds=5.0,
            stages=self.pods,
        )
        await node.start()
        self.nodes[name] = node
        return node

    async def resume_pods(self) -> int:
        """Run again each node's pods whose task was cancelled from outside: kopf, stopping, cancels every task
        spawned in the loop while it ran, and so the pods that started meanwhile, which would then never report
        again (a Job's verdict, say). Each runs anew from the pod as stored; how many."""
        resumed = 0
        for node in self.nodes.values():
            for uid, work in list(node.pods.items()):
                if not any(t is not None and t.cancelled() for t in (work.task, work.terminating)):
                    continue
                if node.pods.get(uid) is not work:  # the node forgot it meanwhile (its pod deleted): nothing to run
                    continue
                del node.pods[uid]
                path = f"/api/v1/namespaces/{work.namespace}/pods/{work.name}"
                try:
                    pod = await asyncio.to_thread(self.cp.request, "GET", path)
                except urllib.error.HTTPError as exc:
                    if exc.code != 404:
                        raise
                    continue
                if pod["metadata"]["uid"] == uid:
                    node.handle("MODIFIED", pod)
                    resumed += 1
        return resumed

    def operator(
        self, resync: float = 300.0, policy: bool = True, clock: Any = None, **options: Any
    ) -> LifecycleOperator:
        return LifecycleOperator(self, resync=resync, policy=policy, clock=clock, **options)

    # -- the API, as the admin --
    def kubectl(self, *args: str, input: str | None = None, check: bool = False, timeout: float = 60) -> Any:
        return self.kube.kubectl(*args, input=input, check=check, timeout=timeout)

    def apply(self, doc: dict[str, Any]) -> None:
        """``kubectl apply`` (client-side, as most users do) into the test's namespace."""
        self.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc), check=True)

    def path(self, api_version: str, kind: str, name: str | None = None) -> str:
        return api_path(api_version, kind, self.ns, name)

    def find(self, api_version: str, kind: str, name: str) -> dict[str, Any] | None:
        try:
            return self.cp.request("GET", self.path(api_version, kind, name))  # type: ignore[no-any-return]
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    def get(self, api_version: str, kind: str, name: str) -> dict[str, Any]:
        obj = self.find(api_version, kind, name)
        if obj is None:
            raise LookupError(f"{kind} {self.ns}/{name} not found")
        return obj

    def list(self, api_version: str, kind: str, selector: str | None = None) -> list[dict[str, Any]]:
        query = f"?labelSelector={urllib.parse.quote(selector)}" if selector else ""
        try:
            return self.cp.request("GET", self.path(api_version, kind) + query).get("items") or []  # type: ignore[no-any-return]
        except urllib.error.HTTPError as exc:
            if exc.code == 404:  # a kind not served (a CRD not installed)
                return []
            raise

    def create(self, doc: dict[str, Any]) -> dict[str, Any]:
        kind = doc["kind"]
        if kind not in CLUSTER_SCOPED:
            doc = {**doc, "metadata": {**doc["metadata"], "namespace": self.ns}}
        return self.cp.request("POST", self.path(doc["apiVersion"], kind), doc)  # type: ignore[no-any-return]

    def patch(self, api_version: str, kind: str, name: str, body: dict[str, Any], subresource: str = "") -> Any:
        path = self.path(api_version, kind, name) + (f"/{subresource}" if subresource else "")
        return self.cp.request("PATCH", path, body, content_type="application/merge-patch+json")

    def delete(self, api_version: str, kind: str, name: str) -> None:
        with contextlib.suppress(urllib.error.HTTPError):
            self.cp.request("DELETE", self.path(api_version, kind, name))

    def install_crd(self, path: Path) -> dict[str, Any]:
        """Install a CustomResourceDefinition (cluster-wide: :meth:`remove_crd` it before the test ends)."""
        doc = yaml.safe_load(path.read_text())
        self.kubectl("apply", "--server-side", "-f", str(path), check=True)
        self.cp.wait_established(doc["metadata"]["name"])
        return doc

    def remove_crd(self, path: Path) -> None:
        name = yaml.safe_load(path.read_text())["metadata"]["name"]
        with contextlib.suppress(urllib.error.HTTPError):
            self.cp.request("DELETE", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")

    # -- views --
    def rdd(self, name: str = NAME) -> dict[str, Any]:
        return self.get(API_VERSION, KIND, name)

    def status(self, name: str = NAME) -> dict[str, Any]:
        obj = self.find(API_VERSION, KIND, name)
        return (obj or {}).get("status") or {}

    def condition(self, type_: str, name: str = NAME) -> dict[str, Any]:
        return next(c for c in self.status(name).get("conditions", []) if c["type"] == type_)

    def jobs(self, component: str = "engine-build") -> list[dict[str, Any]]:
        """The operator's Jobs of one component (engine builds by default; ``validation``, ``drafter-training``)."""
        jobs = self.list("batch/v1", "Job", f"{names.LABEL_COMPONENT}={component}")
        return sorted(jobs, key=lambda j: j["metadata"]["name"])

    def job_names(self) -> list[str]:
        return [j["metadata"]["name"] for j in self.jobs()]

    def running_jobs(self) -> list[str]:
        """Build Jobs without a terminal condition (the Job controller has not finished them)."""
        return [
            j["metadata"]["name"]
            for j in self.jobs()
            if not any(
                c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
                for c in (j.get("status") or {}).get("conditions") or []
            )
        ]

    def events(self) -> list[tuple[str, str, str]]:
        return [(e["reason"], e.get("type", ""), e.get("message", "")) for e in self.list("v1", "Event")]

    def deployment(self, variant: str, name: str = NAME) -> dict[str, Any] | None:
        return self.find("apps/v1", "Deployment", names.serving_deployment_name(name, variant))

    def versions(self) -> dict[tuple[str, str], str]:
        """The resourceVersion of every object of the kinds the operator writes."""
        return {
            (kind, o["metadata"]["name"]): o["metadata"]["resourceVersion"]
            for api_version, kind in OPERATOR_KINDS
            for o in self.list(api_version, kind)
        }

    def rendered(self, doc: dict[str, Any], **kw: Any) -> list[dict[str, Any]]:
        """What `render` prints for the applied resource (uid and generation as the cluster gave them)."""
        from redrafter_operator.controller.preview import planned_children

        live = self.rdd(doc["metadata"]["name"])
        meta = {**doc["metadata"], "namespace": self.ns}
        meta.update(uid=live["metadata"]["uid"], generation=live["metadata"]["generation"])
        return planned_children({**doc, "metadata": meta}, **kw)

    def differing(self, rendered: list[dict[str, Any]], kinds: set[str]) -> list[str]:
        """The rendered children of these kinds that the cluster does not hold as rendered (by kind/name)."""
        out = []
        for doc in rendered:
            if doc["kind"] not in kinds:
                continue
            stored = self.find(doc["apiVersion"], doc["kind"], doc["metadata"]["name"])
            fields = {k: v for k, v in doc.items() if k not in ("apiVersion", "kind", "metadata")}
            meta = {k: doc["metadata"][k] for k in ("labels", "annotations", "ownerReferences") if k in doc["metadata"]}
            if stored is None or not contained({**fields, "metadata": meta}, stored):
                out.append(f"{doc['kind']}/{doc['metadata']['name']}")
        return out

    # -- what the operator sent --
    def mark(self) -> int:
        return self.proxy.mark()

    def operator_requests(self, since: int = 0) -> list[Request]:
        return self.proxy.requests(since)

    def operator_writes(self, since: int = 0) -> list[Request]:
        return [r for r in self.proxy.requests(since) if r.write]

    def inject(self, status: int, **fault: Any) -> None:
        """The next matching requests of the operator answer ``status`` (:meth:`FaultProxy.inject`)."""
        self.proxy.inject(status, **fault)

    def cut_watches(self, reset: bool = False) -> int:
        return self.proxy.cut_watches(reset=reset)

    # -- the pods --
    def complete_job(self, job: str, message: str = "", init_message: str = "") -> None:
        """The Job's pods exit 0 with this termination message (now, or when they start); ``init_message``: the
        one their init containers, if any, terminated with."""
        self.pods.init_messages[job] = init_message
        self.pods.verdicts[job] = (0, message)
        self.pods.changed()

    def fail_job(self, job: str, exit_code: int = 1, message: str = "") -> None:
        """The Job's pods exit ``exit_code`` with this termination message; the Job controller decides the rest
        (retry within backoffLimit, FailJob on a podFailurePolicy rule)."""
        self.pods.verdicts[job] = (exit_code, message)
        self.pods.changed()

    def complete_all(self) -> list[str]:
        """Complete every running build Job, each reporting what it built."""
        done = self.running_jobs()
        for job in done:
            self.complete_job(job, BUILT.message(f"OK: engine built by {job}"))
        return done

    def set_pods_ready(self, ready: bool) -> None:
        self.pods.ready = ready
        self.pods.changed()

    def set_fault(self, deployment: str, fault: failures.Fault | None) -> None:
        """Deployment's pods fail as the kubelet reports ``fault`` (None: they run again)."""
        if fault is None:
            self.pods.faults.pop(deployment, None)
        else:
            self.pods.faults[deployment] = fault
        self.pods.changed()

    # -- traffic --
    async def _sample(self) -> None:
        while True:
            try:
                await asyncio.to_thread(self._sample_once)
            except (urllib.error.URLError, OSError):
                pass
            await asyncio.sleep(0.1)

    def _sample_once(self) -> None:
        """One sample per target: its selector and the Ready pods it selects at one moment. The two reads are two
        requests; where the target's selector changed between them (a switch), the sample is not of one moment and
        is dropped (the next one, 0.1 s later, reads the new selector)."""
        for api_version, kind, samples in (
            ("v1", "Service", self.samples),
            (INFERENCE_POOL_API, "InferencePool", self.pool_samples),
        ):
            target = self.find(api_version, kind, NAME)
            if not target:
                continue
            selector = target["spec"]["selector"]
            match = selector.get("matchLabels", selector)
            pods = self.list("v1", "Pod", names.selector_string(match))
            after = self.find(api_version, kind, NAME)
            if after is None or after["spec"]["selector"] != selector:
                continue
            samples.append((time.monotonic(), match.get(names.LABEL_TRAFFIC, ""), sum(map(is_ready, pods))))


# -- waiting on the operator --
async def settle(cluster: Cluster, seconds: float = 1.0) -> None:
    """Wait until the operator sent no write for ``seconds``."""
    last, mark = time.monotonic(), cluster.mark()
    while time.monotonic() - last < seconds:
        await asyncio.sleep(0.1)
        if cluster.operator_writes(mark):
            mark, last = cluster.mark(), time.monotonic()


async def quiesce(cluster: Cluster, op: InProcessOperator, *names_: str) -> None:
    """A deterministic settle instead of a sleep: the operator's watch caught up with each named resource
    (default: the one), each reconciled once more from now, and the controller idle (nothing queued,
    reconciling or monitoring)."""
    ctl = op.controller
    assert ctl is not None
    keys = [(cluster.ns, n) for n in names_ or (NAME,)]

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


async def to_serving(cluster: Cluster, name: str = NAME) -> None:
    """Both builds run, then complete: the resource Serving."""
    await until(lambda: len(cluster.running_jobs()) >= 1, what="build Jobs")
    await until(lambda: cluster.status(name).get("phase") == "Building", what="phase Building")
    cluster.complete_all()
    await until(lambda: cluster.status(name).get("phase") == "Serving", what="phase Serving")


C = TypeVar("C", bound=Cluster)
Op = TypeVar("Op", bound=LifecycleOperator)


@contextlib.asynccontextmanager
async def running_cluster(cp: ControlPlane, workdir: Path, kind: type[C] = Cluster) -> AsyncIterator[C]:  # type: ignore[assignment]
    """A started cluster of ``kind`` (the lifecycle one, or a subclass), closed after."""
    cluster = kind(cp, workdir)
    try:
        yield await cluster.start()
    finally:
        await cluster.close()


@contextlib.asynccontextmanager
async def running_operator(
    cluster: Cluster,
    kind: type[Op] = LifecycleOperator,  # type: ignore[assignment]
    **options: Any,
) -> AsyncIterator[Op]:
    """A started operator of ``kind`` on the cluster, stopped after."""
    op = kind(cluster, **options)
    await op.start()
    try:
        yield op
    finally:
        await op.stop()


__all__ = [
    "BUILT",
    "Cluster",
    "EXAMPLE",
    "INFERENCE_POOL_API",
    "INFERENCE_POOL_CRD",
    "LifecycleOperator",
    "NAME",
    "contained",
    "count_calls",
    "example",
    "quiesce",
    "routed",
    "running_cluster",
    "running_operator",
    "settle",
    "table_rows",
    "to_serving",
]
