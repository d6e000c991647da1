"""Replica autoscaling with the Kubernetes HPA algorithm, on requests queued per replica.

Follows kube-controller-manager's HorizontalPodAutoscaler (autoscaling/v2 behaviour):

* ratio = mean(active + waiting per pod) / targetQueuePerReplica; no change while
  |ratio - 1| <= tolerance; otherwise desired = ceil(current x ratio).
* pods that did not report (missing data) are assumed at 0 when scaling up and at the target when
  scaling down, and the ratio is recomputed; if that flips the direction or falls within the
  tolerance there is no change (HPA's conservative treatment of missing metrics).
* stabilization (KEP-853): every raw recommendation is recorded; the result is bounded below by the
  minimum recommendation within the scale-up window and above by the maximum within the scale-down
  window, so a brief dip does not scale down and (with a window) a brief spike does not scale up.
* at most ``maxStep`` replicas added or removed per evaluation, then clamped to [min, max].
* no metrics at all: no change. ``External``/``Disabled`` never write replicas.
* current = 0 is left alone unless minReplicas > 0 (scaling from zero needs an external signal).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pydantic import BaseModel, Field

from ..api.types import parse_duration
from ..metrics.window import Aggregate

_EPS = 1e-9  # float noise: a ratio of exactly 1 + tolerance is within tolerance, as written


class AutoscalerState(BaseModel):
    """Recommendation history (time, replicas) within the longest stabilization window; JSON-able."""

    recommendations: list[tuple[float, int]] = Field(default_factory=list)


@dataclass(frozen=True)
class ScaleDecision:
    """``replicas`` is None when the operator must not write replicas (External/Disabled mode)."""

    replicas: int | None
    reason: str
    message: str
    metric: float | None = None  # mean queue per replica used
    recommendation: int | None = None  # raw HPA recommendation before stabilization/limits

    def changed(self, current: int) -> bool:
        return self.replicas is not None and self.replicas != current


def _raw_recommendation(a, current: int, load: Aggregate) -> tuple[int, float, str]:
    """HPA's desired replicas from the metric (before stabilization); returns (desired, metric, why)."""
    target = a.target_queue_per_replica
    n = load.pods_reporting
    total = load.load.get("active", 0.0) + load.load.get("waiting", 0.0)
    mean = total / n
    ratio = mean / target
    if abs(ratio - 1.0) <= a.tolerance + _EPS:
        return current, mean, "WithinTolerance"
    missing = load.pods_failed
    if missing:
        if ratio > 1.0:  # scaling up: pretend missing pods are idle
            adj = total / (n + missing) / target
        else:  # scaling down: pretend missing pods are exactly at target
            adj = (total + missing * target) / (n + missing) / target
        if abs(adj - 1.0) <= a.tolerance + _EPS or (adj > 1.0) != (ratio > 1.0):
            return current, mean, "MissingPodsConservative"
        ratio = adj
    desired = math.ceil(current * ratio - _EPS)
    return desired, mean, "ScaleUp" if desired > current else ("ScaleDown" if desired < current else "NoChange")


def recommend(spec, state: AutoscalerState, current: int, load: Aggregate | None,
              now: float) -> tuple[ScaleDecision, AutoscalerState]:
    """One autoscaler evaluation for the active pool (``load`` = its aggregate). Pure."""
    a = spec.autoscaling
    if a.mode != "Operator":
        return ScaleDecision(None, f"Mode{a.mode}", f"autoscaling mode {a.mode}: replicas are not written"), state
    up_w, down_w = parse_duration(a.scale_up_stabilization), parse_duration(a.scale_down_stabilization)
    history = [(t, r) for t, r in state.recommendations if now - t <= max(up_w, down_w)]

    if current == 0 and a.min_replicas == 0:
        return ScaleDecision(0, "ScaledToZero", "0 replicas and minReplicas 0: nothing to measure"), \
            AutoscalerState(recommendations=history)
    if current == 0 or load is None or load.pods_reporting == 0 or "active" not in load.load:
        floor = max(current, a.min_replicas)
        bounded = min(floor, a.max_replicas)
        why = "no pods report load" if current else "scaling up from zero to minReplicas"
        return ScaleDecision(bounded, "NoMetrics" if current else "BelowMinimum", why), \
            AutoscalerState(recommendations=history)

    raw, metric, why = _raw_recommendation(a, current, load)
    # KEP-853 stabilization: bounds from the windows, the current raw recommendation included.
    up_rec = min([r for t, r in history if now - t <= up_w] + [raw])
    down_rec = max([r for t, r in history if now - t <= down_w] + [raw])
    stabilized = current
    if stabilized < up_rec:
        stabilized = up_rec
    if stabilized > down_rec:
        stabilized = down_rec
    history.append((now, raw))

    step = max(current - a.max_step, min(current + a.max_step, stabilized))
    final = max(a.min_replicas, min(a.max_replicas, step))
    msg = (f"queue/replica {metric:.2f} vs target {a.target_queue_per_replica} (tolerance {a.tolerance}): "
           f"recommendation {raw}, stabilized {stabilized}, limited {final}")
    if final == current:
        reason = why if why in ("WithinTolerance", "MissingPodsConservative") else (
            "Stabilized" if raw != current else "NoChange")
    elif final != stabilized:
        reason = "Limited"
    else:
        reason = "ScaleUp" if final > current else "ScaleDown"
    return ScaleDecision(final, reason, msg, metric, raw), AutoscalerState(recommendations=history)
