"""The simulated node's Job controller + kubelet for the operator's Jobs (engine builds, validation).

For each Job labelled ``app.kubernetes.io/component`` ``engine-build``, ``validation`` or ``engine-cache`` it
creates a Pod in the API, lays out the Pod's volumes on this machine (:mod:`.hostfs`), and runs the container's own command —
``python -m engine_jobs build --spec /etc/redrafter/build.json`` — as a real subprocess with the
stand-in TensorRT-LLM toolchain. Only paths change: build.json's ``cache_dir`` and credentials
directories point into the pod's root, and engine_jobs' settings (environment variables) name the
toolchain, the pvc:// mount root and the termination-message file. pvc:// source claims are
provisioned with a tiny fake checkpoint (:mod:`.checkpoint`) the first time a build reads them, and
``hf://redrafter-sim/<fixture>`` sources are put into the Job's Hugging Face cache (the node is offline). The
PyTorch path's prepare Jobs (``backend: pytorch``) run the same program and need no toolchain.
Validation Jobs run ``redrafter-operator evaluate validate`` the same way, engine-cache Jobs
``python -m engine_jobs cache ls|gc`` (their read-only mounts are not enforced: a mount is a symlink); their in-cluster Service
addresses (``<svc>.<ns>.svc:<port>``) are resolved to a Ready endpoint of that Service, as cluster DNS
and kube-proxy would. The Pod's and Job's status come from the real exit code and termination-message
file, with the Job's ``podFailurePolicy`` (a FailJob exit code ends the Job at once), ``backoffLimit``
retries and ``activeDeadlineSeconds``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from engine_jobs import contract
from engine_jobs.contract import BuildSpec, SourceRef, TrainSpec

from . import objects, podfailurepolicy
from .checkpoint import FIXTURES, write_base, write_drafter, write_hf_fixture, write_tokenizer
from .hostfs import HostFS, PodRoot, configmap_names, secret_names
from .kubeapi import CONFIGMAPS, ENDPOINTS, EVENTS, JOBS, PODS, SECRETS, ApiStatusError, KubeApi
from .podidentity import Identity

log = logging.getLogger("redrafter.sim.jobs")

#: The stand-in TensorRT-LLM toolchain (converter scripts under examples/, bin/trtllm-build).
#: The one place that names its location.
TOOLCHAIN_DIR = Path(__file__).resolve().parent / "toolchain"

COMPONENT_LABEL = "app.kubernetes.io/component"
JOB_COMPONENTS = ("engine-build", "drafter-training", "validation", "engine-cache")
SERVICE_ADDRESS = re.compile(
    r"\b([a-z0-9]([-a-z0-9]*[a-z0-9])?)\.([a-z0-9]([-a-z0-9]*[a-z0-9])?)\.svc(\.cluster\.local)?:(\d+)\b"
)
TERMINATION_MESSAGE_LIMIT = 4096
LOG_TAIL_LINES = 80
DATASET_PROMPTS = 64  # prompts a provisioned dataset holds
POD_CREATE_RETRY_SECONDS = 1.0


def toolchain_env(toolchain: Path = TOOLCHAIN_DIR) -> dict[str, str]:
    """engine_jobs settings selecting the stand-in toolchain (see engine_jobs/settings.py)."""
    return {
        "REDRAFTER_TRTLLM_EXAMPLES": str(toolchain / "examples"),
        "REDRAFTER_TRTLLM_BUILD": str(toolchain / "bin" / "trtllm-build"),
        "REDRAFTER_PYTHON": sys.executable,
        "REDRAFTER_NVIDIA_SMI": "nvidia-smi-not-on-this-node",
        "REDRAFTER_LOCK_POLL_SECONDS": "0.5",
        "REDRAFTER_LOCK_HEARTBEAT_SECONDS": "2",
    }


def host_program(name: str) -> str | None:
    """The program on this machine that stands in for the image's ``name`` (None: run ``name`` as is)."""
    if name in ("python", "python3"):
        return sys.executable
    if name == "redrafter-operator":
        return str(Path(sys.executable).parent / "redrafter-operator")
    return None


def container_argv(container: Mapping[str, Any], root: PodRoot, termination_log: str) -> list[str]:
    """The container's command and args as this node runs them.

    Only the container's own strings name container paths, so only they are mapped into the pod's root;
    the host program that stands in for the image's entrypoint is put in afterwards and never mapped,
    or a checkout under a mount path (``/tmp``, an emptyDir in every pod) would lose its interpreter.
    The node's mapping itself also leaves the stand-ins' host paths alone (:meth:`PodRoot.translate`).
    """
    command = [*(container.get("command") or []), *(container.get("args") or [])]
    if not command:
        raise ValueError("container has no command")
    term_path = container.get("terminationMessagePath") or contract.TERMINATION_LOG
    argv = [termination_log if a == term_path else root.translate(a) for a in command]
    argv[0] = host_program(command[0]) or argv[0]
    return argv


