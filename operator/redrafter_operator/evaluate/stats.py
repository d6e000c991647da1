"""Pure statistics over per-request measurements: percentiles, latencies, tokens/s, acceptance, the
measured crossover concurrency. Inputs are plain numbers or :class:`Sample` records, so everything
here is testable without a server (and importable without tritonclient).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Sequence

ACCEPTANCE_BINS: tuple[float, ...] = tuple(i / 10 for i in range(11))  # 0.0, 0.1, ..., 1.0


def default_concurrencies(max_batch_size: int) -> list[int]:
    """1, 2, 4, ... up to and including ``max_batch_size``."""
    if max_batch_size < 1:
        raise ValueError("max_batch_size must be >= 1")
    out, c = [], 1
    while c < max_batch_size:
        out.append(c)
        c *= 2
    return out + [max_batch_size]


def parse_concurrencies(text: str) -> list[int]:
    values = sorted({int(x) for x in text.split(",") if x.strip()})
    if not values or values[0] < 1:
        raise ValueError("concurrency levels must be integers >= 1")
    return values


@dataclass(frozen=True)
class Sample:
    """One finished request as the statistics see it (seconds; chunk times relative to its start)."""

    start: float
    end: float
    ok: bool = True
    output_tokens: int = 0
    chunk_times: tuple[float, ...] = ()
    chunk_tokens: tuple[int, ...] = ()
    acceptance_rate: float | None = None
    accepted_draft_tokens: int | None = None
    draft_tokens: int | None = None


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between closest ranks."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError("q must be within [0, 100]")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass(frozen=True)
class Dist:
    """Summary of a distribution (seconds for latencies)."""

    count: int
    mean: float
    p50: float
    p90: float
    p99: float
    min: float
    max: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(values: Iterable[float]) -> Dist | None:
    xs = [float(v) for v in values]
    if not xs:
        return None
    return Dist(
        len(xs), sum(xs) / len(xs), percentile(xs, 50), percentile(xs, 90), percentile(xs, 99), min(xs), max(xs)
    )


def inter_token_latencies(chunk_times: Sequence[float], chunk_tokens: Sequence[int]) -> list[float]:
    """Per-token gaps: a chunk's gap since the previous chunk, spread evenly over its tokens.

    ReDrafter returns several tokens per chunk (1 + accepted drafts); each of them gets
    ``gap / tokens``. Tokens arriving with the first chunk have no predecessor and give no gap.
    """
    if len(chunk_times) != len(chunk_tokens):
        raise ValueError("chunk_times and chunk_tokens differ in length")
    out: list[float] = []
    for i in range(1, len(chunk_times)):
        n = chunk_tokens[i]
        if n <= 0:
            raise ValueError("a chunk must carry at least one token")
        gap = chunk_times[i] - chunk_times[i - 1]
        out.extend([gap / n] * n)
    return out


def acceptance_histogram(rates: Iterable[float], bins: Sequence[float] = ACCEPTANCE_BINS) -> list[dict[str, Any]]:
    """Counts of per-request acceptance rates in [bins[i], bins[i+1]) (the last bin includes 1.0)."""
    edges = list(bins)
    counts = [0] * (len(edges) - 1)
    for r in rates:
        if r < edges[0] or r > edges[-1]:
            continue
        counts[min(bisect.bisect_right(edges, r) - 1, len(counts) - 1)] += 1
    return [{"lo": edges[i], "hi": edges[i + 1], "count": c} for i, c in enumerate(counts)]


@dataclass(frozen=True)
class Acceptance:
    requests: int  # requests that drafted tokens
    mean: float  # mean of per-request acceptance rates
    pooled: float  # accepted / drafted over all requests
    draft_tokens: int
    accepted_draft_tokens: int
    histogram: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def acceptance(samples: Iterable[Sample]) -> Acceptance | None:
    """Acceptance over the requests that drafted tokens (None for a base engine: it drafts none)."""
    drafted = [s for s in samples if s.ok and s.draft_tokens]
    if not drafted:
        return None
    rates = [
        s.acceptance_rate if s.acceptance_rate is not None else (s.accepted_draft_tokens or 0) / (s.draft_tokens or 1)
        for s in drafted
    ]
    total = sum(s.draft_tokens or 0 for s in drafted)
    accepted = sum(s.accepted_draft_tokens or 0 for s in drafted)
    return Acceptance(
        len(drafted), sum(rates) / len(rates), accepted / total, total, accepted, acceptance_histogram(rates)
    )


@dataclass(frozen=True)
class LevelStats:
    """One (endpoint, concurrency) point of a sweep."""

    concurrency: int
    requests: int
    errors: int
    duration_s: float  # first request start -> last request end
    output_tokens: int
    tokens_per_s: float  # output tokens / duration (the throughput compared across engines)
    requests_per_s: float
    ttft: Dist | None
    itl: Dist | None  # per output token
    e2e: Dist | None
    generation: Dist | None  # end-to-end minus TTFT: the decode phase speculation speeds up
    tokens_per_s_per_request: Dist | None
    acceptance: Acceptance | None
    gpu_utilization: float | None = None  # percent, mean over the level (DCGM), when exposed
    first_error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "LevelStats":
        def dist(key: str) -> Dist | None:
            return Dist(**raw[key]) if raw.get(key) else None

        acc = Acceptance(**raw["acceptance"]) if raw.get("acceptance") else None
        keys = ("ttft", "itl", "e2e", "generation", "tokens_per_s_per_request", "acceptance")
        plain = {k: v for k, v in raw.items() if k not in keys}
        dists: dict[str, Any] = {k: dist(k) for k in keys[:-1]}
        return cls(**plain, **dists, acceptance=acc)


def level_stats(
    concurrency: int, samples: Sequence[Sample], gpu_utilization: float | None = None, first_error: str | None = None
) -> LevelStats:
    ok = [s for s in samples if s.ok]
    duration = (max(s.end for s in samples) - min(s.start for s in samples)) if samples else 0.0
    tokens = sum(s.output_tokens for s in ok)
    itl: list[float] = []
    for s in ok:
        itl += inter_token_latencies(s.chunk_times, s.chunk_tokens)
    ttfts = [s.chunk_times[0] for s in ok if s.chunk_times]
    return LevelStats(
        concurrency=concurrency,
        requests=len(samples),
        errors=len(samples) - len(ok),
        duration_s=duration,
        output_tokens=tokens,
        tokens_per_s=tokens / duration if duration > 0 else 0.0,
        requests_per_s=len(ok) / duration if duration > 0 else 0.0,
        ttft=summarize(ttfts),
        itl=summarize(itl),
        e2e=summarize(s.end - s.start for s in ok),
        generation=summarize(s.end - s.start - s.chunk_times[0] for s in ok if s.chunk_times),
        tokens_per_s_per_request=summarize(s.output_tokens / (s.end - s.start) for s in ok if s.end > s.start),
        acceptance=acceptance(ok),
        gpu_utilization=gpu_utilization,
        first_error=first_error,
    )


def speedups(redrafter: Sequence[LevelStats], base: Sequence[LevelStats]) -> list[tuple[int, float]]:
    """(concurrency, ReDrafter tokens/s ÷ base tokens/s) at every concurrency both measured."""
    by_c = {lv.concurrency: lv for lv in base if lv.tokens_per_s > 0}
    return sorted(
        (lv.concurrency, lv.tokens_per_s / by_c[lv.concurrency].tokens_per_s)
        for lv in redrafter
        if lv.concurrency in by_c
    )


@dataclass(frozen=True)
class Crossover:
    """Where ReDrafter stops beating base.

    ``status``: ``crossed`` (``concurrency`` is interpolated between the last faster and the first
    slower point), ``never_faster`` (slower already at the lowest concurrency measured:
    ``concurrency`` 0, as the cost model reports it), ``always_faster`` (faster at every measured
    point: ``concurrency`` None, ``at_least`` the highest concurrency measured) or ``no_data``.
    """

    status: str
    concurrency: float | None
    at_least: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def crossover(points: Sequence[tuple[float, float]]) -> Crossover:
    """First down-crossing of speedup 1.0, linearly interpolated in concurrency."""
    pts = sorted(points)
    if not pts:
        return Crossover("no_data", None)
    if pts[0][1] < 1.0:
        return Crossover("never_faster", 0.0)
    for (c0, s0), (c1, s1) in zip(pts, pts[1:]):
        if s0 >= 1.0 > s1:
            return Crossover("crossed", c0 + (s0 - 1.0) / (s0 - s1) * (c1 - c0))
    return Crossover("always_faster", None, at_least=pts[-1][0])


def window_stats(samples: Sequence[Sample], now: float, window_s: float) -> dict[str, Any]:
    """Running figures over requests that finished in the last ``window_s`` seconds (for live display)."""
    recent = [s for s in samples if s.end >= now - window_s]
    ok = [s for s in recent if s.ok]
    ttft = summarize(s.chunk_times[0] for s in ok if s.chunk_times)
    acc = acceptance(ok)
    return {
        "window_s": window_s,
        "finished": len(recent),
        "errors": len(recent) - len(ok),
        "tokens_per_s": sum(s.output_tokens for s in ok) / window_s if window_s > 0 else 0.0,
        "ttft_p50_s": ttft.p50 if ttft else None,
        "acceptance_rate": acc.pooled if acc else None,
    }
