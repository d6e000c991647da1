"""The simulated node's Deployment controller + kubelet for serving Deployments.

For each Deployment labelled ``app.kubernetes.io/component=serving`` it keeps ``spec.replicas`` Pods
of the current template (rolling update with surge, or Recreate), each a real tritonserver on its own
loopback address 127.0.0.N (the Pod IP; ports 8000/8001/8002 as in the cluster). The pod serves the
repository the launcher (engine_jobs.serve) would generate from the pod's serving.json — written with
engine_jobs.model_repo from the built artifact in the engine cache — with the simulated engine in
place of tensorrt_llm (on the PyTorch path, the simulated llmapi model next to the generated model.yaml;
plus the backend's load gauges, :mod:`.engine.load`). With ``openai_front``
the pod also runs the OpenAI-compatible front as the launcher does (``engine_jobs.serve.front_argv``,
port 9000) and readiness follows the container's rendered readinessProbe (the front's, which reports
Triton's); without it readiness is Triton's ``/v2/health/ready``. A dead server or front restarts the
pod (restartCount + 1); scale-down deletes the Pod and then stops its processes (both drain).

Failures come out as the real scheduler and kubelet write them (:mod:`.failures`): with ``gpus`` set, a
pod whose nvidia.com/gpu limit does not fit the node's free GPUs stays Pending/Unschedulable until one
frees up; an image in ``unpullable`` is ErrImagePull, then ImagePullBackOff; an env reference to a
missing Secret/ConfigMap is CreateContainerConfigError; a server that dies is CrashLoopBackOff with its
last run in ``lastState.terminated``; with ``memory_needed`` set, a memory limit below it is OOMKilled
(exit code 137) once the server is up; a rollout not available within the progress deadline gets
``Progressing=False ProgressDeadlineExceeded``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import math
import os
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from engine_jobs import contract
from engine_jobs.contract import ServingConfig
from engine_jobs.model_repo import write_model_repository
from engine_jobs.serve import LaunchSettings, front_argv
from redrafter_operator.render import names

from . import objects
from .engine import SimEngineSettings, add_load_gauges, install_sim_engine_for
from .failures import (
    GPU_RESOURCE,
    Fault,
    crash_loop_states,
    missing_env_source,
    pod_status,
    progress_deadline_exceeded,
    unschedulable_message,
)
from .hostfs import HostFS, PodRoot, configmap_names, secret_names
from .kubeapi import CONFIGMAPS, DEPLOYMENTS, EVENTS, PODS, SECRETS, ApiStatusError, KubeApi
from .triton import STUB_TIMEOUT_SECONDS, TritonServer, port_is_free

#: packages the emulated serving image lacks, first on every serving process's sys.path (:func:`serving_workdir`)
SERVING_IMAGE = Path(__file__).resolve().parent / "serving_image"

log = logging.getLogger("redrafter.sim.serving")

SERVING_SELECTOR = f"{names.LABEL_COMPONENT}=serving"
RESTART_BACKOFF_SECONDS = 2.0
#: a deleted pod keeps serving this long before SIGTERM (a preStop sleep), so clients that still
#: route to it (Endpoints and routers refresh every sync period) are not refused
TERMINATION_DELAY_SECONDS = 1.5


#: Triton servers loading their models at the same time on this node (a switch starts a whole pool).
STARTS_IN_PARALLEL = 4


POD_IPS_ENV = "REDRAFTER_SIM_POD_IPS"  # "first-last": the range of N this machine's nodes may use


def pod_ip_range(default: tuple[int, int] = (10, 250)) -> tuple[int, int]:
    """The 127.0.0.N range for pod IPs: ``REDRAFTER_SIM_POD_IPS`` narrows it (so that clusters run side by side,
    one per test worker, never race for the same address)."""
    value = os.environ.get(POD_IPS_ENV, "")
    if not value:
        return default
    first, _, last = value.partition("-")
    return int(first), int(last)


class IpPool:
    """Pod IPs on loopback: 127.0.0.N whose Triton ports are free on this machine."""

    def __init__(
        self,
        first: int | None = None,
        last: int | None = None,
        ports: tuple[int, ...] = (contract.HTTP_PORT, contract.GRPC_PORT, contract.METRICS_PORT, contract.OPENAI_PORT),
    ) -> None:
        low, high = pod_ip_range()
        first, last = first if first is not None else low, last if last is not None else high
        self._candidates = [f"127.0.0.{n}" for n in range(first, last + 1)]
        self._ports = ports
        self._used: set[str] = set()

    def allocate(self) -> str:
        for ip in self._candidates:
            if ip not in self._used and all(port_is_free(ip, p) for p in self._ports):
                self._used.add(ip)
                return ip
        raise RuntimeError("no free loopback address for a pod")

    def release(self, ip: str) -> None:
        self._used.discard(ip)


def _http_probe(container: dict[str, Any]) -> tuple[str, int] | None:
    """(path, port) of the container's readinessProbe, its named port resolved as the kubelet does."""
    get = (container.get("readinessProbe") or {}).get("httpGet") or {}
    port = get.get("port")
    if isinstance(port, str):
        port = next((p["containerPort"] for p in container.get("ports") or [] if p.get("name") == port), None)
    return (get.get("path", "/"), int(port)) if port is not None else None


