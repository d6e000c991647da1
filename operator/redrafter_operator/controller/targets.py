"""Serving targets: what serving converges to without a policy decision, and the blue/green step toward it.

Pure. The policy and the validation gate hand the reconciler :class:`~.plan_types.ServingTargets`;
:func:`plan_switch` moves the Deployments and the stable Service one safe step toward them per reconcile.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from engine_jobs.contract import VARIANTS, Variant

from ..api.spec import ReDrafterDeploymentSpec
from ..api.status import EngineStatus, ReDrafterDeploymentStatus
from ..policy import pinned_engine
from ..policy.loop import canary_from_status
from .facts import Observed
from .plan_types import READY_STATES, ServingTargets
from .validation import gate_from_status


def default_targets(spec: ReDrafterDeploymentSpec, status: ReDrafterDeploymentStatus) -> ServingTargets:
    """Without a policy decision: the engine that serves keeps serving; a new resource starts on the engine
    its mode pins (ReDrafter in Auto). A pin that moves a serving resource is the policy's switch, made
    (and recorded in status.history) by its next evaluation, which a new spec brings forward to the next tick."""
    pin = pinned_engine(spec)
    active: Variant
    if status.active_engine is not None:
        active = status.active_engine
    elif status.drafter is not None and status.drafter.state == "Rejected":
        active = pin or "base"  # no ReDrafter engine is built from a rejected drafter: the base serves
    else:
        active = pin or "redrafter"
    replicas = spec.serving.replicas
    if spec.autoscaling.mode == "Operator":  # until the autoscaler decides, spec within [min, max]
        replicas = max(spec.autoscaling.min_replicas, min(spec.autoscaling.max_replicas, replicas))
    other: Variant = "base" if active == "redrafter" else "redrafter"
    # What the policy and the validation gate would keep, read from status, so that a restarted operator's
    # first reconciles (before the monitors run) neither drop the canary nor a pod under validation.
    canary = canary_from_status(spec, status) if active == "base" else 0
    return gate_from_status(
        ServingTargets(
            active=active,
            replicas={active: replicas, other: 1 if spec.serving.rollout.keep_standby else 0},
            canary=canary,
        ),
        spec,
        status,
    )


def deployable_key(variant: Variant, engine: EngineStatus, observed: Observed) -> str | None:
    """The engine key to serve for a variant: the current engine if built, else what is deployed now."""
    if engine.state in READY_STATES:
        return engine.key
    dep = observed.deployments.get(variant)
    if dep and dep.key:
        return dep.key  # keep serving the previous engine while the new one builds
    return None


@dataclass(frozen=True)
class ServingPlan:
    pool: Variant | None  # what the stable Service selects after this step
    replicas: dict[str, int]  # per deployable variant
    switching: bool
    message: str


def plan_switch(
    targets: ServingTargets, deployable: Mapping[str, bool], observed: Observed, strategy: str, *, routed: bool = False
) -> ServingPlan:
    """Blue/green (or Recreate) step toward ``targets`` from what is observed (pure, one step per call).

    BlueGreen: the target variant is scaled up first; the Service moves only once that Deployment's
    rollout is complete and Ready; the previous variant is scaled down only once the Service is
    observed selecting the target — so the Service never selects a pool without Ready pods. ``routed``:
    the InferencePool <name> moves with the Service, and the previous variant also waits until the
    InferencePool is observed on the target (gateways, too, never route to a pool without Ready pods).
    Recreate: the previous variant goes to zero first (no spare GPUs), then the target comes up.
    """
    target = targets.active
    want: dict[str, int] = {v: int(targets.replicas.get(v, 0)) for v in VARIANTS if deployable.get(v)}
    current = observed.service_pool if observed.service_pool in VARIANTS else None
    if not deployable.get(target):
        if current and deployable.get(current):
            # Target engine not built yet: keep serving what is selected now, at the target's size.
            keep = {**want, current: max(want.get(current, 0), int(targets.replicas.get(target, 0)))}
            return ServingPlan(current, keep, True, f"waiting for the {target} engine before switching")
        return ServingPlan(current, want, False, f"waiting for the {target} engine")
    lagging = observed.routing_pool if routed and observed.routing_pool in VARIANTS else None
    if current == target and lagging and lagging != target and deployable.get(lagging) and strategy != "Recreate":
        lag_dep = observed.deployments.get(lagging)
        keep_lagging = max(want.get(lagging, 0), lag_dep.replicas if lag_dep else 0)
        return ServingPlan(target, {**want, lagging: keep_lagging}, True, f"moving the InferencePool to {target}")
    if current is None or current == target:
        return ServingPlan(target, want, False, "")
    old_dep = observed.deployments.get(current)
    new_dep = observed.deployments.get(target)
    if strategy == "Recreate":
        if old_dep and old_dep.total_replicas > 0 and old_dep.replicas > 0:
            return ServingPlan(
                current, {**want, current: 0, target: 0}, True, f"scaling {current} down before {target} comes up"
            )
        return ServingPlan(target, want, True, f"switched to {target} (Recreate)")
    target_ready = bool(
        new_dep
        and new_dep.replicas == want.get(target)
        and new_dep.rolled_out
        and new_dep.ready_replicas >= max(1, want.get(target, 0))
    )
    keep_old = max(want.get(current, 0), old_dep.replicas if old_dep else 0)
    if not target_ready:
        return ServingPlan(
            current, {**want, current: keep_old}, True, f"bringing {target} up before moving the Service"
        )
    # Target Ready: move the Service now; scale the old pool down on a later step, once the Service
    # is observed on the target (this step keeps it up).
    return ServingPlan(target, {**want, current: keep_old}, True, f"moving the Service to {target}")
