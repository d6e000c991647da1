"""Settings of the builder that differ per image or per cluster, read from environment variables.

Defaults match the builder image layout (TensorRT-LLM installed with pip, its examples at
``/app/tensorrt_llm/examples`` as in NVIDIA's TensorRT-LLM release containers, ``trtllm-build`` on
PATH). Every variable is documented in :data:`ENV_VARS`, which ``python -m engine_jobs plan`` prints.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from . import contract

#: name -> (default shown to users, meaning)
ENV_VARS: dict[str, tuple[str, str]] = {
    "REDRAFTER_TRTLLM_EXAMPLES": ("/app/tensorrt_llm/examples", "TensorRT-LLM examples root (converters, quantize.py)"),
    "REDRAFTER_PYTHON": ("python3", "interpreter that runs the converter scripts"),
    "REDRAFTER_TRTLLM_BUILD": ("trtllm-build", "trtllm-build executable (name on PATH or absolute path)"),
    "REDRAFTER_NVIDIA_SMI": ("nvidia-smi", "nvidia-smi executable, used to record the GPU in the manifest"),
    "REDRAFTER_DOWNLOAD_DIR": (
        "",
        "hf:// and s3:// download cache; empty = huggingface_hub's default (HF_HOME) and <cache>/.s3 for s3://",
    ),
    "REDRAFTER_SOURCES_MOUNT": (contract.SOURCES_MOUNT, "where pvc:// claims are mounted"),
    "REDRAFTER_TERMINATION_LOG": (contract.TERMINATION_LOG, "termination-message file read by Kubernetes"),
    "REDRAFTER_LOCK_STALE_SECONDS": ("180", "a lock whose heartbeat is older than this is taken over"),
    "REDRAFTER_LOCK_HEARTBEAT_SECONDS": ("15", "how often the lock owner refreshes its heartbeat"),
    "REDRAFTER_LOCK_WAIT_SECONDS": ("21600", "how long a second builder waits for a live owner"),
    "REDRAFTER_LOCK_POLL_SECONDS": ("5", "how often a waiting builder looks at the lock and the manifest"),
    "REDRAFTER_DISK_RESERVE_BYTES": ("0", "free space to keep on the cache volume beyond the estimate"),
    "REDRAFTER_FP8_CALIB_SIZE": ("512", "quantize.py --calib_size for FP8"),
    "REDRAFTER_FP8_CALIB_DATASET": ("", "quantize.py --calib_dataset (local dir or HF dataset); empty = its default"),
    "REDRAFTER_STDERR_TAIL_LINES": ("40", "lines of a failed tool's output kept for the termination message"),
}


@dataclass(frozen=True)
class Settings:
    examples_root: str
    python: str
    trtllm_build: str
    nvidia_smi: str
    download_dir: str | None
    sources_mount: str
    termination_log: str
    lock_stale_seconds: float
    lock_heartbeat_seconds: float
    lock_wait_seconds: float
    lock_poll_seconds: float
    disk_reserve_bytes: int
    fp8_calib_size: int
    fp8_calib_dataset: str | None
    stderr_tail_lines: int

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env

        def get(name: str) -> str:
            return env.get(name, "") or ENV_VARS[name][0]

        def number(name: str, kind: type[float] | type[int]) -> float | int:
            raw = get(name)
            try:
                value: float | int = kind(raw)
            except ValueError:
                raise ValueError(f"{name}={raw!r} is not a valid {kind.__name__}") from None
            if value < 0:
                raise ValueError(f"{name}={raw!r} must not be negative")
            return value

        return cls(
            examples_root=get("REDRAFTER_TRTLLM_EXAMPLES"),
            python=get("REDRAFTER_PYTHON"),
            trtllm_build=get("REDRAFTER_TRTLLM_BUILD"),
            nvidia_smi=get("REDRAFTER_NVIDIA_SMI"),
            download_dir=get("REDRAFTER_DOWNLOAD_DIR") or None,
            sources_mount=get("REDRAFTER_SOURCES_MOUNT"),
            termination_log=get("REDRAFTER_TERMINATION_LOG"),
            lock_stale_seconds=number("REDRAFTER_LOCK_STALE_SECONDS", float),
            lock_heartbeat_seconds=number("REDRAFTER_LOCK_HEARTBEAT_SECONDS", float),
            lock_wait_seconds=number("REDRAFTER_LOCK_WAIT_SECONDS", float),
            lock_poll_seconds=number("REDRAFTER_LOCK_POLL_SECONDS", float),
            disk_reserve_bytes=int(number("REDRAFTER_DISK_RESERVE_BYTES", int)),
            fp8_calib_size=int(number("REDRAFTER_FP8_CALIB_SIZE", int)),
            fp8_calib_dataset=get("REDRAFTER_FP8_CALIB_DATASET") or None,
            stderr_tail_lines=int(number("REDRAFTER_STDERR_TAIL_LINES", int)),
        )


def describe() -> str:
    """One line per variable: name, default, meaning."""
    return "\n".join(
        f"  {name} (default {default or '<empty>'}): {meaning}" for name, (default, meaning) in ENV_VARS.items()
    )
