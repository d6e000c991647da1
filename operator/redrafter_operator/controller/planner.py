"""The reconciler's brain (pure): (resource, observed facts) -> desired status, children, Events.

No I/O here. The kopf layer feeds it facts from its indexes and applies the result; running it twice
on the same inputs gives the same plan, and applying an already-applied plan writes nothing.

One plan step, each part in its own module: the engines and their builds (:mod:`.engines`), the
validation gate (:mod:`.gate`), the serving targets and the blue/green step toward them
(:mod:`.targets`), the children rendered for that step, and the status that explains it (:mod:`.status`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

from engine_jobs.contract import VARIANTS

from ..api.engine_key import engine_keys as engine_keys_of
from ..api.spec import ReDrafterDeploymentSpec, parse_spec
from ..render.common import Owner, in_engine_concurrency
from . import routing
from .collection import collection_children
from .conditions import merge_conditions
from .drafter import plan_drafter, waiting_engine
from .engines import engine_stage, plan_engine
from .facts import Observed
from .fingerprints import manifest_hash
from .plan_types import READY_STATES, Plan, Renderers, Resource, ServingTargets
from .reports import RetentionReport, SpeculationReport, TrainingReport
from .status import invalid_plan, resource_status, schedulable, status_events, unplaced_message
from .targets import default_targets, deployable_key, plan_switch
from .validation import gate_from_status, operator_image, plan_validation, promotion_state


@dataclass(frozen=True)
class Inputs:
    """What the monitors handed over for one resource since it was last planned (in memory, newest only)."""

    speculation: SpeculationReport | None = None
    retention: RetentionReport | None = None
    targets: ServingTargets | None = None  # set by hand (tests, a manual override); else the policy's
    training: TrainingReport | None = None


def plan(
    res: Resource,
    observed: Observed,
    *,
    now: str,
    renderers: Renderers,
    spec: ReDrafterDeploymentSpec | None = None,
    errors: list[str] | None = None,
    inputs: Inputs = Inputs(),
    image: str | None = None,
    engine_keys: Mapping[str, str] | None = None,
) -> Plan:
    """The whole desired state of one resource: children, one status, Events.

    ``spec`` is the resource's parsed spec (the reconciler parses it once per change); None with ``errors``
    for an invalid one. Parsed here when neither is given (unit use). ``image``: what validation Jobs run in;
    ``engine_keys``: each variant's key when the caller computed them already.
    """
    if spec is None and not errors:
        spec, errors = parse_spec(dict(res.spec))
    if errors or spec is None:
        return invalid_plan(res, errors or ["spec is invalid"], now)
    owner = Owner(res.name, res.namespace, res.uid, spec, res.generation)
    old_status = dict(res.status)
    result = Plan(status={})
    keys = dict(engine_keys) if engine_keys else engine_keys_of(spec)
    drafter = (
        plan_drafter(res, owner, observed, result, keys["drafter"], inputs.training) if "drafter" in keys else None
    )
    engines: dict[str, dict[str, Any]] = {}
    for v in VARIANTS:
        if v == "redrafter" and drafter is not None and drafter["state"] not in READY_STATES:
            stage = engine_stage(res, owner, v, keys[v])
            engines[v] = waiting_engine({"key": stage.key, "path": stage.path}, drafter)
        else:
            engines[v] = plan_engine(res, owner, v, observed, result, keys[v])

    # Validation sees this plan's engines: a pair built just now is validated (and gated) at once, not one
    # reconcile later.
    current = {**old_status, "engines": engines, **({"drafter": drafter} if drafter is not None else {})}
    validation = plan_validation(owner, current, observed, res.annotations, image=image or operator_image(), now=now)
    current.update(validation.status)
    owner = replace(owner, in_engine_concurrency=in_engine_concurrency(current))
    if validation.job is not None:
        result.create.append(validation.job)
    wanted = inputs.targets or (inputs.speculation.targets if inputs.speculation else None)
    tgt = gate_from_status(wanted or default_targets(spec, current), spec, current)
    deploy: dict[str, str | None] = {v: deployable_key(v, engines[v], observed) for v in VARIANTS}
    gate, stable = promotion_state(spec, current, engines)
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

    if inputs.retention is not None and inputs.retention.claim is not None:
        apply, delete = collection_children(inputs.retention.claim)
        result.apply += apply
        result.delete += delete
    status_res = Resource(res.name, res.namespace, res.uid, res.generation, res.spec, res.annotations, current)
    result.status = resource_status(
        status_res,
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
        unplaced=unplaced_message(result),
    )
    placement, placement_event = schedulable(old_status, result, observed)
    if placement is not None:
        result.status["conditions"] = merge_conditions(
            result.status["conditions"], [placement], generation=res.generation, now=now
        )
    if placement_event is not None:
        result.events.append(placement_event)
    if drafter is not None:
        result.status["drafter"] = drafter
    if renderers.inference_pool:
        result.status = routing.with_condition(
            result.status, routing.condition(spec, res.name, observed, step.pool), generation=res.generation, now=now
        )
    if inputs.speculation is not None and inputs.speculation.uid in (res.uid, ""):
        report = inputs.speculation
        result.status.update(report.fields)
        if report.condition is not None:
            result.status["conditions"] = merge_conditions(
                result.status["conditions"], [report.condition], generation=res.generation, now=now
            )
        result.events += report.events
    measured = current.get("validation") or {}
    if measured.get("state") == "Passed" and measured.get("crossoverConcurrency") is not None:
        # the crossover the validation Job measured beats the cost model's
        result.status["speculation"] = {
            **(result.status.get("speculation") or {}),
            "crossoverConcurrency": measured["crossoverConcurrency"],
        }
    result.events += validation.events
    status_events(old_status, result.status, result)
    return result
