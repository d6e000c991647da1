"""Demo traffic: the evaluate load generator, with every request routed through a Service.

:class:`RoutedLoadGenerator` is :class:`~redrafter_operator.evaluate.loadgen.LoadGenerator` (closed
loop, ``set_concurrency`` while running) whose workers ask the :class:`~.router.ServiceRouter` for a
backend per request instead of using one fixed endpoint, so moving the Service selector moves the
traffic. :class:`TrafficStats` keeps running figures per window (tokens/s, client-side acceptance,
errors, where requests went) from each finished request.
"""

from __future__ import annotations

import asyncio
import collections
import time
from dataclasses import dataclass
from typing import Sequence

import tritonclient.grpc.aio as grpcaio

from redrafter_operator.evaluate.loadgen import LoadGenerator
from redrafter_operator.evaluate.prompts import Prompt
from redrafter_operator.evaluate.stream import RequestOptions, RequestResult, stream_request

from .router import NoEndpoints, ServiceRouter

NO_ENDPOINT_BACKOFF_S = 0.2


@dataclass
class _Done:
    end: float
    ok: bool
    tokens: int
    drafted: int
    accepted: int
    pod: str


class TrafficStats:
    """Running figures over the last ``window_s`` seconds and in total."""

    def __init__(self, window_s: float = 5.0) -> None:
        self.window_s = window_s
        self._recent: collections.deque[_Done] = collections.deque()
        self.total_requests = 0
        self.total_errors = 0
        self.total_tokens = 0
        self.last_error = ""

    def add(self, r: RequestResult, pod: str) -> None:
        self.total_requests += 1
        self.total_errors += 0 if r.ok else 1
        self.total_tokens += r.output_tokens if r.ok else 0
        if not r.ok:
            self.last_error = r.error or ""
        self._recent.append(
            _Done(
                r.end or time.monotonic(), r.ok, r.output_tokens, r.draft_tokens or 0, r.accepted_draft_tokens or 0, pod
            )
        )

    def _trim(self, now: float) -> list[_Done]:
        while self._recent and self._recent[0].end < now - self.window_s:
            self._recent.popleft()
        return list(self._recent)

    def window(self) -> dict[str, float | int | None | dict[str, int]]:
        now = time.monotonic()
        recent = self._trim(now)
        ok = [d for d in recent if d.ok]
        drafted = sum(d.drafted for d in ok)
        return {
            "requests_per_s": len(recent) / self.window_s,
            "tokens_per_s": sum(d.tokens for d in ok) / self.window_s,
            "acceptance_rate": (sum(d.accepted for d in ok) / drafted) if drafted else None,
            "errors": len(recent) - len(ok),
            "by_pod": dict(collections.Counter(d.pod for d in recent)),
        }


class RoutedLoadGenerator(LoadGenerator):
    """A LoadGenerator whose requests each go to ``router.pick()`` (a gRPC client per backend)."""

    def __init__(
        self,
        router: ServiceRouter,
        prompts: Sequence[Prompt],
        options: RequestOptions,
        *,
        concurrency: int = 0,
        stats: TrafficStats | None = None,
        keep_results: int = 2000,
    ) -> None:
        # the endpoint given to the base class is never used: every request is routed
        super().__init__(
            f"{router.service}.invalid:1", prompts, options, concurrency=concurrency, keep_results=keep_results
        )
        self.router = router
        self.stats = stats or TrafficStats()
        self._clients: dict[str, grpcaio.InferenceServerClient] = {}

    def _client_for(self, url: str) -> grpcaio.InferenceServerClient:
        client = self._clients.get(url)
        if client is None:
            client = self._clients[url] = grpcaio.InferenceServerClient(url)
        return client

    async def run(self) -> list[RequestResult]:
        try:
            return await super().run()
        finally:
            clients, self._clients = list(self._clients.values()), {}
            await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)

    async def _send(self, index: int, prompt: Prompt) -> RequestResult:
        try:
            backend = self.router.pick()
        except NoEndpoints as exc:  # a client sees connection refused; it retries shortly
            result = RequestResult(prompt_index=index, start=time.monotonic(), error=str(exc))
            result.end = result.start
            self.stats.add(result, "")
            await asyncio.sleep(NO_ENDPOINT_BACKOFF_S)
            return result
        result = await stream_request(
            self._client_for(backend.url),
            prompt.text,
            self.options,
            self.counter,
            prompt_index=index,
            max_tokens=prompt.max_tokens,
        )
        self.stats.add(result, backend.pod)
        return result
