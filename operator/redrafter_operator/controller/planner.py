"""The reconciler's brain (pure): (resource, observed facts) -> desired status, children, Events.

No I/O here. The kopf layer feeds it facts from its indexes and applies the result; running it twice
on the same inputs gives the same plan, and applying an already-applied plan writes nothing.

How the operator knows an engine artifact is complete (documented choice):
  1. a *succeeded* build Job labelled with the engine key whose artifact (cache claim + path) matches —
     from this resource or any other in the namespace (Jobs are kept a day after they finish);
  2. else any ReDrafterDeployment in the namespace whose status shows that key Ready/Cached with the
     same claim + path (status outlives the Jobs), including this resource's own previous status.
  The build Job itself publishes atomically (manifest written last), so "Job succeeded" implies
  "artifact complete". A Job running for the same artifact anywhere in the namespace is waited on,
  never duplicated: two resources sharing a cache with identical build inputs produce one build.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol

from engine_jobs.contract import VARIANTS, Variant
from pydantic import ValidationError

from ..api.engine_key import engine_key
from ..api.spec import ReDrafterDeploymentSpec, spec_errors
from ..policy.loop import canary_from_status
from ..render import names
from ..render.build import artifact_path, build_configmap, build_job
from ..render.common import Owner
from .conditions import Cond, find, merge_conditions
from .facts import (
    ANNOTATION_CACHE_CLAIM,
    ANNOTATION_RETRY_TOKEN,
    DeploymentFact,
    JobFact,
    Observed,
)

if TYPE_CHECKING:
    from .validation import Gate

READY_STATES = ("Ready", "Cached")
MESSAGE_LIMIT = 1024  # engine failure messages in status (the full stderr tail stays in the Pod)


# ---- inputs ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Resource:
    """The ReDrafterDeployment as last observed: identity, raw spec, annotations and status."""

    name: str
    namespace: str
    uid: str
    generation: int
    spec: Mapping[str, Any]
    annotations: Mapping[str, str]
    status: Mapping[str, Any]

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> "Resource":
        meta = body.get("metadata") or {}
        return cls(
            name=meta.get("name", ""),
            namespace=meta.get("namespace") or "default",
            uid=meta.get("uid") or "",
            generation=int(meta.get("generation") or 1),
            spec=body.get("spec") or {},
            annotations=dict(meta.get("annotations") or {}),
            status=body.get("status") or {},
        )

    @property
    def retry_token(self) -> str:
        return self.annotations.get(names.ANNOTATION_RETRY_BUILD, "")


@dataclass(frozen=True)
class ServingTargets:
    """The seam for the speculation policy and autoscaler (issue 6): what serving should converge to.

    ``active`` is the engine the stable Service should end up selecting; ``replicas`` the replicas
    per variant once any switch is complete. The planner applies it blue/green (or Recreate):
    the target comes up and Ready before the Service moves, the other variant scales down after.
    """

    active: Variant
    replicas: Mapping[str, int]
    canary: int = 0  # ReDrafter canary replicas in the base pool (rendered only if the renderer supports it)


class ServingRenderer(Protocol):
    """Renders the serving children of one variant serving engine ``key`` (render/serving.py)."""

    def __call__(self, owner: Owner, variant: Variant, key: str, replicas: int) -> list[dict[str, Any]]: ...


class ServiceRenderer(Protocol):
    def __call__(self, owner: Owner, pool: Variant) -> list[dict[str, Any]]: ...


class CanaryRenderer(Protocol):
    def __call__(self, owner: Owner, key: str, replicas: int) -> list[dict[str, Any]]: ...


@dataclass(frozen=True)
class Renderers:
    variant: ServingRenderer
    services: ServiceRenderer
    canary: CanaryRenderer | None = None  # ReDrafter pods in the base pool (policy-driven; none without it)
    candidate: CanaryRenderer | None = None  # a new ReDrafter engine under validation, in no pool


# ---- outputs -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class EventSpec:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass
class Plan:
    status: dict[str, Any]
    create: list[dict[str, Any]] = field(default_factory=list)  # create-only, in order (build ConfigMap, Job)
    apply: list[dict[str, Any]] = field(default_factory=list)  # create-or-patch, in order
    events: list[EventSpec] = field(default_factory=list)
    claims: list[tuple[str, str, str]] = field(default_factory=list)  # (claim, artifact path, job) builds started


def default_targets(spec: ReDrafterDeploymentSpec, status: Mapping[str, Any]) -> ServingTargets:
    """Without a policy decision: pinned modes pick their engine, Auto keeps the current one (ReDrafter first)."""
    mode = spec.speculation.mode
    if mode == "Never":
        active: Variant = "base"
    elif mode == "Always":
        active = "redrafter"
    else:
        active = "base" if status.get("activeEngine") == "base" else "redrafter"
    replicas = spec.serving.replicas
    if spec.autoscaling.mode == "Operator":  # until the autoscaler decides, spec within [min, max]
        replicas = max(spec.autoscaling.min_replicas, min(spec.autoscaling.max_replicas, replicas))
    other: Variant = "base" if active == "redrafter" else "redrafter"
    # What the policy and the validation gate would keep, read from status, so that a restarted operator's
    # first reconciles (before the evaluators run) neither drop the canary nor a pod under validation.
    canary = canary_from_status(spec, status) if active == "base" else 0
    from .validation import gate_from_status  # controller/validation.py imports this module

    return gate_from_status(ServingTargets(active=active, replicas={active: replicas, other: 1 if spec.serving.rollout.keep_standby else 0},
                                           canary=canary), spec, status)


# ---- engines -----------------------------------------------------------------------------------
def _failure_text(job: JobFact, observed: Observed) -> str:
    pod = observed.pods.get(job.name)
    detail = (pod.message if pod and pod.message else job.message).strip()
    text = f"Job {job.name} failed ({job.reason or 'Failed'})" + (f": {detail}" if detail else "")
    return text if len(text) <= MESSAGE_LIMIT else text[: MESSAGE_LIMIT - 3] + "..."


def plan_engine(
    res: Resource, owner: Owner, variant: Variant, observed: Observed, plan: Plan
) -> dict[str, Any]:
    """One variant's engine status; appends the build ConfigMap + Job to ``plan.create`` when needed."""
    spec = owner.spec
    key = engine_key(spec, variant)
    path = artifact_path(spec, key)
    claim = spec.engine.cache.claim_name
    retries = spec.engine.build.retries
    token = res.retry_token
    old = (res.status.get("engines") or {}).get(variant) or {}
    old = old if old.get("key") == key and old.get("path") == path else {}
    jobs = sorted((j for j in observed.jobs
                   if j.variant == variant and j.key == key and j.claim == claim and j.artifact in ("", path)),
                  key=lambda j: j.attempt)
    epoch = [j for j in jobs if j.retry_token == token]
    failed = [j for j in epoch if j.state == "Failed"]
    running = [j for j in jobs if j.state == "Running"]
    succeeded = [j for j in jobs if j.state == "Succeeded"]
    shared = observed.shared.get(variant)
    out: dict[str, Any] = {"key": key, "path": path, "attempts": len(epoch), "retryToken": token}
    if succeeded:
        out.update(state="Ready", job=succeeded[-1].name)
    elif old.get("state") in READY_STATES:
        out.update(state=old["state"], job=old.get("job"), attempts=old.get("attempts", 0))
    elif shared and shared.ready_by:
        out.update(state="Cached", message=f"engine already in the cache (built for {shared.ready_by})")
    elif running:
        out.update(state="Building", job=running[-1].name)
        if failed:
            out["message"] = _failure_text(failed[-1], observed)
    elif shared and shared.building_job:
        out.update(state="Building", job=shared.building_job,
                   message=f"waiting for Job {shared.building_job}, which builds the same engine into the shared cache")
    else:
        n_failed = len(failed)
        if not jobs and old.get("state") == "Failed" and old.get("retryToken", "") == token:
            n_failed = int(old.get("attempts") or 0)  # the failed Jobs expired; status remembers
        if n_failed > retries:
            msg = _failure_text(failed[-1], observed) if failed else old.get("message") or "build failed"
            out.update(state="Failed", job=failed[-1].name if failed else old.get("job"), message=msg,
                       attempts=n_failed)
        else:
            attempt = max((j.attempt for j in jobs), default=-1) + 1
            job = build_job(owner, variant, attempt)
            ann = job["metadata"].setdefault("annotations", {})
            ann[ANNOTATION_RETRY_TOKEN] = token
            ann[ANNOTATION_CACHE_CLAIM] = claim
            plan.create += [build_configmap(owner, variant), job]
            plan.claims.append((claim, path, job["metadata"]["name"]))
            out.update(state="Building", job=job["metadata"]["name"], attempts=n_failed + 1)
            if failed:
                out["message"] = _failure_text(failed[-1], observed)
    _engine_events(variant, old, out, observed, retries, plan)
    return {k: v for k, v in out.items() if v is not None}


