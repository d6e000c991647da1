"""The validation Job's verdict and its termination-message format (pure; the controller's gate parses it).

The Job writes one line to its termination-message file (``/dev/termination-log``), which Kubernetes
copies into ``status.containerStatuses[].state.terminated.message`` (at most 4096 bytes):

    <Reason>: <human-readable message>[ | crossoverConcurrency=<float>]

``Reason`` is CamelCase and usable as a condition reason as is: ``Passed``, ``Diverged`` (greedy
outputs differ), ``RequestFailed`` (a request errored or returned nothing), ``EndpointUnavailable``
(an endpoint never became ready) or ``InvalidInput`` (bad arguments / prompt file). The exit code
follows the reason (:data:`EXIT_CODES`), so a Job's failure is visible without parsing anything.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

PASSED = "Passed"
DIVERGED = "Diverged"
REQUEST_FAILED = "RequestFailed"
ENDPOINT_UNAVAILABLE = "EndpointUnavailable"
INVALID_INPUT = "InvalidInput"
EXIT_CODES = {PASSED: 0, DIVERGED: 1, REQUEST_FAILED: 1, INVALID_INPUT: 2, ENDPOINT_UNAVAILABLE: 3}
MAX_MESSAGE_BYTES = 4096  # Kubernetes truncates termination messages beyond this
_CROSSOVER = " | crossoverConcurrency="
_LINE = re.compile(
    r"^(?P<reason>[A-Z][A-Za-z]*): (?P<message>.*?)(?: \| crossoverConcurrency=(?P<x>[0-9.eE+-]+|inf))?$"
)


@dataclass(frozen=True)
class ValidationOutcome:
    reason: str
    message: str
    crossover_concurrency: float | None = None  # measured after a pass, when asked for

    @property
    def passed(self) -> bool:
        return self.reason == PASSED

    @property
    def exit_code(self) -> int:
        return EXIT_CODES.get(self.reason, 1)


def format_termination_message(outcome: ValidationOutcome, limit: int = MAX_MESSAGE_BYTES) -> str:
    """One line, within ``limit`` bytes (the message is shortened, never the reason or crossover)."""
    tail = "" if outcome.crossover_concurrency is None else f"{_CROSSOVER}{outcome.crossover_concurrency:.3f}"
    head = f"{outcome.reason}: "
    message = " ".join(outcome.message.replace("|", "/").split())
    room = limit - len(head.encode()) - len(tail.encode())
    encoded = message.encode()
    if len(encoded) > room:
        message = encoded[: max(room - 3, 0)].decode("utf-8", "ignore") + "..."
    return f"{head}{message}{tail}"


def parse_termination_message(text: str | None) -> ValidationOutcome | None:
    """The outcome in a terminated container's message (None when it is not one of ours)."""
    if not text:
        return None
    m = _LINE.match(text.strip().splitlines()[0] if text.strip() else "")
    if not m or m["reason"] not in EXIT_CODES:
        return None
    x = m["x"]
    return ValidationOutcome(m["reason"], m["message"], float(x) if x is not None else None)


def write_termination_message(path: str | Path, outcome: ValidationOutcome) -> None:
    """Best effort: a missing directory (running outside a pod) must not hide the verdict."""
    try:
        Path(path).write_text(format_termination_message(outcome) + "\n", encoding="utf-8")
    except OSError:
        pass
