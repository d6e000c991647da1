"""Reading serving metrics: pod scrape or PromQL -> typed samples -> windowed rates per engine/pool."""

from .parse import parse_exposition
from .prometheus import PrometheusError, PrometheusSource
from .samples import (
    COUNTERS,
    MetricsSource,
    PodError,
    PodSample,
    PodStatus,
    PodTarget,
    Reading,
    collect,
    pod_is_ready,
    queue_of,
)
from .scraper import PodScraper
from .source import source_for, statuses_from_pods, targets_from_pods
from .window import Aggregate, PodMark, Windows, WindowState, advance

__all__ = [
    "Aggregate",
    "COUNTERS",
    "MetricsSource",
    "PodError",
    "PodMark",
    "PodSample",
    "PodScraper",
    "PodStatus",
    "PodTarget",
    "PrometheusError",
    "PrometheusSource",
    "Reading",
    "WindowState",
    "Windows",
    "advance",
    "collect",
    "parse_exposition",
    "pod_is_ready",
    "queue_of",
    "source_for",
    "statuses_from_pods",
    "targets_from_pods",
]
