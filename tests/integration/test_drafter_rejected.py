"""A trained drafter the drafter gate rejects, against the emulated API server as a user sees it: the training
Job reports a head that memorised (held-out acceptance near zero, held-out top-1 collapsed against training);
``status.drafter`` is Rejected with the figures, a Warning Event says why, no ReDrafter engine is built and the
base engine serves. ``acceptRejected`` then builds the ReDrafter engine from the same head, with no new training.
"""

from __future__ import annotations

from typing import Any

import pytest
from test_lifecycle import NS, Cluster, Operator, apply, cluster, example, operator, until  # noqa: F401, I001

from engine_jobs.contract import BuildResult, TrainingResult
from redrafter_operator.render import names
from redrafter_sim import controllers

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
    return [
        *cluster.jobs(),
        *cluster.emu.list_objects("batch/v1", "Job", NS, label_selector=f"{names.LABEL_COMPONENT}=drafter-training"),
    ]


def finish(cluster: Cluster, variant: str, message: str) -> None:
    for job in jobs(cluster):
        if variant_of(job) == variant and not (job.get("status") or {}).get("conditions"):
            controllers.complete_job(cluster.emu, job["metadata"]["name"], NS, message=message)


async def test_a_rejected_drafter_leaves_the_base_serving(cluster: Cluster, operator: Operator, kubectl: Any) -> None:
    doc = example(model__drafter={"train": TRAIN})
    apply(kubectl, doc)
    await until(lambda: {variant_of(j) for j in jobs(cluster)} == {"drafter", "base"}, what="training and base Jobs")
    finish(cluster, "drafter", MEMORISED.message("OK: drafter trained"))
    finish(cluster, "base", BUILT.message("OK: engine built"))

    await until(lambda: (cluster.status().get("drafter") or {}).get("state") == "Rejected", what="drafter Rejected")
    drafter = cluster.status()["drafter"]
    assert "held-out acceptance 0.008" in drafter["message"] and "prompt lookup 0.010" in drafter["message"]
    assert "collapsed against training 0.550" in drafter["message"]
    assert (drafter["heldOutTop1"], drafter["trainTop1"], drafter["promptLookupAcceptance"]) == (0.02, 0.55, 0.01)
    await until(lambda: [e for e in cluster.events() if e[0] == "DrafterRejected"], what="the DrafterRejected Event")
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
    apply(kubectl, doc)
    await until(lambda: "redrafter" in {variant_of(j) for j in jobs(cluster)}, what="the ReDrafter engine build")
    await until(lambda: cluster.status()["drafter"]["state"] in ("Ready", "Cached"), what="the drafter accepted")
    assert cluster.status()["drafter"]["message"].startswith("accepted by")
    assert [variant_of(j) for j in jobs(cluster)].count("drafter") == 1  # trained once
