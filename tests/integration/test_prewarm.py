"""Prewarm in the running operator: serving.replicas 0 with autoscaling Disabled builds the engines, serves
nothing and says so (phase Prewarmed); scaling up then serves the built engines without a build."""

from __future__ import annotations

import json
from typing import Any

import pytest

from harness.lifecycle import Cluster, LifecycleOperator, example
from harness.waiting import until
from redrafter_operator.render import names

pytestmark = pytest.mark.timeout(120)


async def test_prewarm_then_scale_up(cluster: Cluster, operator: LifecycleOperator, kubectl: Any) -> None:
    doc = example(serving__replicas=0, autoscaling__mode="Disabled", validation__enabled=False)
    cluster.apply(doc)
    await until(lambda: len(cluster.running_jobs()) == 2, what="build Jobs")
    cluster.complete_all()
    await until(lambda: cluster.status().get("phase") == "Prewarmed", what="phase Prewarmed")
    available = cluster.condition("Available")
    assert available["status"] == "False" and available["reason"] == "Prewarmed"
    assert all(e["state"] == "Ready" for e in cluster.status()["engines"].values())
    for variant in ("redrafter", "base"):
        dep = cluster.deployment(variant)
        assert dep is None or dep["spec"]["replicas"] == 0, f"{variant} must not serve"
    assert not cluster.list("v1", "Pod", f"{names.LABEL_COMPONENT}=serving")  # no pod runs
    jobs = cluster.job_names()
    kubectl(
        "patch",
        "rdd",
        doc["metadata"]["name"],
        "--type=merge",
        "-p",
        json.dumps({"spec": {"serving": {"replicas": 1}}}),
        check=True,
    )
    await until(lambda: cluster.status().get("phase") == "Serving", what="Serving after scale-up")
    active = cluster.status()["activeEngine"]
    assert cluster.deployment(active)["spec"]["replicas"] == 1 and cluster.status()["serving"]["readyReplicas"] == 1
    assert cluster.job_names() == jobs, "nothing is rebuilt"
