"""Validation before promotion, as the tests read it: the validation Jobs, the Validated condition, and the
builds that come before them (shared by the validation-gate and method tests)."""

from __future__ import annotations

from typing import Any

from .lifecycle import Cluster
from .metered import policy_doc
from .waiting import until


def validated_doc() -> dict[str, Any]:
    """The policy test's resource with validation on."""
    doc = policy_doc()
    doc["spec"]["validation"] = {"enabled": True}
    return doc


def validation_jobs(cluster: Cluster) -> list[str]:
    return [j["metadata"]["name"] for j in cluster.jobs("validation")]


def validated(cluster: Cluster) -> dict[str, Any]:
    """The Validated condition ({} before the operator set it)."""
    return next((c for c in cluster.status().get("conditions", []) if c["type"] == "Validated"), {})


def engines_ready(cluster: Cluster) -> bool:
    engines = cluster.status().get("engines") or {}
    return all((engines.get(v) or {}).get("state") == "Ready" for v in ("redrafter", "base"))


async def built(cluster: Cluster) -> tuple[str, str]:
    """Both build Jobs run, then complete: the (redrafter, base) engine keys once both are Ready."""
    await until(lambda: len(cluster.running_jobs()) == 2, what="build Jobs")
    cluster.complete_all()
    await until(lambda: engines_ready(cluster), what="both engines Ready")
    e = cluster.status()["engines"]
    return e["redrafter"]["key"], e["base"]["key"]


def never_without_ready_pods(cluster: Cluster) -> None:
    """From the first sample with a Ready pod on, the Service never selected a pool without one."""
    serving = [s for s in cluster.samples if s[1]]
    first = next(i for i, s in enumerate(serving) if s[2] > 0)
    assert all(n >= 1 for _, _, n in serving[first:]), [s for s in serving[first:] if s[2] < 1][:5]


__all__ = ["built", "engines_ready", "never_without_ready_pods", "validated", "validated_doc", "validation_jobs"]
