"""The status the planner writes (pure): conditions, phase and serving summary, and the Events its changes mean.

Conditions follow metav1.Condition (see :mod:`.conditions` for the bookkeeping); the phase is a summary
of them for ``kubectl get``. An invalid spec gets its own status (:func:`invalid_plan`) that leaves the
running children alone.
"""

from __future__ import annotations

from typing import Any, Mapping

from engine_jobs.contract import VARIANTS

from ..api.spec import ReDrafterDeploymentSpec
from ..render import names
from .conditions import Cond, find, merge_conditions
from .facts import DeploymentFact, Observed
from .gitops import gitops_conditions
from .plan_types import EventSpec, Plan, Resource, ServingTargets
from .serving_health import ServingFailure, serving_failure
from .targets import ServingPlan
from .validation import ANNOTATION_RETRY_VALIDATION, Gate

NO_MATCHING_GPU_NODES = "NoMatchingGPUNodes"


def resource_status(
    res: Resource,
    spec: ReDrafterDeploymentSpec,
    observed: Observed,
    *,
    engines: Mapping[str, Mapping[str, Any]],
    targets: ServingTargets,
    step: ServingPlan,
    deploy: Mapping[str, str | None],
    gate: Gate | None,
    stable: str | None,
    candidate: str | None,
    now: str,
    applied: Mapping[str, str] | None = None,
    unplaced: str | None = None,
) -> dict[str, Any]:
    """The whole status after one plan step: what serves, how ready, and why (conditions and phase).

    ``applied`` maps each Deployment this step applies to its manifest hash: a Deployment not known to
    carry it (``observed.applied``) has not seen this step's spec yet, so its rollout is not complete
    however Ready it is. ``unplaced``: why GPU Jobs this step needs were not created (no node could run
    them), as the Schedulable condition says it.
    """
    old_status = dict(res.status)
    old_conditions = list(old_status.get("conditions") or [])
    active = step.pool
    active_dep: DeploymentFact | None = observed.deployments.get(active) if active else None
    want_active = step.replicas.get(active, 0) if active else targets.replicas.get(targets.active, 0)
    ready = active_dep.ready_replicas if active_dep and observed.service_pool == active else 0
    target_engine = engines[targets.active]
    current_key = bool(active_dep and active_dep.key == engines[active]["key"]) if active else False
    current_spec = bool(
        active_dep
        and (
            not applied
            or active_dep.name not in applied
            or active_dep.name not in observed.applied
            or observed.applied[active_dep.name] == applied[active_dep.name]
        )
    )
    rolled = bool(active_dep and active_dep.rolled_out and active_dep.replicas == want_active and current_spec)
    settled = bool(
        active
        and active == targets.active
        and not step.switching
        and current_key
        and rolled
        and observed.service_pool == active
    )
    # after the switch completes, the scale-down of the old pool must also be observed
    if settled:
        for v in VARIANTS:
            dep = observed.deployments.get(v)
            if v != active and dep and deploy[v] is not None and dep.replicas != step.replicas.get(v, 0):
                settled = False
    failed = [v for v in VARIANTS if engines[v]["state"] == "Failed"]
    building = [v for v in VARIANTS if engines[v]["state"] == "Building"]
    pending = [v for v in VARIANTS if engines[v]["state"] == "Pending"]
    available = ready >= 1
    running = [v for v in VARIANTS if step.replicas.get(v, 0) > 0 and deploy[v] is not None]
    failure = None if settled else serving_failure(observed, running)

    conds = [Cond("SpecValid", "True", "Valid", "spec is valid")]
    if failed:
        conds.append(
            Cond(
                "EnginesReady",
                "False",
                "BuildFailed",
                "; ".join(f"{v}: {engines[v].get('message', '')}" for v in failed),
            )
        )
    elif building:
        retrying = [v for v in building if engines[v].get("message", "").startswith("Job ")]
        conds.append(
            Cond(
                "EnginesReady",
                "False",
                "BuildRetrying" if retrying else "Building",
                "; ".join(
                    f"{v}: Job {engines[v].get('job')}"
                    + (f" (previous: {engines[v]['message']})" if v in retrying else "")
                    for v in building
                ),
            )
        )
    elif pending:
        conds.append(
            Cond(
                "EnginesReady",
                "False",
                NO_MATCHING_GPU_NODES if unplaced else "Pending",
                "; ".join(f"{v}: {engines[v].get('message', 'pending')}" for v in pending),
            )
        )
    else:
        conds.append(
            Cond("EnginesReady", "True", "EnginesBuilt", ", ".join(f"{v} {engines[v]['key']}" for v in VARIANTS))
        )
    if available:
        conds.append(
            Cond(
                "Available",
                "True",
                "MinimumReplicasAvailable",
                f"{ready}/{want_active} {active} replicas Ready behind Service {names.service_name(res.name)}",
            )
        )
    elif want_active == 0 and active and prewarm(spec):
        conds.append(
            Cond(
                "Available",
                "False",
                "Prewarmed",
                "engines built and validated, not serving: "
                "serving.replicas is 0 with autoscaling Disabled; scale up to serve at once",
            )
        )
    elif want_active == 0 and active:
        conds.append(Cond("Available", "False", "ScaledToZero", "serving.replicas is 0"))
    elif active is None:
        reason = "EngineFailed" if target_engine["state"] == "Failed" else "EngineNotReady"
        conds.append(Cond("Available", "False", reason, f"the {targets.active} engine is {target_engine['state']}"))
    elif failure:
        conds.append(
            Cond("Available", "False", failure.reason, f"0/{want_active} {active} replicas Ready; {failure.summary}")
        )
    else:
        conds.append(Cond("Available", "False", "NoReadyReplicas", f"0/{want_active} {active} replicas Ready"))
    invalid = _validation_failure(gate, stable, old_status, engines)
    if targets.active in failed and not available:
        conds.append(Cond("Progressing", "False", "BuildFailed", f"the {targets.active} engine could not be built"))
    elif failure:  # the kubelet retries, so it is still progressing, until the Deployment's deadline says not
        conds.append(
            Cond("Progressing", "False" if failure.deadline_exceeded else "True", failure.reason, failure.summary)
        )
    elif invalid and not step.switching:
        conds.append(Cond("Progressing", "False", "ValidationFailed", invalid))
    elif gate and gate.state in ("Pending", "Running") and not step.switching:  # not promoted yet: not complete
        where = f" on Deployment {names.candidate_name(res.name)}" if candidate else ""
        serving = (
            f"the promoted ReDrafter engine {stable} keeps serving"
            if stable
            else f"the {active or targets.active} engine serves meanwhile"
        )
        conds.append(
            Cond(
                "Progressing",
                "True",
                "Validating",
                f"validating the ReDrafter engine {engines['redrafter']['key']}{where} against base "
                f"{engines['base']['key']}; {serving}",
            )
        )
    elif settled and not building:
        conds.append(
            Cond("Progressing", "False", "Complete", f"serving the {active} engine {engines[str(active)]['key']}")
        )
    elif step.switching:
        conds.append(Cond("Progressing", "True", "Switching", step.message))
    elif building:
        conds.append(Cond("Progressing", "True", "Building", f"building the {' and '.join(building)} engine(s)"))
    elif unplaced and active is None:  # nothing serves yet and nothing can be built: waiting for a node
        conds.append(Cond("Progressing", "True", NO_MATCHING_GPU_NODES, unplaced))
    else:
        conds.append(
            Cond("Progressing", "True", "RollingOut", f"waiting for {active or targets.active} replicas to be Ready")
        )
    by_type = {c.type: c for c in conds}
    stall = (
        ("BuildFailed", by_type["EnginesReady"].message)
        if failed
        else (failure.reason, failure.summary)
        if failure
        else ("ValidationFailed", invalid)
        if invalid
        else None
    )
    conds += gitops_conditions(by_type["Progressing"], by_type["Available"], stall)
    if spec.speculation.mode == "Never":
        conds.append(
            Cond(
                "SpeculationHealthy",
                "False",
                "SpeculationDisabled",
                "speculation.mode is Never: serving the base engine",
            )
        )
    elif (find(old_conditions, "SpeculationHealthy") or {"reason": "SpeculationDisabled"}).get(
        "reason"
    ) == "SpeculationDisabled":
        conds.append(Cond("SpeculationHealthy", "Unknown", "NotMeasured", "no acceptance measurement yet"))

    if (available or want_active == 0) and settled:  # scaled to zero on purpose is a settled state too
        phase = "Degraded" if failed else ("Prewarmed" if want_active == 0 and prewarm(spec) else "Serving")
    elif available:
        phase = "Degraded" if failed else ("Serving" if ready >= want_active else "Deploying")
    elif targets.active in failed or (active and engines[active]["state"] == "Failed"):
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
            "selector": names.selector_string(names.traffic_selector(res.name, active or targets.active)),
            "service": names.service_name(res.name),
            **({"failure": failure.as_status()} if failure else {}),
        },
    )
    if active:
        status["activeEngine"] = active
    return status


