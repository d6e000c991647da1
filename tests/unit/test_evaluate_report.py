"""evaluate.report: JSON assembly, figures, markdown and self-contained HTML from a synthetic sweep."""

from __future__ import annotations

import base64
import json
import re

import pytest

from redrafter_operator.evaluate.report import (
    FIGURES,
    REPORT_KIND,
    build_report,
    figures,
    load_levels,
    markdown,
    write_report,
)
from redrafter_operator.evaluate.stats import Sample, level_stats

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
LABEL = "simulated engine on CPU"


def _level(concurrency: int, tokens_per_s: float, acceptance: float | None) -> object:
    """``concurrency`` requests of 60 tokens over a wall time giving ``tokens_per_s``."""
    duration = concurrency * 60 / tokens_per_s
    samples = []
    for i in range(concurrency):
        drafted = 40 if acceptance is not None else None
        samples.append(
            Sample(
                start=0.0,
                end=duration,
                output_tokens=60,
                chunk_times=(0.05, duration / 2, duration),
                chunk_tokens=(1, 29, 30),
                acceptance_rate=acceptance,
                accepted_draft_tokens=round(acceptance * drafted) if drafted else None,
                draft_tokens=drafted,
            )
        )
    return level_stats(concurrency, samples)


@pytest.fixture
def levels():
    # ReDrafter: 2x at 1, 1.2x at 2, 0.8x at 4 -> crossover at 2 + 0.2/0.4*2 = 3.0
    base = {1: 100.0, 2: 180.0, 4: 300.0}
    ratio = {1: 2.0, 2: 1.2, 4: 0.8}
    return {
        "redrafter": [_level(c, base[c] * ratio[c], 0.65 if c < 4 else 0.75) for c in (1, 2, 4)],
        "base": [_level(c, base[c], None) for c in (1, 2, 4)],
    }


def test_report_structure(levels):
    report = build_report(levels, {"endpoints": {"redrafter": "r:8001", "base": "b:8001"}}, label=LABEL)
    assert report["kind"] == REPORT_KIND and report["label"] == LABEL
    assert set(report["levels"]) == {"redrafter", "base"}
    assert [p["concurrency"] for p in report["speedup"]] == [1, 2, 4]
    assert [p["speedup"] for p in report["speedup"]] == pytest.approx([2.0, 1.2, 0.8])
    assert report["crossover"] == {"status": "crossed", "concurrency": pytest.approx(3.0), "at_least": None}
    acc = report["acceptance"]
    assert acc["draft_tokens"] == 7 * 40
    assert acc["pooled"] == pytest.approx((3 * 26 + 4 * 30) / 280)
    counts = {b["lo"]: b["count"] for b in acc["histogram"]}
    assert counts[0.6] == 3 and counts[0.7] == 4 and sum(counts.values()) == 7
    assert json.loads(json.dumps(report)) == report  # plain JSON
    assert load_levels(report) == levels


def test_single_endpoint_report_has_no_speedup(levels):
    report = build_report({"base": levels["base"]}, {})
    assert report["speedup"] == [] and report["crossover"]["status"] == "no_data"
    assert set(figures(report)) == {"throughput", "latency"}
    assert "both variants are needed" in markdown(report)


def test_write_report_is_self_contained(levels, tmp_path):
    report = build_report(
        levels, {"endpoints": {"redrafter": "r:8001", "base": "b:8001"}, "max_tokens": 60}, label=LABEL
    )
    paths = write_report(report, tmp_path / "out")
    assert json.loads(paths["json"].read_text()) == report
    for name in FIGURES:
        assert paths[name].read_bytes().startswith(PNG_MAGIC)
    md = paths["markdown"].read_text()
    assert md.startswith(f"# ReDrafter evaluation — {LABEL}")
    assert "about **3.00** concurrent requests" in md
    assert all(f"]({name}.png)" in md for name in FIGURES)
    page = paths["html"].read_text()
    uris = re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", page)
    assert len(uris) == len(FIGURES)
    assert all(base64.b64decode(u).startswith(PNG_MAGIC) for u in uris)
    assert LABEL in page and "<script" not in page and "http" not in page.split("<h2>Data</h2>")[0]


def test_crossover_wording_for_each_status(levels):
    faster = {"redrafter": levels["redrafter"][:2], "base": levels["base"][:2]}
    assert "above 2" in markdown(build_report(faster, {}))
    slower = {"redrafter": levels["redrafter"][2:], "base": levels["base"][2:]}
    assert "slower than base at every concurrency" in markdown(build_report(slower, {}))