def _engine_events(variant: str, old: Mapping[str, Any], new: Mapping[str, Any], observed: Observed,
                   retries: int, plan: Plan) -> None:
    state, job = new["state"], new.get("job")
    if old.get("state") == state and old.get("job") == job:
        return
    prev_job = next((j for j in observed.jobs if j.name == old.get("job")), None)
    if prev_job and prev_job.state == "Failed" and (state == "Failed" or job != prev_job.name):
        plan.events.append(EventSpec("Warning", "BuildFailed", f"{variant} engine: {_failure_text(prev_job, observed)}"))
    if state == "Building" and job != old.get("job"):
        if job and any(c[2] == job for c in plan.claims):
            plan.events.append(EventSpec("Normal", "BuildStarted",
                                         f"Job {job} builds the {variant} engine {new['key']} "
                                         f"(attempt {new['attempts']} of {retries + 1})"))
        else:
            plan.events.append(EventSpec("Normal", "BuildWaiting", f"{variant} engine {new['key']}: {new.get('message') or f'Job {job} is building it'}"))
    elif state == "Ready":
        plan.events.append(EventSpec("Normal", "EngineReady", f"{variant} engine {new['key']} is built ({new['path']})"))
    elif state == "Cached":
        plan.events.append(EventSpec("Normal", "EngineCached", f"{variant} engine {new['key']} found in the cache ({new['path']}); no build"))
    elif state == "Failed":
        if not prev_job or prev_job.state != "Failed":
            plan.events.append(EventSpec("Warning", "BuildFailed", f"{variant} engine: {new.get('message', '')}"))
        plan.events.append(EventSpec("Warning", "RetriesExhausted",
                                     f"{variant} engine {new['key']}: {new['attempts']} build Jobs failed; "
                                     f"change the spec or set annotation {names.ANNOTATION_RETRY_BUILD} to retry"))


