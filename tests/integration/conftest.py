"""The lifecycle tests' fixtures: a namespace with GPU nodes whose pods the test drives (:mod:`harness.lifecycle`)
on the session's control plane, the operator in-process under the chart's identity, and kubectl as the admin."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from harness.lifecycle import Cluster, LifecycleOperator, running_cluster, running_operator
from redrafter_sim.controlplane import ControlPlane


@pytest.fixture
async def cluster(control_plane: ControlPlane, tmp_path: Path) -> AsyncIterator[Cluster]:
    async with running_cluster(control_plane, tmp_path / "cluster") as c:
        yield c


@pytest.fixture
async def operator(cluster: Cluster) -> AsyncIterator[LifecycleOperator]:
    async with running_operator(cluster, resync=1.0) as op:
        yield op


@pytest.fixture
def kubectl(cluster: Cluster) -> Any:
    """kubectl as the admin, in the test's namespace."""
    return cluster.kubectl
