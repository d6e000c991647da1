"""The reconciler's brain (pure): (resource, observed facts) -> desired status, children, Events.

No I/O here. The kopf layer feeds it facts from its indexes and applies the result; running it twice
on the same inputs gives the same plan, and applying an already-applied plan writes nothing.

One plan step, each part in its own module: the engines and their builds (:mod:`.engines`), the
validation gate (:mod:`.gate`), the serving targets and the blue/green step toward them
(:mod:`.targets`), the children rendered for that step, and the status that explains it (:mod:`.status`).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from pydantic import ValidationError

from engine_jobs.contract import VARIANTS

from ..api.spec import ReDrafterDeploymentSpec, spec_errors
from ..render.common import Owner
from . import routing
from .engines import plan_engine
from .facts import Observed, manifest_hash
from .gate import gate_from_status, promotion_state
from .plan_types import READY_STATES, Plan, Renderers, Resource, ServingTargets
from .status import invalid_plan, resource_status, status_events
from .targets import default_targets, deployable_key, plan_switch


def plan(
    res: Resource,
    observed: Observed,
    *,
    now: str,
    renderers: Renderers,
    targets: Callable[[ReDrafterDeploymentSpec, Mapping[str, Any]], ServingTargets | None] | None = None,
) -> Plan:
    """The whole desired state of one resource."""
    old_status = dict(res.status)
    errors = spec_errors(dict(res.spec))
    if errors:
        return invalid_plan(res, errors, now)
    try:
        owner = Owner(
            res.name, res.namespace, res.uid, ReDrafterDeploymentSpec.model_validate(dict(res.spec)), res.generation
        )
    except ValidationError as exc:  # pragma: no cover - spec_errors and model_validate agree
        return invalid_plan(res, [str(exc)], now)
    spec = owner.spec
    result = Plan(status={})
    engines = {v: plan_engine(res, owner, v, observed, result) for v in VARIANTS}

    # The gate sees this plan's engines: a pair built just now is gated at once, not one reconcile later
    # (targets set before the evaluators saw it, e.g. the policy's, are gated here too; gating is idempotent).
    current = {**old_status, "engines": engines}
    tgt = gate_from_status(
        (targets(spec, old_status) if targets else None) or default_targets(spec, current), spec, current
    )
    deploy = {v: deployable_key(v, engines[v], observed) for v in VARIANTS}
    gate, stable = promotion_state(spec, old_status, engines)
    if stable:  # the promoted ReDrafter engine keeps the primary Deployment until the new one passes
        deploy["redrafter"] = stable
    # A variant whose Deployment runs an old key keeps it only while its new engine is not built.
    routed = routing.enabled(spec) and renderers.inference_pool is not None
    step = plan_switch(
        tgt, {v: deploy[v] is not None for v in VARIANTS}, observed, spec.serving.rollout.strategy, routed=routed
    )
    for v in VARIANTS:
        key = deploy[v]
        if key is not None:
            result.apply += renderers.variant(owner, v, key, step.replicas.get(v, 0))
    if renderers.canary and deploy["redrafter"] and (tgt.canary > 0 or "canary" in observed.deployments):
        result.apply += renderers.canary(owner, deploy["redrafter"], max(0, tgt.canary))
    candidate = str(engines["redrafter"]["key"]) if stable and engines["redrafter"]["state"] in READY_STATES else None
    if renderers.candidate and candidate:
        result.apply += renderers.candidate(owner, candidate, 0 if gate and gate.state == "Failed" else 1)
    elif renderers.candidate and "candidate" in observed.deployments:  # promoted or superseded: scale it away
        result.apply += renderers.candidate(owner, observed.deployments["candidate"].key, 0)
    if step.pool is not None:
        result.apply += renderers.services(owner, step.pool)
        if routed and renderers.inference_pool:  # the same step as the Service: gateways follow it exactly
            result.apply += renderers.inference_pool(owner, step.pool)
    if not routing.enabled(spec) and observed.routing_pool is not None:
        result.delete.append(routing.stale_pool(res.name, res.namespace))

    result.status = resource_status(
        res,
        spec,
        observed,
        engines=engines,
        targets=tgt,
        step=step,
        deploy=deploy,
        gate=gate,
        stable=stable,
        candidate=candidate,
        now=now,
        applied={m["metadata"]["name"]: manifest_hash(m) for m in result.apply if m.get("kind") == "Deployment"},
    )
    if renderers.inference_pool:
        result.status = routing.with_condition(
            result.status, routing.condition(spec, res.name, observed, step.pool), generation=res.generation, now=now
        )
    status_events(old_status, result.status, result)
    return result
