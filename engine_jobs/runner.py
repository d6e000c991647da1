"""Run one planned step as a subprocess, streaming its output into the build log as it comes."""

from __future__ import annotations

import collections
import subprocess
import threading
import time
from typing import IO

from .errors import BuildError, ExitCode
from .plan import Step
from .progress import Log

TERMINATE_GRACE_SECONDS = 10


def _pump(stream: IO[str], prefix: str, log: Log, tail: collections.deque[str]) -> None:
    for line in stream:
        line = line.rstrip("\n")
        tail.append(line)
        log(f"  {prefix} | {line}")


def run_step(
    step: Step,
    log: Log,
    tail_lines: int,
    env: dict[str, str] | None = None,
    passthrough: tuple[ExitCode, ...] = (),
) -> float:
    """Run ``step.argv`` (never through a shell); seconds taken, or BuildError(TOOL_FAILURE) with its tail.

    A step of our own (the training worker) that exits with one of ``passthrough`` fails the Job with that
    code and the reason of its ``<CODE>: <reason>`` line: a bad dataset is bad input, not a tool failure.
    """
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            list(step.argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            bufsize=1,
            env=env,
        )
    except OSError as exc:
        raise BuildError(
            ExitCode.TOOL_FAILURE, f"step {step.name}: cannot start {step.argv[0]}: {exc.strerror or exc}"
        ) from None
    out_tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
    err_tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
    assert proc.stdout is not None and proc.stderr is not None
    pumps = [
        threading.Thread(target=_pump, args=(proc.stdout, step.name, log, out_tail), daemon=True),
        threading.Thread(target=_pump, args=(proc.stderr, step.name, log, err_tail), daemon=True),
    ]
    for t in pumps:
        t.start()
    try:
        code = proc.wait()
    finally:
        if proc.poll() is None:  # we are being stopped (SIGTERM, lock lost): do not orphan a GPU job
            proc.terminate()
            try:
                proc.wait(TERMINATE_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for t in pumps:
            t.join(timeout=5)
    seconds = time.monotonic() - start
    if code in passthrough:
        known = ExitCode(code)
        reason = next(
            (line[len(known.name) + 2 :] for line in reversed(err_tail) if line.startswith(f"{known.name}: ")),
            f"step {step.name} failed with {known.name}",
        )
        raise BuildError(known, log.redact(reason), log.redact("\n".join(err_tail)))
    if code != 0:
        tail = err_tail or out_tail  # the error is usually on stderr; some tools only use stdout
        how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
        raise BuildError(
            ExitCode.TOOL_FAILURE, f"step {step.name} failed ({how}) after {seconds:.0f}s", log.redact("\n".join(tail))
        )
    return seconds
