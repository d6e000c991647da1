"""The pure planner: engine states, build Jobs, retries, shared cache, blue/green steps, status, Events."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from engine_jobs.contract import BuildResult
from redrafter_operator.api.engine_key import engine_key
from redrafter_operator.api.spec import ReDrafterDeploymentSpec
from redrafter_operator.api.status import Condition, ReDrafterDeploymentStatus
from redrafter_operator.controller.conditions import Cond, find, merge_conditions
from redrafter_operator.controller.facts import (
    DeploymentFact,
    JobFact,
    Observed,
    PodFact,
    SharedArtifact,
)
from redrafter_operator.controller.fingerprints import manifest_hash
from redrafter_operator.controller.plan_types import Renderers, Resource, ServingTargets
from redrafter_operator.controller.planner import Inputs, plan
from redrafter_operator.controller.targets import plan_switch
from redrafter_operator.render import names
from redrafter_operator.render.placement import LABEL_PRODUCT, Node, Taint

ROOT = Path(__file__).resolve().parents[2]
NOW = "2026-01-01T00:00:00Z"
LATER = "2026-01-01T00:05:00Z"


def _variant(owner, variant, key, replicas):
    return [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "name": names.serving_deployment_name(owner.name, variant),
                "namespace": owner.namespace,
                "labels": {names.LABEL_ENGINE_KEY: key},
            },
            "spec": {"replicas": replicas},
        }
    ]


def _services(owner, pool):
    return [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": names.service_name(owner.name), "namespace": owner.namespace},
            "spec": {"selector": names.traffic_selector(owner.name, pool)},
        }
    ]


RENDER = Renderers(variant=_variant, services=_services)


def body(**spec_overrides) -> dict:
    doc = yaml.safe_load((ROOT / "examples" / "llama3-8b.yaml").read_text())
    doc["metadata"].update(uid="u-1", generation=1)
    for dotted, value in spec_overrides.items():
        node = doc["spec"]
        *parents, leaf = dotted.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return doc


def res_of(doc: dict, status: dict | None = None) -> Resource:
    d = copy.deepcopy(doc)
    if status is not None:
        d["status"] = status
    return Resource.from_body(d)


def keys(doc: dict) -> dict[str, str]:
    spec = ReDrafterDeploymentSpec.model_validate(doc["spec"])
    return {v: engine_key(spec, v) for v in ("redrafter", "base")}


def job(doc, variant, state, attempt=0, token="", reason="", message="", owner=None) -> JobFact:
    key = keys(doc)[variant]
    return JobFact(
        name=names.build_job_name(owner or doc["metadata"]["name"], variant, key, attempt),
        namespace="default",
        owner=owner or doc["metadata"]["name"],
        variant=variant,
        key=key,
        attempt=attempt,
        retry_token=token,
        claim="engine-cache",
        artifact=f"engines/{key}",
        state=state,
        reason=reason,
        message=message,
    )


def dep(name, variant, key, replicas=1, ready=1, gen=1, observed_gen=1) -> DeploymentFact:
    return DeploymentFact(
        name=names.serving_deployment_name(name, variant),
        variant=variant,
        key=key,
        replicas=replicas,
        ready_replicas=ready,
        updated_replicas=ready,
        total_replicas=replicas,
        generation=gen,
        observed_generation=observed_gen,
    )


def cond(status: dict, type_: str) -> dict:
    c = find(status["conditions"], type_)
    assert c is not None, type_
    return c


def test_fresh_resource_creates_both_build_jobs_and_is_building():
    doc = body()
    p = plan(res_of(doc), Observed(), now=NOW, renderers=RENDER)
    kinds = [(m["kind"], m["metadata"]["labels"][names.LABEL_VARIANT]) for m in p.create]
    assert kinds == [("ConfigMap", "redrafter"), ("Job", "redrafter"), ("ConfigMap", "base"), ("Job", "base")]
    assert p.apply == []  # nothing to serve yet
    st = p.status.wire()
    assert st["phase"] == "Building" and st["observedGeneration"] == 1
    assert st["engines"]["redrafter"]["state"] == "Building" and st["engines"]["redrafter"]["attempts"] == 1
    assert cond(st, "SpecValid")["status"] == "True"
    assert cond(st, "EnginesReady")["reason"] == "Building"
    assert cond(st, "Available")["status"] == "False"
    assert [e.reason for e in p.events].count("BuildStarted") == 2
    ReDrafterDeploymentStatus.model_validate(st)  # status matches the API model (and so the CRD)


def test_replanning_with_own_running_jobs_creates_nothing_and_emits_nothing():
    doc = body()
    first = plan(res_of(doc), Observed(), now=NOW, renderers=RENDER)
    observed = Observed(jobs=[job(doc, "redrafter", "Running"), job(doc, "base", "Running")])
    again = plan(res_of(doc, first.status.wire()), observed, now=LATER, renderers=RENDER)
    assert again.create == [] and again.events == []
    assert again.status.wire() == first.status.wire()  # identical => no status write


def test_invalid_spec_names_the_field_and_never_raises():
    doc = body(engine__maxSeqLen=100, engine__maxInputLen=200)
    p = plan(res_of(doc), Observed(), now=NOW, renderers=RENDER)
    c = cond(p.status.wire(), "SpecValid")
    assert c["status"] == "False" and c["reason"] == "InvalidSpec"
    assert "spec.engine" in c["message"] and "maxInputLen must be less than maxSeqLen" in c["message"]
    assert p.create == [] and p.apply == [] and p.status.wire()["phase"] == "Failed"
    assert [e.reason for e in p.events] == ["InvalidSpec", "PhaseFailed"]
    again = plan(res_of(doc, p.status.wire()), Observed(), now=LATER, renderers=RENDER)
    assert again.events == [] and again.status.wire() == p.status.wire()


def test_active_engine_ready_deploys_serving_without_waiting_for_base():
    doc = body()
    k = keys(doc)
    observed = Observed(jobs=[job(doc, "redrafter", "Succeeded"), job(doc, "base", "Running")])
    p = plan(res_of(doc), observed, now=NOW, renderers=RENDER)
    names_applied = [m["metadata"]["name"] for m in p.apply]
    assert names_applied == ["llama3-8b-redrafter", "llama3-8b"]
    assert p.apply[0]["metadata"]["labels"][names.LABEL_ENGINE_KEY] == k["redrafter"]
    assert p.status.wire()["phase"] == "Deploying" and p.status.wire()["activeEngine"] == "redrafter"
    # pods Ready => Serving
    observed.deployments = {"redrafter": dep("llama3-8b", "redrafter", k["redrafter"])}
    observed.service_pool = "redrafter"
    p2 = plan(res_of(doc, p.status.wire()), observed, now=LATER, renderers=RENDER)
    assert p2.status.wire()["phase"] == "Serving"
    assert cond(p2.status.wire(), "Available")["status"] == "True"
    assert cond(p2.status.wire(), "EnginesReady")["status"] == "False"  # base still building
    assert p2.status.wire()["serving"] == {
        "replicas": 1,
        "readyReplicas": 1,
        "service": "llama3-8b",
        "selector": names.selector_string(names.traffic_selector("llama3-8b", "redrafter")),
    }
    assert [e.reason for e in p2.events] == ["PhaseServing"]


def test_mode_never_serves_base_and_waits_for_it():
    doc = body(speculation__mode="Never")
    observed = Observed(jobs=[job(doc, "redrafter", "Succeeded"), job(doc, "base", "Running")])
    p = plan(res_of(doc), observed, now=NOW, renderers=RENDER)
    assert p.status.wire()["phase"] == "Building"
    assert not any(m["kind"] == "Service" for m in p.apply)
    assert cond(p.status.wire(), "SpeculationHealthy")["reason"] == "SpeculationDisabled"


def test_failed_job_retries_with_attempt_suffix_then_fails_without_loop():
    doc = body(engine__build__retries=1)
    st0 = plan(res_of(doc), Observed(), now=NOW, renderers=RENDER).status.wire()
    failed0 = job(doc, "redrafter", "Failed", reason="BackoffLimitExceeded")
    pod = PodFact(job=failed0.name, phase="Failed", message="BuildError: trtllm-build exited 1: out of memory")
    obs = Observed(jobs=[failed0, job(doc, "base", "Succeeded")], pods={failed0.name: pod})
    p1 = plan(res_of(doc, st0), obs, now=NOW, renderers=RENDER)
    retry = [m for m in p1.create if m["kind"] == "Job"]
    assert [m["metadata"]["name"] for m in retry] == [
        names.build_job_name("llama3-8b", "redrafter", keys(doc)["redrafter"], 1)
    ]
    eng = p1.status.wire()["engines"]["redrafter"]
    assert eng["attempts"] == 2 and "out of memory" in eng["message"]
    assert cond(p1.status.wire(), "EnginesReady")["reason"] == "BuildRetrying"
    assert [e.reason for e in p1.events][:2] == ["BuildFailed", "BuildStarted"]
    failed1 = job(doc, "redrafter", "Failed", attempt=1, reason="DeadlineExceeded")
    obs.jobs.append(failed1)
    p2 = plan(res_of(doc, p1.status.wire()), obs, now=NOW, renderers=RENDER)
    assert p2.create == []
    assert p2.status.wire()["engines"]["redrafter"]["state"] == "Failed"
    assert p2.status.wire()["phase"] == "Failed"
    assert cond(p2.status.wire(), "EnginesReady")["reason"] == "BuildFailed"
    assert "DeadlineExceeded" in cond(p2.status.wire(), "EnginesReady")["message"]
    assert {"BuildFailed", "RetriesExhausted", "PhaseFailed"} <= {e.reason for e in p2.events}
    # no rebuild loop: same inputs again => nothing
    p3 = plan(res_of(doc, p2.status.wire()), obs, now=LATER, renderers=RENDER)
    assert p3.create == [] and p3.events == [] and p3.status.wire() == p2.status.wire()
    # failed Jobs expired (TTL): status still remembers, still no rebuild
    p4 = plan(
        res_of(doc, p2.status.wire()), Observed(jobs=[job(doc, "base", "Succeeded")]), now=LATER, renderers=RENDER
    )
    assert p4.create == [] and p4.status.wire()["engines"]["redrafter"]["state"] == "Failed"
    # retry annotation (any new value) => a fresh Job with the next attempt number
    doc2 = copy.deepcopy(doc)
    doc2["metadata"]["annotations"] = {names.ANNOTATION_RETRY_BUILD: "1"}
    p5 = plan(res_of(doc2, p2.status.wire()), obs, now=LATER, renderers=RENDER)
    jobs5 = [m for m in p5.create if m["kind"] == "Job"]
    assert [m["metadata"]["name"] for m in jobs5] == [
        names.build_job_name("llama3-8b", "redrafter", keys(doc)["redrafter"], 2)
    ]
    assert jobs5[0]["metadata"]["annotations"]["redrafter.dev/retry-token"] == "1"
    assert p5.status.wire()["engines"]["redrafter"]["state"] == "Building"


def _fail_job_body(doc, code: int) -> dict:
    """A build Job as the Job controller leaves it after its podFailurePolicy matched ``code``."""
    k = keys(doc)["redrafter"]
    name = names.build_job_name("llama3-8b", "redrafter", k, 0)
    why = f"Container build for pod default/{name}-x7k2p failed with exit code {code} matching FailJob rule at index 0"
    return {
        "metadata": {
            "name": name,
            "namespace": "default",
            "labels": {
                names.LABEL_DEPLOYMENT: "llama3-8b",
                names.LABEL_VARIANT: "redrafter",
                names.LABEL_ENGINE_KEY: k,
            },
            "annotations": {
                "redrafter.dev/attempt": "0",
                "redrafter.dev/artifact": f"engines/{k}",
                "redrafter.dev/cache-claim": "engine-cache",
            },
        },
        "status": {
            "failed": 1,
            "conditions": [
                {"type": "FailureTarget", "status": "True", "reason": "PodFailurePolicy", "message": why},
                {"type": "Failed", "status": "True", "reason": "PodFailurePolicy", "message": why},
            ],
        },
    }


def test_job_fact_reads_the_exit_code_a_fail_job_rule_matched():
    doc = body()
    fact = JobFact.from_body(_fail_job_body(doc, 2))
    assert fact.state == "Failed" and fact.reason == "PodFailurePolicy" and fact.final_exit_code == 2
    other = _fail_job_body(doc, 2)
    for c in other["status"]["conditions"]:
        c["reason"] = "BackoffLimitExceeded"
    assert JobFact.from_body(other).final_exit_code is None, "only the pod failure policy makes a failure final"


@pytest.mark.parametrize(("code", "name"), [(2, "BAD_INPUT"), (6, "SOURCE_UNAVAILABLE")])
def test_non_retryable_exit_code_fails_the_engine_after_one_job(code, name):
    doc = body(engine__build__retries=2)
    st0 = plan(res_of(doc), Observed(), now=NOW, renderers=RENDER).status.wire()
    failed = JobFact.from_body(_fail_job_body(doc, code))
    pod = PodFact(job=failed.name, phase="Failed", message=f"{name}: base source hf://x/y is unreachable")
    obs = Observed(jobs=[failed, job(doc, "base", "Succeeded")], pods={failed.name: pod})
    p = plan(res_of(doc, st0), obs, now=NOW, renderers=RENDER)
    assert [m for m in p.create if m["kind"] == "Job"] == [], "no second Job for a code no retry can fix"
    eng = p.status.wire()["engines"]["redrafter"]
    assert eng["state"] == "Failed" and eng["attempts"] == 1 and eng["exitCode"] == code
    assert eng["message"].startswith(f"exit code {code} ({name}) cannot succeed on retry")
    assert "kubectl annotate rdd llama3-8b redrafter.dev/retry-build=<new value> --overwrite" in eng["message"]
    assert f"{name}: base source" in eng["message"]  # the build's own reason follows
    assert p.status.wire()["phase"] == "Failed"
    events = {e.reason: e for e in p.events}
    assert "BuildNotRetried" in events and "RetriesExhausted" not in events
    assert f"exit code {code} ({name})" in events["BuildNotRetried"].message
    assert "retry-build" in events["BuildNotRetried"].message
    # a long stderr tail never pushes the code and the retry hint out of the bounded message
    long_tail = Observed(
        jobs=obs.jobs, pods={failed.name: PodFact(job=failed.name, phase="Failed", message="x" * 5000)}
    )
    bounded = plan(res_of(doc, st0), long_tail, now=NOW, renderers=RENDER).status.wire()["engines"]["redrafter"][
        "message"
    ]
    assert len(bounded) <= 1024 and "retry-build=<new value>" in bounded
    # the Job expires (TTL): status remembers the code, still no Job
    p2 = plan(res_of(doc, p.status.wire()), Observed(jobs=[job(doc, "base", "Succeeded")]), now=LATER, renderers=RENDER)
    assert p2.create == [] and p2.status.wire()["engines"]["redrafter"]["exitCode"] == code
    # a new retry-build value starts one fresh Job
    doc2 = copy.deepcopy(doc)
    doc2["metadata"]["annotations"] = {names.ANNOTATION_RETRY_BUILD: "fixed"}
    p3 = plan(res_of(doc2, p.status.wire()), obs, now=LATER, renderers=RENDER)
    assert len([m for m in p3.create if m["kind"] == "Job"]) == 1
    assert "exitCode" not in p3.status.wire()["engines"]["redrafter"]


def test_shared_cache_running_or_complete_elsewhere_means_no_build():
    doc = body()
    other = job(doc, "redrafter", "Running", owner="other")
    obs = Observed(
        jobs=[],
        shared={
            "redrafter": SharedArtifact(building_job=other.name),
            "base": SharedArtifact(ready_by="Job other-build-base"),
        },
    )
    p = plan(res_of(doc), obs, now=NOW, renderers=RENDER)
    assert p.create == []
    assert p.status.wire()["engines"]["redrafter"]["state"] == "Building"
    assert p.status.wire()["engines"]["redrafter"]["job"] == other.name
    assert p.status.wire()["engines"]["base"]["state"] == "Cached"
    assert {e.reason for e in p.events} >= {"BuildWaiting", "EngineCached"}


def test_build_input_change_keeps_serving_old_engine_until_new_is_ready():
    doc = body()
    k = keys(doc)
    serving = Observed(
        jobs=[job(doc, "redrafter", "Succeeded"), job(doc, "base", "Succeeded")],
        deployments={
            "redrafter": dep("llama3-8b", "redrafter", k["redrafter"]),
            "base": dep("llama3-8b", "base", k["base"], replicas=0, ready=0),
        },
        service_pool="redrafter",
    )
    st = plan(res_of(doc), serving, now=NOW, renderers=RENDER).status.wire()
    st = plan(res_of(doc, st), serving, now=NOW, renderers=RENDER).status.wire()
    assert st["phase"] == "Serving"
    changed = body(redrafter__numBeams=4)
    changed["metadata"]["generation"] = 2
    p = plan(res_of(changed, st), serving, now=LATER, renderers=RENDER)
    assert [m["metadata"]["labels"][names.LABEL_VARIANT] for m in p.create if m["kind"] == "Job"] == ["redrafter"]
    deployment = next(m for m in p.apply if m["kind"] == "Deployment" and "redrafter" in m["metadata"]["name"])
    assert deployment["metadata"]["labels"][names.LABEL_ENGINE_KEY] == k["redrafter"]  # still the old engine
    assert p.status.wire()["phase"] == "Serving" and cond(p.status.wire(), "Progressing")["status"] == "True"
    assert p.status.wire()["observedGeneration"] == 2
    new_key = keys(changed)["redrafter"]
    assert new_key != k["redrafter"] and keys(changed)["base"] == k["base"]


def test_serving_only_change_patches_deployments_without_jobs():
    doc = body()
    k = keys(doc)
    obs = Observed(
        jobs=[job(doc, "redrafter", "Succeeded"), job(doc, "base", "Succeeded")],
        deployments={"redrafter": dep("llama3-8b", "redrafter", k["redrafter"])},
        service_pool="redrafter",
    )
    st = plan(res_of(doc), obs, now=NOW, renderers=RENDER).status.wire()
    changed = body(serving__replicas=3)
    p = plan(res_of(changed, st), obs, now=LATER, renderers=RENDER)
    assert p.create == []
    d = next(m for m in p.apply if m["metadata"]["name"] == "llama3-8b-redrafter")
    assert d["spec"]["replicas"] == 3


def test_blue_green_switch_order():
    targets = ServingTargets(active="base", replicas={"base": 2, "redrafter": 0})
    both = {"redrafter": True, "base": True}
    # 1. target not Ready: scale it up, keep the Service and the old pool
    obs = Observed(
        deployments={
            "redrafter": dep("x", "redrafter", "k1", replicas=2, ready=2),
            "base": dep("x", "base", "k2", replicas=0, ready=0),
        },
        service_pool="redrafter",
    )
    s = plan_switch(targets, both, obs, "BlueGreen")
    assert s.pool == "redrafter" and s.replicas == {"base": 2, "redrafter": 2} and s.switching
    # 2. target rolled out and Ready: move the Service, keep the old pool up
    obs.deployments["base"] = dep("x", "base", "k2", replicas=2, ready=2)
    s = plan_switch(targets, both, obs, "BlueGreen")
    assert s.pool == "base" and s.replicas["redrafter"] == 2
    # 3. Service observed on the target: scale the old pool down
    obs.service_pool = "base"
    s = plan_switch(targets, both, obs, "BlueGreen")
    assert s.pool == "base" and s.replicas == {"base": 2, "redrafter": 0} and not s.switching


def test_recreate_switch_scales_old_down_first():
    targets = ServingTargets(active="base", replicas={"base": 1, "redrafter": 0})
    both = {"redrafter": True, "base": True}
    obs = Observed(deployments={"redrafter": dep("x", "redrafter", "k1")}, service_pool="redrafter")
    s = plan_switch(targets, both, obs, "Recreate")
    assert s.pool == "redrafter" and s.replicas == {"redrafter": 0, "base": 0}
    obs.deployments["redrafter"] = dep("x", "redrafter", "k1", replicas=0, ready=0)
    s = plan_switch(targets, both, obs, "Recreate")
    assert s.pool == "base" and s.replicas == {"redrafter": 0, "base": 1}


def test_switch_waits_when_target_engine_not_built():
    targets = ServingTargets(active="base", replicas={"base": 2, "redrafter": 0})
    obs = Observed(deployments={"redrafter": dep("x", "redrafter", "k1")}, service_pool="redrafter")
    s = plan_switch(targets, {"redrafter": True, "base": False}, obs, "BlueGreen")
    assert s.pool == "redrafter" and s.replicas == {"redrafter": 2}


@pytest.mark.parametrize("old_status,new_status,changed", [("True", "True", False), ("True", "False", True)])
def test_last_transition_time_only_moves_on_status_change(old_status, new_status, changed):
    first = merge_conditions([], [Cond("Available", old_status, "A", "m1")], generation=1, now=NOW)
    second = merge_conditions(first, [Cond("Available", new_status, "B", "m2")], generation=2, now=LATER)
    assert second[0].last_transition_time == (LATER if changed else NOW)
    assert second[0].reason == "B" and second[0].observed_generation == 2


def test_conditions_owned_by_others_are_kept_and_ordered():
    old = [
        {"type": "Custom", "status": "True", "reason": "X"},
        {"type": "SpeculationHealthy", "status": "True", "reason": "AcceptanceHigh", "lastTransitionTime": NOW},
    ]
    out = merge_conditions(
        [Condition.from_wire(c) for c in old], [Cond("SpecValid", "True", "Valid")], generation=1, now=LATER
    )
    assert [c.type for c in out] == ["SpecValid", "SpeculationHealthy", "Custom"]


def test_policy_targets_render_the_canary_and_real_serving_children():
    from redrafter_operator.controller.renderers import default_renderers

    doc = body(validation__enabled=False)  # the policy's targets as they are (no validation gate)
    k = keys(doc)
    obs = Observed(
        jobs=[job(doc, "redrafter", "Succeeded"), job(doc, "base", "Succeeded")],
        deployments={
            "redrafter": dep("llama3-8b", "redrafter", k["redrafter"]),
            "base": dep("llama3-8b", "base", k["base"], replicas=0, ready=0),
        },
        service_pool="redrafter",
    )
    targets = ServingTargets(active="base", replicas={"base": 2, "redrafter": 0}, canary=1)
    p = plan(res_of(doc), obs, now=NOW, renderers=default_renderers(), inputs=Inputs(targets=targets))
    by_name = {(m["kind"], m["metadata"]["name"]): m for m in p.apply}
    canary = by_name[("Deployment", names.canary_deployment_name("llama3-8b"))]
    assert canary["spec"]["replicas"] == 1
    assert canary["spec"]["template"]["metadata"]["labels"][names.LABEL_TRAFFIC] == "base"
    # blue/green step 1: base scaled up, the Service still on redrafter until base is Ready
    assert by_name[("Deployment", "llama3-8b-base")]["spec"]["replicas"] == 2
    assert by_name[("Deployment", "llama3-8b-redrafter")]["spec"]["replicas"] == 1
    assert by_name[("Service", "llama3-8b")]["spec"]["selector"][names.LABEL_TRAFFIC] == "redrafter"
    assert {("ConfigMap", "llama3-8b-redrafter-serving"), ("ConfigMap", "llama3-8b-base-serving")} <= set(by_name)
    assert cond(p.status.wire(), "Progressing")["reason"] == "Switching"


def test_a_new_redrafter_engine_is_validated_on_a_candidate_while_the_promoted_one_serves():
    from redrafter_operator.controller.renderers import default_renderers

    doc = body()
    k = keys(doc)
    promoted = {"redrafterKey": "r-old", "baseKey": k["base"]}
    old_pair = {"redrafterKey": "r-old", "baseKey": k["base"], "state": "Passed", "promoted": promoted}

    def step(validation, jobs=("redrafter", "base"), candidate=None):
        deps = {
            "redrafter": dep("llama3-8b", "redrafter", "r-old", replicas=2, ready=2),
            "base": dep("llama3-8b", "base", k["base"], replicas=1, ready=1),
        }
        if candidate:
            deps["candidate"] = DeploymentFact(
                names.candidate_name("llama3-8b"), "redrafter", candidate, 1, 1, 1, 1, 1, 1, ""
            )
        obs = Observed(jobs=[job(doc, v, "Succeeded") for v in jobs], deployments=deps, service_pool="redrafter")
        engines = {v: {"key": k[v], "state": "Ready" if v in jobs else "Building"} for v in ("redrafter", "base")}
        status = {"activeEngine": "redrafter", "validation": validation, "engines": engines}
        p = plan(res_of(doc, status), obs, now=NOW, renderers=default_renderers())
        return p, {(m["kind"], m["metadata"]["name"]): m for m in p.apply}

    def key_of(m):
        return m["spec"]["template"]["metadata"]["labels"][names.LABEL_ENGINE_KEY]

    cand = names.candidate_name("llama3-8b")
    # the new ReDrafter engine is built, the base one not yet: nothing unvalidated reaches the primary
    p, by = step(old_pair, jobs=("redrafter",))
    assert key_of(by[("Deployment", "llama3-8b-redrafter")]) == "r-old"
    # both built, validation pending: the primary keeps the promoted engine, the candidate runs the new one
    p, by = step(old_pair)
    assert key_of(by[("Deployment", "llama3-8b-redrafter")]) == "r-old"
    assert key_of(by[("Deployment", cand)]) == k["redrafter"] and by[("Deployment", cand)]["spec"]["replicas"] == 1
    assert k["redrafter"] in by[("ConfigMap", names.candidate_config_name("llama3-8b"))]["data"]["serving.json"]
    assert "r-old" in by[("ConfigMap", "llama3-8b-redrafter-serving")]["data"]["serving.json"]
    assert ("Service", cand) in by
    assert by[("Service", "llama3-8b")]["spec"]["selector"][names.LABEL_TRAFFIC] == "redrafter"
    assert by[("Deployment", "llama3-8b-base")]["spec"]["replicas"] >= 1  # the reference for the Job
    prog = cond(p.status.wire(), "Progressing")
    assert prog["reason"] == "Validating" and "r-old keeps serving" in prog["message"] and cand in prog["message"]
    # the new pair fails: the promoted engine keeps serving, the candidate scales to zero
    failed = {
        "redrafterKey": k["redrafter"],
        "baseKey": k["base"],
        "state": "Failed",
        "reason": "Diverged",
        "message": "1 of 12 differ",
        "promoted": promoted,
    }
    p, by = step(failed, candidate=k["redrafter"])
    assert key_of(by[("Deployment", "llama3-8b-redrafter")]) == "r-old"
    assert by[("Deployment", "llama3-8b-redrafter")]["spec"]["replicas"] >= 1
    assert by[("Deployment", cand)]["spec"]["replicas"] == 0
    assert by[("Service", "llama3-8b")]["spec"]["selector"][names.LABEL_TRAFFIC] == "redrafter"
    prog = cond(p.status.wire(), "Progressing")
    assert prog["reason"] == "ValidationFailed" and "promoted ReDrafter engine r-old keeps serving" in prog["message"]
    assert p.status.wire()["phase"] == "Degraded"
    # a retry passes: the primary rolls to the new engine, the candidate scales away
    passed = {
        "redrafterKey": k["redrafter"],
        "baseKey": k["base"],
        "state": "Passed",
        "promoted": {"redrafterKey": k["redrafter"], "baseKey": k["base"]},
    }
    p, by = step(passed, candidate=k["redrafter"])
    assert key_of(by[("Deployment", "llama3-8b-redrafter")]) == k["redrafter"]
    assert by[("Deployment", cand)]["spec"]["replicas"] == 0


def test_without_a_promoted_engine_the_primary_runs_the_new_engine_as_before():
    from redrafter_operator.controller.renderers import default_renderers

    doc = body()
    k = keys(doc)
    obs = Observed(
        jobs=[job(doc, v, "Succeeded") for v in ("redrafter", "base")],
        deployments={"redrafter": dep("llama3-8b", "redrafter", "r-old")},
        service_pool="redrafter",
    )
    p = plan(res_of(doc, {"activeEngine": "redrafter"}), obs, now=NOW, renderers=default_renderers())
    by = {(m["kind"], m["metadata"]["name"]): m for m in p.apply}
    assert (
        by[("Deployment", "llama3-8b-redrafter")]["spec"]["template"]["metadata"]["labels"][names.LABEL_ENGINE_KEY]
        == k["redrafter"]
    )
    assert ("Deployment", names.candidate_name("llama3-8b")) not in by
    prog = cond(p.status.wire(), "Progressing")  # not promoted yet: the rollout is not complete
    assert (prog["status"], prog["reason"]) == ("True", "Validating") and "serves meanwhile" in prog["message"]


def test_engine_status_reports_size_and_built_at_from_the_build_message():
    """The build Pod's success message carries the manifest's size and built-at; status keeps them after
    the Job expires, and a Cached engine gets them from the Job that built it for another resource."""
    doc = body()
    built = BuildResult(size_bytes=16 * 2**30, built_at="2026-01-01T00:00:00Z")
    rd = job(doc, "redrafter", "Succeeded")
    ok = PodFact(job=rd.name, phase="Succeeded", message=built.message("OK: engine k (redrafter) is complete at /c/k"))
    other_ok = built.model_copy(update={"size_bytes": 123}).message("OK: engine b (base) is complete at /c/b")
    obs = Observed(
        jobs=[rd],
        pods={rd.name: ok},
        shared={"base": SharedArtifact(ready_by="Job other-build-base", built_message=other_ok)},
    )
    p = plan(res_of(doc), obs, now=NOW, renderers=RENDER)
    engines = p.status.wire()["engines"]
    assert (engines["redrafter"]["sizeBytes"], engines["redrafter"]["builtAt"]) == (16 * 2**30, "2026-01-01T00:00:00Z")
    assert engines["base"]["state"] == "Cached" and engines["base"]["sizeBytes"] == 123
    ReDrafterDeploymentStatus.model_validate(p.status.wire())
    later = plan(res_of(doc, p.status.wire()), Observed(), now=LATER, renderers=RENDER)  # Jobs and Pods expired
    assert all(
        (later.status.wire()["engines"][v]["sizeBytes"], later.status.wire()["engines"][v]["builtAt"])
        == (engines[v]["sizeBytes"], engines[v]["builtAt"])
        for v in ("redrafter", "base")
    )
    # a message from an older builder (no result line) leaves the fields out rather than inventing them
    bare = Observed(jobs=[rd], pods={rd.name: PodFact(job=rd.name, phase="Succeeded", message="OK: engine k")})
    assert "sizeBytes" not in plan(res_of(doc), bare, now=NOW, renderers=RENDER).status.wire()["engines"]["redrafter"]


def test_out_of_disk_collects_then_retries_once_beyond_the_retries():
    """An out-of-disk failure (exit 4) is followed by one build whose init container collects unreferenced
    engines under the resource's retention; a second out-of-disk failure is final (retries 0 here)."""
    doc = body(engine__build__retries=0, engine__cache={"retention": {"keep": 1, "maxAge": "24h"}})
    st0 = plan(res_of(doc), Observed(), now=NOW, renderers=RENDER).status.wire()
    failed0 = job(doc, "redrafter", "Failed", reason="BackoffLimitExceeded")
    ood = "OUT_OF_DISK: not enough free space on the cache volume: about 16.0 GiB needed, 2.0 GiB free"
    obs = Observed(
        jobs=[failed0, job(doc, "base", "Succeeded")],
        pods={failed0.name: PodFact(job=failed0.name, phase="Failed", message=ood)},
    )
    p1 = plan(res_of(doc, st0), obs, now=NOW, renderers=RENDER)
    (retry,) = [m for m in p1.create if m["kind"] == "Job"]
    assert retry["metadata"]["name"] == names.build_job_name("llama3-8b", "redrafter", keys(doc)["redrafter"], 1)
    pod = retry["spec"]["template"]["spec"]
    (collect,) = pod["initContainers"]
    assert collect["image"] == pod["containers"][0]["image"]  # the builder image: engine_jobs, the files' owner
    assert collect["command"][4:] == [
        "gc",
        "--local",
        "/cache",
        "--references",
        "/etc/redrafter/cache/references.json",
        "--termination-log",
        "/dev/termination-log",
        "--keep",
        "1",
        "--max-age",
        "86400s",
    ]
    assert retry["metadata"]["labels"]["redrafter.dev/cache-verb"] == "gc-before-build"
    engine = p1.status.wire()["engines"]["redrafter"]
    assert (
        engine["state"] == "Building"
        and "ran out of disk" in engine["message"]
        and "then one more build" in engine["message"]
    )
    failed1 = JobFact.from_body(
        {
            **retry,
            "status": {
                "conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "x"}]
            },
        }
    )
    assert failed1.collected and failed1.state == "Failed"
    obs.jobs.append(failed1)
    obs.pods[failed1.name] = PodFact(job=failed1.name, phase="Failed", message=ood)
    p2 = plan(res_of(doc, p1.status.wire()), obs, now=LATER, renderers=RENDER)
    assert p2.create == [] and p2.status.wire()["engines"]["redrafter"]["state"] == "Failed"


