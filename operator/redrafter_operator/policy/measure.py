"""One measurement of the speculation policy: is ReDrafter paying right now?

What is measured:

* on ReDrafter: acceptance of the ReDrafter pods; failure below ``minAcceptanceRate``; with
  ``loadAware``, also failure when the cost model predicts speedup < 1 - margin at the pool's batch
  (in-flight requests per pod, an EWMA of the instantaneous gauge so a one-interval burst is damped).
* on base (recovery): ``canaryReplicas`` ReDrafter pods run in the base traffic pool (Deployment
  ``<name>-redrafter-canary``, LABEL_VARIANT=redrafter, LABEL_TRAFFIC=base), so the stable Service
  sends them a share of live traffic and acceptance stays measured at base-pool load. Success needs
  acceptance >= minAcceptanceRate + acceptanceHysteresis and, with ``loadAware``, predicted speedup
  > 1 + margin. Cost: canaryReplicas x TP GPUs serve ReDrafter (slower than base while acceptance is
  low) for a canary/pool share of traffic. A fallback caused by load alone (``loadAware``, at an
  acceptance that cleared the canary's recovery bar) runs no canary (:func:`canary_replicas`): it would
  serve at ReDrafter's speed exactly while the load makes ReDrafter the slower engine, and such a
  fallback recovers from the last acceptance measured on ReDrafter and the current load, as with
  ``canaryReplicas: 0``. A fallback caused by low acceptance
  needs the canary: without one it cannot observe recovery and stays on base (RecoveryUnobservable).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from ..api.spec import ReDrafterDeploymentSpec
from ..metrics.window import Aggregate, Windows
from . import cost
from .state import SpeculationState

Outcome = Literal["Successful", "Failed", "Inconclusive", "Error"]

# A lone canary finishes few requests per interval: windows are pooled until they reach minSamples
# (at most ACCUMULATE_MAX, oldest dropped first); a conclusive measurement consumes them, so no window
# is counted twice.
ACCUMULATE_MAX = 10
LOAD_SMOOTHING = 0.5  # EWMA weight of the newest batch sample (a burst shorter than ~2 intervals is damped)


@dataclass(frozen=True)
class Observation:
    """What the controller read for one evaluation."""

    windows: Windows | None  # None when the metrics source failed entirely
    error: str | None = None  # why the read failed
    available: frozenset[str] = frozenset({"redrafter", "base"})  # engines with a Ready artifact
    measured_crossover: float | None = None  # from the validation Job (status.speculation.crossoverConcurrency)

    @classmethod
    def failed(cls, error: str, available: frozenset[str] = frozenset({"redrafter", "base"})) -> "Observation":
        return cls(windows=None, error=error, available=available)


@dataclass(frozen=True)
class Measurement:
    outcome: Outcome
    reason: str  # CamelCase, fit for a condition / Event reason
    message: str
    acceptance_rate: float | None = None
    tokens_per_step: float | None = None
    samples: int = 0
    batch: float | None = None  # mean in-flight requests per pod of the serving pool
    predicted_speedup: float | None = None
    crossover: float | None = None
    windows: int = 1  # evaluation intervals pooled to reach minSamples


def _pool_batch(windows: Windows, pool: str, previous: float | None = None) -> float | None:
    """In-flight requests per pod of the serving pool, smoothed (EWMA, LOAD_SMOOTHING) because the
    gauge is one instantaneous sample per interval; None when no pod reported load."""
    agg = windows.pools.get(pool)
    now = agg.active_per_pod if agg else None
    if now is None or previous is None:
        return now
    return LOAD_SMOOTHING * now + (1 - LOAD_SMOOTHING) * previous


def _row(agg: Aggregate) -> list[float]:
    """The counters of one window that acceptance is computed from (kept in state.recent)."""
    inc = agg.increases
    return [
        round(inc.get(k, 0.0), 3)
        for k in ("requests", "draft_tokens", "accepted_draft_tokens", "output_tokens", "steps")
    ]


def _pool(rows: list[list[float]], min_samples: int) -> tuple[list[float], int] | None:
    """Sum of the most recent windows that together reach ``min_samples`` requests (and how many)."""
    total = [0.0] * 5
    for n, row in enumerate(reversed(rows), start=1):
        total = [a + b for a, b in zip(total, row)]
        if total[0] >= min_samples:
            return total, n
    return None


def _acceptance_of(
    agg: Aggregate | None, rows: list[list[float]], min_samples: int
) -> tuple[tuple[str, str], None] | tuple[None, tuple[list[float], int]]:
    """(inconclusive reason, message) or (pooled counters, windows used)."""
    if agg is None or agg.pods_reporting == 0:
        failed = f" ({agg.pods_failed} pods unreadable)" if agg else ""
        return ("NoData", f"no ReDrafter pod reported metrics{failed}"), None
    if agg.missing:
        return ("NoData", "first reading of these pods: baseline only"), None
    pooled = _pool(rows, min_samples)
    if pooled is None:
        n = int(sum(r[0] for r in rows))
        return (
            "TooFewSamples",
            f"{n} finished requests in the last {len(rows)} intervals < minSamples {min_samples}",
        ), None
    if pooled[0][1] <= 0:
        return ("NoDraftTokens", "no draft tokens were proposed in the window"), None
    return None, pooled


def recent_rows(state: SpeculationState, obs: Observation) -> list[list[float]]:
    """state.recent plus this window's ReDrafter counters (when it has any)."""
    red = obs.windows.variants.get("redrafter") if obs.windows else None
    if red is None or red.missing:
        return list(state.recent)
    return (list(state.recent) + [_row(red)])[-ACCUMULATE_MAX:]