def control_file_name(namespace: str, deployment: str, variant: str) -> str:
    """The simulated engine's control file of every pod of (resource, variant) — see sim/engine/control.py."""
    return f"{namespace}.{deployment}.{variant}.json"


@dataclass
class ServingPod:
    namespace: str
    name: str
    owner_uid: str
    template_hash: str
    labels: dict[str, str]
    ip: str
    root: PodRoot
    container: str
    image: str
    started: str = field(default_factory=objects.now)
    restarts: int = 0
    server: TritonServer | None = None
    front: subprocess.Popen | None = None  # the OpenAI-compatible front, when the controller runs it
    probe: tuple[str, int] | None = None  # the container's readinessProbe: (path, port)
    ready: bool = False
    reported: str = ""  # a fingerprint of the last status written to the API
    starting: asyncio.Task[None] | None = None
    error: str = ""
    deleted: bool = False
    uid: str = ""
    gpus: int = 0  # nvidia.com/gpu limit of its container
    scheduled: bool = True  # False: Pending, no node has the GPUs
    blocked: tuple[str, str] | None = None  # (waiting reason, message): the container cannot be created
    memory_limit: int | None = None  # bytes (resources.limits.memory)
    oom: bool = False  # its last run was killed for exceeding the memory limit
    last_exit: dict[str, Any] | None = None  # lastState of a container that ran and died
    backing_off: bool = False  # between a crash and the next start
    pulls_failed: int = 0


