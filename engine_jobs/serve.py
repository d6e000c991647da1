"""The serving pod's launcher: build the model repository from serving.json, then run Triton.

The engine volume is read-only, so the repository is written to a writable directory at every start
(serving-only changes never need a rebuild). TP=1 runs one tritonserver in the foreground; TP>1 runs
one tritonserver per GPU under ``mpirun`` (rank 0 serves HTTP/gRPC/metrics, the other ranks load only
tensorrt_llm with every endpoint off), as tensorrtllm_backend's scripts/launch_triton_server.py does.
Next to Triton runs the OpenAI-compatible front (``python -m engine_jobs openai``, port ``openai``)
over Triton's gRPC port on localhost. SIGTERM/SIGINT are forwarded to both, so each drains in-flight
requests (Triton: ``--exit-timeout-secs``; the front: the same timeout); if either exits on its own
the other is stopped and the pod's container exits, so it restarts as one.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from .contract import (
    ENGINE_DIR,
    ENGINE_MODEL,
    GRPC_PORT,
    HTTP_PORT,
    METRICS_PORT,
    OPENAI_PORT,
    TOKENIZER_DIR,
    ServingConfig,
)
from .model_repo import write_model_repository


@dataclass(frozen=True)
class LaunchSettings:
    """Where the binaries are and how Triton listens (environment-overridable in the image)."""

    tritonserver: str = "/opt/tritonserver/bin/tritonserver"
    mpirun: str = "mpirun"
    model_repo_dir: str = "/tmp/redrafter/model_repo"
    backend_dir: str | None = None  # None: Triton's default (/opt/tritonserver/backends)
    host: str = "0.0.0.0"
    http_port: int = HTTP_PORT
    grpc_port: int = GRPC_PORT
    metrics_port: int = METRICS_PORT
    openai_port: int = OPENAI_PORT
    exit_timeout_secs: int = 30
    log_verbose: int = 0
    #: upstream's llmapi model code in the PyTorch path's runtime image (images/triton-runtime.Dockerfile)
    llmapi_model_dir: str = "/opt/redrafter/llmapi"

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> "LaunchSettings":
        env = dict(os.environ if env is None else env)
        d = cls()
        return cls(
            tritonserver=env.get("REDRAFTER_TRITONSERVER", d.tritonserver),
            mpirun=env.get("REDRAFTER_MPIRUN", d.mpirun),
            model_repo_dir=env.get("REDRAFTER_MODEL_REPO_DIR", d.model_repo_dir),
            backend_dir=env.get("REDRAFTER_BACKEND_DIR") or d.backend_dir,
            exit_timeout_secs=int(env.get("REDRAFTER_EXIT_TIMEOUT_SECS", d.exit_timeout_secs)),
            log_verbose=int(env.get("REDRAFTER_LOG_VERBOSE", d.log_verbose)),
            llmapi_model_dir=env.get("REDRAFTER_LLMAPI_MODEL_DIR", d.llmapi_model_dir),
        )


#: where Triton's HTTP and gRPC ports listen when the pod's API needs keys: only the pod itself reaches them
LOOPBACK = "127.0.0.1"


def rank_argv(
    s: LaunchSettings, repo: str, rank: int, shm_prefix: str = "prefix", *, private: bool = False
) -> list[str]:
    """One tritonserver's argv for ``rank`` (0 serves clients; others only run their engine shard).

    ``private`` (the pod's OpenAI API requires API keys): rank 0's HTTP and gRPC ports listen on the
    loopback address only, so nothing outside the pod bypasses the keys through Triton's unauthenticated
    protocols (``--http-address``/``--grpc-address``, Triton 2.61 src/command_line_parser.cc); the metrics
    port stays on ``s.host`` for scrapers, as the front's /metrics is open too."""
    api_host = LOOPBACK if private else s.host
    argv = [
        s.tritonserver,
        f"--model-repository={repo}",
        "--disable-auto-complete-config",
        f"--backend-config=python,shm-region-prefix-name={shm_prefix}{rank}_",
    ]
    if s.backend_dir:
        argv.append(f"--backend-directory={s.backend_dir}")
    if rank == 0:
        argv += [
            f"--http-address={api_host}",
            f"--http-port={s.http_port}",
            f"--grpc-address={api_host}",
            f"--grpc-port={s.grpc_port}",
            "--allow-metrics=true",
            f"--metrics-address={s.host}",
            f"--metrics-port={s.metrics_port}",
            "--allow-gpu-metrics=false",
            "--allow-cpu-metrics=false",
            "--metrics-interval-ms=1000",
            # nv_inference_first_response_histogram_ms of decoupled models (triton-inference-server/core r25.09
            # src/metric_model_reporter.cc; since r24.11, older servers ignore the setting): the decoupled entry
            # model's first response is a streaming request's first token
            "--metrics-config=histogram_latencies=true",
            f"--exit-timeout-secs={s.exit_timeout_secs}",
        ]
        if s.log_verbose:
            argv.append(f"--log-verbose={s.log_verbose}")
    else:
        argv += [
            "--allow-http=false",
            "--allow-grpc=false",
            "--allow-metrics=false",
            "--model-control-mode=explicit",
            f"--load-model={ENGINE_MODEL}",
            "--log-info=false",
            "--log-warning=false",
            f"--exit-timeout-secs={s.exit_timeout_secs}",
        ]
    return argv


def launch_argv(s: LaunchSettings, repo: str, tensor_parallel: int, *, private: bool = False) -> list[str]:
    """The whole command: tritonserver alone for TP=1, an MPMD mpirun with one rank per GPU otherwise."""
    if tensor_parallel < 1:
        raise ValueError("tensor_parallel must be >= 1")
    if tensor_parallel == 1:
        return rank_argv(s, repo, 0, private=private)
    argv = [s.mpirun, "--allow-run-as-root"]
    for rank in range(tensor_parallel):
        if rank:
            argv.append(":")
        argv += ["-n", "1", *rank_argv(s, repo, rank, private=private)]
    return argv


def load_serving_config(path: str | os.PathLike[str]) -> ServingConfig:
    try:
        return ServingConfig.model_validate_json(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SystemExit(f"serving config {path} not found (is the ConfigMap mounted?)") from None


def prepare(cfg: ServingConfig, s: LaunchSettings) -> list[str]:
    """Write the repository for ``cfg`` and return the argv that serves it."""
    artifact = cfg.artifact_dir.rstrip("/")
    write_model_repository(
        Path(s.model_repo_dir),
        cfg,
        f"{artifact}/{ENGINE_DIR}",
        f"{artifact}/{TOKENIZER_DIR}",
        llmapi_model_dir=s.llmapi_model_dir,
    )
    # The PyTorch backend's LLM starts its own tensor-parallel workers: one tritonserver, never mpirun.
    ranks = cfg.tensor_parallel if cfg.backend == "tensorrt" else 1
    return launch_argv(s, s.model_repo_dir, ranks, private=cfg.api_keys_dir is not None)


def front_argv(s: LaunchSettings, config_path: str) -> list[str]:
    """The OpenAI-compatible front of this pod, calling rank 0's gRPC port on the pod's own address (the
    loopback address when Triton listens on every address, or only there: see :func:`rank_argv`)."""
    grpc_host = LOOPBACK if s.host in ("0.0.0.0", "::", "") else s.host
    return [
        sys.executable,
        "-m",
        "engine_jobs",
        "openai",
        "--config",
        config_path,
        "--host",
        s.host,
        "--port",
        str(s.openai_port),
        "--grpc-url",
        f"{grpc_host}:{s.grpc_port}",
        "--shutdown-timeout",
        str(s.exit_timeout_secs),
    ]


def run_together(argvs: list[list[str]], poll_seconds: float = 0.2) -> int:
    """Run every argv; forward SIGTERM/SIGINT to all (graceful drain); if one exits unasked, stop the
    others. Returns the first non-zero exit code (0 when all exited cleanly)."""
    procs: list[subprocess.Popen[bytes]] = [subprocess.Popen(argv) for argv in argvs]
    stopping = False

    def forward(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    first_exit: int | None = None
    try:
        while any(p.poll() is None for p in procs):
            exited = [p for p in procs if p.poll() is not None]
            if exited and not stopping:
                first_exit = exited[0].returncode
                print(
                    f"redrafter serve: {argvs[procs.index(exited[0])][0]} exited with {first_exit}; stopping the rest",
                    file=sys.stderr,
                    flush=True,
                )
                forward(signal.SIGTERM, None)
            time.sleep(poll_seconds)
        codes = [p.wait() for p in procs]
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if first_exit is not None:
        return first_exit or 1  # a component that stops unasked is a failure even with status 0
    return next((c for c in codes if c), 0)


def serve(config_path: str, settings: LaunchSettings | None = None) -> int:
    s = settings or LaunchSettings.from_env()
    cfg = load_serving_config(config_path)
    argv = prepare(cfg, s)
    print(
        f"redrafter serve: {cfg.deployment}/{cfg.variant} engine {cfg.engine_key} TP={cfg.tensor_parallel}",
        file=sys.stderr,
        flush=True,
    )
    return run_together([argv, front_argv(s, config_path)])


def add_serve_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``python -m engine_jobs serve --config /etc/redrafter/serving.json`` (the serving pod's command)."""
    import argparse

    from .contract import CONFIG_MOUNT, SERVING_CONFIG_FILE

    p = sub.add_parser(
        "serve",
        help="write the Triton model repository and run tritonserver in the foreground",
        description=__doc__ + "\nEnvironment: REDRAFTER_TRITONSERVER, REDRAFTER_MPIRUN, REDRAFTER_MODEL_REPO_DIR, "
        "REDRAFTER_BACKEND_DIR, REDRAFTER_EXIT_TIMEOUT_SECS, REDRAFTER_LOG_VERBOSE.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", default=f"{CONFIG_MOUNT}/{SERVING_CONFIG_FILE}", help="serving.json path")
    p.add_argument("--dry-run", action="store_true", help="write the repository and print the argv, do not run")
    p.set_defaults(func=_cmd_serve)


def add_openai_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``python -m engine_jobs openai --config serving.json`` (started by ``serve`` next to Triton)."""
    from .contract import CONFIG_MOUNT, SERVING_CONFIG_FILE

    p = sub.add_parser("openai", help="serve the OpenAI-compatible API over Triton's gRPC endpoint")
    p.add_argument("--config", default=f"{CONFIG_MOUNT}/{SERVING_CONFIG_FILE}", help="serving.json path")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=OPENAI_PORT)
    p.add_argument("--grpc-url", default=f"127.0.0.1:{GRPC_PORT}", help="Triton's gRPC endpoint host:port")
    p.add_argument("--tokenizer-dir", default=None, help="default: <artifact_dir>/tokenizer")
    p.add_argument("--api-keys-dir", default=None, help="default: the config's api_keys_dir (the mounted Secret)")
    p.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        help="seconds in-flight requests may take to finish after SIGTERM",
    )
    p.set_defaults(func=_cmd_openai)


def _cmd_openai(args: argparse.Namespace) -> int:
    from .openai_api import run

    run(
        load_serving_config(args.config),
        host=args.host,
        port=args.port,
        grpc_url=args.grpc_url,
        tokenizer_dir=args.tokenizer_dir,
        shutdown_timeout=args.shutdown_timeout,
        api_keys_dir=args.api_keys_dir,
    )
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    if args.dry_run:
        import json

        print(json.dumps(prepare(load_serving_config(args.config), LaunchSettings.from_env())))
        return 0
    return serve(args.config)