def _grouped(found: list[tuple[str, str]]) -> str:
    """``redrafter engine, base engine: no node offers ...``: the Jobs that share a placement message, once."""
    by_message: dict[str, list[str]] = {}
    for what, message in found:
        whats = by_message.setdefault(message, [])
        if what not in whats:
            whats.append(what)
    return "; ".join(f"{', '.join(whats)}: {message}" for message, whats in by_message.items())


def unplaced_message(p: Plan) -> str | None:
    """Why this step's GPU Jobs were not created, or None when every one could be placed."""
    return _grouped(p.unplaced) if p.unplaced else None


def schedulable(old_status: Mapping[str, Any], p: Plan, observed: Observed) -> tuple[Cond | None, EventSpec | None]:
    """The Schedulable condition (and the Event of its change) from this step's GPU Jobs' placement.

    False with NoMatchingGPUNodes when a Job this step needs fits no node; True once one does, or once
    no Job waits any more. Not set while nodes are not watched (the check is off), and left as it was
    when this step created no GPU Job.
    """
    if observed.nodes is None:
        return None, None
    old = find(old_status.get("conditions") or [], "Schedulable")
    if p.unplaced:
        message = _grouped(p.unplaced)
        cond = Cond("Schedulable", "False", NO_MATCHING_GPU_NODES, message)
        fresh = not old or old.get("status") != "False"
        return cond, EventSpec("Warning", NO_MATCHING_GPU_NODES, message) if fresh else None
    if p.placed:
        cond = Cond("Schedulable", "True", "MatchingGPUNodes", _grouped(p.placed))
    elif old and old.get("status") == "False":
        cond = Cond("Schedulable", "True", "NoJobWaiting", "no GPU Job waits for a node")
    else:
        return None, None
    if old and old.get("status") == "False":
        return cond, EventSpec("Normal", "GPUNodesFound", f"GPU Jobs can be placed now: {cond.message}")
    return cond, None


