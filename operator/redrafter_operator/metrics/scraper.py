"""Read serving metrics by scraping each Ready pod's Triton metrics port (rank 0, :8002/metrics), and the
OpenAI front's own /metrics (port ``openai``) where the pod runs one: its queue is part of the pod's load.

Triton's metrics are the sample: a pod whose Triton port fails is a :class:`PodError`. The front's gauges
are one part of it: when they cannot be read, the sample simply has no front keys (missing data for that
part, not an error)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable, Sequence

import aiohttp

from .parse import parse_exposition
from .samples import FRONT_LOAD, PodError, PodSample, PodTarget, Reading, collect

log = logging.getLogger(__name__)

MAX_BODY = 8 * 1024 * 1024  # a Triton exposition is a few hundred KiB; refuse anything absurd


async def read_body(resp: aiohttp.ClientResponse, limit: int) -> bytes | None:
    """The whole body, or None once it passes ``limit`` bytes (read no further: a pod's answer is not trusted)."""
    chunks, size = [], 0
    async for chunk in resp.content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


class PodScraper:
    """Scrapes pods concurrently with a per-pod timeout; a pod that fails becomes a :class:`PodError`.

    ``session`` may be shared with the rest of the operator; when omitted, one is created per read.
    ``clock`` gives the sample time (epoch seconds) and is injectable for tests.
    """

    def __init__(
        self,
        deployment: str,
        timeout: float = 2.0,
        *,
        session: aiohttp.ClientSession | None = None,
        max_concurrency: int = 32,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.deployment = deployment
        self.timeout = timeout
        self._session = session
        self._limit = asyncio.Semaphore(max_concurrency)
        self._clock = clock

    async def read(self, targets: Sequence[PodTarget]) -> Reading:
        if self._session is not None:
            results = await asyncio.gather(*(self._one(self._session, t) for t in targets))
        else:
            async with aiohttp.ClientSession() as session:
                results = await asyncio.gather(*(self._one(session, t) for t in targets))
        return Reading(
            time=self._clock(),
            samples=tuple(r for r in results if isinstance(r, PodSample)),
            errors=tuple(r for r in results if isinstance(r, PodError)),
        )

    async def _one(self, session: aiohttp.ClientSession, target: PodTarget) -> PodSample | PodError:
        def fail(msg: str) -> PodError:
            return PodError(pod=target.name, variant=target.variant, pool=target.pool, error=msg)

        if not target.ip:
            return fail("pod has no IP")
        triton, front = await asyncio.gather(
            self._get(session, target.ip, target.port),
            self._get(session, target.ip, target.front_port) if target.front_port else _none(),
        )
        if isinstance(triton, str):
            return fail(triton)
        counters, load = collect(triton, self.deployment)
        if isinstance(front, str):
            log.debug("%s: the OpenAI front's metrics are missing: %s", target.name, front)
        elif front is not None:
            _, front_load = collect(front, self.deployment)
            load.update({k: v for k, v in front_load.items() if k in FRONT_LOAD})
        return PodSample(
            pod=target.name,
            identity=target.identity,
            variant=target.variant,
            pool=target.pool,
            time=self._clock(),
            counters=counters,
            load=load,
            started_at=target.started_at,
        )

    async def _get(
        self, session: aiohttp.ClientSession, ip: str, port: int
    ) -> list[tuple[str, dict[str, str], float]] | str:
        """The series of ``http://ip:port/metrics``, or why they could not be read."""
        host = f"[{ip}]" if ":" in ip else ip
        url = f"http://{host}:{port}/metrics"
        async with self._limit:
            try:
                async with session.get(url, timeout=aiohttp.ClientTimeout(total=self.timeout)) as resp:
                    if resp.status != 200:
                        return f"GET {url}: HTTP {resp.status}"
                    body = await read_body(resp, MAX_BODY)
                    if body is None:
                        return f"GET {url}: body larger than {MAX_BODY} bytes"
            except asyncio.TimeoutError:
                return f"GET {url}: timed out after {self.timeout}s"
            except aiohttp.ClientError as exc:
                return f"GET {url}: {type(exc).__name__}: {exc}"
        try:
            return parse_exposition(body.decode("utf-8", errors="replace"))
        except ValueError as exc:
            return str(exc)


async def _none() -> None:
    return None
