"""GitOps health: the verdicts kstatus (Flux, kubectl wait) and Argo CD (docs/argocd-health.lua) reach on
the statuses the planner writes, in each state a GitOps tool waits through.

kstatus' rules, transcribed below from sigs.k8s.io/cli-utils at tag v0.37.2:
  * pkg/kstatus/status/status.go ``Compute``: the generic checks first; then type-specific rules (none for
    this kind: ``GetLegacyConditionsFn`` in core.go knows only built-in kinds); then ``checkReadyCondition``:
    Ready=True -> Current, Ready=False or Unknown -> InProgress; else Current ("Resource is current").
  * pkg/kstatus/status/generic.go ``checkGenericProperties``: metadata.deletionTimestamp set -> Terminating;
    ``checkGeneration``: metadata.generation and status.observedGeneration both present and different ->
    InProgress (LatestGenerationNotObserved); then, conditions in list order: Reconciling=True ->
    InProgress, Stalled=True -> Failed.
"""

from __future__ import annotations

import copy
import dataclasses
import sys
from pathlib import Path
from typing import Any

import lupa.lua51 as lua51

from redrafter_operator.controller.facts import DeploymentFact, Observed, PodFact, ServingPodFact
from redrafter_operator.controller.fingerprints import manifest_hash
from redrafter_operator.controller.plan_types import ServingTargets
from redrafter_operator.controller.planner import Inputs, plan
from redrafter_operator.controller.renderers import default_renderers
from redrafter_operator.render import names
from redrafter_sim.failures import Fault, pod_status

sys.path.insert(0, str(Path(__file__).parent))
from test_controller_planner import (  # noqa: E402
    LATER,
    NOW,
    RENDER,
    body,
    cond,
    dep,  # noqa: E402
    job,
    keys,
    res_of,
)

ROOT = Path(__file__).resolve().parents[2]
LUA = ROOT / "docs" / "argocd-health.lua"
NAME = "llama3-8b"


# ---- kstatus v0.37.2, transcribed -----------------------------------------------------------------
def kstatus(u: dict[str, Any]) -> str:
    """``status.Compute`` for a custom resource (see the module docstring for the source)."""
    meta, status = u.get("metadata") or {}, u.get("status") or {}
    if meta.get("deletionTimestamp"):
        return "Terminating"
    if "generation" in meta and "observedGeneration" in status and status["observedGeneration"] != meta["generation"]:
        return "InProgress"
    for c in status.get("conditions") or []:
        if c.get("type") == "Reconciling" and c.get("status") == "True":
            return "InProgress"
        if c.get("type") == "Stalled" and c.get("status") == "True":
            return "Failed"
    for c in status.get("conditions") or []:
        if c.get("type") == "Ready":
            if c.get("status") == "True":
                return "Current"
            if c.get("status") in ("False", "Unknown"):
                return "InProgress"
    return "Current"


# ---- Argo CD: the documented Lua, run by Lua 5.1 (Argo CD embeds gopher-lua, a Lua 5.1) ------------
def argocd(u: dict[str, Any]) -> tuple[str, str]:
    runtime = lua51.LuaRuntime(unpack_returned_tuples=True)
    runtime.globals().obj = runtime.table_from(u, recursive=True)
    hs = runtime.execute(LUA.read_text())
    return hs["status"], hs["message"]


def resource(doc: dict[str, Any], status: dict[str, Any] | None, generation: int = 1) -> dict[str, Any]:
    u = copy.deepcopy(doc)
    u["metadata"]["generation"] = generation
    if status is not None:
        u["status"] = status
    return u


def verdicts(u: dict[str, Any]) -> tuple[str, str]:
    return kstatus(u), argocd(u)[0]


def _both_built(doc: dict[str, Any]) -> list[Any]:
    return [job(doc, "redrafter", "Succeeded"), job(doc, "base", "Succeeded")]


