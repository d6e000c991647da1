"""Validation before promotion, end to end: the validation Job's verdict gates which engine the Service selects.

The real control plane with metered serving pods (:mod:`harness.metered`: metrics on each pod's IP, ReDrafter
acceptance high so the policy always wants ReDrafter). The test plays the validation Job's pod (its exit code and
the termination message ``evaluate validate`` writes); the real Job controller fails or completes the Job.
"""

from __future__ import annotations

from typing import Any

import pytest

from harness.lifecycle import NAME, quiesce
from harness.metered import MeteredCluster, WatchedOperator
from harness.validation import built, never_without_ready_pods, validated, validated_doc, validation_jobs
from harness.waiting import until
from redrafter_operator.controller.validation import ANNOTATION_RETRY_VALIDATION
from redrafter_operator.render import names
from redrafter_operator.render.validation import validation_job_name

pytestmark = pytest.mark.timeout(240)


async def test_failed_validation_serves_base_and_blocks_promotion_until_a_retry_passes(
    cluster: MeteredCluster, operator: WatchedOperator
) -> None:
    cluster.apply(validated_doc())
    rkey, bkey = await built(cluster)
    # both variants are kept up (>= 1 Ready pod each) so the Job can compare them
    await until(lambda: validation_jobs(cluster), what="the validation Job")
    job = validation_jobs(cluster)[0]
    assert job == validation_job_name(NAME, rkey, bkey, 0)
    await until(
        lambda: (
            cluster.deployment("base")["spec"]["replicas"] >= 1
            and cluster.deployment("redrafter")["spec"]["replicas"] >= 1
        ),
        what="both variants up",
    )
    await until(lambda: (cluster.status().get("validation") or {}).get("state") == "Running", what="status Running")
    st = cluster.status()
    assert st["validation"]["job"] == job
    assert validated(cluster)["status"] == "Unknown" and validated(cluster)["reason"] == "Validating"
    await until(lambda: any(r == "ValidationStarted" for r, _, _ in cluster.events()), what="ValidationStarted Event")

    verdict = "Diverged: 2 of 12 prompts differ between redrafter and base (first: prompt 3, token 5)"
    cluster.fail_job(job, 1, verdict)  # exit 1: the Job's podFailurePolicy fails it at its first pod
    await until(lambda: validated(cluster).get("status") == "False", what="Validated=False")
    cond = validated(cluster)
    assert cond["reason"] == "Diverged" and "2 of 12 prompts differ" in cond["message"]
    st = cluster.status()
    assert st["validation"]["state"] == "Failed" and st["validation"]["reason"] == "Diverged"
    # the divergent ReDrafter engine is not promoted: the Service serves base, ReDrafter scales away
    await until(lambda: cluster.pool() == "base", what="Service on base")
    await until(lambda: cluster.deployment("redrafter")["spec"]["replicas"] == 0, what="ReDrafter scaled down")
    canary = cluster.find("apps/v1", "Deployment", names.canary_deployment_name(NAME))
    assert canary is None or canary["spec"]["replicas"] == 0  # no unvalidated engine in the base pool either
    await until(
        lambda: any(r == "ValidationFailed" and t == "Warning" and "Diverged" in m for r, t, m in cluster.events()),
        what="ValidationFailed Event",
    )
    await until(
        lambda: (
            cluster.condition("Progressing")["reason"] == "ValidationFailed"
            and cluster.status().get("phase") == "Degraded"
        ),
        what="Progressing=False ValidationFailed, Degraded",
    )
    assert cluster.condition("Progressing")["status"] == "False"
    described = cluster.kubectl("describe", "rdd", NAME, check=True).stdout
    assert "Validated" in described and "Diverged" in described and "ValidationFailed" in described

    # the policy keeps wanting ReDrafter (acceptance high), the gate keeps it out
    i = len(operator.evaluations)
    await until(lambda: len(operator.after(i)) >= 4, what="policy evaluations while blocked")
    assert cluster.pool() == "base" and validation_jobs(cluster) == [job]  # no retry without a request

    # a retry request re-runs the validation as attempt 1; a pass promotes ReDrafter
    cluster.kubectl("annotate", f"rdd/{NAME}", f"{ANNOTATION_RETRY_VALIDATION}=1", check=True)
    retry = validation_job_name(NAME, rkey, bkey, 1)
    await until(lambda: retry in validation_jobs(cluster), what="the retry Job")
    cluster.complete_job(retry, "Passed: 12 prompts identical across 5 batch shapes | crossoverConcurrency=6.5")
    await until(lambda: validated(cluster).get("status") == "True", what="Validated=True")
    await until(lambda: cluster.pool() == "redrafter", what="ReDrafter promoted")
    await until(lambda: cluster.status().get("phase") == "Serving", what="phase Serving again")
    st = cluster.status()
    assert st["validation"]["state"] == "Passed" and st["validation"]["attempt"] == 1
    assert st["speculation"]["crossoverConcurrency"] == 6.5
    await until(lambda: cluster.deployment("base")["spec"]["replicas"] == 0, what="base back to standby size")
    await until(lambda: any(r == "ValidationPassed" for r, _, _ in cluster.events()), what="ValidationPassed Event")
    never_without_ready_pods(cluster)


