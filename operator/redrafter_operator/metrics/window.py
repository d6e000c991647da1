"""Windowed rates from successive counter snapshots, surviving counter resets and pod restarts.

The controller keeps a :class:`WindowState` (small, JSON-able: one mark per pod) between evaluations
and calls :func:`advance` with each new :class:`Reading`. Per pod, the increase of a counter over the
window follows Prometheus ``rate()``/``increase()`` semantics:

* same pod identity and value >= previous: increase = value - previous;
* value < previous (counter reset) or a new identity (pod replaced / container restarted since the
  previous mark): the counter restarted from zero during the window, so increase = value;
* a pod never seen before: if it started after the previous evaluation its whole value belongs to
  the window, otherwise (e.g. a fresh state) the sample is only a baseline for the next window.

A pod that failed to answer keeps its previous mark (its next increase spans the longer gap; rates
use each pod's own span), and contributes nothing now: missing data, never zero.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from pydantic import BaseModel, Field

from .samples import COUNTERS, PodError, PodSample, Reading, queue_of


class PodMark(BaseModel):
    """Last counters seen for one pod."""

    id: str = Field(description="pod identity (uid/restarts)")
    t: float = Field(description="time of the sample (epoch s)")
    c: dict[str, float] = Field(default_factory=dict, description="cumulative counters")


class WindowState(BaseModel):
    """What must survive between evaluations (and operator restarts): one mark per pod."""

    t: float | None = None
    pods: dict[str, PodMark] = Field(default_factory=dict)


@dataclass(frozen=True)
class Aggregate:
    """Rates and load of a group of pods (one engine variant, or one traffic pool) over a window."""

    seconds: float  # length of the window (0 for a baseline-only reading)
    pods_reporting: int  # pods that answered
    pods_failed: int  # pods that did not answer (missing data)
    pods_with_increase: int  # answered pods that had a previous mark (contributed rates)
    resets: int  # pods whose counters restarted during the window
    increases: dict[str, float]  # summed counter increases
    tokens_per_second: float  # output tokens/s summed over pods (each over its own span)
    load: dict[str, float]  # summed instantaneous gauges: active, waiting, max, front_queued, front_in_flight

    @property
    def samples(self) -> int:
        """Requests finished in the window."""
        return int(round(self.increases.get("requests", 0.0)))

    @property
    def missing(self) -> bool:
        """No pod contributed an increase: nothing can be concluded from this window."""
        return self.pods_with_increase == 0

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted / proposed draft tokens (None when nothing was drafted)."""
        draft = self.increases.get("draft_tokens", 0.0)
        return self.increases.get("accepted_draft_tokens", 0.0) / draft if draft > 0 else None

    @property
    def tokens_per_step(self) -> float | None:
        """Output tokens per engine step (None without steps)."""
        steps = self.increases.get("steps", 0.0)
        return self.increases.get("output_tokens", 0.0) / steps if steps > 0 else None

    @property
    def active_per_pod(self) -> float | None:
        """Mean in-flight batch (requests being generated) per pod that reported load."""
        return self.load["active"] / self.pods_reporting if "active" in self.load and self.pods_reporting else None

    @property
    def queue_per_pod(self) -> float | None:
        """Mean requests generating or waiting per pod, Triton's and the OpenAI front's queue (the autoscaler's
        metric, :func:`~.samples.queue_of`)."""
        queue = queue_of(self.load)
        return queue / self.pods_reporting if queue is not None and self.pods_reporting else None

    @property
    def queue_seconds_per_request(self) -> float | None:
        """Mean time a finished request spent queued in the engine model."""
        n = self.increases.get("requests", 0.0)
        return self.increases["queue_us"] / n / 1e6 if n > 0 and "queue_us" in self.increases else None


@dataclass(frozen=True)
class Windows:
    """One evaluation's aggregates, by engine variant and by traffic pool."""

    time: float
    variants: dict[str, Aggregate]
    pools: dict[str, Aggregate]


@dataclass(frozen=True)
class _PodDelta:
    sample: PodSample
    increases: dict[str, float] | None  # None: baseline only
    span: float
    reset: bool


def _pod_delta(sample: PodSample, mark: PodMark | None, prev_t: float | None) -> _PodDelta:
    if mark is None:
        born_in_window = prev_t is not None and sample.started_at is not None and sample.started_at >= prev_t
        if not born_in_window:
            return _PodDelta(sample, None, 0.0, False)
        span = max(sample.time - sample.started_at, 1e-9)  # type: ignore[operator]
        return _PodDelta(sample, {k: v for k, v in sample.counters.items()}, span, True)
    new_identity = mark.id != sample.identity
    out: dict[str, float] = {}
    reset = new_identity
    for key, value in sample.counters.items():
        prev = mark.c.get(key)
        if new_identity or prev is None or value < prev:
            reset = reset or (prev is not None and value < prev)
            out[key] = value if (new_identity or prev is not None) else 0.0
        else:
            out[key] = value - prev
    return _PodDelta(sample, out, max(sample.time - mark.t, 1e-9), reset)


def _aggregate(deltas: Iterable[_PodDelta], errors: Iterable[PodError], seconds: float) -> Aggregate:
    deltas, errors = list(deltas), list(errors)
    inc = {k: 0.0 for k in COUNTERS}
    seen: set[str] = set()
    tps = 0.0
    load: dict[str, float] = {}
    for d in deltas:
        for k, v in d.sample.load.items():
            load[k] = load.get(k, 0.0) + v
        if d.increases is None:
            continue
        for k, v in d.increases.items():
            inc[k] += v
            seen.add(k)
        tps += d.increases.get("output_tokens", 0.0) / d.span
    return Aggregate(
        seconds=seconds,
        pods_reporting=len(deltas),
        pods_failed=len(errors),
        pods_with_increase=sum(d.increases is not None for d in deltas),
        resets=sum(d.reset for d in deltas),
        increases={k: v for k, v in inc.items() if k in seen},
        tokens_per_second=tps,
        load=load,
    )


def advance(state: WindowState | None, reading: Reading) -> tuple[Windows, WindowState]:
    """Aggregates of the window ending at ``reading.time``, and the state for the next call."""
    state = state or WindowState()
    deltas = [_pod_delta(s, state.pods.get(s.pod), state.t) for s in reading.samples]
    seconds = reading.time - state.t if state.t is not None else 0.0

    def group(attr: str) -> dict[str, Aggregate]:
        keys = {getattr(d.sample, attr) for d in deltas} | {getattr(e, attr) for e in reading.errors}
        return {
            k: _aggregate(
                (d for d in deltas if getattr(d.sample, attr) == k),
                (e for e in reading.errors if getattr(e, attr) == k),
                seconds,
            )
            for k in sorted(keys)
        }

    marks = {s.pod: PodMark(id=s.identity, t=s.time, c=dict(s.counters)) for s in reading.samples}
    for err in reading.errors:  # keep the last mark of a pod that did not answer
        if err.pod in state.pods:
            marks[err.pod] = state.pods[err.pod]
    return Windows(reading.time, group("variant"), group("pool")), WindowState(t=reading.time, pods=marks)