def prewarm(spec: ReDrafterDeploymentSpec) -> bool:
    """Build (and validate) ahead of a launch: zero replicas that no autoscaler will raise."""
    return spec.serving.replicas == 0 and spec.autoscaling.mode == "Disabled"


def _validation_failure(
    gate: Gate | None, stable: str | None, status: Mapping[str, Any], engines: Mapping[str, Mapping[str, Any]]
) -> str | None:
    """Why the current engine pair is not promoted, when its validation Failed (:mod:`.validation`)."""
    if gate is None or gate.state != "Failed":
        return None
    v = status.get("validation") or {}
    serving = f"the promoted ReDrafter engine {stable} keeps serving" if stable else "serving base"
    return (
        f"the ReDrafter engine {engines['redrafter']['key']} failed validation against base "
        f"{engines['base']['key']} ({v.get('reason')}: {v.get('message')}); {serving} until a retry passes "
        f"(annotation {ANNOTATION_RETRY_VALIDATION})"
    )


def invalid_plan(res: Resource, errors: list[str], now: str) -> Plan:
    """Invalid spec: say exactly which fields are wrong; leave running children alone."""
    old = dict(res.status)
    message = "; ".join(errors)
    conds = [
        Cond("SpecValid", "False", "InvalidSpec", message),
        Cond("Progressing", "False", "InvalidSpec", "fix the spec; nothing is changed until it is valid"),
    ]
    conds += gitops_conditions(conds[1], None, ("InvalidSpec", message))
    phase = old.get("phase") if old.get("phase") in ("Serving", "Prewarmed", "Degraded") else "Failed"
    status = {
        **{k: v for k, v in old.items() if k != "kopf"},
        "phase": phase,
        "observedGeneration": res.generation,
        "conditions": merge_conditions(old.get("conditions") or [], conds, generation=res.generation, now=now),
    }
    p = Plan(status=status)
    prev = find(old.get("conditions") or [], "SpecValid")
    if not prev or prev.get("status") != "False" or prev.get("message") != message:
        p.events.append(EventSpec("Warning", "InvalidSpec", message))
    status_events(old, status, p, skip_spec=True)
    return p


def status_events(old: Mapping[str, Any], new: Mapping[str, Any], p: Plan, skip_spec: bool = False) -> None:
    if not skip_spec:
        prev = find(old.get("conditions") or [], "SpecValid")
        if prev and prev.get("status") == "False":
            p.events.append(EventSpec("Normal", "SpecValid", "spec is valid again"))
    if old.get("activeEngine") and new.get("activeEngine") and old["activeEngine"] != new["activeEngine"]:
        p.events.append(
            EventSpec(
                "Normal",
                "Switched",
                f"Service now selects the {new['activeEngine']} engine (was {old['activeEngine']})",
            )
        )
    failure = ServingFailure.from_status(new.get("serving"))
    before = ServingFailure.from_status(old.get("serving"))
    if failure and (
        before is None
        or (before.reason, before.pod, before.deployment) != (failure.reason, failure.pod, failure.deployment)
    ):
        p.events.append(EventSpec("Warning", failure.reason, failure.summary))  # once per cause, not per reconcile
    if old.get("phase") != new.get("phase"):
        serving = new.get("serving") or {}
        typ = "Warning" if new.get("phase") in ("Failed", "Degraded") else "Normal"
        detail = {
            "Serving": f"{serving.get('readyReplicas')}/{serving.get('replicas')} {new.get('activeEngine')} replicas Ready",
            "Failed": next(
                (
                    c.get("message", "")
                    for c in new.get("conditions", [])
                    if c.get("type") in ("EnginesReady", "SpecValid") and c.get("status") == "False"
                ),
                "",
            ),
        }.get(str(new.get("phase")), "")
        p.events.append(
            EventSpec(
                typ,
                f"Phase{new.get('phase')}",
                f"phase {old.get('phase') or 'None'} -> {new.get('phase')}" + (f": {detail}" if detail else ""),
            )
        )
