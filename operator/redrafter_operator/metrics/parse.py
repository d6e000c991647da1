"""Prometheus text exposition (Triton's :8002/metrics) -> the series a pod sample is built from."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def parse_exposition(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample line as ``(name, labels, value)``; raises ValueError on malformed text."""
    out: list[tuple[str, dict[str, str], float]] = []
    try:
        for family in text_string_to_metric_families(text):
            out.extend((s.name, dict(s.labels), float(s.value)) for s in family.samples)
    except (ValueError, TypeError, IndexError) as exc:  # the parser raises several kinds
        raise ValueError(f"malformed metrics exposition: {exc}") from exc
    return out