def test_out_of_disk_without_a_retention_collects_nothing():
    doc = body(engine__build__retries=0)
    failed0 = job(doc, "redrafter", "Failed", reason="BackoffLimitExceeded")
    obs = Observed(
        jobs=[failed0],
        pods={failed0.name: PodFact(job=failed0.name, phase="Failed", message="OUT_OF_DISK: not enough free space")},
    )
    p = plan(res_of(doc), obs, now=NOW, renderers=RENDER)
    assert not [
        m for m in p.create if m["kind"] == "Job" and m["metadata"]["labels"].get(names.LABEL_VARIANT) == "redrafter"
    ]
    assert p.status.wire()["engines"]["redrafter"]["state"] == "Failed"


def _prewarm_to_rest(doc, obs, st, rounds=3):
    """Plan a few steps, the Deployments following what was applied (Ready when they have replicas)."""
    k = keys(doc)
    p = None
    for _ in range(rounds):
        p = plan(res_of(doc, st), obs, now=LATER, renderers=RENDER)
        st = p.status.wire()
        applied = {
            v: m
            for m in p.apply
            for v in ("redrafter", "base")
            if m["kind"] == "Deployment" and m["metadata"]["name"] == names.serving_deployment_name("llama3-8b", v)
        }
        want = {v: m["spec"]["replicas"] for v, m in applied.items()}
        obs.deployments = {
            v: dep("llama3-8b", v, k[v], replicas=want.get(v, 0), ready=want.get(v, 0)) for v in ("redrafter", "base")
        }
        obs.applied = {
            names.serving_deployment_name("llama3-8b", v): manifest_hash(applied[v]) if v in applied else "h"
            for v in ("redrafter", "base")
        }  # as applied: the Deployments carry this step's spec
        svc = next((m for m in p.apply if m["kind"] == "Service"), None)
        obs.service_pool = svc["spec"]["selector"].get(names.LABEL_TRAFFIC) if svc else None
    return p