# ---- serving -----------------------------------------------------------------------------------
def _deployable_key(variant: Variant, engine: Mapping[str, Any], observed: Observed) -> str | None:
    """The engine key to serve for a variant: the current engine if built, else what is deployed now."""
    if engine.get("state") in READY_STATES:
        return str(engine["key"])
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


def plan_switch(targets: ServingTargets, deployable: Mapping[str, bool], observed: Observed,
                strategy: str) -> ServingPlan:
    """Blue/green (or Recreate) step toward ``targets`` from what is observed (pure, one step per call).

    BlueGreen: the target variant is scaled up first; the Service moves only once that Deployment's
    rollout is complete and Ready; the previous variant is scaled down only once the Service is
    observed selecting the target — so the Service never selects a pool without Ready pods.
    Recreate: the previous variant goes to zero first (no spare GPUs), then the target comes up.
    """
    target = targets.active
    want = {v: int(targets.replicas.get(v, 0)) for v in VARIANTS if deployable.get(v)}
    current = observed.service_pool if observed.service_pool in VARIANTS else None
    if not deployable.get(target):
        if current and deployable.get(current):
            # Target engine not built yet: keep serving what is selected now, at the target's size.
            keep = {**want, current: max(want.get(current, 0), int(targets.replicas.get(target, 0)))}
            return ServingPlan(current, keep, True, f"waiting for the {target} engine before switching")
        return ServingPlan(current, want, False, f"waiting for the {target} engine")
    if current is None or current == target:
        return ServingPlan(target, want, False, "")
    old_dep = observed.deployments.get(current)
    new_dep = observed.deployments.get(target)
    if strategy == "Recreate":
        if old_dep and old_dep.total_replicas > 0 and old_dep.replicas > 0:
            return ServingPlan(current, {**want, current: 0, target: 0}, True, f"scaling {current} down before {target} comes up")
        return ServingPlan(target, want, True, f"switched to {target} (Recreate)")
    target_ready = bool(new_dep and new_dep.replicas == want.get(target) and new_dep.rolled_out
                        and new_dep.ready_replicas >= max(1, want.get(target, 0)))
    keep_old = max(want.get(current, 0), old_dep.replicas if old_dep else 0)
    if not target_ready:
        return ServingPlan(current, {**want, current: keep_old}, True, f"bringing {target} up before moving the Service")
    # Target Ready: move the Service now; scale the old pool down on a later step, once the Service
    # is observed on the target (this step keeps it up).
    return ServingPlan(target, {**want, current: keep_old}, True, f"moving the Service to {target}")


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
    old_conditions = list(old_status.get("conditions") or [])
    errors = spec_errors(dict(res.spec))
    if errors:
        return _invalid(res, errors, now)
    try:
        owner = Owner(res.name, res.namespace, res.uid, ReDrafterDeploymentSpec.model_validate(dict(res.spec)), res.generation)
    except ValidationError as exc:  # pragma: no cover - spec_errors and model_validate agree
        return _invalid(res, [str(exc)], now)
    spec = owner.spec
    result = Plan(status={})
    engines = {v: plan_engine(res, owner, v, observed, result) for v in VARIANTS}

    # The gate sees this plan's engines: a pair built just now is gated at once, not one reconcile later
    # (targets set before the evaluators saw it, e.g. the policy's, are gated here too; gating is idempotent).
    from .validation import gate_from_status

    current = {**old_status, "engines": engines}
    tgt = gate_from_status((targets(spec, old_status) if targets else None) or default_targets(spec, current), spec, current)
    deploy = {v: _deployable_key(v, engines[v], observed) for v in VARIANTS}
    gate, stable = _promotion(spec, old_status, engines)
    if stable:  # the promoted ReDrafter engine keeps the primary Deployment until the new one passes
        deploy["redrafter"] = stable
    # A variant whose Deployment runs an old key keeps it only while its new engine is not built.
    step = plan_switch(tgt, {v: deploy[v] is not None for v in VARIANTS}, observed, spec.serving.rollout.strategy)
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

    # ---- status ----
    active = step.pool
    active_dep: DeploymentFact | None = observed.deployments.get(active) if active else None
    want_active = step.replicas.get(active, 0) if active else tgt.replicas.get(tgt.active, 0)
    ready = active_dep.ready_replicas if active_dep and observed.service_pool == active else 0
    target_engine = engines[tgt.active]
    current_key = bool(active_dep and active_dep.key == engines[active]["key"]) if active else False
    rolled = bool(active_dep and active_dep.rolled_out and active_dep.replicas == want_active)
    settled = bool(active and active == tgt.active and not step.switching and current_key and rolled
                   and observed.service_pool == active)
    # after the switch completes, the scale-down of the old pool must also be observed
    if settled:
        for v in VARIANTS:
            dep = observed.deployments.get(v)
            if v != active and dep and deploy[v] is not None and dep.replicas != step.replicas.get(v, 0):
                settled = False
    failed = [v for v in VARIANTS if engines[v]["state"] == "Failed"]
    building = [v for v in VARIANTS if engines[v]["state"] == "Building"]
    available = ready >= 1

    conds = [Cond("SpecValid", "True", "Valid", "spec is valid")]
    if failed:
        conds.append(Cond("EnginesReady", "False", "BuildFailed",
                          "; ".join(f"{v}: {engines[v].get('message', '')}" for v in failed)))
    elif building:
        retrying = [v for v in building if engines[v].get("message", "").startswith("Job ")]
        conds.append(Cond("EnginesReady", "False", "BuildRetrying" if retrying else "Building",
                          "; ".join(f"{v}: Job {engines[v].get('job')}" + (f" (previous: {engines[v]['message']})" if v in retrying else "")
                                    for v in building)))
    else:
        conds.append(Cond("EnginesReady", "True", "EnginesBuilt",
                          ", ".join(f"{v} {engines[v]['key']}" for v in VARIANTS)))
    if available:
        conds.append(Cond("Available", "True", "MinimumReplicasAvailable",
                          f"{ready}/{want_active} {active} replicas Ready behind Service {names.service_name(res.name)}"))
    elif want_active == 0 and active:
        conds.append(Cond("Available", "False", "ScaledToZero", "serving.replicas is 0"))
    elif active is None:
        reason = "EngineFailed" if target_engine["state"] == "Failed" else "EngineNotReady"
        conds.append(Cond("Available", "False", reason, f"the {tgt.active} engine is {target_engine['state']}"))
    else:
        conds.append(Cond("Available", "False", "NoReadyReplicas", f"0/{want_active} {active} replicas Ready"))
    invalid = _validation_failure(gate, stable, old_status, engines)
    if tgt.active in failed and not available:
        conds.append(Cond("Progressing", "False", "BuildFailed", f"the {tgt.active} engine could not be built"))
    elif invalid and not step.switching:
        conds.append(Cond("Progressing", "False", "ValidationFailed", invalid))
    elif gate and gate.state in ("Pending", "Running") and not step.switching:  # not promoted yet: not complete
        where = f" on Deployment {names.candidate_name(res.name)}" if candidate else ""
        serving = (f"the promoted ReDrafter engine {stable} keeps serving" if stable
                   else f"the {active or tgt.active} engine serves meanwhile")
        conds.append(Cond("Progressing", "True", "Validating",
                          f"validating the ReDrafter engine {engines['redrafter']['key']}{where} against base "
                          f"{engines['base']['key']}; {serving}"))
    elif settled and not building:
        conds.append(Cond("Progressing", "False", "Complete", f"serving the {active} engine {engines[active]['key']}"))
    elif step.switching:
        conds.append(Cond("Progressing", "True", "Switching", step.message))
    elif building:
        conds.append(Cond("Progressing", "True", "Building", f"building the {' and '.join(building)} engine(s)"))
    else:
        conds.append(Cond("Progressing", "True", "RollingOut", f"waiting for {active or tgt.active} replicas to be Ready"))
    if spec.speculation.mode == "Never":
        conds.append(Cond("SpeculationHealthy", "False", "SpeculationDisabled", "speculation.mode is Never: serving the base engine"))
    elif not find(old_conditions, "SpeculationHealthy") or find(old_conditions, "SpeculationHealthy").get("reason") == "SpeculationDisabled":
        conds.append(Cond("SpeculationHealthy", "Unknown", "NotMeasured", "no acceptance measurement yet"))

    if (available or want_active == 0) and settled:  # scaled to zero on purpose is a settled state too
        phase = "Degraded" if failed else "Serving"
    elif available:
        phase = "Degraded" if failed else ("Serving" if ready >= want_active else "Deploying")
    elif tgt.active in failed or (active and engines[active]["state"] == "Failed"):
        phase = "Failed"
    elif active is not None:
        phase = "Deploying"
    elif target_engine["state"] == "Building":
        phase = "Building"
    else:
        phase = "Pending"
    if invalid and phase == "Serving":
        phase = "Degraded"  # serving base: the ReDrafter engine failed validation

    status: dict[str, Any] = {k: v for k, v in old_status.items() if k not in ("kopf",)}
    status.update(
        phase=phase,
        observedGeneration=res.generation,
        conditions=merge_conditions(old_conditions, conds, generation=res.generation, now=now),
        engines=engines,
        serving={
            "replicas": want_active,
            "readyReplicas": ready,
            "selector": names.selector_string(names.traffic_selector(res.name, active or tgt.active)),
            "service": names.service_name(res.name),
        },
    )
    if active:
        status["activeEngine"] = active
    result.status = status
    _status_events(old_status, status, result)
    return result