def job_finished(job: Mapping[str, Any]) -> bool:
    return objects.condition_true(job, "Complete") or objects.condition_true(job, "Failed")


def provision_source(fs: HostFS, ref: SourceRef | None, role: str, claims: Mapping[str, Path] | None = None) -> None:
    """A pvc:// claim that does not hold the source yet gets the fake checkpoint piece for ``role``
    (``claims``: the host directories of the pod's claims where the node resolved them itself)."""
    if ref is None or not ref.uri.startswith("pvc://"):
        return
    claim, _, sub = ref.uri[len("pvc://") :].partition("/")
    claim_dir = (claims or {}).get(claim) or fs.claim_dir(claim)
    target = claim_dir / sub if sub else claim_dir
    # a fixture by name, whatever reads it; but training needs real weights (the tiny random Llama)
    if role not in ("dataset", "trainable-base") and target.name in FIXTURES:
        if not (target / "config.json").exists():
            FIXTURES[target.name](target)
    elif role == "base" and not (target / "config.json").exists():
        write_base(target)
    elif role == "trainable-base" and not (target / "config.json").exists():  # training loads the weights
        # in a child process with the node's scratch TMPDIR: torch stays out of this process and its temp files
        scratch = fs.node_dir / "tmp"
        scratch.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "redrafter_sim.tiny_llama", str(target)]
        done = subprocess.run(argv, env={**os.environ, "TMPDIR": str(scratch)}, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"cannot write the tiny Llama into {target}:\n{done.stderr[-2000:]}")
    elif role == "dataset" and not target.exists():
        from .tiny_llama import write_prompts_jsonl

        write_prompts_jsonl(target if target.suffix == ".jsonl" else target / "prompts.jsonl", DATASET_PROMPTS)
    elif role == "drafter" and not (target / "config.json").exists():
        write_drafter(target)
    elif role == "tokenizer" and not (target / "tokenizer.json").exists():
        write_tokenizer(target)


def provision_hf_sources(hf_home: str | None, spec: BuildSpec) -> None:
    """hf:// sources that name a fixture (``hf://redrafter-sim/<name>``) are put into the Job's Hugging Face
    cache (its HF_HOME, on the cache volume), as a Hub download would leave them: the node has no Hub."""
    if not hf_home:
        return
    for ref in (spec.base, spec.tokenizer, spec.drafter):
        if ref is not None and ref.uri.startswith("hf://"):
            write_hf_fixture(Path(hf_home) / "hub", ref.uri[len("hf://") :].rstrip("/"), ref.revision or "main")


def localize_train_spec(text: str, pod: PodRoot) -> str:
    """train.json with this machine's paths (as :func:`localize_build_spec`)."""
    spec = TrainSpec.model_validate_json(text)

    def ref(r: SourceRef) -> SourceRef:
        return r.model_copy(update={"credentials_dir": pod.to_host(r.credentials_dir)}) if r.credentials_dir else r

    local = spec.model_copy(
        update={"cache_dir": pod.to_host(spec.cache_dir), "base": ref(spec.base), "dataset": ref(spec.dataset)}
    )
    return local.model_dump_json(indent=2)


def localize_build_spec(text: str, pod: PodRoot) -> str:
    """build.json with this machine's paths: the cache and credentials dirs inside the pod's root."""
    spec = BuildSpec.model_validate_json(text)

    def ref(r: SourceRef | None) -> SourceRef | None:
        if r is None or not r.credentials_dir:
            return r
        return r.model_copy(update={"credentials_dir": pod.to_host(r.credentials_dir)})

    local = spec.model_copy(
        update={
            "cache_dir": pod.to_host(spec.cache_dir),
            "base": ref(spec.base),
            "drafter": ref(spec.drafter),
            "tokenizer": ref(spec.tokenizer),
        }
    )
    return local.model_dump_json(indent=2)


