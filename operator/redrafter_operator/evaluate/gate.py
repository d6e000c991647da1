"""The promotion gate (pure): what the controller does about validation for one engine pair.

The controller calls :func:`validation_step` on every reconcile with what it observes and applies
the result: create the Job (:func:`redrafter_operator.render.validation.validation_job`) when
``create_job`` is set, write ``status`` to ``status.validation``, add ``condition`` to the
conditions, write ``crossover`` to ``status.speculation.crossoverConcurrency``, and only move the
stable Service to (or keep rolling) the new engines while ``promote`` is true. Level-based: the
same inputs give the same step, and the Job name is a function of the pair and the attempt, so a
restarted operator neither duplicates nor forgets a validation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from . import outcome as oc

#: reasons a Job can fail without the container writing a verdict
JOB_FAILED = "JobFailed"


@dataclass(frozen=True)
class GateCondition:
    """A condition to set (the controller adds timestamps / observedGeneration)."""

    type: str
    status: str
    reason: str
    message: str


@dataclass(frozen=True)
class ValidationStep:
    promote: bool  # may the stable Service select the new engine pair?
    create_job: bool  # create validation_job(owner, ..., attempt=attempt) now
    attempt: int
    status: dict[str, Any] | None  # status.validation (camelCase), None when validation is disabled
    condition: GateCondition | None = None
    crossover: float | None = None  # status.speculation.crossoverConcurrency when measured
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message) to post


def validation_step(
    *,
    enabled: bool,
    redrafter_key: str,
    base_key: str,
    pods_ready: bool,
    previous: Mapping[str, Any] | None,
    job: Mapping[str, Any] | None,
    pod: Mapping[str, Any] | None,
    job_name: str,
    now: str,
    retry_token: str | None = None,
) -> ValidationStep:
    """One step of the gate for the pair (``redrafter_key``, ``base_key``).

    ``pods_ready``: both per-variant Services have Ready pods running exactly these keys.
    ``previous``: the current status.validation. ``job`` / ``pod``: the observed validation Job of
    the current attempt (``job_name``) and its pod, if any. ``retry_token``: a changed value (e.g. the
    resource's retry annotation) re-runs a failed validation as attempt + 1.
    """
    if not enabled:
        return ValidationStep(True, False, 0, None)
    prev = dict(previous or {})
    same_pair = prev.get("redrafterKey") == redrafter_key and prev.get("baseKey") == base_key
    attempt = int(prev.get("attempt", 0)) if same_pair else 0
    base_status = {"redrafterKey": redrafter_key, "baseKey": base_key, "attempt": attempt}
    if same_pair and prev.get("state") == "Passed":
        return ValidationStep(
            True,
            False,
            attempt,
            prev,
            GateCondition("Validated", "True", oc.PASSED, prev.get("message") or "engine pair validated"),
        )
    if same_pair and prev.get("state") == "Failed":
        if retry_token and retry_token != prev.get("retryToken"):
            attempt += 1
            status = {**base_status, "attempt": attempt, "state": "Pending", "retryToken": retry_token}
            return ValidationStep(
                False,
                pods_ready,
                attempt,
                status,
                GateCondition("Validated", "Unknown", "Retrying", f"validation attempt {attempt} requested"),
            )
        return ValidationStep(
            False,
            False,
            attempt,
            prev,
            GateCondition(
                "Validated", "False", prev.get("reason") or JOB_FAILED, prev.get("message") or "validation failed"
            ),
        )
    if not pods_ready:
        status = {**base_status, "state": "Pending", "job": None}
        return ValidationStep(
            False,
            False,
            attempt,
            status,
            GateCondition(
                "Validated", "Unknown", "WaitingForPods", "waiting for Ready pods of both engines to validate"
            ),
        )
    if job is None:
        status = {**base_status, "state": "Running", "job": job_name}
        return ValidationStep(
            False,
            True,
            attempt,
            status,
            GateCondition("Validated", "Unknown", "Validating", f"validation Job {job_name} created"),
            events=[
                (
                    "Normal",
                    "ValidationStarted",
                    f"validating engines {redrafter_key[:12]}/{base_key[:12]} with Job {job_name}",
                )
            ],
        )
    result = oc.job_result(dict(job))
    if result is None:
        status = {**base_status, "state": "Running", "job": job_name}
        return ValidationStep(
            False,
            False,
            attempt,
            status,
            GateCondition("Validated", "Unknown", "Validating", f"validation Job {job_name} running"),
        )
    verdict = oc.outcome_from_pod(dict(pod)) if pod else None
    kind, job_reason = result
    if kind == "Complete" and verdict is not None and verdict.passed:
        status = {
            **base_status,
            "state": "Passed",
            "job": job_name,
            "reason": verdict.reason,
            "message": verdict.message,
            "completed": now,
        }
        return ValidationStep(
            True,
            False,
            attempt,
            status,
            GateCondition("Validated", "True", oc.PASSED, verdict.message),
            crossover=verdict.crossover_concurrency,
            events=[("Normal", "ValidationPassed", verdict.message)],
        )
    if verdict is not None and not verdict.passed:
        reason, message = verdict.reason, verdict.message
    else:  # no verdict: deadline, evictions beyond the backoff limit, a crash without a message
        reason, message = JOB_FAILED, f"validation Job {job_name} failed ({job_reason}) without a verdict"
    status = {**base_status, "state": "Failed", "job": job_name, "reason": reason, "message": message, "completed": now}
    if retry_token is not None:
        status["retryToken"] = retry_token
    return ValidationStep(
        False,
        False,
        attempt,
        status,
        GateCondition("Validated", "False", reason, message),
        events=[("Warning", "ValidationFailed", f"{reason}: {message}")],
    )
