"""Replica autoscaling with the Kubernetes HPA algorithm, on requests queued per replica.

Follows kube-controller-manager's HorizontalPodAutoscaler for a ``Pods`` metric (autoscaling/v2),
read in kubernetes/kubernetes ``pkg/controller/podautoscaler`` at release-1.28 and at master (v1.34
development): the same logic in both (only the tolerance became per direction in between), hence in
the 1.30+ releases the project targets, which lie between them:

* ``replica_calculator.go``, ``groupPods``: a pod being deleted or terminal is ignored; a Pending pod
  is *unready*; a running pod without a reading is *missing* (here: a pod still loading its engine,
  which is not Ready and therefore not scraped, or a Ready pod whose scrape failed); the others are
  *ready*, and only their readings make the usage ratio. One deliberate difference: upstream counts a
  running pod that has a reading as ready even when its Ready condition is False (for non-CPU
  metrics); here a pod that is not Ready is missing even if a source (Prometheus) has a reading for
  it, since an engine that is still loading reports no load, which says nothing about its load.
* ``replica_calculator.go``, ``ReplicaCalculator.calcPlainMetricReplicas``: ratio = mean(queue per ready pod)
  / targetQueuePerReplica, where a pod's queue is Triton's active + waiting requests plus the requests queued
  in the pod's OpenAI front for a generation slot (``metrics.queue_of``); no change while |ratio - 1| <= tolerance; otherwise, without unready or
  missing pods, desired = ceil(ratio x **ready pods**) (not x spec replicas: pods that are still
  starting carry no load yet, and counting them again is what ran 2 -> 4 -> 8 -> 16 while engines
  loaded). With missing pods, or unready pods on a scale-up, the ratio is recomputed with missing
  pods at the target on a scale-down and at 0 on a scale-up, unready pods at 0 on a scale-up; if that
  falls within the tolerance or flips the direction there is no change, else desired = ceil(new
  ratio x pods counted), and never in the other direction than the ratio says. So the
  recommendation never scales up on behalf of pods that are still starting.
* no ready pod reports (every pod starting, or no metrics): no change (upstream: "did not receive
  metrics for targeted pods (pods might be unready)").
* ``horizontal.go``, ``HorizontalController.stabilizeRecommendationWithBehaviors`` (KEP-853): every raw recommendation is
  recorded; the result is bounded below by the minimum recommendation within the scale-up window and
  above by the maximum within the scale-down window.
* after the Service moved to another pool (a switch), that pool is not scaled down below the size it
  took the traffic with for the scale-down window (at least ``SETTLE_INTERVALS`` evaluations): its
  in-flight gauges read ~0 until the traffic has arrived. Same rule as the HPA's downscale
  stabilization, with a window that starts at the move (the old pool's recommendations are dropped).
* at most ``maxStep`` replicas added or removed per evaluation, then clamped to [min, max].
* ``External``/``Disabled`` never write replicas. current = 0 is left alone unless minReplicas > 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

from pydantic import BaseModel, Field

from ..api.spec import Autoscaling, ReDrafterDeploymentSpec
from ..api.types import parse_duration
from ..metrics.samples import PodStatus, Reading, queue_of

_EPS = 1e-9  # float noise: a ratio of exactly 1 + tolerance is within tolerance, as written
SETTLE_INTERVALS = 3  # evaluations after a Service move during which the new pool is never scaled down


class AutoscalerState(BaseModel):
    """Recommendation history (time, replicas) within the longest stabilization window; JSON-able."""

    recommendations: list[tuple[float, int]] = Field(default_factory=list)
    settle: tuple[float, int] | None = Field(
        default=None, description="(until, replicas): no scale-down below replicas until then (Service just moved)."
    )


@dataclass(frozen=True)
class ScaleDecision:
    """``replicas`` is None when the operator must not write replicas (External/Disabled mode)."""

    replicas: int | None
    reason: str
    message: str
    metric: float | None = None  # mean queue per ready pod used
    recommendation: int | None = None  # raw HPA recommendation before stabilization/limits

    def changed(self, current: int) -> bool:
        return self.replicas is not None and self.replicas != current


@dataclass(frozen=True)
class PoolLoad:
    """The scale target's pods as the HPA groups them, and the summed load of the ready ones."""

    total: float  # queued requests (Triton's active + waiting, the front's queued) summed over the ready pods
    ready: int  # pods whose load was read
    missing: int = 0  # running pods without a reading (starting, or unreadable)
    unready: int = 0  # Pending pods


def pool_load(reading: Reading, pool: str, pods: Iterable[PodStatus] | None = None) -> PoolLoad | None:
    """The serving Deployment's pods (variant == pool: a canary in the pool is another Deployment) grouped
    as ``groupPods`` does; None when no ready pod reported load. Without ``pods`` (no pod list), the
    pods in the reading are the only ones known: those that failed to answer are missing."""
    usage = {
        s.pod: queue
        for s in reading.samples
        if s.variant == pool and s.pool == pool and (queue := queue_of(s.load)) is not None
    }
    if pods is None:
        missing = sum(1 for e in reading.errors if e.variant == pool and e.pool == pool)
        unready = 0
    else:
        mine = [p for p in pods if p.variant == pool and p.pool == pool and p.phase != "Ignored"]
        unready = sum(1 for p in mine if p.phase == "Pending")
        ready = {p.name for p in mine if p.phase == "Ready"}
        usage = {name: u for name, u in usage.items() if name in ready}
        missing = sum(1 for p in mine if p.phase != "Pending" and p.name not in usage)
    if not usage:
        return None
    return PoolLoad(sum(usage.values()), len(usage), missing, unready)


