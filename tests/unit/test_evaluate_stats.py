"""evaluate.stats: percentiles, per-token latencies, tokens/s, acceptance, crossover, DCGM parsing."""

from __future__ import annotations

import random

import numpy as np
import pytest

from redrafter_operator.evaluate.gpu import gpu_utilization
from redrafter_operator.evaluate.stats import (
    Crossover,
    Sample,
    acceptance,
    acceptance_histogram,
    crossover,
    default_concurrencies,
    inter_token_latencies,
    level_stats,
    parse_concurrencies,
    percentile,
    speedups,
    summarize,
    window_stats,
)


def test_percentile_matches_numpy_linear():
    rng = random.Random(7)
    xs = [rng.expovariate(3.0) for _ in range(257)]
    for q in (0, 1, 50, 90, 99, 100):
        assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_summarize():
    d = summarize([0.3, 0.1, 0.2])
    assert (d.count, d.min, d.max, d.p50) == (3, 0.1, 0.3, 0.2)
    assert d.mean == pytest.approx(0.2)
    assert summarize([]) is None


def test_chunk_gap_is_spread_over_its_tokens():
    # first chunk at 0.1 s (TTFT, 1 token), then a 4-token chunk 0.4 s later, then 1 token 0.1 s later
    itl = inter_token_latencies([0.1, 0.5, 0.6], [1, 4, 1])
    assert itl == pytest.approx([0.1, 0.1, 0.1, 0.1, 0.1])
    # extra tokens of the first chunk have no predecessor: no gap for them
    assert inter_token_latencies([0.2], [3]) == []
    with pytest.raises(ValueError):
        inter_token_latencies([0.1, 0.2], [1, 0])
    with pytest.raises(ValueError):
        inter_token_latencies([0.1], [1, 1])


def _sample(start, end, tokens, chunks, ok=True, rate=None, drafted=None):
    per = [tokens // len(chunks)] * len(chunks)
    per[-1] += tokens - sum(per)
    accepted = None if drafted is None else round(rate * drafted)
    return Sample(start, end, ok, tokens, tuple(chunks), tuple(per), rate, accepted, drafted)


def test_level_stats_figures():
    samples = [
        _sample(0.0, 1.0, 10, [0.1, 0.5, 1.0], rate=0.5, drafted=8),
        _sample(0.5, 2.0, 20, [0.2, 1.5], rate=0.75, drafted=8),
        Sample(1.0, 1.2, ok=False),
    ]
    lv = level_stats(2, samples, gpu_utilization=55.0, first_error="boom")
    assert (lv.requests, lv.errors, lv.output_tokens) == (3, 1, 30)
    assert lv.duration_s == pytest.approx(2.0)
    assert lv.tokens_per_s == pytest.approx(15.0)
    assert lv.requests_per_s == pytest.approx(1.0)
    assert lv.ttft.p50 == pytest.approx(0.15)
    assert lv.e2e.max == pytest.approx(1.5)
    assert lv.generation.min == pytest.approx(0.9)  # 1.0 - 0.1
    assert lv.acceptance.pooled == pytest.approx((4 + 6) / 16)
    assert lv.acceptance.mean == pytest.approx(0.625)
    assert (lv.gpu_utilization, lv.first_error) == (55.0, "boom")
    assert type(lv).from_dict(lv.to_dict()) == lv


def test_acceptance_ignores_base_and_bins_one_into_last_bin():
    base = [Sample(0, 1, output_tokens=5, draft_tokens=0, accepted_draft_tokens=0, acceptance_rate=0.0)]
    assert acceptance(base) is None
    hist = acceptance_histogram([0.0, 0.05, 0.1, 0.95, 1.0, 1.5])
    assert [b["count"] for b in hist] == [2, 1, 0, 0, 0, 0, 0, 0, 0, 2]
    assert (hist[0]["lo"], hist[-1]["hi"]) == (0.0, 1.0)


def test_crossover_interpolates_first_down_crossing():
    c = crossover([(1, 2.0), (2, 1.5), (4, 0.5), (8, 1.2)])
    assert c == Crossover("crossed", pytest.approx(3.0))
    assert crossover([(4, 0.9), (1, 1.4), (2, 1.0)]).concurrency == pytest.approx(2.0)  # unsorted input
    assert crossover([(1, 0.9), (2, 0.8)]) == Crossover("never_faster", 0.0)
    assert crossover([(1, 2.0), (16, 1.1)]) == Crossover("always_faster", None, at_least=16)
    assert crossover([]).status == "no_data"


def test_speedups_pair_equal_concurrency():
    r = [level_stats(c, [Sample(0, 1, output_tokens=t)]) for c, t in ((1, 30), (2, 40), (4, 50))]
    b = [level_stats(c, [Sample(0, 1, output_tokens=t)]) for c, t in ((1, 10), (2, 40))]
    assert speedups(r, b) == [(1, pytest.approx(3.0)), (2, pytest.approx(1.0))]


def test_concurrency_levels():
    assert default_concurrencies(1) == [1]
    assert default_concurrencies(8) == [1, 2, 4, 8]
    assert default_concurrencies(12) == [1, 2, 4, 8, 12]
    assert parse_concurrencies("8, 1,2,2") == [1, 2, 8]
    for bad in ("", "0,1", "x"):
        with pytest.raises(ValueError):
            parse_concurrencies(bad)
    with pytest.raises(ValueError):
        default_concurrencies(0)


def test_window_stats_counts_recent_requests_only():
    samples = [
        Sample(0, 1, output_tokens=100),
        Sample(5, 9, output_tokens=40, chunk_times=(0.2,), chunk_tokens=(40,)),
        Sample(6, 9.5, ok=False),
    ]
    w = window_stats(samples, now=10.0, window_s=2.0)
    assert (w["finished"], w["errors"]) == (2, 1)
    assert w["tokens_per_s"] == pytest.approx(20.0)
    assert w["ttft_p50_s"] == pytest.approx(0.2)


def test_gpu_utilization_from_dcgm_exposition():
    text = (
        "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a"} 80\nDCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-b"} 60\n'
        '# TYPE DCGM_FI_DEV_FB_USED gauge\nDCGM_FI_DEV_FB_USED{gpu="0"} 1234\n'
    )
    assert gpu_utilization(text) == pytest.approx(70.0)
    assert gpu_utilization("# TYPE x gauge\nx 1\n") is None