class JobRunner:
    """Runs every unfinished build/validation Job (a Pod per attempt) and reports Pod and Job status."""

    def __init__(
        self,
        api: KubeApi,
        fs: HostFS,
        *,
        toolchain: Path = TOOLCHAIN_DIR,
        parallel: int = 2,
        components: tuple[str, ...] = JOB_COMPONENTS,
    ) -> None:
        """``components``: the Jobs it runs, by component label (a test may play the others itself)."""
        self.api = api
        self.fs = fs
        self.components = components
        self.toolchain = toolchain
        self._slots = asyncio.Semaphore(parallel)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.finished: dict[str, int] = {}  # job uid -> exit code of its last pod (for tests/the demo)

    async def sync(self) -> None:
        jobs = [
            j
            for j in await self.api.list(JOBS)
            if (j["metadata"].get("labels") or {}).get(COMPONENT_LABEL) in self.components
        ]
        alive = set()
        for job in jobs:
            uid = job["metadata"]["uid"]
            alive.add(uid)
            if uid in self._tasks or job_finished(job) or uid in self.finished:
                continue
            self._tasks[uid] = asyncio.create_task(self._run_job(job), name=f"job/{job['metadata']['name']}")
        for uid, task in list(self._tasks.items()):
            if task.done():
                self._tasks.pop(uid)
                if not task.cancelled() and task.exception() is not None:
                    log.error("build job task failed: %r", task.exception())
            elif uid not in alive:  # the Job was deleted: kill its pod
                task.cancel()

    async def shutdown(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        self._tasks.clear()

    # ------------------------------------------------------------------ one Job
    async def _run_job(self, job: dict[str, Any]) -> None:
        meta, spec = job["metadata"], job.get("spec") or {}
        ns, name, uid = meta["namespace"], meta["name"], meta["uid"]
        backoff = int(spec.get("backoffLimit", 6))
        deadline = spec.get("activeDeadlineSeconds")
        started = objects.now()
        await self._job_status(ns, name, {"startTime": started, "active": 1})
        failures, code, message = 0, 0, ""
        try:
            while True:
                try:
                    code, message, pod = await asyncio.wait_for(self._run_pod(job), timeout=deadline)
                except asyncio.TimeoutError:
                    self.finished[uid] = -1
                    await self._job_status(
                        ns,
                        name,
                        self._failed(failures + 1, "DeadlineExceeded", "Job was active longer than specified deadline"),
                    )
                    return
                if code == 0:
                    break
                # the pod failure policy first, as the Job controller does: FailJob ends the Job now,
                # Ignore does not count the failure against backoffLimit
                action, why = podfailurepolicy.match(job, pod)
                if action == podfailurepolicy.FAIL_JOB:
                    self.finished[uid] = code
                    await self._job_status(ns, name, self._failed(failures + 1, podfailurepolicy.REASON, why))
                    return
                if action != podfailurepolicy.IGNORE:
                    failures += 1
                if failures > backoff:
                    break
                await self._job_status(ns, name, {"active": 1, "failed": failures})
        finally:
            self.finished.setdefault(uid, code)
        self.finished[uid] = code
        if code == 0:
            t = objects.now()
            await self._job_status(
                ns,
                name,
                {
                    "active": 0,
                    "succeeded": 1,
                    "failed": failures,
                    "completionTime": t,
                    "conditions": [
                        {
                            "type": "SuccessCriteriaMet",
                            "status": "True",
                            "reason": "CompletionsReached",
                            "message": "Reached expected number of succeeded pods",
                            "lastTransitionTime": t,
                        },
                        {
                            "type": "Complete",
                            "status": "True",
                            "reason": "CompletionsReached",
                            "message": "Reached expected number of succeeded pods",
                            "lastTransitionTime": t,
                        },
                    ],
                },
            )
        else:
            await self._job_status(
                ns, name, self._failed(failures, "BackoffLimitExceeded", "Job has reached the specified backoff limit")
            )

    @staticmethod
    def _failed(failures: int, reason: str, message: str) -> dict[str, Any]:
        t = objects.now()
        return {
            "active": 0,
            "failed": failures,
            "conditions": [
                {
                    "type": "FailureTarget",
                    "status": "True",
                    "reason": reason,
                    "message": message,
                    "lastTransitionTime": t,
                },
                {"type": "Failed", "status": "True", "reason": reason, "message": message, "lastTransitionTime": t},
            ],
        }

    async def _job_status(self, ns: str, name: str, status: dict[str, Any]) -> None:
        with contextlib.suppress(Exception):
            await self.api.patch(JOBS, name, ns, {"status": status}, subresource="status")

    # ------------------------------------------------------------------ one Pod of the Job
    async def _run_pod(self, job: dict[str, Any]) -> tuple[int, str, dict[str, Any]]:
        """Run one Pod of the Job: (exit code, termination message, the Pod as the Job controller sees it)."""
        meta = job["metadata"]
        ns, job_name = meta["namespace"], meta["name"]
        template = (job.get("spec") or {}).get("template") or {}
        pod_name = f"{job_name[:57]}-{objects.suffix()}"
        labels = {
            "job-name": job_name,
            "batch.kubernetes.io/job-name": job_name,
            "controller-uid": meta["uid"],
            "batch.kubernetes.io/controller-uid": meta["uid"],
        }
        manifest = objects.pod_manifest(job, pod_name, template, labels)
        await self._create_pod(job, manifest)
        container = manifest["spec"]["containers"][0]
        image = container.get("image", "")
        started = objects.now()
        ip = objects.pod_ip(f"{ns}/{pod_name}")  # on loopback: a training pod serves its progress there
        root = self.fs.pod_root(ns, pod_name)
        inits: list[dict[str, Any]] = []  # initContainerStatuses: each runs to completion first, in order
        try:
            async with self._slots:
                for init in manifest["spec"].get("initContainers") or []:
                    argv, env, identity = await self._prepare(ns, manifest, init, root, ip)
                    code, message = await self._execute(argv, env, root, identity)
                    inits.append(
                        objects.terminated_status(init["name"], ip, started, code, message, init.get("image", ""))[
                            "containerStatuses"
                        ][0]
                    )
                    if code != 0:  # the pod fails with its init container; the main container never starts
                        break
                else:
                    argv, env, identity = await self._prepare(ns, manifest, container, root, ip)
                    await self._pod_status(
                        ns,
                        pod_name,
                        {
                            **objects.running_status(container["name"], ip, started, True, 0, image),
                            **({"initContainerStatuses": inits} if inits else {}),
                        },
                    )
                    code, message = await self._execute(argv, env, root, identity)
        except (OSError, ValueError) as exc:  # a volume or ConfigMap the pod cannot start with
            code, message = 128, f"CreateContainerConfigError: {exc}"
        status = objects.terminated_status(container["name"], ip, started, code, message, image)
        if inits:
            status["initContainerStatuses"] = inits
            if inits[-1]["state"]["terminated"]["exitCode"] != 0:  # the main container never ran
                status["containerStatuses"][0]["state"] = {"waiting": {"reason": "PodInitializing"}}
        await self._pod_status(ns, pod_name, status)
        log.info("build pod %s/%s exited %s", ns, pod_name, code)
        return code, message, {"metadata": {"name": pod_name, "namespace": ns}, "status": status}

    async def _create_pod(self, job: dict[str, Any], manifest: dict[str, Any]) -> None:
        """Create the Pod; while admission rejects it, record a FailedCreate Event on the Job (once per
        message) and retry as the Job controller does, until the Job's activeDeadlineSeconds."""
        ns, reported = job["metadata"]["namespace"], ""
        while True:
            try:
                await self.api.create(PODS, manifest, ns)
                return
            except ApiStatusError as exc:
                if exc.code != 403:
                    raise
                if exc.message != reported:
                    reported = exc.message
                    log.warning("pod of job %s/%s rejected: %s", ns, job["metadata"]["name"], exc.message)
                    with contextlib.suppress(ApiStatusError):
                        await self.api.create(
                            EVENTS, objects.failed_create_event(job, exc.message, "job-controller"), ns
                        )
            await asyncio.sleep(POD_CREATE_RETRY_SECONDS)

    async def _prepare(
        self, ns: str, manifest: dict[str, Any], container: dict[str, Any], root: PodRoot, ip: str
    ) -> tuple[list[str], dict[str, str], Identity]:
        pod_spec = manifest["spec"]
        claims = self.fs.claims_of(root, pod_spec)
        configmaps: dict[str, dict[str, str]] = {}
        build_specs: list[BuildSpec] = []
        for cm_name in configmap_names(pod_spec):
            cm = await self.api.get(CONFIGMAPS, cm_name, ns)
            if cm is None:
                raise FileNotFoundError(f"configmap {cm_name!r} not found")
            data = dict(cm.get("data") or {})
            if contract.BUILD_SPEC_FILE in data:
                spec = BuildSpec.model_validate_json(data[contract.BUILD_SPEC_FILE])
                build_specs.append(spec)
                provision_source(self.fs, spec.base, "base", claims)
                provision_source(self.fs, spec.drafter, "drafter", claims)
                provision_source(self.fs, spec.tokenizer, "tokenizer", claims)
                data[contract.BUILD_SPEC_FILE] = localize_build_spec(data[contract.BUILD_SPEC_FILE], root)
            if contract.TRAIN_SPEC_FILE in data:
                train = TrainSpec.model_validate_json(data[contract.TRAIN_SPEC_FILE])
                provision_source(self.fs, train.base, "trainable-base", claims)
                provision_source(self.fs, train.dataset, "dataset", claims)
                data[contract.TRAIN_SPEC_FILE] = localize_train_spec(data[contract.TRAIN_SPEC_FILE], root)
            configmaps[cm_name] = data
        secrets: dict[str, dict[str, bytes]] = {}
        for secret_name in secret_names(pod_spec):
            secret = await self.api.get(SECRETS, secret_name, ns)
            if secret is not None:
                secrets[secret_name] = {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}
                secrets[secret_name].update({k: v.encode() for k, v in (secret.get("stringData") or {}).items()})
        identity = Identity.of(pod_spec, container)
        self.fs.mount_volumes(root, pod_spec, container, configmaps, secrets, identity)
        env = dict(os.environ)
        for item in container.get("env") or []:
            if "value" in item:
                env[item["name"]] = root.translate(item["value"])
            elif (item.get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath") == "metadata.name":
                env[item["name"]] = manifest["metadata"]["name"]
            elif (item.get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath") == "status.podIP":
                env[item["name"]] = ip
        env.update(toolchain_env(self.toolchain))
        env.update(root.tmp_env())
        env.setdefault("HF_HUB_OFFLINE", "1")  # no Hub here: hf:// fixtures are provisioned into the cache
        for spec in build_specs:
            provision_hf_sources(env.get("HF_HOME"), spec)
        env["REDRAFTER_SOURCES_MOUNT"] = root.to_host(contract.SOURCES_MOUNT)
        # each container has its own termination-message file, as each has its own /dev/termination-log
        env["REDRAFTER_TERMINATION_LOG"] = str(root.root / "termination" / container["name"])
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        Path(env["REDRAFTER_TERMINATION_LOG"]).parent.mkdir(parents=True, exist_ok=True)
        argv = container_argv(container, root, env["REDRAFTER_TERMINATION_LOG"])
        return [await self._resolve_services(a, ns) for a in argv], env, identity

    async def _resolve_services(self, arg: str, namespace: str) -> str:
        """``<svc>.<ns>.svc:<port>`` -> ``<ready endpoint ip>:<target port>`` (cluster DNS + kube-proxy)."""

        async def one(m: re.Match[str]) -> str:
            return await self.service_endpoint(m.group(1), m.group(3), int(m.group(6))) or m.group(0)

        out, last = [], 0
        for m in SERVICE_ADDRESS.finditer(arg):
            out += [arg[last : m.start()], await one(m)]
            last = m.end()
        return "".join(out) + arg[last:]

    async def service_endpoint(self, svc: str, ns: str, port: int) -> str | None:
        """``ip:port`` of an endpoint of the Service (from its Endpoints), None when it has none."""
        eps = await self.api.get(ENDPOINTS, svc, ns) or {}
        for subset in eps.get("subsets") or []:
            addresses = subset.get("addresses") or subset.get("notReadyAddresses") or []
            ports = subset.get("ports") or []
            target = next((p["port"] for p in ports if p.get("port") == port), None)
            if target is None and len(ports) == 1:
                target = ports[0]["port"]
            if addresses:
                return f"{addresses[0]['ip']}:{target or port}"
        return None

    async def _execute(
        self, argv: list[str], env: dict[str, str], root: PodRoot, identity: Identity, grace: float = 5.0
    ) -> tuple[int, str]:
        """Run the container's command as ``identity`` (its capabilities; file access was set at mount);
        cancelled, it is stopped as a deleted pod's container is: SIGTERM, SIGKILL after ``grace`` seconds."""
        log_path = root.root / "container.log"
        with open(log_path, "wb") as out:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
                env=env,
                cwd=root.root,
                start_new_session=True,
                preexec_fn=identity.preexec,
            )
        try:
            code = await proc.wait()
        except asyncio.CancelledError:
            await _terminate(proc, grace)
            raise
        term = Path(env["REDRAFTER_TERMINATION_LOG"])
        message = term.read_text(errors="replace") if term.is_file() else ""
        if code != 0 and not message.strip():  # terminationMessagePolicy: FallbackToLogsOnError
            lines = log_path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
            message = "\n".join(lines)
        return code, message[-TERMINATION_MESSAGE_LIMIT:]

    async def _pod_status(self, ns: str, name: str, status: dict[str, Any]) -> None:
        with contextlib.suppress(Exception):
            await self.api.patch(PODS, name, ns, {"status": status}, subresource="status")


async def _terminate(proc: asyncio.subprocess.Process, grace: float = 5.0) -> None:
    """SIGTERM the process group, SIGKILL after ``grace`` seconds."""
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), grace)
    except asyncio.TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
