"""Shared fixtures: an emulated API server on 127.0.0.1, a kubeconfig for it, and the pinned kubectl."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from redrafter_sim.server import EmulatorHandle, EmulatorThread, write_kubeconfig

KUBECTL = Path(sys.executable).parent / "kubectl"

Kubectl = Callable[..., "subprocess.CompletedProcess[str]"]


@pytest.fixture
def apiserver() -> Iterator[EmulatorHandle]:
    """A fresh emulated API server in a background thread: ``.url`` and ``.emulator`` (log, faults, objects)."""
    thread = EmulatorThread()
    handle = thread.start()
    try:
        yield handle
    finally:
        thread.stop()


@pytest.fixture
def kubeconfig(apiserver: EmulatorHandle, tmp_path: Path) -> Path:
    """A kubeconfig file pointing at the emulated API server."""
    return write_kubeconfig(apiserver.url, tmp_path / "kubeconfig")


@pytest.fixture
def kubectl(kubeconfig: Path, tmp_path: Path) -> Kubectl:
    """Run the pinned kubectl against the emulator: ``kubectl("get", "ns")`` or ``kubectl([...], input=...)``."""
    if not KUBECTL.exists():
        pytest.skip(f"pinned kubectl not found at {KUBECTL}")
    cache = tmp_path / "kubectl-cache"

    def run(
        *argv: str | list[str], input: str | None = None, timeout: float = 60, check: bool = False
    ) -> subprocess.CompletedProcess[str]:
        args = list(argv[0]) if len(argv) == 1 and isinstance(argv[0], list) else [str(a) for a in argv]
        env = {**os.environ, "KUBECONFIG": str(kubeconfig), "HOME": str(tmp_path)}
        cmd = [str(KUBECTL), "--kubeconfig", str(kubeconfig), "--cache-dir", str(cache), *args]
        result = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout, env=env)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
        return result

    return run
