"""One evaluation of a ReDrafterDeployment: reading -> windows -> speculation decision + replicas.

The single pure entry point the controller calls every ``spec.speculation.interval``. Everything
that must survive between evaluations and operator restarts is :class:`PolicyState` (JSON-able);
the controller stores it (e.g. ``status.policy``) and passes it back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from pydantic import BaseModel, Field, ValidationError

from ..api.spec import ReDrafterDeploymentSpec
from ..api.status import ReDrafterDeploymentStatus
from ..metrics.samples import PodStatus, Reading
from ..metrics.window import Windows, WindowState, advance
from .autoscaler import AutoscalerState, ScaleDecision, pool_load, recommend, settled
from .measure import canary_replicas
from .speculation import Decision, Observation, SpeculationState, evaluate, initial_state

BOTH = frozenset({"redrafter", "base"})


class PolicyState(BaseModel):
    """Counter marks, speculation state machine and autoscaler history, persisted together."""

    window: WindowState = Field(default_factory=WindowState)
    speculation: SpeculationState
    autoscaler: AutoscalerState = Field(default_factory=AutoscalerState)
    replicas: int | None = Field(
        default=None, description="Replicas the last evaluation asked of the engine it chose (Operator mode)."
    )
    serving: str | None = Field(default=None, description="The pool the Service selected at the last evaluation.")

    @classmethod
    def new(cls, spec: ReDrafterDeploymentSpec, now: float, serving: str | None = None) -> "PolicyState":
        return cls(speculation=initial_state(spec, now, serving))


@dataclass(frozen=True)
class ServingPlan:
    """What serving should converge to (maps 1:1 onto the controller's ServingTargets)."""

    active: str  # engine the stable Service selects once the switch is complete
    replicas: dict[str, int]  # per variant Deployment (the inactive one: 1 with keepStandby, else 0)
    canary: int  # ReDrafter replicas in the base pool (only while on base in Auto mode)


@dataclass(frozen=True)
class Evaluation:
    """What the controller acts on: the engine to serve and the replicas of its Deployment."""

    speculation: Decision
    scale: ScaleDecision
    windows: Windows | None
    current_replicas: int = 0  # the serving pool's replicas this evaluation started from
    canary: int = 0  # ReDrafter canary replicas the base pool needs (measure.canary_replicas)

    def plan(self, spec: ReDrafterDeploymentSpec, current_replicas: int) -> ServingPlan:
        """Targets for the planner. Replicas come from the autoscaler in Operator mode, otherwise
        from spec.serving.replicas (which an external HPA/KEDA writes through the scale subresource)."""
        active = self.speculation.engine
        other = "base" if active == "redrafter" else "redrafter"
        if spec.autoscaling.mode == "Operator":
            replicas = self.scale.replicas if self.scale.replicas is not None else current_replicas
        else:
            replicas = spec.serving.replicas
        canary = self.canary if active == "base" else 0
        standby = 1 if spec.serving.rollout.keep_standby else 0
        return ServingPlan(active=active, replicas={active: replicas, other: standby}, canary=canary)


def step(
    spec: ReDrafterDeploymentSpec,
    state: PolicyState | None,
    reading: Reading | None,
    now: float,
    *,
    current_replicas: int,
    error: str | None = None,
    available: frozenset[str] = BOTH,
    measured_crossover: float | None = None,
    serving: str | None = None,
    pods: Sequence[PodStatus] | None = None,
) -> tuple[Evaluation, PolicyState]:
    """Evaluate once. ``reading`` is None when the metrics source failed as a whole (``error`` says why).

    ``current_replicas``: spec replicas of the serving pool's Deployment (canary excluded). In
    Operator mode the replicas the previous evaluation asked for take precedence, as an HPA starts
    from the scale it wrote: the Deployment lags a reconcile behind, and right after a switch the
    new pool still has its standby size.
    ``available``: engines whose artifact is Ready to serve (a switch to another one is held).
    ``measured_crossover``: crossover concurrency measured by a passed validation Job; when given, the
    load-aware rule uses the cost model calibrated to it instead of the default calibration.
    ``serving``: the pool the stable Service selects now (default: the engine the policy chose). The
    autoscaler sizes the pool that takes the traffic: while a switch is in flight, or while validation
    holds the Service on base, the chosen engine's pool has no traffic to measure.
    ``pods``: every serving pod's readiness (the pod list the reading was taken from). The autoscaler
    multiplies by the pods that reported and counts the others as the HPA does (see
    :mod:`.autoscaler`); without it only the pods in the reading are known.
    """
    state = state or PolicyState.new(spec, now, serving)
    if spec.autoscaling.mode == "Operator" and state.replicas is not None:
        current_replicas = state.replicas
    if reading is None:
        windows, window_state = None, state.window
        obs = Observation.failed(error or "metrics could not be read", available)
    else:
        windows, window_state = advance(state.window, reading)
        obs = Observation(windows, None, available, measured_crossover)
    decision, spec_state = evaluate(spec, state.speculation, obs, now)
    # Scale the pool that serves. On a switch decision, and on the first evaluation after the Service moved
    # to another pool, that pool's load is not measured yet (its in-flight gauges still read ~0), so the
    # autoscaler sees no metrics and keeps the replica count (HPA behaviour without metrics); after the move
    # the pool is not scaled down for a settle window either (autoscaler.settled).
    pool = serving or decision.engine
    moved = state.serving is not None and pool != state.serving
    auto = settled(spec, current_replicas, now) if moved and spec.autoscaling.mode == "Operator" else state.autoscaler
    load = pool_load(reading, pool, pods) if reading is not None and not decision.switched and not moved else None
    scale, auto_state = recommend(spec, auto, current_replicas, load, now)
    new = PolicyState(
        window=window_state, speculation=spec_state, autoscaler=auto_state, replicas=scale.replicas, serving=pool
    )
    return Evaluation(decision, scale, windows, current_replicas, canary_replicas(spec, spec_state)), new


def canary_from_status(spec: ReDrafterDeploymentSpec, status: ReDrafterDeploymentStatus) -> int:
    """The canary replicas the policy last asked for, from ``status.policy``, for a restarted operator's
    first reconciles (before the policy first runs): the spec's ``canaryReplicas`` on base in Auto mode when
    status holds no readable policy state (so no canary pod is dropped, nor started and dropped again)."""
    if status.active_engine != "base" or spec.speculation.mode != "Auto":
        return 0
    try:
        stored = PolicyState.model_validate(status.policy or {}).speculation
    except ValidationError:
        return spec.speculation.canary_replicas
    return canary_replicas(spec, stored) if stored.engine == "base" else spec.speculation.canary_replicas