def test_prewarm_builds_and_validates_then_rests_without_serving_and_scaling_up_serves_at_once():
    doc = body(serving__replicas=0, autoscaling__mode="Disabled")
    k = keys(doc)
    obs = Observed(jobs=[job(doc, "redrafter", "Succeeded"), job(doc, "base", "Succeeded")])
    first = plan(res_of(doc), obs, now=NOW, renderers=RENDER)
    assert first.status.wire()["phase"] != "Prewarmed"  # the pair is validated first (its pods run for that)
    st = {
        **first.status.wire(),
        "validation": {
            "state": "Passed",
            "redrafterKey": k["redrafter"],
            "baseKey": k["base"],
            "promoted": {"redrafterKey": k["redrafter"], "baseKey": k["base"]},
        },
    }
    p = _prewarm_to_rest(doc, obs, st)
    assert p.status.wire()["phase"] == "Prewarmed" and p.create == []
    assert {m["metadata"]["name"]: m["spec"]["replicas"] for m in p.apply if m["kind"] == "Deployment"} == {
        "llama3-8b-redrafter": 0,
        "llama3-8b-base": 0,
    }
    available = cond(p.status.wire(), "Available")
    assert available["status"] == "False" and available["reason"] == "Prewarmed"
    # GitOps tools see a prewarmed resource as healthy and done (kstatus Current, Argo CD Healthy)
    assert [cond(p.status.wire(), t)["status"] for t in ("Ready", "Reconciling", "Stalled")] == [
        "True",
        "False",
        "False",
    ]
    ReDrafterDeploymentStatus.model_validate(p.status.wire())
    # scaling up: the built, validated engine serves; nothing is rebuilt
    up = copy.deepcopy(doc)
    up["spec"]["serving"]["replicas"] = 2
    p2 = _prewarm_to_rest(up, obs, p.status.wire())
    assert p2.create == [] and p2.status.wire()["phase"] == "Serving"
    assert {m["metadata"]["name"]: m["spec"]["replicas"] for m in p2.apply if m["kind"] == "Deployment"}[
        f"llama3-8b-{p2.status.wire()['activeEngine']}"
    ] == 2
    # zero replicas while the autoscaler may scale up again is not a prewarm
    auto = body(serving__replicas=0, autoscaling__mode="External")
    assert _prewarm_to_rest(auto, obs, p.status.wire()).status.wire()["phase"] == "Serving"


