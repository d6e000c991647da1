"""Admission to the OpenAI front: a bounded number of generations at once, a bounded queue, 429 past it.

``GET /metrics`` exports its counts (:func:`admission_metrics`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

from . import contract
from .openai_protocol import ApiError

_R = TypeVar("_R")


class Admission:
    """At most ``max_in_flight`` generations at once; the rest get 429 once ``max_in_flight + max_queued``
    requests are held (receiving their body, or waiting for a generation slot).

    A request takes a *place* before its body is read, so the bodies in memory stay bounded by the places;
    it takes a generation *slot* only once its body has fully arrived (bounded by ``body_timeout``, 408) and
    parsed, so a slow upload never holds a slot a ready request could use."""

    def __init__(self, max_in_flight: int, max_queued: int, queue_timeout: float, retry_after: int) -> None:
        self.max_in_flight, self.max_queued = max_in_flight, max_queued
        self.queue_timeout, self.retry_after = queue_timeout, retry_after
        self._slots = asyncio.Semaphore(max_in_flight)
        self.in_flight = 0
        self.queued = 0  # received, waiting for a generation slot
        self.receiving = 0  # holding a place while their body arrives
        self.rejected: dict[str, int] = {"queue_full": 0, "queue_timeout": 0}

    def _busy(self, reason: str, message: str) -> ApiError:
        self.rejected[reason] += 1
        return ApiError(
            429, message, type_="rate_limit_error", code=reason, headers={"Retry-After": str(self.retry_after)}
        )

    @asynccontextmanager
    async def slot(self, receive: Callable[[], Awaitable[_R]]) -> AsyncIterator[_R]:
        """Take a place (429 ``queue_full`` when none is left), ``receive()`` the request holding it, then
        wait for a generation slot (429 ``queue_timeout``) and hold it for the block; yields what
        ``receive`` returned. A request that ``receive`` refuses (400, 408, 413) never waits for a slot."""
        if self.in_flight + self.queued + self.receiving >= self.max_in_flight + self.max_queued:
            raise self._busy(
                "queue_full",
                f"the server is at capacity ({self.max_in_flight} requests in flight, {self.max_queued} "
                "queued, the limits max_in_flight and max_queued); retry after a moment",
            )
        self.receiving += 1
        try:
            received = await receive()
        finally:
            self.receiving -= 1
        self.queued += 1
        try:
            async with asyncio.timeout(self.queue_timeout):
                await self._slots.acquire()
        except TimeoutError:
            raise self._busy(
                "queue_timeout",
                f"the request waited {self.queue_timeout:g}s (queue_timeout) for one of the server's "
                f"{self.max_in_flight} slots; retry after a moment",
            ) from None
        finally:
            self.queued -= 1
        self.in_flight += 1
        try:
            yield received
        finally:
            self.in_flight -= 1
            self._slots.release()


def admission_metrics(a: Admission) -> str:
    """The front's gauges and counters in Prometheus' text format (names in engine_jobs.contract)."""
    lines: list[str] = []
    for name, kind, help_, samples in (
        (contract.METRIC_FRONT_IN_FLIGHT, "gauge", "Generations the OpenAI front is running.", [("", a.in_flight)]),
        (contract.METRIC_FRONT_QUEUED, "gauge", "Requests waiting for a generation slot.", [("", a.queued)]),
        (
            contract.METRIC_FRONT_MAX_IN_FLIGHT,
            "gauge",
            "Generation slots of the OpenAI front (max_in_flight).",
            [("", a.max_in_flight)],
        ),
        (
            contract.METRIC_FRONT_MAX_QUEUED,
            "gauge",
            "Queue places of the OpenAI front (max_queued).",
            [("", a.max_queued)],
        ),
        (
            contract.METRIC_FRONT_REJECTED,
            "counter",
            "Requests refused with 429, by reason.",
            [(f'{{reason="{reason}"}}', n) for reason, n in sorted(a.rejected.items())],
        ),
    ):
        lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]
        lines += [f"{name}{labels} {value}" for labels, value in samples]
    return "\n".join(lines) + "\n"