def _within(ratio: float, tolerance: float) -> bool:
    return abs(ratio - 1.0) <= tolerance + _EPS


def _raw_recommendation(a: Autoscaling, current: int, load: PoolLoad) -> tuple[int, float, str]:
    """``calcPlainMetricReplicas`` (replica_calculator.go): desired replicas before stabilization;
    returns (desired, mean queue per ready pod, why)."""
    target = a.target_queue_per_replica
    mean = load.total / load.ready
    ratio = mean / target
    scale_up_with_unready = load.unready > 0 and ratio > 1.0
    if not scale_up_with_unready and load.missing == 0:
        if _within(ratio, a.tolerance):
            return current, mean, "WithinTolerance"
        desired = math.ceil(ratio * load.ready - _EPS)
        return desired, mean, _direction(desired, current)
    total, counted = load.total, load.ready
    if load.missing and ratio < 1.0:  # scale-down: missing pods at the target
        total, counted = total + load.missing * target, counted + load.missing
    elif load.missing and ratio > 1.0:  # scale-up: missing pods idle
        counted += load.missing
    if scale_up_with_unready:  # scale-up: unready pods idle
        counted += load.unready
    new_ratio = total / counted / target
    why = "UnreadyPodsConservative" if scale_up_with_unready else "MissingPodsConservative"
    if _within(new_ratio, a.tolerance) or (ratio < 1.0 < new_ratio) or (new_ratio < 1.0 < ratio):
        return current, mean, why
    desired = math.ceil(new_ratio * counted - _EPS)
    if (new_ratio < 1.0 and desired > current) or (new_ratio > 1.0 and desired < current):
        return current, mean, why  # the pods counted would turn the direction around
    return desired, mean, _direction(desired, current)


def _direction(desired: int, current: int) -> str:
    return "ScaleUp" if desired > current else ("ScaleDown" if desired < current else "NoChange")


def settled(spec: ReDrafterDeploymentSpec, current: int, now: float) -> AutoscalerState:
    """State right after the Service moved to another pool: no scale-down below ``current`` for the
    scale-down window (at least SETTLE_INTERVALS evaluations), the old pool's history dropped."""
    window = max(
        parse_duration(spec.autoscaling.scale_down_stabilization),
        SETTLE_INTERVALS * parse_duration(spec.speculation.interval),
    )
    return AutoscalerState(recommendations=[], settle=(now + window, current))


def recommend(
    spec: ReDrafterDeploymentSpec, state: AutoscalerState, current: int, load: PoolLoad | None, now: float
) -> tuple[ScaleDecision, AutoscalerState]:
    """One autoscaler evaluation for the serving pool (``load``: see :func:`pool_load`). Pure."""
    a = spec.autoscaling
    if a.mode != "Operator":
        return ScaleDecision(None, f"Mode{a.mode}", f"autoscaling mode {a.mode}: replicas are not written"), state
    up_w, down_w = parse_duration(a.scale_up_stabilization), parse_duration(a.scale_down_stabilization)
    history = [(t, r) for t, r in state.recommendations if now - t <= max(up_w, down_w)]
    settle = state.settle if state.settle is not None and now < state.settle[0] else None
    kept = AutoscalerState(recommendations=history, settle=settle)

    if current == 0 and a.min_replicas == 0:
        return ScaleDecision(0, "ScaledToZero", "0 replicas and minReplicas 0: nothing to measure"), kept
    if current == 0 or load is None or load.ready == 0:
        floor = max(current, a.min_replicas)
        bounded = min(floor, a.max_replicas)
        why = "no ready pod reports load" if current else "scaling up from zero to minReplicas"
        return ScaleDecision(bounded, "NoMetrics" if current else "BelowMinimum", why), kept

    raw, metric, why = _raw_recommendation(a, current, load)
    # KEP-853 stabilization: bounds from the windows, the current raw recommendation included.
    up_rec = min([r for t, r in history if now - t <= up_w] + [raw])
    down_rec = max([r for t, r in history if now - t <= down_w] + [raw] + ([settle[1]] if settle else []))
    stabilized = current
    if stabilized < up_rec:
        stabilized = up_rec
    if stabilized > down_rec:
        stabilized = down_rec
    history.append((now, raw))

    step = max(current - a.max_step, min(current + a.max_step, stabilized))
    final = max(a.min_replicas, min(a.max_replicas, step))
    msg = (
        f"queue/replica {metric:.2f} over {load.ready} ready pods ({load.missing} missing, {load.unready} "
        f"pending) vs target {a.target_queue_per_replica} (tolerance {a.tolerance}): "
        f"recommendation {raw}, stabilized {stabilized}, limited {final}"
    )
    if final == current:
        if why in ("WithinTolerance", "MissingPodsConservative", "UnreadyPodsConservative"):
            reason = why
        elif settle and raw < current and down_rec == settle[1]:
            reason = "SwitchSettling"
        else:
            reason = "Stabilized" if raw != current else "NoChange"
    elif final != stabilized:
        reason = "Limited"
    else:
        reason = "ScaleUp" if final > current else "ScaleDown"
    return ScaleDecision(final, reason, msg, metric, raw), AutoscalerState(recommendations=history, settle=settle)
