"""A fake clock for the controller (``redrafter_operator.controller.clock.Clock``): time moves only when a test
or bench calls :meth:`FakeClock.advance`, so "after 5 minutes" takes no 5 minutes and no fixed sleep.

The same idea as k8s.io/utils/clock/testing's FakeClock: sleepers wake in the order of their due times, each
at its own time, and the event loop runs what a wake-up started before the next one wakes.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools


class FakeClock:
    def __init__(self, *, monotonic: float = 1000.0, epoch: float = 1_800_000_000.0) -> None:
        self._now = monotonic
        self._offset = epoch - monotonic
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def monotonic(self) -> float:
        return self._now

    def time(self) -> float:
        return self._now + self._offset

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + seconds, next(self._seq), future))
        await future

    @property
    def sleepers(self) -> int:
        """Sleepers still waiting (cancelled ones excluded)."""
        return sum(1 for _, _, f in self._sleepers if not f.done())

    async def advance(self, seconds: float, *, turns: int = 20) -> None:
        """Move time forward by ``seconds``, waking each sleeper due by then at its own due time; after each
        wake-up the loop gets ``turns`` turns to run what it started (callers that wait on I/O settle on their
        own condition afterwards)."""
        end = self._now + seconds
        while self._sleepers and self._sleepers[0][0] <= end:
            due, _, future = heapq.heappop(self._sleepers)
            self._now = max(self._now, due)
            if not future.done():
                future.set_result(None)
                for _ in range(turns):
                    await asyncio.sleep(0)
        self._now = end
        for _ in range(turns):
            await asyncio.sleep(0)


__all__ = ["FakeClock"]