def _serving(doc: dict[str, Any], renderers: Any = RENDER, **kw: Any) -> dict[str, Any]:
    """Status of a resource serving the ReDrafter engine, settled (two reconciles)."""
    k = keys(doc)
    obs = Observed(
        jobs=_both_built(doc),
        deployments={"redrafter": dep(NAME, "redrafter", k["redrafter"])},
        service_pool="redrafter",
        **kw,
    )
    st = plan(res_of(doc), obs, now=NOW, renderers=renderers).status.wire()
    return plan(res_of(doc, st), obs, now=NOW, renderers=renderers).status.wire()


# ---- the states ------------------------------------------------------------------------------------
def test_first_deploy_is_in_progress_until_serving_then_current() -> None:
    doc = body(validation__enabled=False)
    building = plan(res_of(doc), Observed(), now=NOW, renderers=RENDER).status.wire()
    assert building["observedGeneration"] == 1
    assert verdicts(resource(doc, building)) == ("InProgress", "Progressing")
    assert cond(building, "Reconciling")["reason"] == "Building" and cond(building, "Ready")["status"] == "False"
    # engines built, the Deployment applied but no replica Ready yet: still in progress
    k = keys(doc)
    rolling = Observed(
        jobs=_both_built(doc), deployments={"redrafter": dep(NAME, "redrafter", k["redrafter"], ready=0)}
    )
    st = plan(res_of(doc, building), rolling, now=LATER, renderers=RENDER).status.wire()
    assert verdicts(resource(doc, st)) == ("InProgress", "Progressing")
    served = _serving(doc)
    assert verdicts(resource(doc, served)) == ("Current", "Healthy")
    assert cond(served, "Ready")["reason"] == "Serving" and argocd(resource(doc, served))[1].startswith("Serving: ")


def test_before_the_first_status_write_only_argo_cd_can_tell() -> None:
    # kstatus' documented gap (status.go, checkReadyCondition's comment): a resource seen before its
    # controller wrote any status is Current to it. The Lua check says Progressing.
    doc = body()
    assert verdicts(resource(doc, None)) == ("Current", "Progressing")


def test_a_build_in_progress_is_never_done_even_while_serving() -> None:
    doc = body(validation__enabled=False)
    k = keys(doc)
    obs = Observed(
        jobs=[job(doc, "redrafter", "Succeeded"), job(doc, "base", "Running")],
        deployments={"redrafter": dep(NAME, "redrafter", k["redrafter"])},
        service_pool="redrafter",
    )
    st = plan(res_of(doc), obs, now=NOW, renderers=RENDER).status.wire()
    st = plan(res_of(doc, st), obs, now=NOW, renderers=RENDER).status.wire()
    assert st["phase"] == "Serving" and cond(st, "Available")["status"] == "True"
    assert verdicts(resource(doc, st)) == ("InProgress", "Progressing")  # the base engine still builds
    assert cond(st, "Reconciling")["status"] == "True"


def test_a_failed_build_is_failed_and_degraded() -> None:
    doc = body(engine__build__retries=0)
    st0 = plan(res_of(doc), Observed(), now=NOW, renderers=RENDER).status.wire()
    failed = job(doc, "redrafter", "Failed", reason="BackoffLimitExceeded")
    obs = Observed(
        jobs=[failed, job(doc, "base", "Running")],
        pods={failed.name: PodFact(job=failed.name, phase="Failed", message="BuildError: out of memory")},
    )
    st = plan(res_of(doc, st0), obs, now=NOW, renderers=RENDER).status.wire()
    assert st["engines"]["redrafter"]["state"] == "Failed"
    u = resource(doc, st)
    assert verdicts(u) == ("Failed", "Degraded")
    assert cond(st, "Stalled")["reason"] == "BuildFailed" and "out of memory" in argocd(u)[1]