async def test_passed_validation_promotes_and_costs_no_further_api_calls(
    cluster: MeteredCluster, operator: WatchedOperator
) -> None:
    cluster.apply(validated_doc())
    await built(cluster)
    await until(lambda: validation_jobs(cluster), what="the validation Job")
    job = validation_jobs(cluster)[0]
    cluster.complete_job(job, "Passed: 12 prompts identical")
    await until(lambda: validated(cluster).get("status") == "True", what="Validated=True")
    await until(
        lambda: cluster.pool() == "redrafter" and cluster.status().get("activeEngine") == "redrafter",
        what="ReDrafter serving",
    )
    await until(lambda: cluster.deployment("base")["spec"]["replicas"] == 0, what="base back to zero")
    mark, i = cluster.mark(), len(operator.evaluations)
    # two policy evaluations and a reconcile of the resource later (counted, not waited for)
    await until(lambda: len(operator.after(i)) >= 2, what="policy evaluations")
    await quiesce(cluster, operator)
    job_reads = [
        (r.method, r.path)
        for r in cluster.operator_requests(mark)
        if ("/jobs" in r.path or "/pods" in r.path) and not r.watch
    ]
    assert job_reads == []  # a Passed pair is settled from status alone; Jobs and Pods come from the watch
    assert validation_jobs(cluster) == [job]
    never_without_ready_pods(cluster)


