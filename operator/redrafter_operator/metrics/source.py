"""Choosing the metrics source a ReDrafterDeployment asks for, and which pods it reads."""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import aiohttp

from engine_jobs.contract import METRICS_PORT, VARIANTS

from ..api.spec import ReDrafterDeploymentSpec
from ..render.names import LABEL_ROLE, LABEL_VARIANT, ROLE_CANDIDATE
from .prometheus import PrometheusSource
from .samples import MetricsSource, PodStatus, PodTarget, pod_is_ready
from .scraper import PodScraper


def _serving(pod: Mapping[str, Any]) -> bool:
    """A pod with a variant label that serves live traffic. A candidate engine's pods serve only the
    validation Job, whose acceptance says nothing about live traffic."""
    labels = pod.get("metadata", {}).get("labels") or {}
    return bool(labels.get(LABEL_VARIANT)) and labels.get(LABEL_ROLE) != ROLE_CANDIDATE


def targets_from_pods(pods: Iterable[Mapping[str, Any]], port: int = METRICS_PORT) -> list[PodTarget]:
    """Ready serving pods (with a variant label) as scrape targets, sorted by name for stable output."""
    out = [PodTarget.from_pod(p, port) for p in pods if pod_is_ready(p) and _serving(p)]
    return sorted(out, key=lambda t: t.name)


def statuses_from_pods(pods: Iterable[Mapping[str, Any]]) -> list[PodStatus]:
    """Every serving pod's readiness (Ready or not), for the autoscaler; sorted by name. A pod with an
    unknown variant belongs to no pool (the scrape reports it as an error)."""
    return sorted(
        (
            PodStatus.from_pod(p)
            for p in pods
            if _serving(p) and (p.get("metadata", {}).get("labels") or {}).get(LABEL_VARIANT) in VARIANTS
        ),
        key=lambda s: s.name,
    )


def source_for(
    spec: ReDrafterDeploymentSpec, deployment: str, namespace: str, session: aiohttp.ClientSession | None = None
) -> MetricsSource:
    """PodScraper or PrometheusSource per ``spec.metrics`` (timeouts from the spec)."""
    m = spec.metrics
    if m.source == "Prometheus":
        assert m.prometheus_url is not None  # Metrics._url_for_prometheus requires it with this source
        return PrometheusSource(
            m.prometheus_url, deployment, namespace, timeout=m.scrape_timeout_seconds, session=session
        )
    return PodScraper(deployment, timeout=m.scrape_timeout_seconds, session=session)
