"""A concurrency sweep (1, 2, 4, ..., maxBatchSize) against one or two endpoints (ReDrafter and base).

Levels run one endpoint at a time (each point is measured without the other engine's load); each
endpoint is warmed up first. The result is plain data (:class:`SweepResult`), turned into a report
by :mod:`.report`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from .gpu import GpuSampler
from .loadgen import Bounds, run_level
from .prompts import Prompt
from .stats import LevelStats, level_stats
from .stream import RequestOptions, to_sample
from .tokens import TokenCounter, WordCounter


@dataclass(frozen=True)
class SweepConfig:
    endpoints: dict[str, str]  # variant (redrafter | base) -> grpc endpoint
    concurrencies: Sequence[int]
    options: RequestOptions
    requests_per_worker: int = 3  # each level sends concurrency x this many requests
    max_level_s: float = 120.0  # no request starts later than this into a level
    warmup_requests: int = 2
    metrics_urls: dict[str, str] = field(default_factory=dict)  # variant -> DCGM metrics URL


@dataclass
class SweepResult:
    config: SweepConfig
    levels: dict[str, list[LevelStats]]
    token_counting: str
    started_at: float
    duration_s: float


async def run_sweep(
    config: SweepConfig,
    prompts: Sequence[Prompt],
    counter: TokenCounter | None = None,
    progress: Callable[[str, LevelStats], None] | None = None,
) -> SweepResult:
    counter = counter or WordCounter()
    started = time.time()
    t0 = time.monotonic()
    for endpoint in config.endpoints.values():
        if config.warmup_requests:
            await run_level(endpoint, prompts, config.options, 1, Bounds(max_requests=config.warmup_requests), counter)
    levels: dict[str, list[LevelStats]] = {v: [] for v in config.endpoints}
    for c in config.concurrencies:
        for variant, endpoint in config.endpoints.items():
            sampler = GpuSampler(config.metrics_urls[variant]) if variant in config.metrics_urls else None
            if sampler:
                sampler.start()
            results = await run_level(
                endpoint,
                prompts,
                config.options,
                c,
                Bounds(max_requests=c * config.requests_per_worker, duration_s=config.max_level_s),
                counter,
            )
            gpu = await sampler.stop() if sampler else None
            first_error = next((r.error for r in results if r.error), None)
            stats = level_stats(c, [to_sample(r) for r in results], gpu, first_error)
            levels[variant].append(stats)
            if progress:
                progress(variant, stats)
    return SweepResult(config, levels, counter.method, started, time.monotonic() - t0)


def report_config(result: SweepResult, prompts: int) -> dict[str, Any]:
    """What the report records about how the sweep ran."""
    from engine_jobs.contract import ENTRY_MODEL

    c = result.config
    return {
        "model": ENTRY_MODEL,
        "endpoints": dict(c.endpoints),
        "concurrencies": list(c.concurrencies),
        "max_tokens": c.options.max_tokens,
        "fixed_length": c.options.fixed_length,
        "greedy": c.options.greedy,
        "requests_per_worker": c.requests_per_worker,
        "warmup_requests": c.warmup_requests,
        "prompts": prompts,
        "token_counting": result.token_counting,
        "duration_s": round(result.duration_s, 3),
        "gpu_metrics": dict(c.metrics_urls),
    }
