"""A few seeded fault episodes in the suite (bench/chaos.py runs the campaign): the operator, run as processes
against the emulated API server under 5xx, 429, 409, latency, cut and expired watches, outages, API server
restarts and SIGKILLs, converges with no duplicate Job, no lost switch, no crash, no write by a non-leader
and no idle write."""

from __future__ import annotations

from pathlib import Path

import pytest

from redrafter_sim.chaos import FAULTS, run_episode


@pytest.mark.parametrize(("seed", "replicas"), [(0, 1), (1, 2)])
async def test_a_seeded_fault_episode_converges_cleanly(seed: int, replicas: int, tmp_path: Path) -> None:
    ep = await run_episode(seed, tmp_path, replicas=replicas, fault_seconds=5.0, idle_seconds=1.5)
    assert sum(ep.faults.values()) >= 4, ep.faults  # the schedule did inject
    assert set(ep.faults) <= set(FAULTS)
    assert ep.converged, ep.detail
    assert (ep.duplicate_jobs, ep.history_errors, ep.crashes, ep.non_leader_writes, ep.idle_writes) == (
        0,
        0,
        0,
        0,
        0,
    ), ep.detail
