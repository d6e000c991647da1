"""Typed readings of serving pods: what a metrics source returns, whatever it reads from.

A source (pod scrape or PromQL) turns raw series into one :class:`PodSample` per pod that answered and
one :class:`PodError` per pod that did not. A pod that did not answer is *missing data*, never zeros:
the window computation keeps its last mark and the policy treats a window without data as
inconclusive.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Iterable, Literal, Mapping, Protocol, Sequence

from engine_jobs import contract as c
from engine_jobs.contract import Variant

from ..render.names import LABEL_TRAFFIC, LABEL_VARIANT

#: counter keys of a sample -> the exported metric they are read from
COUNTER_METRICS: dict[str, str] = {
    "requests": c.METRIC_REQUESTS,
    "output_tokens": c.METRIC_OUTPUT_TOKENS,
    "draft_tokens": c.METRIC_DRAFT_TOKENS,
    "accepted_draft_tokens": c.METRIC_ACCEPTED_DRAFT_TOKENS,
    "steps": c.METRIC_STEPS,
    # cumulative microseconds requests spent queued in the TensorRT-LLM model (Triton counter)
    "queue_us": c.METRIC_QUEUE_DURATION,
}
COUNTERS: tuple[str, ...] = tuple(COUNTER_METRICS)
#: nv_trt_llm_request_metrics request_type values kept as load gauges
LOAD_TYPES: tuple[str, ...] = ("active", "waiting", "max")
#: load keys read from the OpenAI front's own /metrics (port openai) -> the gauge they come from. Requests the
#: front has admitted but not yet sent to Triton (``front_queued``) are in no Triton gauge; its generations in
#: flight (``front_in_flight``) are Triton's active or waiting requests already.
FRONT_LOAD: dict[str, str] = {
    "front_queued": c.METRIC_FRONT_QUEUED,
    "front_in_flight": c.METRIC_FRONT_IN_FLIGHT,
}
#: name of the serving container's port of the OpenAI front (render/serving.py PORTS)
FRONT_PORT_NAME = "openai"


def queue_of(load: Mapping[str, float]) -> float | None:
    """A pod's requests being generated or waiting: Triton's ``active`` + ``waiting``, plus the requests
    queued in the OpenAI front for a generation slot. None without Triton's ``active`` gauge (no reading);
    a missing front gauge counts nothing (missing data for that part only)."""
    if "active" not in load:
        return None
    return load["active"] + load.get("waiting", 0.0) + load.get("front_queued", 0.0)


@dataclass(frozen=True)
class PodTarget:
    """A Ready serving pod to read, as the controller sees it in the API."""

    name: str
    uid: str
    variant: Variant  # engine in the pod (LABEL_VARIANT)
    pool: Variant  # traffic pool the pod is in (LABEL_TRAFFIC); a canary has variant redrafter, pool base
    ip: str | None = None
    port: int = c.METRICS_PORT
    front_port: int | None = None  # the OpenAI front's port (its /metrics), None where the pod runs no front
    restarts: int = 0  # sum of container restart counts: a restart resets counters
    started_at: float | None = None  # epoch seconds of the pod's (last container's) start

    @property
    def identity(self) -> str:
        """Changes whenever the pod's counters restart from zero (new pod or container restart)."""
        return f"{self.uid}/{self.restarts}"

    @classmethod
    def from_pod(cls, pod: Mapping[str, Any], port: int = c.METRICS_PORT) -> "PodTarget":
        """Build a target from a Pod object (dict as returned by the API)."""
        meta, status = pod.get("metadata", {}), pod.get("status", {}) or {}
        labels = meta.get("labels", {}) or {}
        variant = labels.get(LABEL_VARIANT)
        if variant not in c.VARIANTS:
            raise ValueError(f"pod {meta.get('name')!r} has no valid {LABEL_VARIANT} label")
        pool = labels.get(LABEL_TRAFFIC, variant)
        statuses = status.get("containerStatuses") or []
        restarts = sum(int(s.get("restartCount", 0)) for s in statuses)
        started = _container_start(statuses) or status.get("startTime")
        return cls(
            name=meta["name"],
            uid=meta.get("uid", meta["name"]),
            variant=variant,
            pool=pool if pool in c.VARIANTS else variant,
            ip=status.get("podIP"),
            port=port,
            front_port=_front_port(pod),
            restarts=restarts,
            started_at=_epoch(started) if started else None,
        )


def pod_is_ready(pod: Mapping[str, Any]) -> bool:
    """True when the Pod's Ready condition is True and it is not being deleted."""
    if pod.get("metadata", {}).get("deletionTimestamp"):
        return False
    conds = (pod.get("status") or {}).get("conditions") or []
    return any(x.get("type") == "Ready" and x.get("status") == "True" for x in conds)


PodPhase = Literal["Ready", "Starting", "Pending", "Ignored"]


