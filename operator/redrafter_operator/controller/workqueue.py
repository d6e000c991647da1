"""The reconciler's work queue: each resource queued at most once, never reconciled by two workers at once.

Same contract as client-go's workqueue: a key added while a worker holds it is processed again after
``done``; ``add_after`` (backoff, retries) keeps one timer per key.
"""

from __future__ import annotations

import asyncio

from .clock import Clock, SystemClock

ResourceKey = tuple[str, str]  # (namespace, name) of a ReDrafterDeployment


class WorkQueue:
    """Deduplicating queue: a key is queued at most once and never processed by two workers at once."""

    def __init__(self, clock: Clock | None = None) -> None:
        self._clock = clock or SystemClock()
        self._queue: asyncio.Queue[ResourceKey] = asyncio.Queue()
        self._queued: set[ResourceKey] = set()
        self._active: set[ResourceKey] = set()
        self._dirty: set[ResourceKey] = set()
        self._timers: dict[ResourceKey, asyncio.Task[None]] = {}

    def __len__(self) -> int:
        return len(self._queued)

    def add(self, key: ResourceKey) -> None:
        if key in self._active:
            self._dirty.add(key)
        elif key not in self._queued:
            self._queued.add(key)
            self._queue.put_nowait(key)

    def add_after(self, key: ResourceKey, delay: float) -> None:
        old = self._timers.pop(key, None)
        if old:
            old.cancel()
        self._timers[key] = asyncio.create_task(self._later(key, delay), name=f"redrafter-requeue-{key[0]}/{key[1]}")

    async def _later(self, key: ResourceKey, delay: float) -> None:
        """On the controller's clock, so that a test's fake clock moves backoffs too."""
        await self._clock.sleep(delay)
        self._timers.pop(key, None)
        self.add(key)

    async def get(self) -> ResourceKey:
        key = await self._queue.get()
        self._queued.discard(key)
        self._active.add(key)
        return key

    def done(self, key: ResourceKey) -> None:
        self._active.discard(key)
        if key in self._dirty:
            self._dirty.discard(key)
            self.add(key)

    def idle(self) -> bool:
        return not self._queued and not self._active

    def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
