"""The trained drafter (pure): ``status.drafter`` and the training Job when one is needed.

A spec with ``model.drafter.train`` adds one stage before the ReDrafter engine: the drafter, content-addressed
by its training inputs and produced by a training Job on the same cache claim as the engines, with the same
bookkeeping (:func:`.engines.plan_stage`: never run twice, retries, non-retryable exit codes, shared across
resources). The ReDrafter engine waits for it (its key includes the drafter's); the base engine does not, so
the base engine builds and serves while the drafter trains.
"""

from __future__ import annotations

from typing import Any, Mapping

from engine_jobs.contract import TrainingResult

from ..api.status import DrafterStatus
from ..policy.drafter_gate import DrafterFigures, judge
from ..render.build import drafter_path
from ..render.common import Owner
from ..render.training import STAGE, training_configmap, training_job
from .engines import TRAINING_REASONS, Stage, plan_stage
from .facts import Observed
from .plan_types import READY_STATES, EventSpec, Plan, Resource
from .reports import TrainingReport
from .status import Draft

#: status.drafter fields a running training reports (copied from the pod's progress)
PROGRESS_FIELDS = ("phase", "step", "totalSteps", "loss")
#: status.drafter fields of a finished training (from its termination message)
RESULT_FIELDS = (
    "heldOutAcceptance",
    "untrainedAcceptance",
    "promptLookupAcceptance",
    "heldOutTop1",
    "trainTop1",
    "tokensPerStep",
    "steps",
    "loss",
)
#: the state of a trained drafter the drafter gate rejected (the training itself is Ready or Cached)
REJECTED = "Rejected"


def drafter_stage(res: Resource, owner: Owner, key: str) -> Stage:
    spec = owner.spec
    return Stage(
        name=STAGE,
        what="drafter",
        key=key,
        path=drafter_path(spec, key),
        retries=spec.engine.build.retries,
        children=lambda attempt: [training_configmap(owner), training_job(owner, attempt)],
        old=_stage_old(res.status.get("drafter") or {}),
        collects=False,
        reasons=TRAINING_REASONS,
        gpu_resource=spec.engine.build.gpu_resource,
    )


def _stage_old(old: Mapping[str, Any]) -> Mapping[str, Any]:
    """The stage's view of the old status: a Rejected drafter was trained (Ready), whatever the gate said."""
    return {**old, "state": "Ready"} if old.get("state") == REJECTED else old


def _gate(out: dict[str, Any], old: Mapping[str, Any], accept: bool, plan: Plan) -> None:
    """A trained drafter the gate rejects is Rejected (a Warning Event once), unless the spec accepts it."""
    verdict = judge(DrafterFigures.model_validate(out))
    if verdict.passed:
        return
    if accept:
        out["message"] = f"accepted by spec.model.drafter.train.acceptRejected: {verdict.message}"
        return
    out.update(state=REJECTED, message=verdict.message)
    if old.get("state") != REJECTED:
        plan.events.append(
            EventSpec("Warning", "DrafterRejected", f"drafter {out['key']}: {verdict.message}; the base keeps serving")
        )


def _result(out: Mapping[str, Any], observed: Observed) -> TrainingResult | None:
    pod = observed.pods.get(str(out.get("job") or ""))
    shared = observed.shared.get(STAGE)
    for message in (pod.message if pod else "", shared.built_message if shared else ""):
        result = TrainingResult.from_message(message)
        if result is not None:
            return result
    return None


def plan_drafter(
    res: Resource, owner: Owner, observed: Observed, plan: Plan, key: str, report: TrainingReport | None
) -> dict[str, Any]:
    """``status.drafter``: Pending, Training (with its progress), Ready/Cached (with held-out acceptance and its
    baselines), Rejected (trained, but the drafter gate found it does not draft) or Failed."""
    stage = drafter_stage(res, owner, key)
    events_before = len(plan.events)
    out = dict(plan_stage(res, owner, stage, observed, plan))
    old_status = res.status.get("drafter") or {}
    old = stage.old if stage.old.get("key") == key else {}
    if out["state"] == "Building":
        out["state"] = "Training"
        if report is not None and report.key == key and report.job == out.get("job") and report.progress:
            out.update(report.progress.model_dump(by_alias=True, exclude_none=True), progressAt=report.at)
        elif old.get("job") == out.get("job"):
            out.update({f: old[f] for f in (*PROGRESS_FIELDS, "progressAt") if f in old})
        if report is not None and report.key == key and report.error and "step" not in out:
            out.setdefault("message", f"progress not readable yet: {report.error}")
    elif out["state"] in READY_STATES:
        result = _result(out, observed)
        if result is not None:
            out.update(
                result.model_dump(
                    by_alias=True,
                    include={
                        "held_out_acceptance",
                        "untrained_acceptance",
                        "prompt_lookup_acceptance",
                        "held_out_top1",
                        "train_top1",
                        "tokens_per_step",
                        "steps",
                        "loss",
                    },
                    exclude_none=True,
                )
            )
            if result.trained_at:
                out["trainedAt"] = result.trained_at
        else:
            out.update({f: old[f] for f in (*RESULT_FIELDS, "trainedAt") if f in old})
        if result is None and old.get("state") not in (*READY_STATES, REJECTED):
            # trained, but its figures (the Pod's termination message) not read yet: the gate cannot judge it,
            # so nothing is built from it yet, and the "trained" Event waits for the figures
            del plan.events[events_before:]
            out.update(state="Training", phase="publishing", message="waiting for the training result")
            return {k: v for k, v in out.items() if v is not None}
        train = owner.spec.model.drafter.train if owner.spec.model.drafter else None
        _gate(out, old_status if old_status.get("key") == key else {}, bool(train and train.accept_rejected), plan)
    return {k: v for k, v in out.items() if v is not None}


def waiting_engine(engine: Mapping[str, Any], drafter: Mapping[str, Any]) -> dict[str, Any]:
    """The ReDrafter engine's status while its drafter is not trained: Pending, or Failed with the drafter."""
    base = {"key": engine["key"], "path": engine["path"]}
    if drafter.get("state") == "Failed":
        return {**base, "state": "Failed", "message": f"the drafter failed: {drafter.get('message', '')}"}
    if drafter.get("state") == REJECTED:
        return {
            **base,
            "state": "Pending",
            "message": f"not built: {drafter.get('message', '')}; the base engine serves "
            "(spec.model.drafter.train.acceptRejected builds it anyway)",
        }
    progress = f" (step {drafter['step']}/{drafter.get('totalSteps', '?')})" if "step" in drafter else ""
    return {
        **base,
        "state": "Pending",
        "message": f"waiting for the drafter {drafter['key']}: {drafter.get('state', 'Pending')}{progress}",
    }


def drafter_part(draft: Draft, drafter: Mapping[str, Any]) -> None:
    """``status.drafter``: the drafter concern's own part of the status (no condition of its own yet)."""
    draft.status.drafter = DrafterStatus.from_wire(drafter)