class ServingController:
    """Reconciles serving Deployments into running tritonserver pods."""

    def __init__(
        self,
        api: KubeApi,
        fs: HostFS,
        control_dir: Path,
        *,
        sim: SimEngineSettings | None = None,
        exit_timeout_secs: int = 3,
        gpus: int | None = None,
        openai_front: bool = False,
    ) -> None:
        self.api = api
        self.openai_front = openai_front
        self.gpus = gpus  # the node's allocatable nvidia.com/gpu (None: not limited)
        self.unpullable: set[str] = set()  # images the node's registry does not have
        self.memory_needed: int | None = None  # bytes a started server takes: a lower memory limit is OOM-killed
        self.deadline_seconds: float | None = None  # overrides the Deployments' progressDeadlineSeconds
        self._progress_since: dict[tuple[str, str], float] = {}  # (Deployment uid, template) -> not available since
        self.fs = fs
        self.control_dir = control_dir
        self.sim = sim or SimEngineSettings()
        self.exit_timeout_secs = exit_timeout_secs
        self.ips = IpPool()
        self.pods: dict[tuple[str, str], ServingPod] = {}
        self._stopping: set[asyncio.Task[None]] = set()
        self._http: aiohttp.ClientSession | None = None
        self._start_slots = asyncio.Semaphore(STARTS_IN_PARALLEL)
        self.create_errors: dict[str, str] = {}  # Deployment uid -> why its last Pod was rejected

    async def sync(self) -> None:
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1.0))
        deployments = await self.api.list(DEPLOYMENTS, label_selector=SERVING_SELECTOR)
        api_pods = {
            (p["metadata"]["namespace"], p["metadata"]["name"])
            for p in await self.api.list(PODS, label_selector=SERVING_SELECTOR)
        }
        # pods deleted by someone else (garbage collection of a deleted Deployment, kubectl delete pod)
        for key, pod in list(self.pods.items()):
            if key not in api_pods and not pod.deleted:
                self._stop(pod)
        for dep in deployments:
            await self._reconcile(dep)
        await self._schedule_pending()
        await self._probe_all()
        live_owners = {d["metadata"]["uid"] for d in deployments}
        for pod in list(self.pods.values()):
            if pod.owner_uid not in live_owners and not pod.deleted:
                await self._delete(pod)

    async def shutdown(self) -> None:
        for pod in list(self.pods.values()):
            self._stop(pod, delay=0.0)
        if self._stopping:
            await asyncio.gather(*self._stopping, return_exceptions=True)
        if self._http is not None:
            await self._http.close()
            self._http = None

    # ------------------------------------------------------------------ Deployment controller
    async def _reconcile(self, dep: dict[str, Any]) -> None:
        meta, spec = dep["metadata"], dep.get("spec") or {}
        uid = meta["uid"]
        desired = int(spec.get("replicas", 1) if spec.get("replicas") is not None else 1)
        template = spec.get("template") or {}
        thash = objects.template_hash(template)
        mine = [p for p in self.pods.values() if p.owner_uid == uid and not p.deleted]
        current = [p for p in mine if p.template_hash == thash]
        old = [p for p in mine if p.template_hash != thash]
        if (spec.get("strategy") or {}).get("type") == "Recreate":
            doomed = old  # old pods go first (their servers drain in the background)
        else:  # rolling update with surge: an old pod goes once a new one is Ready in its place
            ready_current = sum(1 for p in current if p.ready)
            doomed = sorted(old, key=lambda p: p.ready)[: max(0, len(old) - max(0, desired - ready_current))]
        for p in doomed:
            await self._delete(p)
        for _ in range(desired - len(current)):
            if not await self._create(dep, template, thash):
                break
        if len(current) > desired:  # scale down: not-Ready pods first, then the newest
            victims = sorted(sorted(current, key=lambda p: p.started, reverse=True), key=lambda p: p.ready)
            for p in victims[: len(current) - desired]:
                await self._delete(p)
        await self._deployment_status(dep, thash)

    async def _deployment_status(self, dep: dict[str, Any], thash: str) -> None:
        meta = dep["metadata"]
        pods = [p for p in self.pods.values() if p.owner_uid == meta["uid"] and not p.deleted]
        desired = (dep.get("spec") or {}).get("replicas", 1)
        ready = sum(1 for p in pods if p.ready)
        updated = sum(1 for p in pods if p.template_hash == thash)
        status = {
            "observedGeneration": meta.get("generation", 1),
            "replicas": len(pods),
            "updatedReplicas": updated,
            "readyReplicas": ready,
            "availableReplicas": ready,
            "unavailableReplicas": max(0, (desired or 0) - ready),
        }
        ref = (meta["uid"], thash)
        if ready >= (desired or 0):
            self._progress_since.pop(ref, None)
        else:
            self._progress_since.setdefault(ref, time.monotonic())
        deadline = (
            self.deadline_seconds
            if self.deadline_seconds is not None
            else float((dep.get("spec") or {}).get("progressDeadlineSeconds", 600))
        )
        exceeded = ref in self._progress_since and time.monotonic() - self._progress_since[ref] > deadline
        have = dep.get("status") or {}
        have_exceeded = any(c.get("reason") == "ProgressDeadlineExceeded" for c in have.get("conditions") or [])
        failure = self.create_errors.get(meta["uid"])
        had_failure = any(c.get("type") == "ReplicaFailure" for c in have.get("conditions") or [])
        if (
            all(have.get(k, 0) == v for k, v in status.items())
            and have_exceeded == exceeded
            and had_failure == bool(failure)
        ):
            return
        t = objects.now()
        status["conditions"] = [
            {
                "type": "Available",
                "status": "True" if ready >= (desired or 0) else "False",
                "reason": "MinimumReplicasAvailable" if ready >= (desired or 0) else "MinimumReplicasUnavailable",
                "lastUpdateTime": t,
                "lastTransitionTime": t,
            },
            progress_deadline_exceeded(f"{meta['name']}-{thash[:8]}")
            if exceeded
            else {
                "type": "Progressing",
                "status": "True",
                "reason": "NewReplicaSetAvailable" if updated == len(pods) == ready else "ReplicaSetUpdated",
                "lastUpdateTime": t,
                "lastTransitionTime": t,
            },
        ]
        if failure:
            status["conditions"].append(objects.replica_failure_condition(failure))
        with contextlib.suppress(ApiStatusError):
            await self.api.patch(DEPLOYMENTS, meta["name"], meta["namespace"], {"status": status}, subresource="status")

    # ------------------------------------------------------------------ pod lifecycle
    async def _create(self, dep: dict[str, Any], template: dict[str, Any], thash: str) -> bool:
        """Create one Pod; False when admission rejected it (recorded as the ReplicaSet controller does:
        a FailedCreate Event and the Deployment's ReplicaFailure condition; this node has no ReplicaSet
        objects, so both are on the Deployment)."""
        ns = dep["metadata"]["namespace"]
        name = f"{dep['metadata']['name'][:46]}-{thash[:8]}-{objects.suffix()}"
        manifest = objects.pod_manifest(dep, name, template, {objects.POD_TEMPLATE_HASH: thash})
        container = manifest["spec"]["containers"][0]
        gpus = _gpu_limit(container)
        fits = self.gpus is None or self._gpus_used() + gpus <= self.gpus
        ip = self.ips.allocate() if fits else ""
        pod = ServingPod(
            namespace=ns,
            name=name,
            owner_uid=dep["metadata"]["uid"],
            template_hash=thash,
            labels=manifest["metadata"]["labels"],
            ip=ip,
            root=self.fs.pod_root(ns, name),
            container=container["name"],
            image=container.get("image", ""),
            gpus=gpus,
            scheduled=fits,
            memory_limit=_memory_limit(container),
            probe=_http_probe(container),
        )
        try:
            created = await self.api.create(PODS, manifest, ns)
        except ApiStatusError as exc:
            if ip:
                self.ips.release(ip)
            if exc.code != 403:
                raise
            if self.create_errors.get(dep["metadata"]["uid"]) != exc.message:
                self.create_errors[dep["metadata"]["uid"]] = exc.message
                log.warning("pod of %s/%s rejected: %s", ns, dep["metadata"]["name"], exc.message)
                with contextlib.suppress(ApiStatusError):
                    await self.api.create(
                        EVENTS, objects.failed_create_event(dep, exc.message, "replicaset-controller"), ns
                    )
            return False
        self.create_errors.pop(dep["metadata"]["uid"], None)
        pod.uid = (created or {}).get("metadata", {}).get("uid", "")
        self.pods[(ns, name)] = pod
        if not fits:
            log.info(
                "pod %s/%s unschedulable: %d %s wanted, %d free",
                ns,
                name,
                gpus,
                GPU_RESOURCE,
                (self.gpus or 0) - self._gpus_used(),
            )
            return True
        pod.starting = asyncio.create_task(self._start(pod, manifest), name=f"pod/{name}")
        log.info("pod %s/%s scheduled on %s", ns, name, ip)
        return True

    def _gpus_used(self) -> int:
        return sum(p.gpus for p in self.pods.values() if p.scheduled and not p.deleted)

    async def _schedule_pending(self) -> None:
        """The scheduler's retry: a pending pod binds once the node has its GPUs free (oldest first)."""
        for pod in sorted(
            (p for p in self.pods.values() if not p.scheduled and not p.deleted), key=lambda p: p.started
        ):
            if self.gpus is not None and self._gpus_used() + pod.gpus > self.gpus:
                continue
            manifest = await self.api.get(PODS, pod.name, pod.namespace)
            if manifest is None:
                continue
            pod.ip, pod.scheduled, pod.started = self.ips.allocate(), True, objects.now()
            pod.starting = asyncio.create_task(self._start(pod, manifest), name=f"pod/{pod.name}")
            log.info("pod %s/%s scheduled on %s", pod.namespace, pod.name, pod.ip)

    async def _blocked(self, pod: ServingPod, manifest: dict[str, Any]) -> tuple[str, str] | None:
        """Why the kubelet cannot create the container (image pull, env from a missing Secret/ConfigMap)."""
        if pod.image in self.unpullable:
            pod.pulls_failed += 1
            if pod.pulls_failed == 1:
                return "ErrImagePull", (
                    f"rpc error: code = NotFound desc = failed to pull and unpack image "
                    f'"{pod.image}": failed to resolve reference "{pod.image}": {pod.image}: not found'
                )
            return "ImagePullBackOff", f'Back-off pulling image "{pod.image}"'
        pod.pulls_failed = 0
        found: dict[tuple[str, str], bool] = {}
        for kind, api_kind in (("Secret", SECRETS), ("ConfigMap", CONFIGMAPS)):
            for container in manifest["spec"]["containers"]:
                for name in _env_source_names(container, kind):
                    if (kind, name) not in found:
                        found[(kind, name)] = await self.api.get(api_kind, name, pod.namespace) is not None
        message = missing_env_source(manifest["spec"]["containers"][0], lambda k, n: found.get((k, n), True))
        return ("CreateContainerConfigError", message) if message else None

    async def _start(self, pod: ServingPod, manifest: dict[str, Any]) -> None:
        try:
            pod.blocked = await self._blocked(pod, manifest)
            if pod.blocked:
                return
            repo, config_path, tokenizer_dir = await self._prepare(pod, manifest)
            # every pod listens on the same ports (on its own IP): the default shared-memory prefix
            # (pid + HTTP port) would collide between pods and crash the Python backends
            server = TritonServer(
                repo,
                host=pod.ip,
                http_port=contract.HTTP_PORT,
                grpc_port=contract.GRPC_PORT,
                metrics_port=contract.METRICS_PORT,
                workdir=serving_workdir(pod.root),
                exit_timeout_secs=self.exit_timeout_secs,
                stub_timeout_secs=STUB_TIMEOUT_SECONDS,
                shm_prefix=f"rdsim{os.getpid()}x{pod.ip.rsplit('.', 1)[-1]}n{pod.restarts}r",
                env=pod.root.tmp_env(),
            )
            pod.server = server
            pod.started = objects.now()
            async with self._start_slots:
                await asyncio.to_thread(server.start)
            pod.oom = (
                self.memory_needed is not None
                and pod.memory_limit is not None
                and pod.memory_limit < self.memory_needed
            )
            if pod.oom:  # the kernel kills the container once the engine is loaded into its cgroup
                await asyncio.to_thread(server.stop)
                pod.server = None
                pod.error = "OOMKilled"
                return
            if self.openai_front:
                pod.front = self._start_front(pod, config_path, tokenizer_dir)
            pod.error = ""
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the container cannot start: report it, retry after a backoff
            pod.error = f"{type(exc).__name__}: {exc}"[-1000:]
            log.warning("pod %s/%s failed to start: %s", pod.namespace, pod.name, pod.error)

    def _start_front(self, pod: ServingPod, config_path: Path, tokenizer_dir: Path) -> subprocess.Popen:
        """``python -m engine_jobs openai`` as the launcher starts it, on the pod's address."""
        settings = LaunchSettings(host=pod.ip, exit_timeout_secs=self.exit_timeout_secs)
        argv = front_argv(settings, str(config_path)) + ["--tokenizer-dir", str(tokenizer_dir)]
        keys_dir = ServingConfig.model_validate_json(config_path.read_text(encoding="utf-8")).api_keys_dir
        if keys_dir:  # the container path of the mounted Secret, as this host sees it
            argv += ["--api-keys-dir", str(pod.root.translate(keys_dir))]
        with open(pod.root.root / "openai-front.log", "ab") as out:
            env = {**os.environ, **pod.root.tmp_env()}
            return subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
                cwd=serving_workdir(pod.root),
            )

    async def _prepare(self, pod: ServingPod, manifest: dict[str, Any]) -> tuple[Path, Path, Path]:
        """The pod's volumes and the repository the launcher would write, with the simulated engine;
        also where the pod's serving.json and tokenizer are on this host."""
        spec = manifest["spec"]
        configmaps: dict[str, dict[str, str]] = {}
        for cm_name in configmap_names(spec):
            cm = await self.api.get(CONFIGMAPS, cm_name, pod.namespace)
            if cm is None:
                raise FileNotFoundError(f"configmap {cm_name!r} not found")
            configmaps[cm_name] = dict(cm.get("data") or {})
        secrets: dict[str, dict[str, bytes]] = {}
        for secret_name in secret_names(spec):  # the API keys Secret (spec.serving.auth)
            secret = await self.api.get(SECRETS, secret_name, pod.namespace)
            if secret is None:
                raise FileNotFoundError(f"secret {secret_name!r} not found")
            secrets[secret_name] = {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}
            secrets[secret_name].update({k: v.encode() for k, v in (secret.get("stringData") or {}).items()})
        container = spec["containers"][0]
        self.fs.mount_volumes(pod.root, spec, container, configmaps, secrets)
        config_path = Path(pod.root.to_host(f"{contract.CONFIG_MOUNT}/{contract.SERVING_CONFIG_FILE}"))
        cfg = ServingConfig.model_validate_json(config_path.read_text(encoding="utf-8"))
        artifact = Path(pod.root.translate(cfg.artifact_dir.rstrip("/")))
        if not (artifact / contract.MANIFEST_FILE).is_file():
            raise FileNotFoundError(f"engine artifact {cfg.artifact_dir} is not complete (no {contract.MANIFEST_FILE})")
        repo = pod.root.root / "model_repo"
        # the PyTorch path's model.yaml names the checkpoint and tokenizer: this host's paths, as the launcher's
        # would be the pod's
        host_cfg = cfg.model_copy(update={"artifact_dir": str(artifact)}) if cfg.backend == "pytorch" else cfg
        write_model_repository(
            repo, host_cfg, str(artifact / contract.ENGINE_DIR), str(artifact / contract.TOKENIZER_DIR)
        )
        deployment = pod.labels.get(names.LABEL_DEPLOYMENT, cfg.deployment)
        self.control_dir.mkdir(parents=True, exist_ok=True)
        sim = SimEngineSettings(
            **{
                **self.sim.__dict__,
                "variant": cfg.variant,
                "draft_len_per_beam": cfg.draft_len_per_beam or self.sim.draft_len_per_beam,
                "num_beams": cfg.num_beams or self.sim.num_beams,
                "control_file": str(self.control_dir / control_file_name(pod.namespace, deployment, cfg.variant)),
            }
        )
        install_sim_engine_for(cfg, repo / contract.ENGINE_MODEL, sim)
        add_load_gauges(repo / contract.ENGINE_MODEL)
        return repo, config_path, artifact / contract.TOKENIZER_DIR

    async def _delete(self, pod: ServingPod) -> None:
        pod.deleted = True
        with contextlib.suppress(ApiStatusError):
            await self.api.delete(PODS, pod.name, pod.namespace)
        self._stop(pod)

    def _stop(self, pod: ServingPod, delay: float = TERMINATION_DELAY_SECONDS) -> asyncio.Task[None]:
        """Forget the pod and stop its server in the background (Triton drains, then the dirs go)."""
        pod.deleted = True
        self.pods.pop((pod.namespace, pod.name), None)
        task = asyncio.create_task(self._stop_server(pod, delay), name=f"stop/{pod.name}")
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)
        return task

    # ------------------------------------------------------------------ a kubelet's half only
    def run_pod(self, manifest: dict[str, Any]) -> ServingPod:
        """Run a Pod the API server bound to this node (a real ReplicaSet controller created it, a real
        scheduler placed it): only the kubelet's work, :meth:`probe_pods` reports its status."""
        meta, container = manifest["metadata"], manifest["spec"]["containers"][0]
        owner: dict[str, Any] = next(iter(meta.get("ownerReferences") or []), {})
        pod = ServingPod(
            namespace=meta["namespace"],
            name=meta["name"],
            owner_uid=owner.get("uid", ""),
            template_hash=(meta.get("labels") or {}).get(objects.POD_TEMPLATE_HASH, ""),
            labels=dict(meta.get("labels") or {}),
            ip=self.ips.allocate(),
            root=self.fs.pod_root(meta["namespace"], meta["name"]),
            container=container["name"],
            image=container.get("image", ""),
            uid=meta.get("uid", ""),
            gpus=_gpu_limit(container),
            memory_limit=_memory_limit(container),
            probe=_http_probe(container),
        )
        self.pods[(pod.namespace, pod.name)] = pod
        pod.starting = asyncio.create_task(self._start(pod, manifest), name=f"pod/{pod.name}")
        log.info("pod %s/%s runs on %s", pod.namespace, pod.name, pod.ip)
        return pod

    async def stop_pod(self, namespace: str, name: str, delay: float) -> None:
        """Stop a deleted Pod's processes (after ``delay``: its preStop) and wait until they are gone."""
        pod = self.pods.get((namespace, name))
        if pod is not None:
            await self._stop(pod, delay)

    def stop_pod_soon(self, namespace: str, name: str) -> None:
        """Stop a Pod that is already gone from the API, in the background."""
        pod = self.pods.get((namespace, name))
        if pod is not None:
            self._stop(pod, delay=0.0)

    async def probe_pods(self) -> None:
        """Probe every pod and report a changed status (the kubelet's status manager)."""
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1.0))
        await self._probe_all()

    async def _stop_server(self, pod: ServingPod, delay: float) -> None:
        if delay:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(delay)
        if pod.starting is not None and not pod.starting.done():
            with contextlib.suppress(BaseException):
                await pod.starting  # start() cannot be interrupted mid-way; stop what it started
        await asyncio.gather(self._stop_front(pod), *([asyncio.to_thread(pod.server.stop)] if pod.server else []))
        if pod.ip:
            self.ips.release(pod.ip)
        self.fs.remove_pod(pod.namespace, pod.name)
        log.info("pod %s/%s stopped", pod.namespace, pod.name)

    async def _stop_front(self, pod: ServingPod) -> None:
        """SIGTERM (the front drains its streams), then SIGKILL after the exit timeout."""
        front, pod.front = pod.front, None
        if front is None or front.poll() is not None:
            return
        front.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(front.wait, self.exit_timeout_secs + 5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(front.pid, signal.SIGKILL)
            await asyncio.to_thread(front.wait)

    # ------------------------------------------------------------------ readiness / liveness
    async def _probe_all(self) -> None:
        await asyncio.gather(*(self._probe(p) for p in list(self.pods.values()) if not p.deleted))

    async def _probe(self, pod: ServingPod) -> None:
        ref = {
            "metadata": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid},
            "spec": {"containers": [{"name": pod.container, "image": pod.image}]},
        }
        if not pod.scheduled:
            ready, status = False, pod_status(ref, Fault("Unschedulable", detail=unschedulable_message(1)))
        elif pod.blocked:  # also while the next attempt waits: the kubelet keeps the waiting reason
            ready = False
            status = objects.waiting_status(
                pod.container, pod.blocked[0], pod.blocked[1], pod.restarts, pod.image, pod.started
            )
            await self._restart(pod, count=False)
        elif (
            pod.backing_off
            or (pod.starting is None or pod.starting.done())
            and (
                pod.error
                or (pod.server is not None and not pod.server.alive())
                or (pod.front is not None and pod.front.poll() is not None)
            )
        ):
            ready = False
            if not pod.backing_off:
                _, pod.last_exit = crash_loop_states(
                    pod.container,
                    "",
                    0,
                    exit_code=137 if pod.oom else 1,
                    reason="OOMKilled" if pod.oom else "Error",
                    message="" if pod.oom else pod.error or "a serving process exited",
                    container_id=f"sim://{pod.container}-{pod.restarts}",
                    at=objects.now(),
                )
            state, _ = crash_loop_states(
                pod.container,
                f"{pod.name}_{pod.namespace}({pod.uid})",
                pod.restarts + 1,
                exit_code=1,
                reason="Error",
                message="",
                container_id="",
                at="",
            )
            status = objects.waiting_status(pod.container, "CrashLoopBackOff", "", pod.restarts, pod.image, pod.started)
            status["phase"] = "Running"
            status["containerStatuses"][0].update(state=state, lastState=pod.last_exit or {})
            await self._restart(pod)
        elif pod.starting is not None and not pod.starting.done():
            ready, status = (
                False,
                objects.waiting_status(pod.container, "ContainerCreating", "", pod.restarts, pod.image, pod.started),
            )
            if pod.last_exit:  # a restart: the container runs again, its previous run is lastState
                status["phase"] = "Running"
                status["containerStatuses"][0]["lastState"] = pod.last_exit
        else:
            ready = await self._ready(pod)
            status = objects.running_status(pod.container, pod.ip, pod.started, ready, pod.restarts, pod.image)
            if pod.last_exit:
                status["containerStatuses"][0]["lastState"] = pod.last_exit
        pod.ready = ready
        fingerprint = (
            f"{status['phase']}/{ready}/{pod.restarts}/{pod.error}/{pod.scheduled}/{pod.blocked}/"
            f"{pod.backing_off}/{bool(pod.starting and not pod.starting.done())}"
        )
        if fingerprint != pod.reported:
            with contextlib.suppress(ApiStatusError):
                await self.api.patch(PODS, pod.name, pod.namespace, {"status": status}, subresource="status")
                pod.reported = fingerprint

    async def _ready(self, pod: ServingPod) -> bool:
        assert self._http is not None
        path, port = pod.probe if self.openai_front and pod.probe else ("/v2/health/ready", contract.HTTP_PORT)
        try:
            async with self._http.get(f"http://{pod.ip}:{port}{path}") as resp:
                return resp.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            return False

    async def _restart(self, pod: ServingPod, count: bool = True) -> None:
        """Try the container again after a back-off (``count``: it ran and died, restartCount + 1)."""
        if pod.starting is not None and not pod.starting.done():
            return
        await self._stop_front(pod)
        if pod.server is not None:
            await asyncio.to_thread(pod.server.stop)
            pod.server = None
        if count:
            pod.backing_off = True

        async def later() -> None:
            await asyncio.sleep(RESTART_BACKOFF_SECONDS)
            manifest = await self.api.get(PODS, pod.name, pod.namespace)
            if manifest is not None and not pod.deleted:
                if pod.backing_off:  # the kubelet creates the container again: restartCount + 1
                    pod.restarts, pod.backing_off = pod.restarts + 1, False
                await self._start(pod, manifest)

        pod.starting = asyncio.create_task(later(), name=f"restart/{pod.name}")

    # ------------------------------------------------------------------ for the demo and tests
    def pods_of(self, namespace: str, labels: Mapping[str, str]) -> list[ServingPod]:
        return [
            p
            for p in self.pods.values()
            if p.namespace == namespace and all(p.labels.get(k) == v for k, v in labels.items())
        ]


