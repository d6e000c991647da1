"""The build Job: cache check -> lock -> fetch -> validate -> plan -> run steps -> repository -> publish.

This is the thin I/O shell around :mod:`engine_jobs.plan`; every failure with a known cause is a
:class:`~engine_jobs.errors.BuildError` carrying its exit code and termination message.
"""

from __future__ import annotations

import errno
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from . import manifest as facts
from .cache import (
    CachePaths,
    KeyLock,
    acquire_or_wait,
    free_bytes,
    owner_identity,
    publish,
    read_manifest,
    remove_partials,
    write_json_atomic,
)
from .contract import (
    ENGINE_DIR,
    MANIFEST_FILE,
    MODEL_REPO_DIR,
    TOKENIZER_DIR,
    BuildSpec,
    ServingConfig,
    SourceRef,
    TritonParams,
)
from .errors import BuildError, ExitCode, bad_input
from .fetch import Fetched, fetch
from .plan import (
    Architecture,
    Layout,
    estimate_required_bytes,
    expected_engine_files,
    plan_steps,
    resolve_architecture,
    validate_spec,
)
from .progress import Log, format_seconds, human_bytes, tree_size
from .runner import run_step
from .settings import Settings
from .validate import validate_base, validate_drafter, validate_tokenizer

WORK_DIR = "work"  # intermediate checkpoints inside the temp dir, removed before publishing


def load_spec(path: str | os.PathLike[str]) -> BuildSpec:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise bad_input(f"cannot read build spec {path}: {exc.strerror}") from None
    try:
        return BuildSpec.model_validate_json(text)
    except ValueError as exc:
        first = str(exc).splitlines()
        raise bad_input(f"build spec {path} is invalid: {' '.join(first[:3])}", str(exc)) from None


@dataclass
class Sources:
    base: Fetched
    tokenizer: Fetched
    drafter: Fetched | None
    base_config: dict[str, Any]
    tokenizer_files: list[str]


@dataclass
class Record:
    """What the manifest reports about the run itself."""

    steps: list[dict[str, Any]] = field(default_factory=list)

    def add(self, name: str, seconds: float, argv: list[str] | None = None, output_bytes: int | None = None) -> None:
        entry: dict[str, Any] = {"name": name, "seconds": round(seconds, 3)}
        if argv is not None:
            entry["argv"] = argv
        if output_bytes is not None:
            entry["output_bytes"] = output_bytes
        self.steps.append(entry)


def fetch_source(role: str, ref: SourceRef, spec: BuildSpec, settings: Settings, log: Log) -> Fetched:
    """One source of ``spec`` where the Job's settings put it."""
    return fetch(
        role,
        ref,
        sources_mount=settings.sources_mount,
        download_dir=settings.download_dir,
        cache_dir=spec.cache_dir,
        log=log,
    )


def fetch_tokenizer(spec: BuildSpec, base: Fetched, settings: Settings, log: Log) -> Fetched:
    """The tokenizer source: the base's own files when the spec names the same source, else fetched."""
    if spec.tokenizer.uri.rstrip("/") == spec.base.uri.rstrip("/") and spec.tokenizer.revision == spec.base.revision:
        return Fetched("tokenizer", base.uri, base.local_dir, base.revision, base.resolved, 0)
    return fetch_source("tokenizer", spec.tokenizer, spec, settings, log)


def fetch_sources(spec: BuildSpec, settings: Settings, log: Log) -> Sources:
    base = fetch_source("base", spec.base, spec, settings, log)
    base_config = validate_base(base.local_dir)
    tokenizer = fetch_tokenizer(spec, base, settings, log)
    tokenizer_files = validate_tokenizer(tokenizer.local_dir)
    drafter = None
    if spec.variant == "redrafter":
        assert spec.drafter is not None
        drafter = fetch_source("drafter", spec.drafter, spec, settings, log)
        validate_drafter(drafter.local_dir, log)
    return Sources(base, tokenizer, drafter, base_config, tokenizer_files)


def check_disk(spec: BuildSpec, sources: Sources, settings: Settings, log: Log) -> int:
    tokenizer_bytes = sum((sources.tokenizer.local_dir / f).stat().st_size for f in sources.tokenizer_files)
    need = (
        estimate_required_bytes(
            spec, sources.base.bytes, sources.drafter.bytes if sources.drafter else 0, tokenizer_bytes
        )
        + settings.disk_reserve_bytes
    )
    return require_free_space(spec, need, "checkpoints, engine", settings, log)


def require_free_space(spec: BuildSpec, need: int, what: str, settings: Settings, log: Log) -> int:
    """Refuse (OUT_OF_DISK) when the cache volume clearly lacks ``need`` bytes (reserve included)."""
    free = free_bytes(Path(spec.cache_dir))
    log(f"disk: this build needs about {human_bytes(need)} on the cache volume; {human_bytes(free)} free")
    if free < need:
        raise BuildError(
            ExitCode.OUT_OF_DISK,
            f"not enough free space on the cache volume: about {human_bytes(need)} needed "
            f"({what}{', reserve' if settings.disk_reserve_bytes else ''}), "
            f"{human_bytes(free)} free",
        )
    return need


