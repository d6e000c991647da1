"""Shared fixtures: the real control plane (one per test session, per xdist worker) and a namespace per test on it;
a second control plane for the tests that restart and compact it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.chaos import APISERVER_ARGS
from harness.cluster import Kube, delete_namespace, namespace_for_test, new_namespace, start_control_plane
from harness.lifecycle import RESTRICTED
from redrafter_sim.controlplane import ControlPlane
from redrafter_sim.servingpods import POD_IPS_ENV


def _worker_pod_ips() -> None:
    """Under pytest-xdist each worker runs clusters of its own: give each a share of the nodes' 127.0.0.N pod IPs,
    so that two workers' serving pods never race for one address."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    if worker and count > 1:
        share = (250 - 10 + 1) // count
        first = 10 + int(worker.removeprefix("gw")) * share
        os.environ[POD_IPS_ENV] = f"{first}-{first + share - 1}"


_worker_pod_ips()
# Several workers, each with its servers and training subprocesses, share few cores: one OpenMP thread per process
# (torch's CPU kernels), instead of one per core spinning while it waits for the others, saves a fifth of the
# training's CPU time on an idle machine and more on a busy one. A test that wants threads sets them itself.
os.environ.setdefault("OMP_NUM_THREADS", "1")


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
def restricted(control_plane: ControlPlane, tmp_path: Path) -> Iterator[Kube]:
    """A namespace of this test's own, labelled to enforce Pod Security ``restricted:latest``, with its default
    ServiceAccount (the ServiceAccount admission refuses a pod before it exists)."""
    kube = new_namespace(control_plane, tmp_path / "kube", RESTRICTED)
    try:
        kube.wait("/api/v1/namespaces/{ns}/serviceaccounts/default", bool, what="the default ServiceAccount")
        yield kube
    finally:
        delete_namespace(kube)