def _gpu_limit(container: Mapping[str, Any]) -> int:
    resources = container.get("resources") or {}
    value = (resources.get("limits") or {}).get(GPU_RESOURCE) or (resources.get("requests") or {}).get(GPU_RESOURCE)
    return int(value or 0)


def serving_workdir(root: PodRoot) -> Path:
    """The working directory of a pod's serving processes (Triton, its Python backend stubs, the front),
    holding the emulated serving image's absent packages (serving_image/: torch, transformers). The stubs'
    embedded Python ignores PYTHONPATH but puts the working directory first on sys.path, as ``python -m``
    does for the front."""
    workdir = root.root / "triton"
    workdir.mkdir(parents=True, exist_ok=True)
    for package in SERVING_IMAGE.iterdir():
        if package.is_dir() and not (workdir / package.name).exists():
            (workdir / package.name).symlink_to(package, target_is_directory=True)
    return workdir


def _env_source_names(container: Mapping[str, Any], kind: str) -> list[str]:
    key, from_key = {"Secret": ("secretKeyRef", "secretRef"), "ConfigMap": ("configMapKeyRef", "configMapRef")}[kind]
    names_ = [((e.get("valueFrom") or {}).get(key) or {}).get("name", "") for e in container.get("env") or []]
    names_ += [(e.get(from_key) or {}).get("name", "") for e in container.get("envFrom") or []]
    return [n for n in names_ if n]


_QUANTITY_SUFFIXES = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "m": 10**-3,
}


def parse_quantity(text: str) -> int:
    """A Kubernetes resource quantity in base units ("8Gi", "512M", "1e9", "1500m"), rounded up."""
    text = str(text).strip()
    for suffix in sorted(_QUANTITY_SUFFIXES, key=len, reverse=True):
        if text.endswith(suffix) and text[: -len(suffix)]:
            return math.ceil(float(text[: -len(suffix)]) * _QUANTITY_SUFFIXES[suffix])
    return math.ceil(float(text))


def _memory_limit(container: Mapping[str, Any]) -> int | None:
    value = ((container.get("resources") or {}).get("limits") or {}).get("memory")
    return parse_quantity(value) if value else None
