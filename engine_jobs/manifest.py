"""Facts recorded in manifest.json: what was built, from what, with which tools, on which GPU.

An engine only loads with the TensorRT-LLM version and GPU architecture it was built for; recording
both lets the operator and users diagnose a mismatch instead of guessing.
"""

from __future__ import annotations

import importlib.metadata
import platform
import shutil
import subprocess
import time
from typing import Any

from .contract import CONTRACT_VERSION

UNKNOWN = "unknown"
NVIDIA_SMI_QUERY = ("--query-gpu=name,compute_cap", "--format=csv,noheader")


def package_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return UNKNOWN


def tensorrt_llm_version() -> str:
    """From the installed distribution's metadata (importing tensorrt_llm would initialise CUDA)."""
    version = package_version("tensorrt_llm")
    if version == UNKNOWN:
        version = package_version("tensorrt-llm")
    return version


def gpu_info(nvidia_smi: str) -> dict[str, Any]:
    """Product name and compute capability of the Job's GPUs, via ``nvidia-smi`` if present."""
    exe = shutil.which(nvidia_smi)
    if exe is None:
        return {"product": UNKNOWN, "compute_capability": UNKNOWN, "count": 0}
    try:
        out = subprocess.run([exe, *NVIDIA_SMI_QUERY], capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return {"product": UNKNOWN, "compute_capability": UNKNOWN, "count": 0}
    gpus = [[field.strip() for field in line.split(",")] for line in out.splitlines() if line.strip()]
    if not gpus or len(gpus[0]) < 2:
        return {"product": UNKNOWN, "compute_capability": UNKNOWN, "count": 0}
    return {"product": gpus[0][0], "compute_capability": gpus[0][1], "count": len(gpus)}


def tool_versions(trtllm_build: str, python: str) -> dict[str, str]:
    return {
        "tensorrt_llm": tensorrt_llm_version(),
        "tensorrt": package_version("tensorrt"),
        "huggingface_hub": package_version("huggingface_hub"),
        "boto3": package_version("boto3"),
        "engine_jobs_python": platform.python_version(),
        "converter_python": shutil.which(python) or python,
        "trtllm_build": shutil.which(trtllm_build) or trtllm_build,
        "engine_jobs_contract": str(CONTRACT_VERSION),
    }


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
