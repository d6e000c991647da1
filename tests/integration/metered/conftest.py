"""The policy tests' fixtures: the lifecycle cluster whose serving pods serve metrics on their pod IPs and see
traffic (:mod:`harness.metered`), and the operator whose every speculation evaluation is recorded."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from harness.metered import MeteredCluster, WatchedOperator, metered_cluster, watched_operator
from redrafter_sim.controlplane import ControlPlane


@pytest.fixture
async def cluster(control_plane: ControlPlane, tmp_path: Path) -> AsyncIterator[MeteredCluster]:
    async with metered_cluster(control_plane, tmp_path / "cluster") as c:
        yield c


@pytest.fixture
async def operator(cluster: MeteredCluster) -> AsyncIterator[WatchedOperator]:
    async with watched_operator(cluster) as op:
        yield op
