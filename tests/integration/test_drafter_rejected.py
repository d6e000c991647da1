"""A trained drafter the drafter gate rejects, on the real control plane as a user sees it: the training Job
reports a head that memorised (held-out acceptance near zero, held-out top-1 collapsed against training);
``status.drafter`` is Rejected with the figures, a Warning Event says why, no ReDrafter engine is built and the
base engine serves. ``acceptRejected`` then builds the ReDrafter engine from the same head, with no new training.
"""

from __future__ import annotations

from typing import Any

import pytest

from engine_jobs.contract import BuildResult, TrainingResult
from harness.lifecycle import Cluster, LifecycleOperator, example
from harness.waiting import until
from redrafter_operator.render import names

pytestmark = pytest.mark.timeout(120)

TRAIN = {"dataset": {"source": "pvc://datasets/chat/prompts.jsonl", "column": "prompt"}, "samples": 500}
#: what the worker measured for a head trained on a chaotic random base (docs/drafter.md)
MEMORISED = TrainingResult(
    steps=150,
    loss=2.1,
    held_out_acceptance=0.008,
    untrained_acceptance=0.0,
    prompt_lookup_acceptance=0.01,
    held_out_top1=0.02,
    train_top1=0.55,
    tokens_per_step=1.04,
    size_bytes=4096,
    trained_at="2026-12-01T10:00:00Z",
)
BUILT = BuildResult(size_bytes=1_000_000, built_at="2026-12-01T10:00:00Z")


def variant_of(job: dict[str, Any]) -> str:
    return str(job["metadata"]["labels"][names.LABEL_VARIANT])


def jobs(cluster: Cluster) -> list[dict[str, Any]]:
    """The engine build Jobs and the training Jobs."""
    return [*cluster.jobs(), *cluster.jobs("drafter-training")]


def finish(cluster: Cluster, variant: str, message: str) -> None:
    """The Jobs of ``variant`` not yet given a verdict exit 0 with this termination message."""
    for job in jobs(cluster):
        if variant_of(job) == variant and job["metadata"]["name"] not in cluster.pods.verdicts:
            cluster.complete_job(job["metadata"]["name"], message)


async def test_a_rejected_drafter_leaves_the_base_serving(
    cluster: Cluster, operator: LifecycleOperator, kubectl: Any
) -> None:
    # the training pod mounts the dataset's claim: the real scheduler binds no pod whose claim does not exist
    pv, pvc = next(iter(cluster.nodes.values())).claim_objects(cluster.ns, "datasets")
    cluster.create(pv)
    try:
        cluster.create(pvc)
        doc = example(model__drafter={"train": TRAIN})
        cluster.apply(doc)
        await until(
            lambda: {variant_of(j) for j in jobs(cluster)} == {"drafter", "base"}, what="training and base Jobs"
        )
        finish(cluster, "drafter", MEMORISED.message("OK: drafter trained"))
        finish(cluster, "base", BUILT.message("OK: engine built"))

        await until(lambda: (cluster.status().get("drafter") or {}).get("state") == "Rejected", what="drafter Rejected")
        drafter = cluster.status()["drafter"]
        assert "held-out acceptance 0.008" in drafter["message"] and "prompt lookup 0.010" in drafter["message"]
        assert "collapsed against training 0.550" in drafter["message"]
        assert (drafter["heldOutTop1"], drafter["trainTop1"], drafter["promptLookupAcceptance"]) == (0.02, 0.55, 0.01)
        await until(
            lambda: [e for e in cluster.events() if e[0] == "DrafterRejected"], what="the DrafterRejected Event"
        )
        reason, type_, message = next(e for e in cluster.events() if e[0] == "DrafterRejected")
        assert type_ == "Warning" and "held-out acceptance 0.008" in message and "base keeps serving" in message

        await until(lambda: cluster.status().get("activeEngine") == "base", what="the base engine serving")
        await until(lambda: cluster.deployment("base") is not None, what="the base Deployment")
        assert "redrafter" not in {variant_of(j) for j in jobs(cluster)}  # no engine from a head that does not draft
        assert cluster.deployment("redrafter") is None
        engine = cluster.status()["engines"]["redrafter"]
        assert engine["state"] == "Pending" and "acceptRejected" in engine["message"]
        assert len([e for e in cluster.events() if e[0] == "DrafterRejected"]) == 1

        # accepting it anyway builds the ReDrafter engine from the same head: the drafter key does not change
        doc["spec"]["model"]["drafter"]["train"]["acceptRejected"] = True
        cluster.apply(doc)
        await until(lambda: "redrafter" in {variant_of(j) for j in jobs(cluster)}, what="the ReDrafter engine build")
        await until(lambda: cluster.status()["drafter"]["state"] in ("Ready", "Cached"), what="the drafter accepted")
        assert cluster.status()["drafter"]["message"].startswith("accepted by")
        assert [variant_of(j) for j in jobs(cluster)].count("drafter") == 1  # trained once
    finally:
        cluster.delete("v1", "PersistentVolume", pv["metadata"]["name"])