# ---- placement: GPU Jobs only when some node could run them ------------------------------------
A100_NODES = (
    Node("a100-0", {LABEL_PRODUCT: "NVIDIA-A100-SXM4-80GB"}, {"nvidia.com/gpu": "8"}),
    Node("a100-1", {LABEL_PRODUCT: "NVIDIA-A100-SXM4-80GB"}, {"nvidia.com/gpu": "8"}),
)
H100_NODES = tuple(
    Node(f"h100-{i}", {LABEL_PRODUCT: "NVIDIA-H100-80GB-HBM3"}, {"nvidia.com/gpu": "8"}) for i in range(3)
)


def test_no_matching_gpu_node_creates_no_job_and_says_why_once():
    doc = body(parallelism__tensor=2)  # 2x NVIDIA-A100-SXM4-80GB
    p = plan(res_of(doc), Observed(nodes=H100_NODES), now=NOW, renderers=RENDER)
    assert p.create == [] and p.claims == []
    st = p.status.wire()
    missing = "no node offers 2× NVIDIA-A100-SXM4-80GB; nodes: 3× NVIDIA-H100-80GB-HBM3 (8 each)"
    sched = cond(st, "Schedulable")
    assert (sched["status"], sched["reason"]) == ("False", "NoMatchingGPUNodes")
    assert sched["message"] == f"redrafter engine, base engine: {missing}"
    assert st["phase"] == "Pending"
    for v in ("redrafter", "base"):
        assert st["engines"][v]["state"] == "Pending"
        assert st["engines"][v]["message"].endswith(missing)
    assert (cond(st, "EnginesReady")["status"], cond(st, "EnginesReady")["reason"]) == ("False", "NoMatchingGPUNodes")
    assert cond(st, "Progressing")["reason"] == "NoMatchingGPUNodes"
    assert cond(st, "Stalled")["status"] == "False"  # a node may come (an autoscaler, an admin): not failed
    assert [(e.type, e.reason) for e in p.events if "GPU" in e.reason] == [("Warning", "NoMatchingGPUNodes")]
    ReDrafterDeploymentStatus.model_validate(st)

    # the same facts again: nothing new, no second Warning
    again = plan(res_of(doc, st), Observed(nodes=H100_NODES), now=LATER, renderers=RENDER)
    assert again.status.wire() == st and again.create == []
    assert [e.reason for e in again.events if "GPU" in e.reason] == []

    # a matching node appears: the Jobs are created, the condition flips, one Normal Event says so
    nodes = H100_NODES + A100_NODES
    found = plan(res_of(doc, st), Observed(nodes=nodes), now=LATER, renderers=RENDER)
    assert [m["kind"] for m in found.create] == ["ConfigMap", "Job", "ConfigMap", "Job"]
    sched = cond(found.status.wire(), "Schedulable")
    assert (sched["status"], sched["reason"]) == ("True", "MatchingGPUNodes")
    assert "2 node(s) offer 2× NVIDIA-A100-SXM4-80GB: a100-0, a100-1" in sched["message"]
    assert found.status.wire()["phase"] == "Building"
    assert [(e.type, e.reason) for e in found.events if "GPU" in e.reason] == [("Normal", "GPUNodesFound")]


