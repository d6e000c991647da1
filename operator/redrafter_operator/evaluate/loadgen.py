"""Closed-loop streaming load against one endpoint (the gRPC entry model or the OpenAI API, see
:mod:`.channel`), at a concurrency that may change.

``N`` workers each keep one request in flight: send, read the stream to its end, send the next
(prompts taken round-robin). The run is bounded by a request count and/or a duration, or runs until
:meth:`LoadGenerator.stop`. The demo drives traffic with it and moves the target concurrency while
it runs (:meth:`LoadGenerator.set_concurrency`); :meth:`LoadGenerator.snapshot` gives running figures.

    gen = LoadGenerator("127.0.0.1:8001", prompts, RequestOptions(max_tokens=64), concurrency=4)
    task = asyncio.create_task(gen.run())
    gen.set_concurrency(16)   # more workers start at once; fewer: surplus workers finish and exit
    print(gen.snapshot())
    gen.stop(); results = await task
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from .channel import Channel, endpoint_for, open_channel
from .prompts import Prompt
from .stats import window_stats
from .stream import RequestOptions, RequestResult, to_sample
from .tokens import TokenCounter, WordCounter


@dataclass(frozen=True)
class Bounds:
    max_requests: int | None = None  # requests started
    duration_s: float | None = None  # no request starts after this


class LoadGenerator:
    def __init__(
        self,
        endpoint: str,
        prompts: Sequence[Prompt],
        options: RequestOptions,
        *,
        concurrency: int = 1,
        bounds: Bounds = Bounds(),
        counter: TokenCounter | None = None,
        on_result: Callable[[RequestResult], None] | None = None,
        keep_results: int | None = None,
    ):
        """``keep_results`` bounds the results kept in memory (the oldest are dropped; totals stay
        exact) for long-running drivers such as the demo; None keeps every result."""
        if not prompts:
            raise ValueError("no prompts")
        if concurrency < 0:
            raise ValueError("concurrency must be >= 0")
        self.target = endpoint_for(endpoint, options.protocol)
        self.prompts = list(prompts)
        self.options = options
        self.bounds = bounds
        self.counter = counter or WordCounter()
        self.on_result = on_result
        self.results: deque[RequestResult] | list[RequestResult] = deque(maxlen=keep_results) if keep_results else []
        self._finished = 0
        self._errors = 0
        self._concurrency = concurrency
        self._issued = 0
        self._in_flight = 0
        self._workers: dict[int, asyncio.Task[None]] = {}
        self._client: Channel | None = None
        self._done: asyncio.Event | None = None
        self._deadline: float | None = None
        self._started_at: float | None = None

    # ---- control ---------------------------------------------------------------------------------
    @property
    def concurrency(self) -> int:
        return self._concurrency

    def set_concurrency(self, n: int) -> None:
        """Change the number of requests kept in flight (takes effect immediately when growing)."""
        if n < 0:
            raise ValueError("concurrency must be >= 0")
        self._concurrency = n
        if self._client is not None:
            self._spawn()

    def stop(self, cancel_in_flight: bool = False) -> None:
        """Start no new request; with ``cancel_in_flight`` also cancel the streams still running."""
        if self._done is not None:
            self._done.set()
        if cancel_in_flight:
            for task in self._workers.values():
                task.cancel()

    # ---- running ---------------------------------------------------------------------------------
    async def run(self) -> list[RequestResult]:
        """Run until stopped or the bounds are reached and in-flight requests finished; the results."""
        self._done = asyncio.Event()
        self._started_at = time.monotonic()
        if self.bounds.duration_s is not None:
            self._deadline = self._started_at + self.bounds.duration_s
        self._client = open_channel(self.target, self.options.protocol, self.options.api_key)
        try:
            self._spawn()
            timeout = None if self._deadline is None else max(self._deadline - time.monotonic(), 0.0)
            try:
                await asyncio.wait_for(self._done.wait(), timeout)
            except asyncio.TimeoutError:
                self._done.set()
            while self._workers:
                await asyncio.gather(*self._workers.values(), return_exceptions=True)
                self._workers = {i: t for i, t in self._workers.items() if not t.done()}
        finally:
            for task in self._workers.values():
                task.cancel()
            await self._client.close()
            self._client = None
        return list(self.results)

    def _spawn(self) -> None:
        for i in range(self._concurrency):
            if i not in self._workers or self._workers[i].done():
                self._workers[i] = asyncio.get_running_loop().create_task(self._worker(i), name=f"loadgen-{i}")

    def _may_start(self, worker: int) -> bool:
        if self._done is None or self._done.is_set() or worker >= self._concurrency:
            return False
        if self._deadline is not None and time.monotonic() >= self._deadline:
            self._done.set()
            return False
        if self.bounds.max_requests is not None and self._issued >= self.bounds.max_requests:
            self._done.set()
            return False
        return True

    async def _send(self, index: int, prompt: Prompt) -> RequestResult:
        """One request (subclasses may route it elsewhere, e.g. the demo's per-request Service routing)."""
        assert self._client is not None
        return await self._client.send(
            prompt.text, self.options, self.counter, prompt_index=index, max_tokens=prompt.max_tokens
        )

    def _record(self, result: RequestResult) -> None:
        self.results.append(result)
        self._finished += 1
        self._errors += 0 if result.ok else 1
        if self.on_result is not None:
            self.on_result(result)

    async def _worker(self, worker: int) -> None:
        while self._may_start(worker):
            index = self._issued % len(self.prompts)
            self._issued += 1
            self._in_flight += 1
            try:
                result = await self._send(index, self.prompts[index])
            finally:
                self._in_flight -= 1
            self._record(result)

    # ---- observing -------------------------------------------------------------------------------
    def snapshot(self, window_s: float = 10.0) -> dict[str, Any]:
        """Running figures: target concurrency, in flight, totals, and the last ``window_s`` seconds."""
        now = time.monotonic()
        window = window_s if self._started_at is None else min(window_s, max(now - self._started_at, 1e-6))
        return {
            "concurrency": self._concurrency,
            "in_flight": self._in_flight,
            "started": self._issued,
            "finished": self._finished,
            "errors": self._errors,
            **{
                f"recent_{k}": v
                for k, v in window_stats(
                    [to_sample(r) for r in self.results if r.end >= now - window], now, window
                ).items()
            },
        }


async def run_level(
    endpoint: str,
    prompts: Sequence[Prompt],
    options: RequestOptions,
    concurrency: int,
    bounds: Bounds,
    counter: TokenCounter | None = None,
) -> list[RequestResult]:
    """One fixed-concurrency run (what a sweep point is)."""
    return await LoadGenerator(
        endpoint, prompts, options, concurrency=concurrency, bounds=bounds, counter=counter
    ).run()
