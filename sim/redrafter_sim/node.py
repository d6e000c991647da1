"""A simulated node that speaks only the real Kubernetes API, as kwok's fake nodes do: a kubelet, nothing else.

``async with SimNode(kubeconfig) as node`` registers a Node object as the node's own identity (``system:node:<name>``,
so the Node authorizer and NodeRestriction apply): GPU Feature Discovery's labels, allocatable ``nvidia.com/gpu``,
cpu, memory and pods (:func:`.nodes.node`), a Ready condition and InternalIP 127.0.0.1. It keeps its Lease in
``kube-node-lease`` renewed and its Ready condition's heartbeat current.

It watches the Pods bound to it (``spec.nodeName=<name>``; the real scheduler binds them, the real Job and
ReplicaSet controllers create them) and runs them on this machine:

* serving pods (``python -m engine_jobs serve``): real tritonservers on 127.0.0.N with the simulated engine, the
  OpenAI front, readiness, restarts and the serving faults (:class:`~.servingpods.ServingController`'s kubelet half);
* every other pod: its containers' commands as processes (:class:`~.noderun.PodRunner`), init containers first,
  with the in-cluster service-account paths, the pod's IP for ``0.0.0.0`` and httpGet readiness probes
  (:mod:`.podns`);
* a pod without a command (an image this node cannot run): Running and Ready, as kwok reports it.

Volumes come from the API as the node may read them (:mod:`.nodevolumes`: claims through their bound
PersistentVolume, projected service-account tokens from the TokenRequest API; ConfigMaps, Secrets, emptyDirs).
A pod given a deletionTimestamp has its processes stopped within its grace period; the node then deletes it with
grace period 0 and its UID as precondition, as a kubelet does. Nothing here plays a controller: Jobs, ReplicaSets,
Endpoints and EndpointSlices are Kubernetes' own.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from . import nodes, objects
from .buildjobs import TOOLCHAIN_DIR
from .engine import SimControl, SimEngineSettings, write_control
from .hostfs import HostFS
from .kubeapi import LEASES, NODES, PODS, ApiStatusError, KubeApi
from .kwokstages import Stages
from .noderun import PodRunner, with_addresses
from .nodevolumes import VolumeNotReady, claim_objects, prepare_volumes
from .servingpods import TERMINATION_DELAY_SECONDS, ServingController, control_file_name

log = logging.getLogger("redrafter.sim.node")

TEMP_PREFIX = "redrafter-sim-node-"
LEASE_NAMESPACE = "kube-node-lease"
LEASE_SECONDS = 40  # the kubelet's nodeLeaseDurationSeconds
VOLUME_RETRY_SECONDS = 1.0
TERMINAL = ("Succeeded", "Failed")


def micro_time() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def is_serving(pod: dict[str, Any]) -> bool:
    """A serving pod: the launcher ``engine_jobs serve`` in a pod restarted always (a Deployment's)."""
    container = pod["spec"]["containers"][0]
    argv = [*(container.get("command") or []), *(container.get("args") or [])]
    return pod["spec"].get("restartPolicy", "Always") == "Always" and "engine_jobs" in argv and "serve" in argv


@dataclass
class PodWork:
    """What the node does for one Pod (by UID)."""

    namespace: str
    name: str
    kind: str  # "serving" | "process" | "placeholder" | "staged"
    task: asyncio.Task[None] | None = None
    terminating: asyncio.Task[None] | None = None


class SimNode:
    def __init__(
        self,
        kubeconfig: Path,
        *,
        name: str = objects.NODE_NAME,
        proxy_kubeconfig: Path | None = None,
        product: str | None = nodes.H100,
        gpus: int = 8,
        sim: SimEngineSettings | None = None,
        toolchain: Path = TOOLCHAIN_DIR,
        node_dir: Path | None = None,
        parallel: int = 2,
        exit_timeout_secs: int = 3,
        openai_front: bool = False,
        heartbeat_seconds: float = 10.0,
        probe_seconds: float = 0.5,
        stages: Stages | None = None,
        allocatable: Mapping[str, str] | None = None,
    ) -> None:
        """``kubeconfig``: the node's identity (``ControlPlane.node_kubeconfig(name)``); ``proxy_kubeconfig``:
        kube-proxy's (``system:kube-proxy``), to resolve Services through EndpointSlices, which a node may not
        list. ``product``/``gpus``: the GPUs it advertises (no product: a CPU node). ``openai_front``: serving pods
        also run the OpenAI-compatible front, whose rendered readinessProbe then decides readiness. ``stages``:
        run no process, post the statuses it decides (kwok's pod stages: :class:`.kwokstages.KwokStages`). ``allocatable``: cpu,
        memory, pods beyond :func:`.nodes.node`'s (a node standing in for a whole cluster)."""
        self.name = name
        self.product = product
        self.gpus = gpus
        self.heartbeat_seconds = heartbeat_seconds
        self.probe_seconds = probe_seconds
        self.stages = stages
        self.allocatable = dict(allocatable or {})
        self._own_dir = node_dir is None
        self.node_dir = Path(node_dir or tempfile.mkdtemp(prefix=TEMP_PREFIX))
        self.fs = HostFS(self.node_dir)
        self.control_dir = self.node_dir / "sim-control"
        self.api = KubeApi.from_kubeconfig(kubeconfig)
        self.proxy = KubeApi.from_kubeconfig(proxy_kubeconfig or kubeconfig)
        self.serving = ServingController(
            self.api, self.fs, self.control_dir, sim=sim, exit_timeout_secs=exit_timeout_secs, openai_front=openai_front
        )
        self.runner = PodRunner(
            self.api, self.proxy, self.fs, toolchain=toolchain, parallel=parallel, unpullable=self.serving.unpullable
        )
        self.runner.node_name = name
        api_url = urlsplit(self.api.url)
        self.runner.cluster_env = {
            "KUBERNETES_SERVICE_HOST": api_url.hostname or "127.0.0.1",
            "KUBERNETES_SERVICE_PORT": str(api_url.port or 443),
        }
        self.pods: dict[str, PodWork] = {}
        self.node_uid = ""
        self._tasks: list[asyncio.Task[None]] = []
        self.errors = 0
        self.last_error = ""

    # ------------------------------------------------------------------ lifecycle
    async def __aenter__(self) -> "SimNode":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Register the Node and its Lease, then run: the Pod watch, the heartbeat, the probes."""
        await self.api.__aenter__()
        await self.proxy.__aenter__()
        try:
            await self.register()
        except BaseException:
            await self.stop()
            raise
        self._tasks = [
            asyncio.create_task(self._keep(self._watch_pods), name=f"node/{self.name}/pods"),
            asyncio.create_task(self._keep(self._heartbeat), name=f"node/{self.name}/heartbeat"),
            asyncio.create_task(self._keep(self._probe), name=f"node/{self.name}/probes"),
        ]

    async def stop(self) -> None:
        """Stop every process it started, then remove its directory. Safe to call twice."""
        try:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            self._tasks = []
            work = [w.task for w in self.pods.values() if w.task is not None] + [
                w.terminating for w in self.pods.values() if w.terminating is not None
            ]
            for task in work:
                task.cancel()
            await asyncio.gather(*work, return_exceptions=True)
            self.pods.clear()
            await asyncio.shield(self._shutdown())
        finally:
            if self._own_dir:
                shutil.rmtree(self.node_dir, ignore_errors=True)

    async def _shutdown(self) -> None:
        await asyncio.gather(self.runner.shutdown(), self.serving.shutdown(), return_exceptions=True)
        await self.api.close()
        await self.proxy.close()

    async def _keep(self, loop: Callable[[], Awaitable[None]]) -> None:
        """Run ``loop`` forever: the API may be briefly unavailable (a restart), a node keeps going."""
        while True:
            try:
                await loop()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.errors += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("node %s: %s", self.name, self.last_error)
                await asyncio.sleep(1.0)

    # ------------------------------------------------------------------ the Node and its Lease
    def _node_status(self) -> dict[str, Any]:
        _, status = nodes.node(self.name, self.product, self.gpus, allocatable=self.allocatable)
        t = objects.now()
        status["conditions"] = [
            {"type": kind, "status": "False", "reason": reason, "lastHeartbeatTime": t, "lastTransitionTime": t}
            for kind, reason in (
                ("MemoryPressure", "KubeletHasSufficientMemory"),
                ("DiskPressure", "KubeletHasNoDiskPressure"),
                ("PIDPressure", "KubeletHasSufficientPID"),
            )
        ] + [
            {
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "message": "kubelet is posting ready status",
                "lastHeartbeatTime": t,
                "lastTransitionTime": t,
            }
        ]
        status["addresses"] = [
            {"type": "InternalIP", "address": objects.HOST_IP},
            {"type": "Hostname", "address": self.name},
        ]
        return status

    async def register(self) -> None:
        """Create (or adopt) the Node, post its status, create its Lease."""
        body, _ = nodes.node(self.name, self.product, self.gpus, allocatable=self.allocatable)
        try:
            node = await self.api.create(NODES, body)
        except ApiStatusError as exc:
            if exc.code != 409:
                raise
            node = await self.api.patch(NODES, self.name, None, {"metadata": {"labels": body["metadata"]["labels"]}})
        self.node_uid = node["metadata"]["uid"]
        await self.api.patch(NODES, self.name, None, {"status": self._node_status()}, "status", strategic=True)
        await self._renew_lease()

    async def _renew_lease(self) -> None:
        try:
            await self.api.patch(LEASES, self.name, LEASE_NAMESPACE, {"spec": {"renewTime": micro_time()}})
        except ApiStatusError as exc:
            if exc.code != 404:
                raise
            lease = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {
                    "name": self.name,
                    "namespace": LEASE_NAMESPACE,
                    "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": self.name, "uid": self.node_uid}],
                },
                "spec": {"holderIdentity": self.name, "leaseDurationSeconds": LEASE_SECONDS, "renewTime": micro_time()},
            }
            await self.api.create(LEASES, lease, LEASE_NAMESPACE)

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_seconds)
            await self._renew_lease()
            t = objects.now()
            beat = [{"type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": t}]
            await self.api.patch(NODES, self.name, None, {"status": {"conditions": beat}}, "status", strategic=True)

    # ------------------------------------------------------------------ the Pods bound to it
    async def _watch_pods(self) -> None:
        async for event, pod in self.api.watch(PODS, field_selector=f"spec.nodeName={self.name}"):
            self.handle(event, pod)

    def handle(self, event: str, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        uid = meta["uid"]
        work = self.pods.get(uid)
        if event == "DELETED":
            if work is not None:
                self._forget(uid, work)
            return
        if meta.get("deletionTimestamp"):
            if work is None:
                work = self.pods[uid] = PodWork(meta["namespace"], meta["name"], "process")
            if work.terminating is None:
                work.terminating = asyncio.create_task(self._terminate(uid, work, pod), name=f"kill/{meta['name']}")
            return
        if work is not None or (pod.get("status") or {}).get("phase") in TERMINAL:
            return
        container = pod["spec"]["containers"][0]
        if self.stages is not None:
            work = PodWork(meta["namespace"], meta["name"], "staged")
            work.task = asyncio.create_task(self.stages.run(pod, self.runner.report), name=f"pod/{meta['name']}")
        elif is_serving(pod):
            work = PodWork(meta["namespace"], meta["name"], "serving")
            work.task = asyncio.create_task(self._serve(pod), name=f"pod/{meta['name']}")
        elif not container.get("command") and not container.get("args"):
            work = PodWork(meta["namespace"], meta["name"], "placeholder")
            work.task = asyncio.create_task(self._placeholder(pod), name=f"pod/{meta['name']}")
        else:
            work = PodWork(meta["namespace"], meta["name"], "process")
            work.task = asyncio.create_task(self._run(pod), name=f"pod/{meta['name']}")
        self.pods[uid] = work

    async def _volumes(self, pod: dict[str, Any]) -> None:
        """Lay out the pod's claims and projected volumes; until they can be, the pod is ContainerCreating."""
        first = pod["spec"]["containers"][0]
        while True:
            try:
                await prepare_volumes(self.api, self.fs, pod)
                return
            except (VolumeNotReady, ApiStatusError) as exc:
                log.info("pod %s: volumes not ready: %s", pod["metadata"]["name"], exc)
                status = objects.waiting_status(
                    first["name"], "ContainerCreating", "", 0, first.get("image", ""), objects.now()
                )
                await self.runner.report(pod, status)
            await asyncio.sleep(VOLUME_RETRY_SECONDS)

    async def _run(self, pod: dict[str, Any]) -> None:
        await self._volumes(pod)
        await self.runner.run(pod)

    async def _serve(self, pod: dict[str, Any]) -> None:
        await self._volumes(pod)
        self.serving.run_pod(pod)

    async def _placeholder(self, pod: dict[str, Any]) -> None:
        meta, first = pod["metadata"], pod["spec"]["containers"][0]
        ip = objects.pod_ip(meta["uid"])
        status = objects.running_status(first["name"], ip, objects.now(), True, 0, first.get("image", ""))
        await self.runner.report(pod, with_addresses(status, ip))

    async def _probe(self) -> None:
        while True:
            await self.serving.probe_pods()
            await asyncio.sleep(self.probe_seconds)

    async def _terminate(self, uid: str, work: PodWork, pod: dict[str, Any]) -> None:
        """Stop the pod's processes within its grace period, then delete it for good (grace 0, UID precondition)."""
        meta = pod["metadata"]
        grace = float(meta.get("deletionGracePeriodSeconds", pod["spec"].get("terminationGracePeriodSeconds", 30)))
        if work.task is not None and not work.task.done():
            work.task.cancel()
            await asyncio.gather(work.task, return_exceptions=True)
        if work.kind == "serving":
            await self.serving.stop_pod(work.namespace, work.name, delay=min(TERMINATION_DELAY_SECONDS, grace / 2))
        self.fs.remove_pod(work.namespace, work.name)
        await self.api.delete(PODS, meta["name"], meta["namespace"], grace_period_seconds=0, uid=uid)
        log.info("pod %s/%s terminated and deleted", meta["namespace"], meta["name"])

    def _forget(self, uid: str, work: PodWork) -> None:
        """The Pod is gone from the API: stop whatever still runs for it."""
        self.pods.pop(uid, None)
        if work.task is not None and not work.task.done():
            work.task.cancel()
        if work.kind == "serving" and (work.namespace, work.name) in self.serving.pods:
            self.serving.stop_pod_soon(work.namespace, work.name)
        elif work.terminating is None:
            self.fs.remove_pod(work.namespace, work.name)

    # ------------------------------------------------------------------ claims, simulated-engine controls
    def claim_path(self, namespace: str, claim: str) -> Path:
        """Where this node keeps the PersistentVolume of ``namespace/claim`` (:meth:`claim_objects`)."""
        return self.node_dir / "pv" / f"{namespace}_{claim}"

    def claim_objects(self, namespace: str, claim: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """A hostPath PersistentVolume under this node's directory and the claim bound to it (to create as an
        admin: a node may not create them)."""
        return claim_objects(namespace, claim, self.claim_path(namespace, claim))

    def control_file(self, namespace: str, deployment: str, variant: str) -> Path:
        return self.control_dir / control_file_name(namespace, deployment, variant)

    def set_engine(self, namespace: str, deployment: str, variant: str, **changes: Any) -> SimControl:
        """Change the simulated engine of every pod (present and future) of (resource, variant)."""
        self.control_dir.mkdir(parents=True, exist_ok=True)
        return write_control(self.control_file(namespace, deployment, variant), **changes)
