"""What the planner creates for a resource, for review (``redrafter-operator render``): the same :func:`plan`,
fed facts that stand for each stage of the lifecycle instead of what the watch shows.

The operator creates a resource's children step by step; a reviewer wants the whole picture. The stages:

1. nothing built: the build ConfigMaps and Jobs;
2. both engines built, validation under way (``spec.validation.enabled``): the validation Job, and with
   ``promoted_key`` (the ReDrafter engine that passed before and still serves) the candidate Deployment,
   its ConfigMap and Service;
3. serving ``active`` (validated, rolled out), with the ReDrafter canary in the base pool when ``canary``; the
   engine cache's references ConfigMap and collection CronJob when the spec enables a retention.

Each child appears once, as the last stage plans it (so Deployments show the replicas they converge to).
Nothing is rendered by a second code path: a test keeps this equal to what the running operator applies.
"""

from __future__ import annotations

from typing import Any, Mapping

from engine_jobs.contract import Variant

from ..api.engine_key import engine_keys
from ..api.spec import ReDrafterDeploymentSpec, parse_spec
from ..api.status import (
    DrafterStatus,
    EnginesStatus,
    EngineStatus,
    PromotedEngines,
    ReDrafterDeploymentStatus,
    ValidationStatus,
)
from ..render import names
from ..render.build import artifact_path, drafter_path
from ..render.cache_refs import references_document
from ..render.validation import DEFAULT_OPERATOR_IMAGE
from .facts import DeploymentFact, Observed
from .plan_types import Plan, Resource, ServingTargets
from .planner import Inputs, plan
from .renderers import default_renderers
from .reports import ClaimFacts, ClaimUser, RetentionReport

NOW = "1970-01-01T00:00:00Z"  # status timestamps are not rendered


class PreviewError(ValueError):
    """The resource cannot be planned (an invalid spec); the message names each field."""


def _rolled_out(name: str, variant: str, key: str, replicas: int = 1) -> DeploymentFact:
    return DeploymentFact(
        name=name,
        variant=variant,
        key=key,
        replicas=replicas,
        ready_replicas=replicas,
        updated_replicas=replicas,
        total_replicas=replicas,
        generation=1,
        observed_generation=1,
    )


def _ready_engine(spec: ReDrafterDeploymentSpec, key: str, retry_token: str) -> EngineStatus:
    """An engine as a finished build leaves it in status."""
    return EngineStatus(key=key, path=artifact_path(spec, key), state="Ready", attempts=1, retry_token=retry_token)


def _built(trained: ReDrafterDeploymentStatus, engines: EnginesStatus, active: Variant) -> ReDrafterDeploymentStatus:
    """The status once both engines are built and ``active`` serves."""
    status = trained.model_copy()
    status.engines, status.active_engine = engines, active
    return status


def planned_children(
    body: Mapping[str, Any],
    *,
    active: Variant = "redrafter",
    canary: bool = False,
    promoted_key: str | None = None,
    operator_namespace: str | None = None,
    image: str = DEFAULT_OPERATOR_IMAGE,
) -> list[dict[str, Any]]:
    """Every child the planner creates or applies for ``body`` over its lifecycle (see the module docs)."""
    res = Resource.from_body(body)
    spec, errors = parse_spec(dict(res.spec))
    if spec is None:
        raise PreviewError("; ".join(errors))
    renderers = default_renderers(operator_namespace)
    keys = engine_keys(spec)
    other: Variant = "base" if active == "redrafter" else "redrafter"
    built = EnginesStatus(
        redrafter=_ready_engine(spec, keys["redrafter"], res.retry_token),
        base=_ready_engine(spec, keys["base"], res.retry_token),
    )
    pair = PromotedEngines(redrafter_key=keys["redrafter"], base_key=keys["base"])

    def stage(status: ReDrafterDeploymentStatus, observed: Observed, inputs: Inputs = Inputs()) -> Plan:
        staged = Resource(res.name, res.namespace, res.uid, res.generation, res.spec, res.annotations, status.wire())
        return plan(
            staged,
            observed,
            now=NOW,
            renderers=renderers,
            spec=spec,
            errors=[],
            inputs=inputs,
            image=image,
            engine_keys=keys,
        )

    stages = [stage(ReDrafterDeploymentStatus(), Observed())]
    # a drafter the operator trains: once trained, the ReDrafter engine's build Job
    trained = ReDrafterDeploymentStatus()
    if "drafter" in keys:
        trained.drafter = DrafterStatus(key=keys["drafter"], path=drafter_path(spec, keys["drafter"]), state="Ready")
        stages.append(stage(trained, Observed()))
    serving_key = promoted_key or keys["redrafter"]
    up = {
        "redrafter": _rolled_out(names.serving_deployment_name(res.name, "redrafter"), "redrafter", serving_key),
        "base": _rolled_out(names.serving_deployment_name(res.name, "base"), "base", keys["base"]),
    }
    if spec.validation.enabled:
        validating = _built(trained, built, active)
        deployments = dict(up)
        if promoted_key and promoted_key != keys["redrafter"]:
            validating.validation = ValidationStatus(
                redrafter_key=promoted_key,
                base_key=keys["base"],
                state="Passed",
                promoted=PromotedEngines(redrafter_key=promoted_key, base_key=keys["base"]),
            )
            deployments["candidate"] = _rolled_out(names.candidate_name(res.name), "redrafter", keys["redrafter"])
        stages.append(stage(validating, Observed(deployments=deployments, service_pool=active, routing_pool=active)))

    serving = _built(trained, built, active)
    if spec.validation.enabled:
        serving.validation = ValidationStatus(
            redrafter_key=pair.redrafter_key, base_key=pair.base_key, state="Passed", promoted=pair
        )
    standby = 1 if spec.serving.rollout.keep_standby else 0
    targets = ServingTargets(
        active=active,
        replicas={active: spec.serving.replicas, other: standby},
        canary=1 if canary and active == "base" else 0,
    )
    replicas: dict[str, int] = {active: spec.serving.replicas, other: standby}
    up = {v: _rolled_out(d.name, v, keys[v], replicas[v]) for v, d in up.items()}
    retention = RetentionReport(
        ClaimFacts(
            res.namespace,
            spec.engine.cache.claim_name,
            (ClaimUser(res.name, res.uid, spec),),
            references_document([{**body, "status": serving.wire()}], []),
            image,
        )
    )
    stages.append(
        stage(
            serving,
            Observed(deployments=up, service_pool=active, routing_pool=active),
            Inputs(targets=targets, retention=retention),
        )
    )

    out: dict[tuple[str, str, str], dict[str, Any]] = {}
    for p in stages:
        for manifest in [*p.create, *p.apply]:
            ref = (manifest["apiVersion"], manifest["kind"], manifest["metadata"]["name"])
            out[ref] = manifest  # first place, last stage's version
    return list(out.values())


__all__ = ["PreviewError", "planned_children"]