@dataclass(frozen=True)
class PodStatus:
    """A serving pod's readiness, grouped as kube-controller-manager's HPA groups pods (``groupPods``
    in pkg/controller/podautoscaler/replica_calculator.go): Ignored (being deleted, or terminal),
    Pending, Ready (scraped), Starting (running but not Ready: e.g. still loading its engine; not
    scraped, so the autoscaler counts it as a pod whose metric is missing)."""

    name: str
    variant: Variant
    pool: Variant
    phase: PodPhase

    @classmethod
    def from_pod(cls, pod: Mapping[str, Any]) -> "PodStatus":
        """From a Pod object (dict as returned by the API); ValueError without a valid variant label."""
        meta, status = pod.get("metadata", {}) or {}, pod.get("status", {}) or {}
        labels = meta.get("labels", {}) or {}
        variant = labels.get(LABEL_VARIANT)
        if variant not in c.VARIANTS:
            raise ValueError(f"pod {meta.get('name')!r} has no valid {LABEL_VARIANT} label")
        pool = labels.get(LABEL_TRAFFIC, variant)
        phase = status.get("phase")
        grouped: PodPhase
        if meta.get("deletionTimestamp") or phase in ("Failed", "Succeeded"):
            grouped = "Ignored"
        elif phase == "Pending":
            grouped = "Pending"
        else:
            grouped = "Ready" if pod_is_ready(pod) else "Starting"
        return cls(name=meta["name"], variant=variant, pool=pool if pool in c.VARIANTS else variant, phase=grouped)


def _front_port(pod: Mapping[str, Any]) -> int | None:
    """The containerPort named ``openai`` of the pod's containers: the pod runs the OpenAI front (pods
    rendered before the front existed have none)."""
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == FRONT_PORT_NAME and isinstance(port.get("containerPort"), int):
                return int(port["containerPort"])
    return None


def _container_start(statuses: list[dict[str, Any]]) -> str | None:
    starts = [s.get("state", {}).get("running", {}).get("startedAt") for s in statuses]
    starts = [s for s in starts if s]
    return max(starts) if starts else None


def _epoch(ts: str) -> float:
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


@dataclass(frozen=True)
class PodSample:
    """One pod's cumulative counters and instantaneous load gauges at ``time``."""

    pod: str
    identity: str
    variant: Variant
    pool: Variant
    time: float
    counters: Mapping[str, float]  # subset of COUNTERS present in the exposition
    load: Mapping[str, float] = field(default_factory=dict)  # subset of LOAD_TYPES and FRONT_LOAD
    started_at: float | None = None


@dataclass(frozen=True)
class PodError:
    """A pod that could not be read (timeout, refused, bad payload, stale series)."""

    pod: str
    variant: Variant
    pool: Variant
    error: str


@dataclass(frozen=True)
class Reading:
    """Everything one evaluation read: samples of live pods, errors of the others."""

    time: float
    samples: tuple[PodSample, ...] = ()
    errors: tuple[PodError, ...] = ()


class MetricsSource(Protocol):
    """Reads the given pods; never raises for one pod's failure (it becomes a PodError)."""

    async def read(self, targets: Sequence[PodTarget]) -> Reading: ...


def collect(
    series: Iterable[tuple[str, Mapping[str, str], float]], deployment: str
) -> tuple[dict[str, float], dict[str, float]]:
    """Fold raw ``(metric name, labels, value)`` series of one pod into (counters, load gauges).

    ReDrafter counters are kept when their ``model`` label names this deployment (summed over other
    labels); Triton's TensorRT-LLM gauges and queue counter are kept for the engine model only; the OpenAI
    front's admission gauges become the FRONT_LOAD keys.
    """
    # Compare without a `_total` suffix: prometheus_client's parser appends it to every counter
    # (Triton's nv_inference_queue_duration_us has none), the Prometheus API returns names as exposed.
    by_metric = {_family(v): k for k, v in COUNTER_METRICS.items()}
    front = {v: k for k, v in FRONT_LOAD.items()}
    counters: dict[str, float] = {}
    load: dict[str, float] = {}
    for raw_name, labels, value in series:
        if value != value:  # NaN: no observation
            continue
        name = _family(raw_name)
        if name == _family(c.METRIC_QUEUE_DURATION):
            if labels.get("model", c.ENGINE_MODEL) == c.ENGINE_MODEL:
                counters["queue_us"] = counters.get("queue_us", 0.0) + value
        elif name in by_metric:
            if labels.get(c.METRIC_LABEL_MODEL, deployment) == deployment:
                key = by_metric[name]
                counters[key] = counters.get(key, 0.0) + value
        elif name == c.METRIC_TRTLLM_REQUESTS:
            kind = labels.get(c.METRIC_TRTLLM_LABEL_TYPE)
            if kind in LOAD_TYPES:
                load[kind] = load.get(kind, 0.0) + value
        elif name in front:
            load[front[name]] = load.get(front[name], 0.0) + value
    return counters, load


def _family(name: str) -> str:
    return name.removesuffix("_total")
