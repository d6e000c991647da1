"""The programs of the operator's Job pods as the simulated node runs them (:class:`ProgramRunner`).

A pod's container command — ``python -m engine_jobs build --spec /etc/redrafter/build.json``, ``redrafter-operator
evaluate validate``, ``python -m engine_jobs cache ls|gc``, the training and prepare programs — runs as a real
subprocess with the stand-in TensorRT-LLM toolchain, in a directory laid out as the pod's volumes
(:mod:`.hostfs`). Only paths change: build.json's ``cache_dir`` and credentials directories point into the pod's
root, and engine_jobs' settings (environment variables) name the toolchain, the pvc:// mount root and the
termination-message file. pvc:// source claims are provisioned with a tiny fake checkpoint (:mod:`.checkpoint`) the
first time a build reads them, and ``hf://redrafter-sim/<fixture>`` sources are put into the pod's Hugging Face cache
(the node is offline). In-cluster Service addresses (``<svc>.<ns>.svc:<port>``) in a command are resolved as
cluster DNS and kube-proxy would (:meth:`ProgramRunner.service_endpoint`, the node's). The pod's status is the
node's (:mod:`.noderun`); the Job's is the real Job controller's.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import posixpath
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from engine_jobs import contract
from engine_jobs.contract import BuildSpec, SourceRef, TrainSpec

from . import objects
from .checkpoint import FIXTURES, write_base, write_drafter, write_hf_fixture, write_tokenizer
from .hostfs import HostFS, PodRoot, configmap_names, secret_names
from .kubeapi import CONFIGMAPS, SECRETS, KubeApi
from .podidentity import Identity

log = logging.getLogger("redrafter.sim.jobs")

#: The stand-in TensorRT-LLM toolchain (converter scripts under examples/, bin/trtllm-build).
#: The one place that names its location.
TOOLCHAIN_DIR = Path(__file__).resolve().parent / "toolchain"

SERVICE_ADDRESS = re.compile(
    r"\b([a-z0-9]([-a-z0-9]*[a-z0-9])?)\.([a-z0-9]([-a-z0-9]*[a-z0-9])?)\.svc(\.cluster\.local)?:(\d+)\b"
)
TERMINATION_MESSAGE_LIMIT = 4096
LOG_TAIL_LINES = 80
DATASET_PROMPTS = 64  # prompts a provisioned dataset holds
#: the downward API's env fieldRefs this node resolves: pod manifest and pod IP -> value
FIELD_REFS: dict[str, Callable[[Mapping[str, Any], str], str]] = {
    "metadata.name": lambda pod, ip: str(pod["metadata"]["name"]),
    "metadata.namespace": lambda pod, ip: str(pod["metadata"]["namespace"]),
    "metadata.uid": lambda pod, ip: str(pod["metadata"].get("uid", "")),
    "spec.nodeName": lambda pod, ip: str(pod["spec"].get("nodeName", "")),
    "spec.serviceAccountName": lambda pod, ip: str(pod["spec"].get("serviceAccountName", "default")),
    "status.podIP": lambda pod, ip: ip,
    "status.hostIP": lambda pod, ip: objects.HOST_IP,
}


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

    Only the container's own strings name container paths, so only they are mapped into the pod's root (a
    whole argument, or the value of a ``--flag=value`` one);
    the host program that stands in for the image's entrypoint is put in afterwards and never mapped,
    or a checkout under a mount path (``/tmp``, an emptyDir in every pod) would lose its interpreter.
    The node's mapping itself also leaves the stand-ins' host paths alone (:meth:`PodRoot.translate`).
    """
    command = [*(container.get("command") or []), *(container.get("args") or [])]
    if not command:
        raise ValueError("container has no command")
    term_path = container.get("terminationMessagePath") or contract.TERMINATION_LOG

    # a mount point itself is named by the volume's directory: the pod root's entry is a symlink, and a program
    # that lstat()s its argument (kubectl's --filename walk) must find the directory a container would have
    points = {posixpath.normpath(m.path): str(m.host) for m in root.mounts}

    def path(value: str) -> str:
        return points.get(posixpath.normpath(value), root.translate(value)) if value.startswith("/") else value

    def mapped(arg: str) -> str:
        if arg == term_path:
            return termination_log
        flag, eq, value = arg.partition("=")
        if arg.startswith("-") and eq:  # --filename=/crds: the flag's value is the path
            return f"{flag}={path(value)}"
        return path(arg)

    argv = [mapped(a) for a in command]
    argv[0] = host_program(command[0]) or argv[0]
    return argv


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


class ProgramRunner:
    """Lays out a pod's volumes and runs its containers' programs (at most ``parallel`` at once)."""

    def __init__(self, api: KubeApi, fs: HostFS, *, toolchain: Path = TOOLCHAIN_DIR, parallel: int = 2) -> None:
        self.api = api
        self.fs = fs
        self.toolchain = toolchain
        self._slots = asyncio.Semaphore(parallel)

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
            elif (path := (item.get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath")) in FIELD_REFS:
                env[item["name"]] = FIELD_REFS[path](manifest, ip)
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
        """``ip:port`` of a ready endpoint of the Service, None when it has none (the node's kube-proxy knows)."""
        raise NotImplementedError

    async def _execute(
        self,
        argv: list[str],
        env: dict[str, str],
        root: PodRoot,
        identity: Identity,
        grace: float = 5.0,
        preexec: Callable[[], None] | None = None,
    ) -> tuple[int, str]:
        """Run the container's command as ``identity`` (its capabilities; file access was set at mount);
        cancelled, it is stopped as a deleted pod's container is: SIGTERM, SIGKILL after ``grace`` seconds.
        ``preexec``: what runs in the child before exec instead of the identity's capability drop alone."""
        log_path = root.root / "container.log"
        with open(log_path, "wb") as out:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
                env=env,
                cwd=root.root,
                start_new_session=True,
                preexec_fn=preexec or identity.preexec,
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
