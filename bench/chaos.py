"""Fault campaign: N seeded episodes of the whole lifecycle under control-plane faults, and the table they make.

Each episode (``tests/harness/chaos.py``) runs the unmodified operator as processes, under the chart's
ServiceAccount and RBAC, through a fault proxy to the real kube-apiserver (etcd, the controller manager and the
scheduler behind it; the simulated node runs the Jobs' pods and real Triton for the serving pods): apply, both
builds, (validation with ``--validate``), Serving on ReDrafter, a switch to base and back, while a seeded
schedule injects 5xx bursts, 429 + Retry-After, 409 storms, latency, cut and reset watches and outages through the
proxy, and for real: etcd compactions (kube-apiserver's own 410s), a kube-apiserver or etcd restart, SIGKILLs of
the operator (two replicas with leader election in about a third of the episodes, the kills then mostly hitting
the leader). Targets: every episode converged, and 0 in every other column.

Run: ``python bench/chaos.py`` (50 episodes, seeds 0..49; one control plane for the campaign, a namespace per
episode), ``--episodes N``, ``--first-seed S``, ``--fault-seconds F``, ``--validate``, ``--json`` (one line per
episode, then the summary). Needs ``make controlplane`` (or ``REDRAFTER_CONTROLPLANE_BIN``). Prints figures;
asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "sim"), str(ROOT / "tests")]

from harness.chaos import FAULTS, ChaosCluster, Episode, run_episode  # noqa: E402

COLUMNS = ("duplicate_jobs", "history_errors", "crashes", "non_leader_writes", "idle_writes")


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (None for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def table(episodes: list[Episode]) -> str:
    n = len(episodes)
    converged = [e for e in episodes if e.converged]
    times = [e.converge_s for e in converged if e.converge_s is not None]
    faults: Counter[str] = Counter()
    for e in episodes:
        faults.update(e.faults)
    p50, p99 = percentile(times, 50), percentile(times, 99)
    rows = [
        ("episodes (two replicas)", f"{n} ({sum(1 for e in episodes if e.replicas > 1)})"),
        ("reached the intended state", f"{len(converged)}/{n} ({100 * len(converged) / max(1, n):.0f}%)"),
        ("time to converge after the faults, p50", f"{p50:.2f} s" if p50 is not None else "-"),
        ("time to converge after the faults, p99", f"{p99:.2f} s" if p99 is not None else "-"),
        ("duplicate Jobs", str(sum(e.duplicate_jobs for e in episodes))),
        ("lost or reordered status.history entries", str(sum(e.history_errors for e in episodes))),
        ("operator crashes (not the injected kills)", str(sum(e.crashes for e in episodes))),
        ("writes by a non-leader", str(sum(e.non_leader_writes for e in episodes))),
        ("idle writes once settled after the faults", str(sum(e.idle_writes for e in episodes))),
        ("(writes while settling, before the quiet check)", str(sum(e.settle_writes for e in episodes))),
        ("(idle status writes of the policy's evaluation alone)", str(sum(e.policy_writes for e in episodes))),
        ("(leaders that lost their Lease and exited 1)", str(sum(e.lease_exits for e in episodes))),
        ("(ERROR 410 events kube-apiserver sent the operator)", str(sum(e.expired_watches for e in episodes))),
        ("faults injected", ", ".join(f"{k} {faults[k]}" for k in FAULTS)),
    ]
    width = max(len(r[0]) for r in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


async def campaign(args: argparse.Namespace) -> list[Episode]:
    out: list[Episode] = []
    root = Path(tempfile.mkdtemp(prefix="chaos-"))
    started = time.monotonic()
    async with ChaosCluster(root / "cluster") as cl:
        print(f"control plane, node and proxy up in {time.monotonic() - started:.0f} s ({root})", flush=True)
        for seed in range(args.first_seed, args.first_seed + args.episodes):
            out.append(await one(cl, seed, root, args))
    return out


async def one(cl: ChaosCluster, seed: int, root: Path, args: argparse.Namespace) -> Episode:
    """One episode, its line (or JSON), its logs kept when it failed."""
    workdir = root / f"seed-{seed}"
    started = time.monotonic()
    kinds = tuple(k for k in FAULTS if k not in args.without)
    ep = await run_episode(
        seed,
        cl,
        workdir,
        fault_seconds=args.fault_seconds,
        validate=args.validate,
        kinds=kinds,
        step_timeout=args.step_timeout,
    )
    took = time.monotonic() - started
    if args.json:
        print(json.dumps({**asdict(ep), "faults": dict(ep.faults), "seconds": round(took, 1)}), flush=True)
    else:
        verdict = "ok" if ep.clean else "FAIL"
        print(
            f"seed {seed:>3} replicas {ep.replicas} {verdict:<4} converge "
            f"{ep.converge_s if ep.converge_s is None else round(ep.converge_s, 2)} s, "
            f"{sum(ep.faults.values())} faults ({ep.faults['kill']} kills, "
            f"{ep.expired_watches} real 410s) in {took:.0f} s" + (f"\n    {ep.detail.strip()}" if not ep.clean else ""),
            flush=True,
        )
    if ep.clean:
        shutil.rmtree(workdir, ignore_errors=True)  # a failed episode keeps its operator logs
    else:
        print(f"    logs: {workdir}", flush=True)
    return ep


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=50)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--fault-seconds", type=float, default=12.0, help="how long each episode's faults last")
    parser.add_argument("--without", type=lambda v: v.split(","), default=[], help="fault kinds left out (a,b)")
    parser.add_argument("--step-timeout", type=float, default=180.0, help="seconds each lifecycle step may take")
    parser.add_argument("--validate", action="store_true", help="run the validation Job before promoting")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    episodes = asyncio.run(campaign(args))
    print()
    print(table(episodes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
