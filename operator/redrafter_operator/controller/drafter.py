"""The trained drafter (pure): ``status.drafter`` and the training Job when one is needed.

A spec with ``model.drafter.train`` adds one stage before the ReDrafter engine: the drafter, content-addressed
by its training inputs and produced by a training Job on the same cache claim as the engines, with the same
bookkeeping (:func:`.engines.plan_stage`: never run twice, retries, non-retryable exit codes, shared across
resources). The ReDrafter engine waits for it (its key includes the drafter's); the base engine does not, so
the base engine builds and serves while the drafter trains.
"""

from __future__ import annotations

from typing import Any, Literal, Mapping

from engine_jobs.contract import TrainingResult

from ..api.status import DrafterStatus, EngineStatus
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
PROGRESS_FIELDS = ("phase", "step", "total_steps", "loss")
#: status.drafter fields of a finished training (from its termination message)
RESULT_FIELDS = (
    "held_out_acceptance",
    "untrained_acceptance",
    "prompt_lookup_acceptance",
    "held_out_top1",
    "train_top1",
    "tokens_per_step",
    "steps",
    "loss",
)
#: the state of a trained drafter the drafter gate rejected (the training itself is Ready or Cached)
REJECTED: Literal["Rejected"] = "Rejected"


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


def _gate(out: DrafterStatus, old: Mapping[str, Any], accept: bool, plan: Plan) -> None:
    """A trained drafter the gate rejects is Rejected (a Warning Event once), unless the spec accepts it."""
    verdict = judge(DrafterFigures.model_validate(out, from_attributes=True))
    if verdict.passed:
        return
    if accept:
        out.message = f"accepted by spec.model.drafter.train.acceptRejected: {verdict.message}"
        return
    out.state, out.message = REJECTED, verdict.message
    if old.get("state") != REJECTED:
        plan.events.append(
            EventSpec("Warning", "DrafterRejected", f"drafter {out.key}: {verdict.message}; the base keeps serving")
        )


def _copy(out: DrafterStatus, old: Mapping[str, Any], fields: tuple[str, ...]) -> None:
    """The ``fields`` the old status (wire form) holds, carried over."""
    for f in fields:
        wire = DrafterStatus.model_fields[f].alias or f
        if wire in old:
            setattr(out, f, old[wire])


def _result(out: DrafterStatus, observed: Observed) -> TrainingResult | None:
    pod = observed.pods.get(out.job or "")
    shared = observed.shared.get(STAGE)
    for message in (pod.message if pod else "", shared.built_message if shared else ""):
        result = TrainingResult.from_message(message)
        if result is not None:
            return result
    return None


def plan_drafter(
    res: Resource, owner: Owner, observed: Observed, plan: Plan, key: str, report: TrainingReport | None
) -> DrafterStatus:
    """``status.drafter``: Pending, Training (with its progress), Ready/Cached (with held-out acceptance and its
    baselines), Rejected (trained, but the drafter gate found it does not draft) or Failed."""
    stage = drafter_stage(res, owner, key)
    events_before = len(plan.events)
    built = plan_stage(res, owner, stage, observed, plan)
    fields = {f: getattr(built, f) for f in built.model_fields_set}
    out = DrafterStatus(**{**fields, "state": "Training" if built.state == "Building" else built.state})
    old_status = res.status.get("drafter") or {}
    old = stage.old if stage.old.get("key") == key else {}
    if built.state == "Building":
        if report is not None and report.key == key and report.job == out.job and report.progress:
            p = report.progress
            out.phase, out.step, out.total_steps, out.loss = p.phase, p.step, p.total_steps, p.loss
            out.progress_at = report.at
        elif old.get("job") == out.job:
            _copy(out, old, (*PROGRESS_FIELDS, "progress_at"))
        if report is not None and report.key == key and report.error and out.step is None:
            out.message = out.message if out.message is not None else f"progress not readable yet: {report.error}"
    elif out.state in READY_STATES:
        result = _result(out, observed)
        if result is not None:
            for f in RESULT_FIELDS:
                if getattr(result, f) is not None:
                    setattr(out, f, getattr(result, f))
            if result.trained_at:
                out.trained_at = result.trained_at
        else:
            _copy(out, old, (*RESULT_FIELDS, "trained_at"))
        if result is None and old.get("state") not in (*READY_STATES, REJECTED):
            # trained, but its figures (the Pod's termination message) not read yet: the gate cannot judge it,
            # so nothing is built from it yet, and the "trained" Event waits for the figures
            del plan.events[events_before:]
            out.state, out.phase, out.message = "Training", "publishing", "waiting for the training result"
            return out
        train = owner.spec.model.drafter.train if owner.spec.model.drafter else None
        _gate(out, old_status if old_status.get("key") == key else {}, bool(train and train.accept_rejected), plan)
    return out


def waiting_engine(engine: EngineStatus, drafter: DrafterStatus) -> EngineStatus:
    """The ReDrafter engine's status while its drafter is not trained: Pending, or Failed with the drafter."""
    if drafter.state == "Failed":
        engine.state, engine.message = "Failed", f"the drafter failed: {drafter.message or ''}"
    elif drafter.state == REJECTED:
        engine.state = "Pending"
        engine.message = (
            f"not built: {drafter.message or ''}; the base engine serves "
            "(spec.model.drafter.train.acceptRejected builds it anyway)"
        )
    else:
        progress = (
            f" (step {drafter.step}/{'?' if drafter.total_steps is None else drafter.total_steps})"
            if drafter.step is not None
            else ""
        )
        engine.state = "Pending"
        engine.message = f"waiting for the drafter {drafter.key}: {drafter.state}{progress}"
    return engine


def drafter_part(draft: Draft, drafter: DrafterStatus) -> None:
    """``status.drafter``: the drafter concern's own part of the status (no condition of its own yet)."""
    draft.status.drafter = drafter
