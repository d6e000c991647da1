"""Shared fixtures: the real control plane (one per test session) and a namespace per test on it; the emulated
API server on 127.0.0.1, a kubeconfig for it, and the pinned kubectl, for the tests not yet moved to it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from harness.chaos import APISERVER_ARGS
from harness.cluster import Kube, namespace_for_test, start_control_plane
from redrafter_sim.controlplane import ControlPlane
from redrafter_sim.server import EmulatorHandle, EmulatorThread, write_kubeconfig
from redrafter_sim.servingpods import POD_IPS_ENV

KUBECTL = Path(sys.executable).parent / "kubectl"

Kubectl = Callable[..., "subprocess.CompletedProcess[str]"]


def _worker_pod_ips() -> None:
    """Under pytest-xdist each worker runs clusters of its own: give each a share of the nodes' 127.0.0.N pod IPs,
    so that two workers' serving pods never race for one address."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    if worker and count > 1:
        share = (250 - 10 + 1) // count
        first = 10 + int(worker.removeprefix("gw")) * share
        os.environ[POD_IPS_ENV] = f"{first}-{first + share - 1}"


_worker_pod_ips()


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """etcd, kube-apiserver, kube-controller-manager and kube-scheduler (``make controlplane`` builds them),
    started once for the session with the project's CRDs installed."""
    try:
        cp = start_control_plane(tmp_path_factory.mktemp("controlplane"))
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="session")
def chaos_control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A control plane of its own for the tests that restart kube-apiserver and etcd and compact etcd, started
    as the fault campaign starts it (``chaos.APISERVER_ARGS``: the CRD's and Jobs' watches served from etcd)."""
    try:
        cp = start_control_plane(tmp_path_factory.mktemp("chaos-controlplane"), APISERVER_ARGS)
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield cp
    finally:
        cp.stop()


@pytest.fixture
def chaos_kube(chaos_control_plane: ControlPlane, tmp_path: Path) -> Iterator[Kube]:
    """A namespace of this test's own on the chaos control plane."""
    with namespace_for_test(chaos_control_plane, tmp_path / "kube") as k:
        yield k


@pytest.fixture
def kube(control_plane: ControlPlane, tmp_path: Path) -> Iterator[Kube]:
    """A namespace of this test's own on the real control plane, with kubectl bound to it as the admin."""
    with namespace_for_test(control_plane, tmp_path / "kube") as k:
        yield k


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
