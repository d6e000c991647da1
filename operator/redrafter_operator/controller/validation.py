"""The validation gate (pure), in one place: the validation step, its status and the promotion rules.

The planner calls :func:`plan_validation` once per plan; the promotion rules (:func:`gate_of`,
:func:`gated_targets`, :func:`promotion_state`, :func:`validated_engines`) decide from status alone, so a
restarted operator gates from its first reconcile. The step reads the watched facts directly (the Job's
result, its Pod's termination message in :mod:`redrafter_operator.evaluate.outcome`'s format) and speaks
the controller's :class:`~.conditions.Cond` and :class:`~.plan_types.EventSpec`.

When ``spec.validation.enabled`` and both engines are Ready/Cached, on every reconcile of the resource (its
validation Jobs and their Pods are watched and indexed: a change of either wakes it):

1. while ``status.validation`` is not Passed for the current (ReDrafter key, base key) pair, both variant
   Deployments keep >= 1 replica (the Job compares the two variant Services' greedy outputs);
2. ``pods_ready`` = both variant Deployments rolled out on the new keys with >= 1 Ready pod;
3. :func:`validation_step` with the observed Job ``validation_job_name(name, rkey, bkey, attempt)`` and its pod;
   ``create_job`` -> ``render.validation.validation_job`` (create-only) (image: spec.validation.image, else
   $REDRAFTER_OPERATOR_IMAGE, the operator's own); status.validation, the ``Validated`` condition,
   ``status.speculation.crossoverConcurrency`` when measured, and the step's Events;
4. the promotion gate, applied by the planner to the serving targets — ReDrafter is *promoted*
   (may take the stable Service, or serve live traffic as a canary) only once its pair Passed:

   * Pending/Running: no switch to ReDrafter (the Service stays where it is; ReDrafter already serving
     before the base engine existed keeps serving: nothing could be validated then); a fallback to base
     is never held; a Service not yet serving starts on base, the reference engine; no canary; both
     variants >= 1 replica;
   * Failed: the Service serves base (greedy ReDrafter must reproduce base's outputs; a divergent
     engine is wrong, not slow), ReDrafter scales to zero, no canary; Validated=False with the verdict.
     Retry: set annotation ``redrafter.dev/retry-validation`` to a new value (attempt + 1).

   A ReDrafter engine that passed before (``status.validation.promoted``) is *stable*: while a newer
   ReDrafter engine is validated, the primary Deployment keeps running the promoted one (the policy
   goes on choosing between it and base) and the new engine runs on the candidate Deployment
   ``<name>-redrafter-candidate``, in no traffic pool, with its own Service for the Job. Pending/
   Running only keep base >= 1 replica; Failed keeps the promoted engine serving (the candidate
   scales to zero). A pass makes the new pair the promoted one: the primary rolls to it.

Nothing happens before both engines are built (there is no reference to compare with), nor with
validation disabled. No step costs an API request: the Job and its Pod come from the indexes, and the Job
is a planner child, created by the reconciler.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from engine_jobs.contract import VARIANTS

from ..api.spec import ReDrafterDeploymentSpec
from ..api.status import PromotedEngines, ReDrafterDeploymentStatus, ValidationState, ValidationStatus
from ..evaluate import outcome as oc
from ..render import names
from ..render.common import Owner
from ..render.validation import DEFAULT_OPERATOR_IMAGE, validation_job, validation_job_name
from .conditions import Cond
from .facts import Observed, RunJobFact, RunPodFact
from .plan_types import READY_STATES, EventSpec, ServingTargets

ANNOTATION_RETRY_VALIDATION = f"{names.DOMAIN}/retry-validation"


@dataclass(frozen=True)
class Gate:
    """Whether ReDrafter may be promoted, and the validation state behind it."""

    promote: bool
    state: str  # Pending | Running | Passed | Failed
    stable: str | None = None  # the promoted ReDrafter key that keeps serving while a newer one is validated


def engine_pair(status: ReDrafterDeploymentStatus) -> tuple[str, str] | None:
    """(ReDrafter key, base key) when both engines are Ready/Cached, else None (nothing to validate)."""
    redrafter, base = status.engines.redrafter, status.engines.base
    if redrafter is None or base is None:
        return None
    if any(e.state not in READY_STATES or not e.key for e in (redrafter, base)):
        return None
    return redrafter.key, base.key


def _promoted_key(validation: ValidationStatus | None) -> str | None:
    return validation.promoted.redrafter_key if validation and validation.promoted else None


def gate_of(validation: ValidationStatus | None, pair: tuple[str, str]) -> Gate:
    """The gate as ``status.validation`` shows it for ``pair`` (a pair not validated yet is Pending)."""
    promoted = _promoted_key(validation)
    stable = promoted if promoted and promoted != pair[0] else None
    if validation is None or (validation.redrafter_key, validation.base_key) != pair:
        return Gate(False, "Pending", stable)
    state = validation.state
    return Gate(True, state) if state == "Passed" else Gate(False, state, stable)


def gated_targets(targets: ServingTargets, gate: Gate | None, current_pool: str | None) -> ServingTargets:
    """The serving targets with the promotion gate applied (the rules: :mod:`.validation`'s docs)."""
    if gate is None or gate.promote:
        return targets
    if gate.stable:  # the promoted engine serves as the policy says; base stays up as the reference
        if gate.state == "Failed":
            return targets
        return replace(targets, replicas={**targets.replicas, "base": max(1, int(targets.replicas.get("base", 0)))})
    size = int(targets.replicas.get(targets.active, 0))
    if gate.state == "Failed":
        return ServingTargets(active="base", replicas={"base": size, "redrafter": 0}, canary=0)
    if targets.active == "base":  # a fallback to the reference engine is never held; ReDrafter stays up to validate
        return ServingTargets(
            active="base",
            replicas={"base": size, "redrafter": max(1, int(targets.replicas.get("redrafter", 0)))},
            canary=0,
        )
    stay = current_pool if current_pool in VARIANTS else "base"
    other = "base" if stay == "redrafter" else "redrafter"
    # the other variant: one pod to validate against (its standby size if larger), not the policy's full size
    spare = 0 if other == targets.active else int(targets.replicas.get(other, 0))
    return ServingTargets(active=stay, replicas={stay: max(size, 1), other: max(1, spare)}, canary=0)


def gate_from_status(
    targets: ServingTargets, spec: ReDrafterDeploymentSpec, status: ReDrafterDeploymentStatus
) -> ServingTargets:
    """``targets`` with the gate status implies (the planner's defaults, before any evaluation)."""
    pair = engine_pair(status) if spec.validation.enabled else None
    if pair is None:
        return targets
    return gated_targets(targets, gate_of(status.validation, pair), status.active_engine)


def validated_engines(spec: ReDrafterDeploymentSpec, status: ReDrafterDeploymentStatus) -> frozenset[str]:
    """The variants the policy may switch to: ReDrafter only once validated (the new engine, or the promoted one)."""
    pair = engine_pair(status) if spec.validation.enabled else None
    if pair is None:
        return frozenset(VARIANTS)
    gate = gate_of(status.validation, pair)
    return frozenset(VARIANTS) if gate.promote or gate.stable is not None else frozenset({"base"})


def pods_ready(deployments: Mapping[str, Any], pair: tuple[str, str], candidate: bool = False) -> bool:
    """Both Deployments under test (the candidate's for ReDrafter when ``candidate``) rolled out on the
    pair's keys with >= 1 Ready pod."""
    for variant, key in zip(("redrafter", "base"), pair):
        dep = deployments.get("candidate" if candidate and variant == "redrafter" else variant)
        if dep is None or dep.key != key or not dep.rolled_out or dep.ready_replicas < 1:
            return False
    return True


def promotion_state(spec: ReDrafterDeploymentSpec, status: ReDrafterDeploymentStatus) -> tuple[Gate | None, str | None]:
    """(the validation gate of the current engine pair or None, the stable ReDrafter key or None).

    Stable: the promoted ReDrafter engine (status.validation.promoted) while a different ReDrafter
    engine is built or validated: it keeps serving from the primary Deployment.
    """
    if not spec.validation.enabled:
        return None, None
    pair = engine_pair(status)
    if pair is not None:
        gate = gate_of(status.validation, pair)
        return gate, gate.stable
    promoted = _promoted_key(status.validation)
    key = status.engines.redrafter.key if status.engines.redrafter else None
    return None, (promoted if promoted and promoted != key else None)


ENV_OPERATOR_IMAGE = "REDRAFTER_OPERATOR_IMAGE"


def operator_image() -> str:
    """What validation and collection Jobs run in: $REDRAFTER_OPERATOR_IMAGE (the chart sets it), else this
    version's published image."""
    return os.environ.get(ENV_OPERATOR_IMAGE) or DEFAULT_OPERATOR_IMAGE


#: reasons a Job can fail without the container writing a verdict
JOB_FAILED = "JobFailed"
VALIDATE_CONTAINER = "validate"


@dataclass(frozen=True)
class ValidationStep:
    """One step of the gate for an engine pair: status.validation, the Validated condition, what to create."""

    create_job: bool  # create validation_job(owner, ..., attempt=attempt) now
    attempt: int
    status: ValidationStatus
    condition: Cond | None = None
    crossover: float | None = None  # status.speculation.crossoverConcurrency when measured
    events: tuple[EventSpec, ...] = ()

    @property
    def promote(self) -> bool:
        """May the stable Service select the pair (it passed)?"""
        return self.status.state == "Passed"


def validation_step(
    name: str,
    pair: tuple[str, str],
    *,
    pods_ready: bool,
    previous: ValidationStatus | None,
    jobs: Mapping[str, RunJobFact],
    pods: Mapping[str, RunPodFact],
    now: str,
    retry_token: str | None = None,
) -> ValidationStep:
    """One step of the gate for ``pair`` (ReDrafter key, base key) of the resource ``name``.

    ``pods_ready``: both Deployments under test run exactly these keys with Ready pods. ``previous``: the
    current status.validation. ``jobs`` / ``pods``: the resource's watched validation Jobs and each one's
    newest Pod, by Job name (the Job of an attempt is ``validation_job_name(name, *pair, attempt)``, so a
    restarted operator neither duplicates nor forgets one). ``retry_token``: a changed value (the retry
    annotation) re-runs a failed validation as attempt + 1. A Job to create is reported as running at
    once (status says so in the same write).
    """
    redrafter_key, base_key = pair
    prev = previous or ValidationStatus()
    same_pair = (prev.redrafter_key, prev.base_key) == pair
    attempt = prev.attempt if same_pair else 0

    def state(state: ValidationState, **fields: Any) -> ValidationStatus:
        return ValidationStatus(state=state, redrafter_key=redrafter_key, base_key=base_key, attempt=attempt, **fields)

    started = True  # a first attempt's Job is announced; a retry's was asked for
    if same_pair and prev.state == "Passed":
        return ValidationStep(
            False, attempt, prev, Cond("Validated", "True", oc.PASSED, prev.message or "engine pair validated")
        )
    if same_pair and prev.state == "Failed":
        if not retry_token or retry_token == prev.retry_token:
            return ValidationStep(
                False,
                attempt,
                prev,
                Cond("Validated", "False", prev.reason or JOB_FAILED, prev.message or "validation failed"),
            )
        attempt += 1
        if not pods_ready:
            return ValidationStep(
                False,
                attempt,
                state("Pending", retry_token=retry_token),
                Cond("Validated", "Unknown", "Retrying", f"validation attempt {attempt} requested"),
            )
        started = False
    elif not pods_ready:
        return ValidationStep(
            False,
            attempt,
            state("Pending"),
            Cond("Validated", "Unknown", "WaitingForPods", "waiting for Ready pods of both engines to validate"),
        )
    job_name = validation_job_name(name, redrafter_key, base_key, attempt)
    validating = Cond("Validated", "Unknown", "Validating", f"validation Job {job_name} running")
    job = jobs.get(job_name) if started else None
    if job is None:
        events = (
            EventSpec(
                "Normal",
                "ValidationStarted",
                f"validating engines {redrafter_key[:12]}/{base_key[:12]} with Job {job_name}",
            ),
        )
        return ValidationStep(
            True, attempt, state("Running", job=job_name), validating, events=events if started else ()
        )
    if job.result is None:
        return ValidationStep(False, attempt, state("Running", job=job_name), validating)
    pod = pods.get(job_name)
    verdict = oc.parse_termination_message(pod.messages.get(VALIDATE_CONTAINER)) if pod else None
    kind, job_reason = job.result
    if kind == "Complete" and verdict is not None and verdict.passed:
        return ValidationStep(
            False,
            attempt,
            state("Passed", job=job_name, reason=verdict.reason, message=verdict.message, completed=now),
            Cond("Validated", "True", oc.PASSED, verdict.message),
            crossover=verdict.crossover_concurrency,
            events=(EventSpec("Normal", "ValidationPassed", verdict.message),),
        )
    if verdict is not None and not verdict.passed:
        reason, message = verdict.reason, verdict.message
    else:  # no verdict: deadline, evictions beyond the backoff limit, a crash without a message
        reason, message = JOB_FAILED, f"validation Job {job_name} failed ({job_reason}) without a verdict"
    return ValidationStep(
        False,
        attempt,
        state("Failed", job=job_name, reason=reason, message=message, completed=now, retry_token=retry_token),
        Cond("Validated", "False", reason, message),
        events=(EventSpec("Warning", "ValidationFailed", f"{reason}: {message}"),),
    )


def validation_after(previous: ValidationStatus | None, step: ValidationStep) -> ValidationStatus:
    """status.validation (with the measured crossover) after one step (pure); its Validated condition is the
    step's to mark. The last pair that passed outlives the record of newer pairs."""
    out = step.status.model_copy()
    promoted = previous.promoted if previous else None
    crossover = None
    if step.crossover is not None and step.crossover != float("inf"):
        crossover = out.crossover_concurrency = round(step.crossover, 4)
    if out.state == "Passed" and out.redrafter_key and out.base_key:
        same = previous is not None and (previous.redrafter_key, previous.base_key) == (
            out.redrafter_key,
            out.base_key,
        )
        if crossover is None and same and previous is not None:
            crossover = previous.crossover_concurrency
            if crossover is None and promoted is not None:
                crossover = promoted.crossover_concurrency
        # what the promoted engine's in-engine limit comes from
        promoted = PromotedEngines(
            redrafter_key=out.redrafter_key, base_key=out.base_key, crossover_concurrency=crossover
        )
    if promoted is not None:
        out.promoted = promoted
    return out


@dataclass
class ValidationPlan:
    """What validation needs of one reconcile: status.validation, the Job to create, the Events."""

    status: ValidationStatus | None = None  # None: unchanged
    job: dict[str, Any] | None = None
    events: list[EventSpec] = field(default_factory=list)
    condition: Cond | None = None  # Validated, when this step changes it


def plan_validation(
    owner: Owner,
    status: ReDrafterDeploymentStatus,
    observed: Observed,
    annotations: Mapping[str, str],
    *,
    image: str,
    now: str,
) -> ValidationPlan:
    """One validation step for the resource's current engine pair (``status`` holds this plan's engines)."""
    spec: ReDrafterDeploymentSpec = owner.spec
    pair = engine_pair(status) if spec.validation.enabled else None
    if pair is None:
        return ValidationPlan()
    retry = annotations.get(ANNOTATION_RETRY_VALIDATION) or None
    prev = status.validation
    gate = gate_of(prev, pair)
    if gate.state == "Passed" or (
        gate.state == "Failed" and (not retry or retry == (prev.retry_token if prev else None))
    ):
        return ValidationPlan()  # settled: status says it all
    ready = pods_ready(observed.deployments, pair, candidate=gate.stable is not None)
    step = validation_step(
        owner.name,
        pair,
        pods_ready=ready,
        previous=prev,
        jobs=observed.validation_jobs,
        pods=observed.validation_pods,
        now=now,
        retry_token=retry,
    )
    job = None
    if step.create_job:
        job = validation_job(
            owner,
            redrafter_key=pair[0],
            base_key=pair[1],
            operator_image=image,
            attempt=step.attempt,
            candidate=gate.stable is not None,
        )
    return ValidationPlan(validation_after(prev, step), job, list(step.events), step.condition)


__all__ = [
    "ANNOTATION_RETRY_VALIDATION",
    "ENV_OPERATOR_IMAGE",
    "JOB_FAILED",
    "Gate",
    "ValidationPlan",
    "ValidationStep",
    "engine_pair",
    "gate_from_status",
    "gate_of",
    "gated_targets",
    "operator_image",
    "plan_validation",
    "promotion_state",
    "pods_ready",
    "validated_engines",
    "validation_after",
    "validation_step",
]
