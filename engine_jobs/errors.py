"""Exit codes and failure reporting of the build Job.

The operator reads a failed Job's exit code (to decide whether a retry can help) and its termination
message (to show in status). Kubernetes keeps at most 4096 bytes of that message, so it is written
already bounded: one reason line first, then as much of the failing tool's output tail as fits.
"""

from __future__ import annotations

import enum
import os
from pathlib import Path

#: Kubernetes truncates the termination message at 4096 bytes.
TERMINATION_MESSAGE_LIMIT = 4096


class ExitCode(enum.IntEnum):
    """Exit codes of ``python -m engine_jobs build`` (and ``plan``), one meaning each.

    0  OK                  engine published, or already in the cache (hit)
    1  INTERNAL            a bug in engine_jobs itself (unexpected exception)
    2  BAD_INPUT           the spec or the model files are wrong; retrying will not help
    3  TOOL_FAILURE        a converter or trtllm-build failed or produced incomplete output
    4  OUT_OF_DISK         the cache volume has clearly too little free space for this build
    5  LOCK_TIMEOUT        another live builder held the key's lock longer than the wait timeout
    6  SOURCE_UNAVAILABLE  a model source (or the cache volume) could not be reached (wrong path, revoked
                           token, outage): not retried by the operator, which asks for a fix and a retry
    143 TERMINATED         stopped by SIGTERM (Job deadline, pod deletion); the lock was released
    """

    OK = 0
    INTERNAL = 1
    BAD_INPUT = 2
    TOOL_FAILURE = 3
    OUT_OF_DISK = 4
    LOCK_TIMEOUT = 5
    SOURCE_UNAVAILABLE = 6
    TERMINATED = 143


#: codes a new attempt cannot fix without a change: the build Job's podFailurePolicy fails the Job at the
#: first such exit (no pod retry) and the operator starts no further Job until the spec or its
#: retry-build annotation changes
NON_RETRYABLE: tuple[ExitCode, ...] = (ExitCode.BAD_INPUT, ExitCode.SOURCE_UNAVAILABLE)


class BuildError(Exception):
    """A failure with a known cause: ends the program with ``code`` and a termination message."""

    def __init__(self, code: ExitCode, reason: str, detail: str = "") -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason
        self.detail = detail


def bad_input(reason: str, detail: str = "") -> BuildError:
    return BuildError(ExitCode.BAD_INPUT, reason, detail)


def format_termination_message(
    code: ExitCode, reason: str, detail: str = "", limit: int = TERMINATION_MESSAGE_LIMIT
) -> str:
    """``<CODE>: <reason>`` on one line, then the *end* of ``detail`` (where errors are), within ``limit`` bytes."""
    head = f"{code.name}: {' '.join(reason.split())}"
    head_bytes = head.encode()
    if len(head_bytes) >= limit:
        return head_bytes[: limit - 3].decode(errors="ignore") + "..."
    detail = detail.strip("\n")
    if not detail:
        return head
    room = limit - len(head_bytes) - 1  # newline
    tail = detail.encode()
    if len(tail) > room:
        marker = "...\n".encode()
        tail = marker + tail[len(tail) - (room - len(marker)) :]
    return head + "\n" + tail.decode(errors="ignore")


def write_termination_message(path: str | os.PathLike[str], message: str) -> None:
    """Best effort: a missing or read-only path must not hide the original failure."""
    try:
        Path(path).write_text(message[:TERMINATION_MESSAGE_LIMIT], encoding="utf-8")
    except OSError:
        pass
