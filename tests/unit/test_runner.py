"""run_step: a tool's failure is TOOL_FAILURE with its tail; our own worker's known exit codes pass through."""

from __future__ import annotations

import io
import sys

import pytest

from engine_jobs.errors import BuildError, ExitCode
from engine_jobs.plan import Step
from engine_jobs.progress import Log
from engine_jobs.runner import run_step


def step(code: str) -> Step:
    return Step("train", (sys.executable, "-c", code), ".", "a step")


def test_a_failing_tool_is_a_tool_failure_with_its_stderr_tail() -> None:
    with pytest.raises(BuildError) as caught:
        run_step(step("import sys; print('boom', file=sys.stderr); sys.exit(2)"), Log(io.StringIO()), 5)
    assert caught.value.code == ExitCode.TOOL_FAILURE and "exit code 2" in caught.value.reason
    assert caught.value.detail == "boom"


def test_a_passed_through_code_keeps_its_meaning_and_the_worker_s_reason() -> None:
    worker = "import sys; print('BAD_INPUT: column text missing in a.jsonl', file=sys.stderr); sys.exit(2)"
    with pytest.raises(BuildError) as caught:
        run_step(step(worker), Log(io.StringIO()), 5, passthrough=(ExitCode.BAD_INPUT, ExitCode.OUT_OF_DISK))
    assert caught.value.code == ExitCode.BAD_INPUT
    assert caught.value.reason == "column text missing in a.jsonl"


def test_a_code_not_passed_through_stays_a_tool_failure() -> None:
    with pytest.raises(BuildError) as caught:
        run_step(step("import sys; sys.exit(6)"), Log(io.StringIO()), 5, passthrough=(ExitCode.BAD_INPUT,))
    assert caught.value.code == ExitCode.TOOL_FAILURE
