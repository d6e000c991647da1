"""Validation before promotion, planned (pure) around ``evaluate.gate.validation_step``.

When ``spec.validation.enabled`` and both engines are Ready/Cached, on every reconcile of the resource (its
validation Jobs and their Pods are watched and indexed: a change of either wakes it):

1. while ``status.validation`` is not Passed for the current (ReDrafter key, base key) pair, both variant
   Deployments keep >= 1 replica (the Job compares the two variant Services' greedy outputs);
2. ``pods_ready`` = both variant Deployments rolled out on the new keys with >= 1 Ready pod;
3. ``validation_step`` with the observed Job ``validation_job_name(name, rkey, bkey, attempt)`` and its pod;
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

from ..api.spec import ReDrafterDeploymentSpec
from ..evaluate.gate import ValidationStep, validation_step
from ..render.common import Owner
from ..render.validation import DEFAULT_OPERATOR_IMAGE, validation_job, validation_job_name
from .conditions import Cond, merge_conditions
from .facts import Observed
from .gate import ANNOTATION_RETRY_VALIDATION, engine_pair, gate_of, pods_ready
from .plan_types import EventSpec

ENV_OPERATOR_IMAGE = "REDRAFTER_OPERATOR_IMAGE"


def operator_image() -> str:
    """What validation and collection Jobs run in: $REDRAFTER_OPERATOR_IMAGE (the chart sets it), else this
    version's published image."""
    return os.environ.get(ENV_OPERATOR_IMAGE) or DEFAULT_OPERATOR_IMAGE


def validation_fragment(old: Mapping[str, Any], step: ValidationStep, *, generation: int, now: str) -> dict[str, Any]:
    """status.validation (with the measured crossover) and the Validated condition after one step (pure)."""
    out: dict[str, Any] = {}
    if step.status is not None:
        out["validation"] = {k: v for k, v in step.status.items() if v is not None}
    if step.condition is not None:
        c = step.condition
        out["conditions"] = merge_conditions(
            old.get("conditions") or [],
            [Cond(c.type, c.status, c.reason, c.message)],  # type: ignore[arg-type]
            generation=generation,
            now=now,
        )
    if "validation" in out:  # the last pair that passed outlives the record of newer pairs
        state = out["validation"]
        prev = old.get("validation") or {}
        promoted = prev.get("promoted")
        crossover = None
        if step.crossover is not None and step.crossover != float("inf"):
            crossover = state["crossoverConcurrency"] = round(step.crossover, 4)
        if state.get("state") == "Passed":
            same = (prev.get("redrafterKey"), prev.get("baseKey")) == (state["redrafterKey"], state["baseKey"])
            if crossover is None and same:
                crossover = prev.get("crossoverConcurrency", (promoted or {}).get("crossoverConcurrency"))
            promoted = {"redrafterKey": state["redrafterKey"], "baseKey": state["baseKey"]}
            if crossover is not None:  # what the promoted engine's in-engine limit comes from
                promoted["crossoverConcurrency"] = crossover
        if promoted:
            out["validation"]["promoted"] = promoted
    return out


@dataclass
class ValidationPlan:
    """What validation needs of one reconcile: status fields, the Job to create, the Events."""

    status: dict[str, Any] = field(default_factory=dict)
    job: dict[str, Any] | None = None
    events: list[EventSpec] = field(default_factory=list)


def plan_validation(
    owner: Owner, status: Mapping[str, Any], observed: Observed, annotations: Mapping[str, str], *, image: str, now: str
) -> ValidationPlan:
    """One validation step for the resource's current engine pair (``status`` holds this plan's engines)."""
    spec: ReDrafterDeploymentSpec = owner.spec
    pair = engine_pair(status) if spec.validation.enabled else None
    if pair is None:
        return ValidationPlan()
    retry = annotations.get(ANNOTATION_RETRY_VALIDATION) or None
    gate = gate_of(status, pair)
    prev = status.get("validation") or {}
    if gate.state == "Passed" or (gate.state == "Failed" and (not retry or retry == prev.get("retryToken"))):
        return ValidationPlan()  # settled: status says it all
    ready = pods_ready(observed.deployments, pair, candidate=gate.stable is not None)
    same = prev.get("redrafterKey") == pair[0] and prev.get("baseKey") == pair[1]
    attempt = int(prev.get("attempt", 0)) if same else 0
    job_name = validation_job_name(owner.name, pair[0], pair[1], attempt)
    fact = observed.validation_jobs.get(job_name) if ready else None
    pod = observed.validation_pods.get(job_name) if fact is not None and fact.result is not None else None
    step = validation_step(
        enabled=True,
        redrafter_key=pair[0],
        base_key=pair[1],
        pods_ready=ready,
        previous=prev,
        job=fact.as_job() if fact else None,
        pod=pod.as_pod() if pod else None,
        job_name=job_name,
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
        # Step again with the Job as created, so status says "running" at once (one write, not two).
        events = step.events
        step = validation_step(
            enabled=True,
            redrafter_key=pair[0],
            base_key=pair[1],
            pods_ready=ready,
            previous={**prev, **(step.status or {})},
            job=job,
            pod=None,
            job_name=job["metadata"]["name"],
            now=now,
            retry_token=retry,
        )
        step = replace(step, events=[*events, *step.events])
    return ValidationPlan(
        validation_fragment(status, step, generation=owner.generation, now=now),
        job,
        [EventSpec(*e) for e in step.events],
    )


__all__ = ["ENV_OPERATOR_IMAGE", "ValidationPlan", "operator_image", "plan_validation", "validation_fragment"]
