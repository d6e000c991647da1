"""The training Job: cache check -> lock -> fetch base and prompts -> train (the recipe) -> verify -> publish.

The thin I/O shell around :mod:`engine_jobs.drafter` (which runs as its own process, one per GPU under
``torchrun``), with the engines' cache semantics (:func:`engine_jobs.build.produce`): a drafter is trained
once per key, under a lock with a heartbeat, published atomically at ``<cache>/drafters/<key>/`` with its
manifest written last. While it runs, this process serves the worker's progress over HTTP for the operator.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from . import manifest as facts
from .build import produce
from .cache import CachePaths, KeyLock, free_bytes, owner_identity, write_json_atomic
from .contract import (
    DRAFTER_EVALUATION_FILE,
    DRAFTERS_DIR,
    MANIFEST_FILE,
    TRAINING_PROGRESS_PATH,
    TRAINING_PROGRESS_PORT,
    TrainingProgress,
    TrainSpec,
)
from .errors import BuildError, ExitCode, bad_input
from .fetch import fetch
from .plan import KEY_PATTERN, Step
from .progress import Log, format_seconds, human_bytes, tree_size
from .runner import run_step
from .settings import Settings
from .validate import validate_base

WORK_DIR = "work"
PROGRESS_FILE = "progress.json"
PROMPTS_FILE = "prompts.jsonl"
#: float32 head weights and optimizer state, plus room for the distilled data and logs
BYTES_PER_PARAMETER = 16
HEADROOM_BYTES = 256 * 1024 * 1024


def load_train_spec(path: str | os.PathLike[str]) -> TrainSpec:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise bad_input(f"cannot read training spec {path}: {exc.strerror}") from None
    try:
        spec = TrainSpec.model_validate_json(text)
    except ValueError as exc:
        first = str(exc).splitlines()
        raise bad_input(f"training spec {path} is invalid: {' '.join(first[:3])}", str(exc)) from None
    if not KEY_PATTERN.fullmatch(spec.key):  # before the key becomes a path
        raise bad_input(f"training spec {path}: key {spec.key!r} is not a cache key")
    return spec


class ProgressServer:
    """Serves the worker's latest progress (the file it rewrites atomically) at TRAINING_PROGRESS_PATH."""

    def __init__(self, progress_file: Path, host: str, port: int) -> None:
        self.progress_file = progress_file
        self.phase = TrainingProgress(phase="fetching")
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                if self.path.split("?", 1)[0] != TRAINING_PROGRESS_PATH:
                    self.send_error(404, "only " + TRAINING_PROGRESS_PATH)
                    return
                body = outer.current().model_dump_json(by_alias=True).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # the operator reads every 30 s: no log
                pass

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, name="progress", daemon=True)

    def current(self) -> TrainingProgress:
        """The worker's progress once it wrote some, else the phase this process is in."""
        try:
            return TrainingProgress.model_validate_json(self.progress_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return self.phase

    def __enter__(self) -> ProgressServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def progress_server(progress_file: Path, log: Log) -> ProgressServer | None:
    """The server on the pod's IP (POD_IP, from the downward API) or all interfaces; None if the port is taken
    (progress is a convenience: training goes on without it)."""
    host = os.environ.get("POD_IP") or "0.0.0.0"
    port = int(os.environ.get("REDRAFTER_PROGRESS_PORT") or TRAINING_PROGRESS_PORT)
    try:
        server = ProgressServer(progress_file, host, port)
    except OSError as exc:
        log(f"progress: cannot listen on {host}:{port} ({exc.strerror}); training without a progress endpoint")
        return None
    log(f"progress: http://{host}:{port}{TRAINING_PROGRESS_PATH}")
    return server


def estimate_required_bytes(base_config: dict[str, Any], spec: TrainSpec) -> int:
    hidden = int(base_config.get("hidden_size") or 0)
    vocab = int(base_config.get("vocab_size") or 0)
    exit_dim = spec.recipe.exit_dim or 2 * hidden
    params = 2 * hidden * exit_dim + spec.recipe.layers * exit_dim * exit_dim + exit_dim * vocab + 2 * hidden * hidden
    return params * BYTES_PER_PARAMETER + HEADROOM_BYTES


def worker_argv(spec: TrainSpec, gpus: int, base_dir: Path, prompts: Path, out: Path, progress: Path) -> list[str]:
    """The recipe's process: one, or one per GPU under torchrun (data parallel)."""
    args = [
        "-m",
        "engine_jobs.drafter",
        "--base",
        str(base_dir),
        "--prompts",
        str(prompts),
        "--recipe",
        spec.recipe.model_dump_json(),
        "--out",
        str(out),
        "--progress",
        str(progress),
    ]
    if gpus > 1:
        return ["torchrun", "--standalone", f"--nproc_per_node={gpus}", *args]
    return [sys.executable, *args]


def assemble(spec: TrainSpec, settings: Settings, tmp: Path, lock: KeyLock, log: Log) -> dict[str, Any]:
    from .drafter.baselines import summary_line
    from .drafter.export import check_drafter_dir
    from .drafter.prompts import load_prompts

    work = tmp / WORK_DIR
    work.mkdir()
    progress = work / PROGRESS_FILE
    server = progress_server(progress, log)
    with server if server is not None else contextlib.nullcontext():
        t0 = time.monotonic()
        where: dict[str, Any] = {
            "sources_mount": settings.sources_mount,
            "download_dir": settings.download_dir,
            "cache_dir": spec.cache_dir,
            "log": log,
        }
        base = fetch("base", spec.base, **where)
        base_config = validate_base(base.local_dir)
        dataset = fetch("dataset", spec.dataset, **where)
        prompts = load_prompts(dataset.local_dir, spec.column, spec.samples)
        log(f"dataset: {len(prompts)} prompts from column {spec.column!r} (asked for {spec.samples})")
        with open(work / PROMPTS_FILE, "w", encoding="utf-8") as fh:
            for text in prompts:
                fh.write(json.dumps({"text": text}) + "\n")
        need = estimate_required_bytes(base_config, spec) + settings.disk_reserve_bytes
        free = free_bytes(tmp)
        if free < need:
            raise BuildError(
                ExitCode.OUT_OF_DISK,
                f"not enough free space on the cache volume: about {human_bytes(need)} needed, {human_bytes(free)} free",
            )
        fetched = time.monotonic() - t0
        if lock.lost.is_set():
            raise BuildError(ExitCode.LOCK_TIMEOUT, "another trainer took over this drafter's lock; stopping")
        gpus = spec.gpus
        argv = worker_argv(spec, gpus, base.local_dir, work / PROMPTS_FILE, tmp, progress)
        log(f"training: {' '.join(argv[:3])} ... ({gpus} GPU{'s' if gpus != 1 else ''})")
        seconds = run_step(
            Step("train", tuple(argv), str(tmp), "self-distillation and training of the ReDrafter head"),
            log,
            settings.stderr_tail_lines,
            passthrough=(ExitCode.BAD_INPUT, ExitCode.OUT_OF_DISK),
        )
        if server is not None:
            server.phase = TrainingProgress(phase="publishing")
    try:
        check_drafter_dir(tmp)
    except ValueError as exc:
        raise BuildError(
            ExitCode.TOOL_FAILURE, f"the trainer exited 0 but its output is not a drafter: {exc}"
        ) from None
    evaluation = json.loads((tmp / DRAFTER_EVALUATION_FILE).read_text(encoding="utf-8"))
    shutil.rmtree(work, ignore_errors=True)
    log(f"trained in {format_seconds(seconds)}: tokens per step {evaluation.get('tokensPerStep')}")
    log(summary_line(evaluation))
    manifest = {
        "key": spec.key,
        "variant": "drafter",  # what `cache ls` shows, and what retention groups by
        "inputs": spec.inputs,
        "sources": {"base": base.record(), "dataset": dataset.record()},
        "recipe": spec.recipe.model_dump(),
        "samples": len(prompts),
        "gpus": gpus,
        "evaluation": evaluation,
        "gpu": facts.gpu_info(settings.nvidia_smi),
        "builder": {**owner_identity(), "built_at": facts.utc_now()},
        "steps": [{"name": "fetch", "seconds": round(fetched, 3)}, {"name": "train", "seconds": round(seconds, 3)}],
        "sizes": {"artifact_bytes": tree_size(tmp)},
        "contract_version": spec.contract_version,
    }
    write_json_atomic(tmp / MANIFEST_FILE, manifest)  # last: its presence means "complete"
    return manifest


def train(spec: TrainSpec, settings: Settings, log: Log) -> dict[str, Any]:
    """Publish ``<cache>/drafters/<key>/`` (or find it there); returns its manifest."""

    def make(paths: CachePaths, tmp: Path, lock: KeyLock) -> dict[str, Any]:
        return assemble(spec, settings, tmp, lock, log)

    return produce(Path(spec.cache_dir) / DRAFTERS_DIR, spec.key, f"drafter {spec.key}", settings, log, make)
