"""The reconciler's brain (pure): (resource, observed facts) -> desired status, children, Events.

No I/O here. The kopf layer feeds it facts from its indexes and applies the result; running it twice
on the same inputs gives the same plan, and applying an already-applied plan writes nothing.

One plan step, each part in its own module: the engines and their builds (:mod:`.engines`), the
validation gate (:mod:`.validation`), the serving targets and the blue/green step toward them
(:mod:`.targets`), the children rendered for that step, and the typed status that explains it, one concern
at a time (:mod:`.status`). The step is decided first (:func:`decide`: children, Jobs, Events); its status
follows once the reconciler's applies answered (:func:`explain`), so one reconcile plans once and writes
one status. :func:`plan` is both at once, for what applies nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping

from engine_jobs.contract import VARIANTS

from ..api.engine_key import engine_keys as engine_keys_of
from ..api.spec import ReDrafterDeploymentSpec, parse_spec
from ..api.status import (
    DrafterStatus,
    EnginesStatus,
    EngineStatus,
    ReDrafterDeploymentStatus,
    ValidationStatus,
)
from ..render.common import Owner, in_engine_concurrency
from . import routing
from .collection import collection_children
from .conditions import Cond
from .drafter import drafter_part, plan_drafter, waiting_engine
from .engines import engine_stage, plan_engine
from .facts import Observed
from .fingerprints import manifest_hash
from .plan_types import READY_STATES, EventSpec, Plan, Renderers, Resource, ServingTargets
from .reports import RetentionReport, SpeculationReport, TrainingReport
from .status import (
    Decided,
    Draft,
    engines_part,
    finish,
    invalid_plan,
    placement_part,
    progress_part,
    serving_part,
    speculation_part,
    status_events,
    unplaced_message,
    validation_part,
)
from .targets import default_targets, deployable_key, plan_switch
from .validation import gate_from_status, operator_image, plan_validation, promotion_state


@dataclass(frozen=True)
class Inputs:
    """What the monitors handed over for one resource since it was last planned (in memory, newest only)."""

    speculation: SpeculationReport | None = None
    retention: RetentionReport | None = None
    targets: ServingTargets | None = None  # set by hand (tests, a manual override); else the policy's
    training: TrainingReport | None = None


@dataclass
class Step:
    """One decided plan step: its children, and what its status will explain once the applies answered."""

    res: Resource
    plan: Plan
    inputs: Inputs = Inputs()
    decided: Decided | None = None  # None: an invalid spec, whose status is final already
    drafter: DrafterStatus | None = None
    validation: ValidationStatus | None = None  # status.validation as this step left it
    validation_events: list[EventSpec] = field(default_factory=list)
    validation_condition: Cond | None = None  # Validated, when this step changes it
    routed: bool = False  # the InferencePool is rendered (its condition is this step's)
    now: str = ""


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
    """The whole desired state of one resource: children, one status, Events (:func:`decide`, then :func:`explain`)."""
    step = decide(
        res,
        observed,
        now=now,
        renderers=renderers,
        spec=spec,
        errors=errors,
        inputs=inputs,
        image=image,
        engine_keys=engine_keys,
    )
    return explain(step, observed)


def decide(
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
) -> Step:
    """The children of one resource's plan step, and what its status needs.

    ``spec`` is the resource's parsed spec (the reconciler parses it once per change); None with ``errors``
    for an invalid one. Parsed here when neither is given (unit use). ``image``: what validation Jobs run in;
    ``engine_keys``: each variant's key when the caller computed them already.
    """
    if spec is None and not errors:
        spec, errors = parse_spec(dict(res.spec))
    if errors or spec is None:
        return Step(res, invalid_plan(res.status, res.generation, errors or ["spec is invalid"], now))
    owner = Owner(res.name, res.namespace, res.uid, spec, res.generation)
    result = Plan(status=ReDrafterDeploymentStatus())
    keys = dict(engine_keys) if engine_keys else engine_keys_of(spec)
    drafter = (
        plan_drafter(res, owner, observed, result, keys["drafter"], inputs.training) if "drafter" in keys else None
    )
    engines: dict[str, EngineStatus] = {}
    for v in VARIANTS:
        if v == "redrafter" and drafter is not None and drafter.state not in READY_STATES:
            stage = engine_stage(res, owner, v, keys[v])
            engines[v] = waiting_engine(EngineStatus(key=stage.key, path=stage.path), drafter)
        else:
            engines[v] = plan_engine(res, owner, v, observed, result, keys[v])

    # Validation sees this plan's engines: a pair built just now is validated (and gated) at once, not one
    # reconcile later.
    current = res.observed_status.model_copy()
    current.engines = EnginesStatus(redrafter=engines["redrafter"], base=engines["base"])
    if drafter is not None:
        current.drafter = drafter
    validation = plan_validation(owner, current, observed, res.annotations, image=image or operator_image(), now=now)
    if validation.status is not None:
        current.validation = validation.status
    promoted = current.validation.promoted if current.validation else None
    owner = replace(owner, in_engine_concurrency=in_engine_concurrency(promoted))
    if validation.job is not None:
        result.create.append(validation.job)
    wanted = inputs.targets or (inputs.speculation.targets if inputs.speculation else None)
    tgt = gate_from_status(wanted or default_targets(spec, current), spec, current)
    deploy: dict[str, str | None] = {v: deployable_key(v, engines[v], observed) for v in VARIANTS}
    gate, stable = promotion_state(spec, current)
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
    candidate = engines["redrafter"].key if stable and engines["redrafter"].state in READY_STATES else None
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
    decided = Decided(spec, engines, tgt, step, deploy, gate, stable, candidate, unplaced_message(result))
    return Step(
        res,
        result,
        inputs,
        decided,
        drafter,
        current.validation,
        validation.events,
        validation.condition,
        renderers.inference_pool is not None,
        now,
    )


def explain(s: Step, observed: Observed) -> Plan:
    """The step's status, one concern at a time, and the Events its changes mean (after the applies: the
    Deployments' carried manifests and a missing InferencePool API are facts by then)."""
    result, res, d = s.plan, s.res, s.decided
    if d is None:
        return result
    draft = Draft.of(res.status)
    draft.marks.mark("SpecValid", "True", "Valid", "spec is valid")
    engines_part(draft, d.engines, d.unplaced)
    applied = {m["metadata"]["name"]: manifest_hash(m) for m in result.apply if m.get("kind") == "Deployment"}
    rollout = serving_part(draft, res.name, observed, d, applied)
    invalid = validation_part(draft, s.validation, d)
    draft.marks.set(s.validation_condition)
    progress_part(draft, res.name, d, rollout, invalid, observed.refused)
    placed = placement_part(draft, result, observed)
    if placed is not None:
        result.events.append(placed)
    if s.drafter is not None:
        drafter_part(draft, s.drafter)
    pool_missing = None
    if s.routed:
        cond = routing.condition(d.spec, res.name, observed, d.step.pool)
        if cond is None:
            draft.marks.remove(routing.CONDITION)
        else:
            draft.marks.set(cond)
        pool_missing = routing.crd_missing_event(draft.old_condition(routing.CONDITION), cond)
    report = s.inputs.speculation
    mine = report if report is not None and report.uid in (res.uid, "") else None
    result.events += speculation_part(draft, d.spec, mine, s.validation)
    result.status = finish(draft, res.generation, s.now)
    result.events += s.validation_events
    status_events(draft.before, result.status, result)
    if pool_missing is not None:
        result.events.append(pool_missing)
    return result