def serving_config(spec: BuildSpec, artifact_dir: str) -> ServingConfig:
    """Defaults for the repository shipped with the artifact (serving pods rewrite it from their own).

    A PyTorch-path artifact serves both variants; its default repository is the speculative one, whichever
    variant's Job prepared it, so the artifact does not depend on which Job ran first."""
    r = spec.redrafter
    if spec.backend == "pytorch":
        return ServingConfig(
            deployment=f"engine-{spec.key}",
            variant="redrafter" if spec.speculative is not None else "base",
            engine_key=spec.key,
            artifact_dir=artifact_dir,
            tensor_parallel=spec.tensor_parallel,
            max_batch_size=spec.limits.max_batch_size,
            paged_context_fmha=spec.limits.paged_context_fmha,
            triton=TritonParams(),
            max_input_len=spec.limits.max_input_len,
            max_seq_len=spec.limits.max_seq_len,
            backend="pytorch",
            speculative=spec.speculative,
            max_num_tokens=spec.limits.max_num_tokens,
        )
    return ServingConfig(
        deployment=f"engine-{spec.key}",
        variant=spec.variant,
        engine_key=spec.key,
        artifact_dir=artifact_dir,
        tensor_parallel=spec.tensor_parallel,
        max_batch_size=spec.limits.max_batch_size,
        paged_context_fmha=spec.limits.paged_context_fmha,
        draft_len_per_beam=r.draft_len_per_beam if r and spec.variant == "redrafter" else 0,
        num_beams=r.num_beams if r and spec.variant == "redrafter" else 0,
        triton=TritonParams(),
    )


