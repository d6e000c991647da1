"""The controller's one clock: the ticker, the work queue's delays, the monitors and the policy read it.

Injectable so that a test moves time instead of waiting for it (k8s.io/utils/clock's idea): the real
:class:`SystemClock` in production; a fake (``redrafter_sim.clock.FakeClock``) in tests and benches.
``monotonic`` measures intervals, ``time`` is wall-clock epoch seconds (what status timestamps show).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float: ...

    def time(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The process's own clocks and ``asyncio.sleep``."""

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def rfc3339(epoch: float) -> str:
    """Whole seconds, UTC, ``Z``: the form Kubernetes writes timestamps in."""
    return dt.datetime.fromtimestamp(epoch, dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


__all__ = ["Clock", "SystemClock", "rfc3339"]
