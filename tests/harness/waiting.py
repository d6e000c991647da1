"""Waiting without fixed sleeps: poll a predicate with a short, growing interval until it holds or a deadline
passes, and say what was awaited when it does not."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


def _timed_out(timeout: float, what: str, explain: Callable[[], str] | None) -> AssertionError:
    return AssertionError(f"timed out after {timeout:.0f}s waiting for {what}" + (f": {explain()}" if explain else ""))


def wait_until(
    predicate: Callable[[], T],
    timeout: float = 60.0,
    what: str = "condition",
    explain: Callable[[], str] | None = None,
) -> T:
    """The predicate's first truthy value; AssertionError naming ``what`` (and what ``explain`` says of the state
    it ended in) after ``timeout`` seconds."""
    deadline, pause = time.monotonic() + timeout, 0.02
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise _timed_out(timeout, what, explain)
        time.sleep(pause)
        pause = min(pause * 1.5, 0.5)


async def until(
    predicate: Callable[[], Any | Awaitable[Any]],
    timeout: float = 60.0,
    what: str = "condition",
    explain: Callable[[], str] | None = None,
) -> Any:
    """The async form: ``predicate`` may be a coroutine function."""
    deadline, pause = time.monotonic() + timeout, 0.02
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise _timed_out(timeout, what, explain)
        await asyncio.sleep(pause)
        pause = min(pause * 1.5, 0.5)
