"""evaluate.gate: the promotion gate's steps, from a new engine pair to Passed / Failed / retried."""

from __future__ import annotations

from redrafter_operator.api.status import ValidationStatus
from redrafter_operator.evaluate import outcome as oc
from redrafter_operator.evaluate.gate import JOB_FAILED, validation_step

R, B, NOW = "rkey-new", "bkey-new", "2026-12-02T10:00:00Z"


def job(kind: str | None, reason: str = "") -> dict:
    conds = [] if kind is None else [{"type": kind, "status": "True", "reason": reason or kind}]
    return {"metadata": {"name": "llm-validate"}, "status": {"conditions": conds}}


def pod(message: str) -> dict:
    return {"status": {"containerStatuses": [{"name": "validate", "state": {"terminated": {"message": message}}}]}}


def step(previous=None, *, pods_ready=True, j=None, p=None, retry=None, enabled=True, r=R, b=B):
    s = validation_step(
        enabled=enabled,
        redrafter_key=r,
        base_key=b,
        pods_ready=pods_ready,
        previous=previous,
        job=j,
        pod=p,
        job_name="llm-validate",
        now=NOW,
        retry_token=retry,
    )
    if s.status is not None:
        ValidationStatus.model_validate(s.status)  # what the controller writes fits status.validation
    return s


def test_disabled_validation_never_blocks():
    s = step(enabled=False, pods_ready=False)
    assert s.promote and not s.create_job and s.status is None and s.condition is None


def test_new_pair_waits_for_pods_then_creates_the_job_once():
    s = step(pods_ready=False)
    assert not s.promote and not s.create_job
    assert (s.status["state"], s.condition.reason) == ("Pending", "WaitingForPods")
    s = step(s.status)
    assert s.create_job and not s.promote and s.attempt == 0
    assert s.status["state"] == "Running" and s.events[0][1] == "ValidationStarted"
    s = step(s.status, j=job(None))  # the Job exists and runs: nothing more to create
    assert not s.create_job and not s.promote and s.condition.reason == "Validating"


def test_pass_promotes_and_records_the_crossover():
    running = step(step().status, j=job(None)).status
    s = step(running, j=job("Complete"), p=pod("Passed: 17 requests identical | crossoverConcurrency=3.5"))
    assert s.promote and s.crossover == 3.5
    assert s.status["state"] == "Passed" and s.status["completed"] == NOW
    assert s.condition.status == "True" and s.events == [("Normal", "ValidationPassed", "17 requests identical")]
    again = step(s.status)  # idempotent: the Job may be gone (TTL) and nothing is re-run
    assert again.promote and not again.create_job and again.status == s.status and not again.events


def test_failure_blocks_promotion_with_the_verdict():
    running = step(step().status, j=job(None)).status
    s = step(running, j=job("Failed", "PodFailurePolicy"), p=pod("Diverged: 1 of 17 differ at character 6"))
    assert not s.promote and not s.create_job
    assert (s.status["state"], s.status["reason"]) == ("Failed", oc.DIVERGED)
    assert s.condition == type(s.condition)("Validated", "False", "Diverged", "1 of 17 differ at character 6")
    assert s.events[0][0] == "Warning"
    stays = step(s.status, j=job("Failed"), p=pod("Diverged: 1 of 17 differ at character 6"))
    assert not stays.promote and not stays.create_job and stays.status == s.status


def test_job_failure_without_a_verdict():
    running = step(step().status, j=job(None)).status
    s = step(running, j=job("Failed", "DeadlineExceeded"), p=None)
    assert s.status["reason"] == JOB_FAILED and "DeadlineExceeded" in s.status["message"]


def test_retry_token_starts_the_next_attempt():
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
    s = step(failed, retry="t2")
    assert s.attempt == 1 and s.create_job and s.status["state"] == "Pending" and s.status["retryToken"] == "t2"


def test_a_new_engine_pair_is_validated_again():
    passed = {"redrafterKey": "old", "baseKey": B, "attempt": 3, "state": "Passed", "message": "ok"}
    s = step(passed)
    assert not s.promote and s.create_job and s.attempt == 0 and s.status["redrafterKey"] == R