def _promotion(spec: ReDrafterDeploymentSpec, status: Mapping[str, Any],
               engines: Mapping[str, Mapping[str, Any]]) -> tuple["Gate | None", str | None]:
    """(the validation gate of the current engine pair or None, the stable ReDrafter key or None).

    Stable: the promoted ReDrafter engine (status.validation.promoted) while a different ReDrafter
    engine is built or validated: it keeps serving from the primary Deployment (controller/validation.py).
    """
    from .validation import engine_pair, gate_of

    if not spec.validation.enabled:
        return None, None
    pair = engine_pair({"engines": engines})
    if pair is not None:
        gate = gate_of(status, pair)
        return gate, gate.stable
    promoted = ((status.get("validation") or {}).get("promoted") or {}).get("redrafterKey")
    key = (engines.get("redrafter") or {}).get("key")
    return None, (str(promoted) if promoted and promoted != key else None)


def _validation_failure(gate: "Gate | None", stable: str | None, status: Mapping[str, Any],
                        engines: Mapping[str, Mapping[str, Any]]) -> str | None:
    """Why the current engine pair is not promoted, when its validation Failed (controller/validation.py)."""
    from .validation import ANNOTATION_RETRY_VALIDATION

    if gate is None or gate.state != "Failed":
        return None
    v = status.get("validation") or {}
    serving = f"the promoted ReDrafter engine {stable} keeps serving" if stable else "serving base"
    return (f"the ReDrafter engine {engines['redrafter']['key']} failed validation against base "
            f"{engines['base']['key']} ({v.get('reason')}: {v.get('message')}); {serving} until a retry passes "
            f"(annotation {ANNOTATION_RETRY_VALIDATION})")