def test_a_serving_failure_is_failed_and_degraded() -> None:
    doc = body(validation__enabled=False)
    k = keys(doc)
    pod = {
        "metadata": {
            "name": f"{NAME}-redrafter-abc-0",
            "namespace": "default",
            "uid": "u",
            "labels": {
                **names.common_labels(NAME, "serving"),
                names.LABEL_VARIANT: "redrafter",
                names.LABEL_ROLE: "primary",
            },
        },
        "spec": {"containers": [{"name": "triton", "image": "img"}]},
    }
    pod["status"] = pod_status(pod, Fault("Unschedulable"))
    obs = Observed(
        jobs=_both_built(doc),
        deployments={"redrafter": dep(NAME, "redrafter", k["redrafter"], ready=0)},
        serving_pods=[ServingPodFact.from_body(pod)],
    )
    st = plan(res_of(doc), obs, now=NOW, renderers=RENDER).status.wire()
    u = resource(doc, st)
    assert verdicts(u) == ("Failed", "Degraded")
    assert "Insufficient nvidia.com/gpu" in argocd(u)[1]


def test_a_fallback_to_base_is_healthy_degraded_performance_not_an_outage() -> None:
    doc = body(validation__enabled=False)
    k = keys(doc)
    served = _serving(doc)
    # the speculation policy measured low acceptance and asked for base (its condition, its targets)
    served["conditions"] = [c for c in served["conditions"] if c["type"] != "SpeculationHealthy"] + [
        {
            "type": "SpeculationHealthy",
            "status": "False",
            "reason": "LowAcceptance",
            "message": "acceptance 0.12 below 0.30",
            "lastTransitionTime": NOW,
            "observedGeneration": 1,
        }
    ]
    on_base = Observed(
        jobs=_both_built(doc),
        service_pool="base",
        deployments={
            "base": dep(NAME, "base", k["base"]),
            "redrafter": dep(NAME, "redrafter", k["redrafter"], replicas=0, ready=0),
        },
    )
    targets = ServingTargets(active="base", replicas={"base": 1, "redrafter": 0})
    st = plan(res_of(doc, served), on_base, now=LATER, renderers=RENDER, inputs=Inputs(targets=targets)).status.wire()
    st = plan(res_of(doc, st), on_base, now=LATER, renderers=RENDER, inputs=Inputs(targets=targets)).status.wire()
    assert st["activeEngine"] == "base" and cond(st, "SpeculationHealthy")["status"] == "False"
    assert verdicts(resource(doc, st)) == ("Current", "Healthy")
    assert (cond(st, "Ready")["status"], cond(st, "Stalled")["status"]) == ("True", "False")