async def test_a_new_redrafter_engine_is_validated_beside_the_promoted_one_which_keeps_serving(
    cluster: MeteredCluster, operator: WatchedOperator
) -> None:
    doc = validated_doc()
    cluster.apply(doc)
    old, bkey = await built(cluster)
    await until(lambda: validation_jobs(cluster), what="the first validation Job")
    cluster.complete_job(validation_jobs(cluster)[0], "Passed: 12 prompts identical")
    await until(lambda: validated(cluster).get("status") == "True", what="Validated=True")
    await until(
        lambda: cluster.pool() == "redrafter" and cluster.status().get("phase") == "Serving",
        what="the first ReDrafter engine promoted and serving",
    )
    assert cluster.status()["validation"]["promoted"] == {"redrafterKey": old, "baseKey": bkey}

    # a drafter change: a new ReDrafter engine, the same base engine
    doc["spec"].setdefault("redrafter", {})["draftLenPerBeam"] = 3
    cluster.apply(doc)
    await until(lambda: len(cluster.running_jobs()) == 1, what="the new ReDrafter build Job")
    cluster.complete_all()
    await until(
        lambda: (
            (cluster.status().get("engines") or {}).get("redrafter", {}).get("key") not in (None, old)
            and cluster.status()["engines"]["redrafter"]["state"] == "Ready"
        ),
        what="new engine Ready",
    )
    new = cluster.status()["engines"]["redrafter"]["key"]
    assert cluster.status()["engines"]["base"]["key"] == bkey

    def candidate() -> dict[str, Any] | None:
        return cluster.find("apps/v1", "Deployment", names.candidate_name(NAME))

    def engine(dep: dict[str, Any] | None) -> str | None:
        return dep["spec"]["template"]["metadata"]["labels"][names.LABEL_ENGINE_KEY] if dep else None

    def served_keys() -> set[str]:
        """Engine keys of the pods the stable Service selects."""
        return {p["metadata"]["labels"][names.LABEL_ENGINE_KEY] for p in cluster.selected_pods()}

    await until(lambda: engine(candidate()) == new, what="the candidate Deployment on the new engine")
    job = validation_job_name(NAME, new, bkey, 0)
    await until(lambda: job in validation_jobs(cluster), what="the candidate's validation Job")
    argv = cluster.get("batch/v1", "Job", job)["spec"]["template"]["spec"]["containers"][0]["command"]
    assert argv[argv.index("--redrafter") + 1].startswith(f"{names.candidate_name(NAME)}.{cluster.ns}.svc:")
    # `render --promoted-key` prints the candidate's children and its validation Job as the operator applied them
    candidate_children = [
        d
        for d in cluster.rendered(doc, promoted_key=old)
        if names.candidate_name(NAME) in d["metadata"]["name"] or d["metadata"]["name"] == job
    ]
    assert len(candidate_children) == 4
    await until(
        lambda: not cluster.differing(candidate_children, {"Deployment", "Service", "ConfigMap", "Job"}),
        what="the candidate's children as rendered",
    )
    # while it is validated, the promoted engine serves: the primary Deployment was never rolled
    assert engine(cluster.deployment("redrafter")) == old and cluster.pool() == "redrafter"
    assert served_keys() == {old}
    await until(lambda: cluster.condition("Progressing")["reason"] == "Validating", what="Progressing Validating")

    cluster.fail_job(job, 1, "Diverged: 1 of 12 prompts differ (first: prompt 2, token 7)")
    await until(lambda: validated(cluster).get("status") == "False", what="Validated=False")
    await until(lambda: candidate()["spec"]["replicas"] == 0, what="the candidate scaled away")
    await until(lambda: cluster.condition("Progressing")["reason"] == "ValidationFailed", what="ValidationFailed")
    assert f"the promoted ReDrafter engine {old} keeps serving" in cluster.condition("Progressing")["message"]
    # the old engine keeps serving: same pool, same key, the primary still Ready at its size
    i = len(operator.evaluations)
    await until(lambda: len(operator.after(i)) >= 3, what="policy evaluations after the failure")
    assert cluster.pool() == "redrafter" and served_keys() == {old}
    assert engine(cluster.deployment("redrafter")) == old and cluster.deployment("redrafter")["spec"]["replicas"] == 2
    assert cluster.status()["validation"]["promoted"]["redrafterKey"] == old

    # a retry that passes promotes the new engine: the primary rolls to it, the candidate stays at zero
    cluster.kubectl("annotate", f"rdd/{NAME}", f"{ANNOTATION_RETRY_VALIDATION}=1", check=True)
    retry = validation_job_name(NAME, new, bkey, 1)
    await until(lambda: retry in validation_jobs(cluster), what="the retry Job")
    cluster.complete_job(retry, "Passed: 12 prompts identical")
    await until(lambda: engine(cluster.deployment("redrafter")) == new, what="primary rolled to the new engine")
    await until(
        lambda: served_keys() == {new} and cluster.status().get("phase") == "Serving",
        what="the new engine serving",
    )
    assert cluster.pool() == "redrafter"
    await until(
        lambda: candidate()["spec"]["replicas"] == 0,
        what=f"the candidate scaled away again ({cluster.status().get('validation')})",
    )
    # children are applied before the status patch of the same reconcile: the record follows at once
    await until(
        lambda: cluster.status()["validation"]["promoted"] == {"redrafterKey": new, "baseKey": bkey},
        timeout=10,
        what="the new pair recorded as promoted",
    )
    never_without_ready_pods(cluster)


# ---- `redrafter-operator render` prints what the operator applies ---------------------------------------
async def test_render_prints_what_the_operator_applies_at_each_stage(
    cluster: MeteredCluster, operator: WatchedOperator
) -> None:
    doc = validated_doc()
    cluster.apply(doc)
    await until(lambda: len(cluster.running_jobs()) == 2 and cluster.status().get("engines"), what="build Jobs")
    keys = [cluster.status()["engines"][v]["key"] for v in ("redrafter", "base")]
    # the build Jobs exactly as rendered; the validation Job comes once both engines are built
    assert cluster.differing(cluster.rendered(doc), {"Job"}) == [f"Job/{validation_job_name(NAME, *keys, 0)}"]
    rkey, bkey = await built(cluster)
    job = validation_job_name(NAME, rkey, bkey, 0)
    await until(lambda: job in validation_jobs(cluster), what="the validation Job")
    assert cluster.differing(cluster.rendered(doc), {"Job"}) == []  # build and validation Jobs exactly as rendered
    cluster.complete_job(job, "Passed: 12 prompts identical")
    serving = {"Deployment", "Service", "ConfigMap", "NetworkPolicy"}
    await until(lambda: not cluster.differing(cluster.rendered(doc), serving), what="the serving children as rendered")
    assert cluster.pool() == "redrafter"
    # the comparison has teeth: a render for the other engine differs in the stable Service and the replicas
    assert cluster.differing(cluster.rendered(doc, active="base"), serving) == [
        f"Deployment/{NAME}-redrafter",
        f"Deployment/{NAME}-base",
        f"Service/{NAME}",
    ]