def copy_tokenizer(directory: Path, files: list[str], dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for name in files:
        shutil.copy2(directory / name, dest / name)  # follows HF snapshot symlinks


def verify_engine(spec: BuildSpec, engine_dir: Path) -> None:
    missing = [f for f in expected_engine_files(spec) if not (engine_dir / f).is_file()]
    if missing:
        raise BuildError(
            ExitCode.TOOL_FAILURE, f"trtllm-build exited 0 but {engine_dir.name}/ lacks {', '.join(missing)}"
        )


def assemble(
    spec: BuildSpec, settings: Settings, paths: CachePaths, tmp: Path, lock: KeyLock, log: Log
) -> dict[str, Any]:
    """Everything between owning the lock and publishing; returns the manifest written into ``tmp``."""
    record = Record()
    t0 = time.monotonic()
    sources = fetch_sources(spec, settings, log)
    arch: Architecture = resolve_architecture(spec.architecture, sources.base_config)
    record.add("fetch", time.monotonic() - t0)
    log(
        f"inputs valid: {arch} base, {spec.dtype}{' + fp8' if spec.quantization == 'fp8' else ''}, "
        f"TP {spec.tensor_parallel}, variant {spec.variant}"
    )
    check_disk(spec, sources, settings, log)

    layout = Layout(
        base_model_dir=str(sources.base.local_dir),
        drafter_model_dir=str(sources.drafter.local_dir) if sources.drafter else None,
        work_dir=str(tmp / WORK_DIR),
        engine_dir=str(tmp / ENGINE_DIR),
    )
    steps = plan_steps(spec, settings, arch, layout)
    for i, step in enumerate(steps, 1):
        if lock.lost.is_set():
            raise BuildError(ExitCode.LOCK_TIMEOUT, "another builder took over this engine's lock; stopping")
        log(f"step {i}/{len(steps)} {step.name}: {step.description}")
        seconds = run_step(step, log, settings.stderr_tail_lines)
        size = tree_size(step.output_dir)
        log(f"step {i}/{len(steps)} {step.name}: done in {format_seconds(seconds)}, output {human_bytes(size)}")
        record.add(step.name, seconds, list(step.argv), size)
    verify_engine(spec, Path(layout.engine_dir))

    final = str(paths.final)
    t1 = time.monotonic()
    copy_tokenizer(sources.tokenizer.local_dir, sources.tokenizer_files, tmp / TOKENIZER_DIR)
    from .model_repo import write_model_repository  # lazily: the other half of the artifact

    write_model_repository(
        tmp / MODEL_REPO_DIR,
        serving_config(spec, final),
        engine_dir=f"{final}/{ENGINE_DIR}",
        tokenizer_dir=f"{final}/{TOKENIZER_DIR}",
    )
    shutil.rmtree(tmp / WORK_DIR, ignore_errors=True)
    record.add("model-repository", time.monotonic() - t1)
    log(f"model repository written ({MODEL_REPO_DIR}/), tokenizer copied ({len(sources.tokenizer_files)} files)")

    engine_files = {p.name: p.stat().st_size for p in sorted(Path(layout.engine_dir).iterdir()) if p.is_file()}
    manifest = {
        "key": spec.key,
        "variant": spec.variant,
        "inputs": spec.inputs,
        "sources": {
            name: src.record()
            for name, src in (("base", sources.base), ("drafter", sources.drafter), ("tokenizer", sources.tokenizer))
            if src
        },
        "architecture": arch,
        "dtype": spec.dtype,
        "quantization": spec.quantization,
        "tensor_parallel": spec.tensor_parallel,
        "redrafter": spec.redrafter.model_dump() if spec.redrafter and spec.variant == "redrafter" else None,
        "limits": spec.limits.model_dump(),
        "tensorrt_llm_version": facts.tensorrt_llm_version(),
        "gpu": facts.gpu_info(settings.nvidia_smi),
        "tools": facts.tool_versions(settings.trtllm_build, settings.python),
        "builder": {**owner_identity(), "built_at": facts.utc_now()},
        "steps": record.steps,
        "sizes": {
            "engine_bytes": sum(engine_files.values()),
            "engine_files": engine_files,
            "artifact_bytes": tree_size(tmp),
        },
        "layout": {"engine": ENGINE_DIR, "tokenizer": TOKENIZER_DIR, "model_repository": MODEL_REPO_DIR},
        "contract_version": spec.contract_version,
    }
    write_json_atomic(tmp / MANIFEST_FILE, manifest)  # last: its presence means "complete"
    return manifest


def build(spec: BuildSpec, settings: Settings, log: Log) -> dict[str, Any]:
    """Publish ``<cache>/<key>/`` (or find it there); returns its manifest.

    A PyTorch-backend spec has no engine to build: :func:`engine_jobs.prepare.prepare` lays out its checkpoints.
    """
    if spec.backend == "pytorch":
        raise bad_input("a PyTorch-backend build spec is prepared, not built (engine_jobs.prepare)")
    validate_spec(spec)  # before the key becomes a path
    return produce(
        Path(spec.cache_dir),
        spec.key,
        f"engine {spec.key} ({spec.variant})",
        settings,
        log,
        lambda paths, tmp, lock: assemble(spec, settings, paths, tmp, lock, log),
    )


def produce(
    root: Path,
    key: str,
    what: str,
    settings: Settings,
    log: Log,
    assemble: Callable[[CachePaths, Path, KeyLock], dict[str, Any]],
) -> dict[str, Any]:
    """The cache's one way to make an artifact (an engine, a trained drafter): find ``<root>/<key>/`` complete,
    or take the key's lock (waiting for a live owner), ``assemble`` it into a temp directory with the manifest
    written last, and publish it atomically. Returns its manifest."""
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BuildError(
            ExitCode.OUT_OF_DISK if exc.errno == errno.ENOSPC else ExitCode.SOURCE_UNAVAILABLE,
            f"cache directory {root} is not usable: {exc.strerror}",
        ) from None
    paths = CachePaths(root, key)
    log(f"{what} -> {paths.final}")
    hit = read_manifest(paths)
    if hit is not None:
        built = hit.get("builder", {}).get("built_at", "?")
        log(f"cache hit: {paths.final} is complete (built {built}); nothing to do")
        return hit
    lock = KeyLock(
        paths.lock,
        stale_seconds=settings.lock_stale_seconds,
        heartbeat_seconds=settings.lock_heartbeat_seconds,
        log=log,
    )
    try:
        hit = acquire_or_wait(
            paths, lock, wait_seconds=settings.lock_wait_seconds, poll_seconds=settings.lock_poll_seconds, log=log
        )
    except PermissionError as exc:  # e.g. a claim not chowned to the pod's fsGroup: a retry cannot help
        raise BuildError(
            ExitCode.SOURCE_UNAVAILABLE,
            f"cache directory {root} is not writable by this pod's user: {exc.strerror} (give the "
            "pod an fsGroup the volume supports, or make the claim writable)",
        ) from None
    if hit is not None:
        log(f"cache hit: {paths.final} was completed by another builder; nothing to do")
        return hit
    lock.start_heartbeat()
    tmp = paths.new_tmp()
    try:
        remove_partials(paths, log)
        tmp.mkdir()
        try:
            manifest = assemble(paths, tmp, lock)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            raise BuildError(
                ExitCode.OUT_OF_DISK, f"the cache volume filled up while assembling {tmp.name}: {exc.strerror}"
            ) from None
        if lock.lost.is_set():
            raise BuildError(ExitCode.LOCK_TIMEOUT, f"another builder took over the lock of {key}; not publishing")
        publish(tmp, paths.final)
        size = (manifest.get("sizes") or {}).get("artifact_bytes") or tree_size(paths.final)
        log(f"published {paths.final} ({human_bytes(size)}) in {format_seconds(log.elapsed())}")
        return manifest
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        lock.release()