def test_unwatched_nodes_are_not_checked():
    p = plan(res_of(body(parallelism__tensor=2)), Observed(nodes=None), now=NOW, renderers=RENDER)
    assert [m["kind"] for m in p.create] == ["ConfigMap", "Job", "ConfigMap", "Job"]
    assert find(p.status.wire()["conditions"], "Schedulable") is None


def test_a_taint_the_build_jobs_do_not_tolerate_is_named_and_a_toleration_clears_it():
    tainted = tuple(
        Node(n.name, n.labels, n.allocatable, (Taint("dedicated", "serving", "NoSchedule"),)) for n in A100_NODES
    )
    p = plan(res_of(body()), Observed(nodes=tainted), now=NOW, renderers=RENDER)
    assert p.create == []
    assert (
        "not tolerated: a100-0 (taint dedicated=serving:NoSchedule)" in cond(p.status.wire(), "Schedulable")["message"]
    )
    tolerating = body(engine__build__tolerations=[{"key": "dedicated", "operator": "Exists"}])
    p = plan(res_of(tolerating), Observed(nodes=tainted), now=NOW, renderers=RENDER)
    assert len(p.create) == 4 and cond(p.status.wire(), "Schedulable")["status"] == "True"


def test_refused_children_stall_the_resource_ahead_of_a_failed_build() -> None:
    """A child the API server refused to apply stops progress until someone acts: Ready/Stalled name it, even
    when a build failed as well (the refused write is what the user must fix first)."""
    doc = body()
    obs = Observed(
        jobs=[job(doc, "redrafter", "Failed"), job(doc, "base", "Succeeded")],
        refused=['Service llama3-8b: 422 Invalid: spec.ports[1].name: Duplicate value: "grpc"'],
    )
    st = plan(res_of(doc), obs, now=NOW, renderers=RENDER).status.wire()
    progressing, stalled, ready = (cond(st, t) for t in ("Progressing", "Stalled", "Ready"))
    assert (progressing["status"], progressing["reason"]) == ("False", "ApplyRefused")
    assert (stalled["status"], stalled["reason"]) == ("True", "ApplyRefused")
    assert (ready["status"], ready["reason"]) == ("False", "ApplyRefused")
    assert "Service llama3-8b: 422 Invalid" in stalled["message"] and "Duplicate value" in ready["message"]
    assert cond(st, "Reconciling")["status"] == "False"
