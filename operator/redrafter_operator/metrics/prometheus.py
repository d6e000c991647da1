"""Read serving metrics from Prometheus (instant PromQL query over the HTTP API).

Same interface as :class:`~.scraper.PodScraper`: raw cumulative counters per pod, so windowing,
reset handling and the policy are identical whichever source is configured. The scrape config must
attach the standard ``namespace`` and ``pod`` target labels (a ServiceMonitor/PodMonitor does). A
pod without Triton's series (its ``up`` is 0, or it has no series at all) is missing data. The OpenAI
front's gauges come from a second endpoint of the same pod (port ``openai``, the chart's PodMonitor
scrapes both); without them the sample has no front keys, as with the pod scraper.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any, Callable, Sequence

import aiohttp

from engine_jobs import contract as c

from .samples import COUNTER_METRICS, FRONT_LOAD, PodError, PodSample, PodTarget, Reading, collect

_FRONT_NAMES = frozenset(FRONT_LOAD.values())
_NAMES = sorted({*COUNTER_METRICS.values(), c.METRIC_TRTLLM_REQUESTS, *_FRONT_NAMES, "up"})
#: target labels the scrape config must attach to every serving pod's series
TARGET_LABELS = ("namespace", "pod")


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def build_query(namespace: str, pods: Sequence[str]) -> str:
    """One PromQL selector returning every series the readers need for the given pods."""
    names = "|".join(re.escape(n) for n in _NAMES)
    pod_re = "|".join(re.escape(p) for p in pods)
    ns_label, pod_label = TARGET_LABELS
    return f"{{__name__=~{_quote(names)},{ns_label}={_quote(namespace)},{pod_label}=~{_quote(pod_re)}}}"


class PrometheusError(RuntimeError):
    """The Prometheus API could not be queried at all (the whole reading failed)."""


class PrometheusSource:
    """Queries ``<url>/api/v1/query``; raises :class:`PrometheusError` when Prometheus itself fails."""

    def __init__(
        self,
        url: str,
        deployment: str,
        namespace: str,
        timeout: float = 5.0,
        *,
        session: aiohttp.ClientSession | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.url = url.rstrip("/")
        self.deployment = deployment
        self.namespace = namespace
        self.timeout = timeout
        self._session = session
        self._clock = clock

    async def read(self, targets: Sequence[PodTarget]) -> Reading:
        if not targets:
            return Reading(time=self._clock())
        now = self._clock()
        params = {"query": build_query(self.namespace, [t.name for t in targets]), "time": f"{now:.3f}"}
        if self._session is not None:
            payload = await self._query(self._session, params)
        else:
            async with aiohttp.ClientSession() as session:
                payload = await self._query(session, params)
        by_pod: dict[str, list[tuple[str, dict[str, str], float]]] = {}
        for item in payload:
            labels = dict(item.get("metric", {}))
            name, pod = labels.pop("__name__", ""), labels.get("pod", "")
            try:
                value = float(item["value"][1])
            except (KeyError, IndexError, TypeError, ValueError):
                continue
            by_pod.setdefault(pod, []).append((name, labels, value))
        samples, errors = [], []
        for t in targets:
            series = by_pod.get(t.name) or []
            up = [v for n, _, v in series if n == "up"]
            # Triton's own series: a failed scrape of its endpoint marks them stale, so they vanish from an
            # instant query even while the front's endpoint (another `up` series) is still scraped
            triton = [s for s in series if s[0] != "up" and s[0] not in _FRONT_NAMES]
            if not series:
                errors.append(PodError(t.name, t.variant, t.pool, "no series in Prometheus"))
            elif up and max(up) < 1:
                errors.append(PodError(t.name, t.variant, t.pool, "Prometheus reports the target down (up == 0)"))
            elif not triton:
                errors.append(PodError(t.name, t.variant, t.pool, "no series of Triton's metrics port in Prometheus"))
            else:
                counters, load = collect(series, self.deployment)
                samples.append(PodSample(t.name, t.identity, t.variant, t.pool, now, counters, load, t.started_at))
        return Reading(time=now, samples=tuple(samples), errors=tuple(errors))

    async def _query(self, session: aiohttp.ClientSession, params: dict[str, str]) -> list[dict[str, Any]]:
        url = f"{self.url}/api/v1/query"
        try:
            async with session.post(url, data=params, timeout=aiohttp.ClientTimeout(total=self.timeout)) as resp:
                body = await resp.json(content_type=None)
        except asyncio.TimeoutError as exc:
            raise PrometheusError(f"POST {url}: timed out after {self.timeout}s") from exc
        except (aiohttp.ClientError, ValueError) as exc:
            raise PrometheusError(f"POST {url}: {type(exc).__name__}: {exc}") from exc
        if not isinstance(body, dict) or body.get("status") != "success":
            err = body.get("error") if isinstance(body, dict) else body
            raise PrometheusError(f"POST {url}: query failed: {err}")
        data = body.get("data", {})
        if data.get("resultType") != "vector":
            raise PrometheusError(f"POST {url}: expected a vector result, got {data.get('resultType')}")
        return list(data.get("result", []))
