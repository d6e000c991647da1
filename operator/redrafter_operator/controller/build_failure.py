"""Why a failed build is not retried, in words a user can act on (engine status message and Event).

A build Job whose podFailurePolicy failed it exited with a code no new attempt can fix (engine_jobs
NON_RETRYABLE: bad input, source unavailable); spending another Job (and GPU time) on it would fail the
same way, so the engine is Failed at once and waits for a change.
"""

from __future__ import annotations

from engine_jobs.errors import ExitCode

from ..render import names


def exit_code_name(code: int) -> str:
    try:
        return ExitCode(code).name
    except ValueError:
        return "unknown"


def not_retried_message(resource: str, code: int) -> str:
    """The status/Event text for a build that ended with ``code``: which code, and how to retry."""
    return (
        f"exit code {code} ({exit_code_name(code)}) cannot succeed on retry, so no further build Job is "
        f"started; fix the spec (a changed spec builds again), or fix the source and run "
        f"`kubectl annotate rdd {resource} {names.ANNOTATION_RETRY_BUILD}=<new value> --overwrite`"
    )
