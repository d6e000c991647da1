"""The reconciler's work queue: each resource queued at most once, never reconciled by two workers at once.

Same contract as client-go's workqueue: a key added while a worker holds it is processed again after
``done``; ``add_after`` (backoff, retries) keeps one timer per key.
"""

from __future__ import annotations

import asyncio

Key = tuple[str, str]  # (namespace, name)


class WorkQueue:
    """Deduplicating queue: a key is queued at most once and never processed by two workers at once."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[Key] = asyncio.Queue()
        self._queued: set[Key] = set()
        self._active: set[Key] = set()
        self._dirty: set[Key] = set()
        self._timers: dict[Key, asyncio.TimerHandle] = {}

    def __len__(self) -> int:
        return len(self._queued)

    def add(self, key: Key) -> None:
        if key in self._active:
            self._dirty.add(key)
        elif key not in self._queued:
            self._queued.add(key)
            self._queue.put_nowait(key)

    def add_after(self, key: Key, delay: float) -> None:
        old = self._timers.pop(key, None)
        if old:
            old.cancel()
        self._timers[key] = asyncio.get_running_loop().call_later(delay, self._fire, key)

    def _fire(self, key: Key) -> None:
        self._timers.pop(key, None)
        self.add(key)

    async def get(self) -> Key:
        key = await self._queue.get()
        self._queued.discard(key)
        self._active.add(key)
        return key

    def done(self, key: Key) -> None:
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