def test_a_spec_change_is_in_progress_until_the_new_generation_is_rolled_out() -> None:
    doc = body(validation__enabled=False)
    renderers = default_renderers()
    k = keys(doc)
    old_manifest = next(
        m
        for m in plan(res_of(doc), Observed(jobs=_both_built(doc)), now=NOW, renderers=renderers).apply
        if m["metadata"]["name"] == f"{NAME}-redrafter"
    )
    applied = DeploymentFact(
        name=f"{NAME}-redrafter",
        variant="redrafter",
        key=k["redrafter"],
        replicas=1,
        ready_replicas=1,
        updated_replicas=1,
        total_replicas=1,
        generation=1,
        observed_generation=1,
    )
    obs = Observed(
        jobs=_both_built(doc),
        deployments={"redrafter": applied},
        service_pool="redrafter",
        applied={applied.name: manifest_hash(old_manifest)},
    )
    st = plan(res_of(doc), obs, now=NOW, renderers=renderers).status.wire()
    st = plan(res_of(doc, st), obs, now=NOW, renderers=renderers).status.wire()
    assert verdicts(resource(doc, st)) == ("Current", "Healthy")

    changed = body(validation__enabled=False, serving__nodeSelector={"gpu": "h100"})  # same engines, new template
    # before the operator saw generation 2
    assert verdicts(resource(changed, st, generation=2)) == ("InProgress", "Progressing")
    # the operator's first reconcile of generation 2: the Deployment in the index still has the old template
    ch = copy.deepcopy(changed)
    ch["metadata"]["generation"] = 2
    st2 = plan(res_of(ch, st), obs, now=LATER, renderers=renderers).status.wire()
    assert st2["observedGeneration"] == 2
    assert verdicts(resource(changed, st2, generation=2)) == ("InProgress", "Progressing")
    # the new template applied and rolled out: current again
    new_manifest = next(
        m
        for m in plan(res_of(ch, st2), obs, now=LATER, renderers=renderers).apply
        if m["metadata"]["name"] == f"{NAME}-redrafter"
    )
    # applied, the watch not showing the apply's result yet: the applier knows no manifest it carries
    obs.applied[applied.name] = ""
    st_sent = plan(res_of(ch, st2), obs, now=LATER, renderers=renderers).status.wire()
    assert verdicts(resource(changed, st_sent, generation=2)) == ("InProgress", "Progressing")
    obs.deployments["redrafter"] = dataclasses.replace(applied, generation=2, observed_generation=2)
    obs.applied[applied.name] = manifest_hash(new_manifest)
    st3 = plan(res_of(ch, st2), obs, now=LATER, renderers=renderers).status.wire()
    assert verdicts(resource(changed, st3, generation=2)) == ("Current", "Healthy")

    rebuilt = body(validation__enabled=False, redrafter__numBeams=4)  # new engine: a build first
    rb = copy.deepcopy(rebuilt)
    rb["metadata"]["generation"] = 3
    st4 = plan(res_of(rb, st3), obs, now=LATER, renderers=renderers).status.wire()
    assert cond(st4, "Reconciling")["reason"] == "Building"
    assert verdicts(resource(rebuilt, st4, generation=3)) == ("InProgress", "Progressing")


def test_validation_pending_is_in_progress() -> None:
    doc = body()  # validation on (the default): serving, but the engine pair is not promoted yet
    st = _serving(doc)
    assert cond(st, "Progressing")["reason"] == "Validating"
    assert verdicts(resource(doc, st)) == ("InProgress", "Progressing")


def test_an_invalid_spec_is_failed_and_degraded() -> None:
    doc = body(engine__maxSeqLen=100, engine__maxInputLen=200)
    st = plan(res_of(doc), Observed(), now=NOW, renderers=RENDER).status.wire()
    u = resource(doc, st)
    assert verdicts(u) == ("Failed", "Degraded") and "maxInputLen" in argocd(u)[1]


def test_the_transcription_and_the_lua_agree_with_kstatus_own_edge_cases() -> None:
    # reference points from the rules themselves, independent of the planner
    base = {"metadata": {"name": "x", "generation": 2}}
    assert kstatus({**base, "status": {"observedGeneration": 1}}) == "InProgress"
    assert kstatus({"metadata": {"name": "x", "generation": 1, "deletionTimestamp": NOW}}) == "Terminating"
    stalled_first = {
        **base,
        "status": {
            "observedGeneration": 2,
            "conditions": [
                {"type": "Stalled", "status": "True", "reason": "R"},
                {"type": "Reconciling", "status": "True", "reason": "R"},
            ],
        },
    }
    assert kstatus(stalled_first) == "Failed"  # list order decides when both are True
    assert (
        kstatus(
            {
                **base,
                "status": {
                    "observedGeneration": 2,
                    "conditions": [{"type": "Ready", "status": "Unknown", "reason": "R"}],
                },
            }
        )
        == "InProgress"
    )
    assert argocd(
        {
            **base,
            "status": {
                "observedGeneration": 2,
                "conditions": [{"type": "Ready", "status": "False", "reason": "R", "message": "m"}],
            },
        }
    ) == ("Progressing", "R: m")