def measure(spec: ReDrafterDeploymentSpec, state: SpeculationState, obs: Observation) -> Measurement:
    """Classify this evaluation's observation for the engine currently desired."""
    sp = spec.speculation
    params = cost.CostParams.from_spec(spec, obs.measured_crossover)
    if obs.windows is None:
        return Measurement("Error", "MetricsUnavailable", obs.error or "metrics could not be read")
    red = obs.windows.variants.get("redrafter")
    batch = _pool_batch(obs.windows, state.engine, state.batch)
    inconclusive, pooled = _acceptance_of(red, recent_rows(state, obs), sp.min_samples)
    samples = red.samples if red else 0
    if inconclusive:
        if state.engine == "base" and canary_replicas(spec, state) == 0:
            return _recover_without_canary(spec, state, batch, params, obs.measured_crossover)
        return Measurement("Inconclusive", *inconclusive, samples=samples, batch=batch)
    assert pooled is not None  # _acceptance_of gives a reason or the pooled counters
    (requests, draft, accepted, output, steps), windows = pooled
    acc = accepted / draft
    tps = output / steps if steps > 0 else cost.tokens_per_step(acc, params.draft_len)
    params = cost.calibrated(params, obs.measured_crossover, tps)
    pred = cost.speedup(batch, tps, params) if batch is not None else None
    common: dict[str, Any] = dict(
        acceptance_rate=acc,
        tokens_per_step=tps,
        samples=int(round(requests)),
        batch=batch,
        predicted_speedup=pred,
        crossover=cost.crossover(tps, params),
        windows=windows,
    )
    if state.engine == "redrafter":
        if acc < sp.min_acceptance_rate:
            return Measurement(
                "Failed",
                "LowAcceptance",
                f"acceptance {acc:.3f} < minAcceptanceRate {sp.min_acceptance_rate}",
                **common,
            )
        if sp.load_aware and pred is not None and pred < 1 - sp.margin:
            return Measurement(
                "Failed",
                "NoSpeedupAtLoad",
                f"predicted speedup {pred:.2f} < {1 - sp.margin:.2f} at batch {batch:.1f}",
                **common,
            )
        return Measurement("Successful", "SpeculationPays", _pays(acc, pred), **common)
    need = sp.min_acceptance_rate + sp.acceptance_hysteresis
    if acc < need:
        return Measurement(
            "Failed",
            "CanaryLowAcceptance",
            f"canary acceptance {acc:.3f} < {need:.3f} (minAcceptanceRate + hysteresis)",
            **common,
        )
    if sp.load_aware and pred is not None and pred <= 1 + sp.margin:
        return Measurement(
            "Failed",
            "NoSpeedupAtLoad",
            f"predicted speedup {pred:.2f} <= {1 + sp.margin:.2f} at batch {batch:.1f}",
            **common,
        )
    return Measurement("Successful", "CanaryRecovered", "canary " + _pays(acc, pred), **common)


def canary_replicas(spec: ReDrafterDeploymentSpec, state: SpeculationState) -> int:
    """ReDrafter canary replicas the base pool runs now: ``canaryReplicas`` while on base in Auto mode,
    except after a fallback caused by load alone (``loadAware``; the acceptance last measured on
    ReDrafter already cleared the canary's own recovery bar, minAcceptanceRate + acceptanceHysteresis):
    its return is judged from the load and that acceptance, and the canary costs most there, serving at
    ReDrafter's speed exactly while the load makes ReDrafter the slower engine. The trade-off: an
    acceptance that improves further while on base is not seen until the load falls (one that worsens
    shows on ReDrafter after the return, as a failure). A fallback for NoSpeedupAtLoad at a lower
    acceptance keeps the canary: there the acceptance decides the return."""
    sp = spec.speculation
    if state.engine != "base" or sp.mode != "Auto":
        return 0
    healthy = (
        state.last_acceptance is not None and state.last_acceptance >= sp.min_acceptance_rate + sp.acceptance_hysteresis
    )
    if (
        sp.load_aware
        and state.fallback_reason == "NoSpeedupAtLoad"
        and healthy
        and state.last_tokens_per_step is not None
    ):
        return 0
    return sp.canary_replicas


def _pays(acc: float, pred: float | None) -> str:
    return f"acceptance {acc:.3f}" + (f", predicted speedup {pred:.2f}" if pred is not None else "")


def _recover_without_canary(
    spec: ReDrafterDeploymentSpec,
    state: SpeculationState,
    batch: float | None,
    params: cost.CostParams,
    measured_crossover: float | None = None,
) -> Measurement:
    """No canary: only a load-caused fallback can be undone, from the last ReDrafter measurement."""
    sp = spec.speculation
    if state.fallback_reason != "NoSpeedupAtLoad" or state.last_tokens_per_step is None:
        return Measurement(
            "Inconclusive", "RecoveryUnobservable", "on base without canary replicas: acceptance cannot be measured"
        )
    if batch is None:
        return Measurement("Inconclusive", "NoData", "no base pod reported load")
    tps = state.last_tokens_per_step
    params = cost.calibrated(params, measured_crossover, tps)
    pred = cost.speedup(batch, tps, params)
    common: dict[str, Any] = dict(
        acceptance_rate=state.last_acceptance,
        tokens_per_step=tps,
        batch=batch,
        predicted_speedup=pred,
        crossover=cost.crossover(tps, params),
    )
    if pred > 1 + sp.margin:
        return Measurement(
            "Successful",
            "LoadDropped",
            f"predicted speedup {pred:.2f} at batch {batch:.1f} (last measured acceptance)",
            **common,
        )
    return Measurement("Failed", "NoSpeedupAtLoad", f"predicted speedup {pred:.2f} at batch {batch:.1f}", **common)