def _invalid(res: Resource, errors: list[str], now: str) -> Plan:
    """Invalid spec: say exactly which fields are wrong; leave running children alone."""
    old = dict(res.status)
    message = "; ".join(errors)
    conds = [
        Cond("SpecValid", "False", "InvalidSpec", message),
        Cond("Progressing", "False", "InvalidSpec", "fix the spec; nothing is changed until it is valid"),
    ]
    phase = old.get("phase") if old.get("phase") in ("Serving", "Degraded") else "Failed"
    status = {**{k: v for k, v in old.items() if k != "kopf"}, "phase": phase, "observedGeneration": res.generation,
              "conditions": merge_conditions(old.get("conditions") or [], conds, generation=res.generation, now=now)}
    p = Plan(status=status)
    prev = find(old.get("conditions") or [], "SpecValid")
    if not prev or prev.get("status") != "False" or prev.get("message") != message:
        p.events.append(EventSpec("Warning", "InvalidSpec", message))
    _status_events(old, status, p, skip_spec=True)
    return p


def _status_events(old: Mapping[str, Any], new: Mapping[str, Any], p: Plan, skip_spec: bool = False) -> None:
    if not skip_spec:
        prev = find(old.get("conditions") or [], "SpecValid")
        if prev and prev.get("status") == "False":
            p.events.append(EventSpec("Normal", "SpecValid", "spec is valid again"))
    if old.get("activeEngine") and new.get("activeEngine") and old["activeEngine"] != new["activeEngine"]:
        p.events.append(EventSpec("Normal", "Switched", f"Service now selects the {new['activeEngine']} engine (was {old['activeEngine']})"))
    if old.get("phase") != new.get("phase"):
        serving = new.get("serving") or {}
        typ = "Warning" if new.get("phase") in ("Failed", "Degraded") else "Normal"
        detail = {
            "Serving": f"{serving.get('readyReplicas')}/{serving.get('replicas')} {new.get('activeEngine')} replicas Ready",
            "Failed": next((c.get("message", "") for c in new.get("conditions", []) if c.get("type") in ("EnginesReady", "SpecValid") and c.get("status") == "False"), ""),
        }.get(str(new.get("phase")), "")
        p.events.append(EventSpec(typ, f"Phase{new.get('phase')}", f"phase {old.get('phase') or 'None'} -> {new.get('phase')}" + (f": {detail}" if detail else "")))
