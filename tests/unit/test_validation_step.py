"""The validation step: from a new engine pair to Passed / Failed / retried, read from the watched facts."""

from __future__ import annotations

from typing import Any

from redrafter_operator.api.status import ValidationStatus
from redrafter_operator.controller.conditions import Cond
from redrafter_operator.controller.facts import RunJobFact, RunPodFact
from redrafter_operator.controller.plan_types import EventSpec
from redrafter_operator.controller.validation import JOB_FAILED, ValidationStep, validation_step
from redrafter_operator.evaluate import outcome as oc
from redrafter_operator.render.validation import validation_job_name

R, B, NOW = "rkey-new", "bkey-new", "2026-12-02T10:00:00Z"
NAME = "llm"
JOB = validation_job_name(NAME, R, B, 0)


def job(kind: str | None, reason: str = "", name: str = JOB) -> dict[str, RunJobFact]:
    """The watched Job of the attempt, as the index keeps it (built from the API's shape)."""
    conds = [] if kind is None else [{"type": kind, "status": "True", "reason": reason or kind}]
    body = {"metadata": {"name": name, "namespace": "ns"}, "status": {"conditions": conds}}
    return {name: RunJobFact.from_body(body)}


def pod(message: str, name: str = JOB) -> dict[str, RunPodFact]:
    body = {
        "metadata": {"name": f"{name}-x", "labels": {"batch.kubernetes.io/job-name": name}},
        "status": {"containerStatuses": [{"name": "validate", "state": {"terminated": {"message": message}}}]},
    }
    return {name: RunPodFact.from_body(body)}


def step(
    previous: ValidationStatus | dict[str, Any] | None = None,
    *,
    pods_ready: bool = True,
    j: dict[str, RunJobFact] | None = None,
    p: dict[str, RunPodFact] | None = None,
    retry: str | None = None,
) -> ValidationStep:
    s = validation_step(
        NAME,
        (R, B),
        pods_ready=pods_ready,
        previous=ValidationStatus.from_wire(previous) if isinstance(previous, dict) else previous,
        jobs=j or {},
        pods=p or {},
        now=NOW,
        retry_token=retry,
    )
    assert ValidationStatus.from_wire(s.status.wire()) == s.status  # what the controller writes reads back the same
    return s


def test_new_pair_waits_for_pods_then_creates_the_job_once() -> None:
    s = step(pods_ready=False)
    assert not s.promote and not s.create_job and s.condition is not None
    assert (s.status.wire()["state"], s.condition.reason) == ("Pending", "WaitingForPods")
    s = step(s.status)
    assert s.create_job and not s.promote and s.attempt == 0
    # created and running in the same step: status says so in one write
    assert s.status.wire() == {"redrafterKey": R, "baseKey": B, "attempt": 0, "state": "Running", "job": JOB}
    assert s.condition == Cond("Validated", "Unknown", "Validating", f"validation Job {JOB} running")
    assert [e.reason for e in s.events] == ["ValidationStarted"]
    again = step(s.status, j=job(None))  # the Job exists and runs: nothing more to create, nothing to say
    assert not again.create_job and not again.promote and not again.events
    assert (again.status, again.condition) == (s.status, s.condition)


def test_pass_promotes_and_records_the_crossover() -> None:
    running = step(step().status, j=job(None)).status
    s = step(running, j=job("Complete"), p=pod("Passed: 17 requests identical | crossoverConcurrency=3.5"))
    assert s.promote and s.crossover == 3.5
    assert s.status.wire()["state"] == "Passed" and s.status.wire()["completed"] == NOW
    assert s.condition is not None and s.condition.status == "True"
    assert s.events == (EventSpec("Normal", "ValidationPassed", "17 requests identical"),)
    again = step(s.status)  # idempotent: the Job may be gone (TTL) and nothing is re-run
    assert again.promote and not again.create_job and again.status == s.status and not again.events


def test_failure_blocks_promotion_with_the_verdict() -> None:
    running = step(step().status, j=job(None)).status
    s = step(running, j=job("Failed", "PodFailurePolicy"), p=pod("Diverged: 1 of 17 differ at character 6"))
    assert not s.promote and not s.create_job
    assert (s.status.wire()["state"], s.status.wire()["reason"]) == ("Failed", oc.DIVERGED)
    assert s.condition == Cond("Validated", "False", "Diverged", "1 of 17 differ at character 6")
    assert s.events[0].type == "Warning"
    stays = step(s.status, j=job("Failed"), p=pod("Diverged: 1 of 17 differ at character 6"))
    assert not stays.promote and not stays.create_job and stays.status == s.status


def test_job_failure_without_a_verdict() -> None:
    running = step(step().status, j=job(None)).status
    s = step(running, j=job("Failed", "DeadlineExceeded"))
    assert s.status.wire()["reason"] == JOB_FAILED and "DeadlineExceeded" in s.status.wire()["message"]
    foreign = step(running, j=job("Failed", "BackoffLimitExceeded"), p=pod("Traceback (most recent call last):"))
    assert foreign.status.wire()["reason"] == JOB_FAILED  # a crash's log is no verdict


def test_retry_token_starts_the_next_attempt() -> None:
    failed = {
        "redrafterKey": R,
        "baseKey": B,
        "attempt": 0,
        "state": "Failed",
        "reason": "RequestFailed",
        "message": "x",
        "retryToken": "t1",
    }
    assert not step(failed, retry="t1").create_job
    waiting = step(failed, retry="t2", pods_ready=False)
    assert waiting.attempt == 1 and not waiting.create_job
    assert waiting.status.wire()["state"] == "Pending" and waiting.status.wire()["retryToken"] == "t2"
    s = step(failed, retry="t2", j=job("Failed"))  # the failed attempt's Job is not the retry's
    assert s.attempt == 1 and s.create_job and s.status.wire()["state"] == "Running"
    assert s.status.wire()["job"] == validation_job_name(NAME, R, B, 1) != JOB


def test_a_new_engine_pair_is_validated_again() -> None:
    passed = {"redrafterKey": "old", "baseKey": B, "attempt": 3, "state": "Passed", "message": "ok"}
    s = step(passed)
    assert not s.promote and s.create_job and s.attempt == 0 and s.status.wire()["redrafterKey"] == R
