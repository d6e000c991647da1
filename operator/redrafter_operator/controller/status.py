"""The status one plan step writes (pure), one concern at a time, and the Events its changes mean.

A :class:`Draft` holds the typed status read from the cluster and the conditions the concerns mark. Each concern
fills its own part and marks its own condition: the engines (``engines``, EnginesReady), serving (``serving``,
``activeEngine``, Available), validation (``validation``, Validated), the rollout (Progressing), placement
(Schedulable), speculation (``speculation``, ``policy``, ``history``, SpeculationHealthy); the drafter
(:mod:`.drafter`) and routing (:mod:`.routing`) mark theirs through the same draft. :func:`finish` derives Ready,
Reconciling and Stalled (:mod:`.condition_set`), the phase, and returns the :class:`ReDrafterDeploymentStatus`.
An invalid spec gets its own status (:func:`invalid_plan`) that leaves the running children alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from engine_jobs.contract import VARIANTS

from ..api.spec import ReDrafterDeploymentSpec
from ..api.status import (
    Condition,
    EnginesStatus,
    EngineStatus,
    Phase,
    ReDrafterDeploymentStatus,
    ServingStatus,
    ValidationStatus,
)
from ..render import names
from .condition_set import CONDITIONS, Marks
from .facts import DeploymentFact, Observed
from .plan_types import EventSpec, Plan, ServingTargets
from .reports import SpeculationReport
from .serving_health import ServingFailure, serving_failure
from .targets import ServingPlan
from .validation import ANNOTATION_RETRY_VALIDATION, Gate

NO_MATCHING_GPU_NODES = "NoMatchingGPUNodes"
APPLY_REFUSED = "ApplyRefused"


@dataclass
class Draft:
    """The status a plan step builds: the observed status and what the concerns mark."""

    before: ReDrafterDeploymentStatus  # as observed, untouched
    status: ReDrafterDeploymentStatus  # what the concerns fill in
    marks: Marks = field(default_factory=Marks)
    phase: Phase | None = None

    @classmethod
    def of(cls, observed: Mapping[str, Any]) -> "Draft":
        before = ReDrafterDeploymentStatus.observed(observed)
        return cls(before, before.model_copy(deep=True))

    def old_condition(self, type_: str) -> Condition | None:
        """The observed condition of ``type_``."""
        return next((c for c in self.before.conditions if c.type == type_), None)


@dataclass(frozen=True)
class Decided:
    """What one plan step decided, that its status explains: engines, the serving step, the gate."""

    spec: ReDrafterDeploymentSpec
    engines: Mapping[str, EngineStatus]
    targets: ServingTargets
    step: ServingPlan
    deploy: Mapping[str, str | None]
    gate: Gate | None
    stable: str | None
    candidate: str | None
    unplaced: str | None = None  # why GPU Jobs this step needs were not created (no node could run them)


@dataclass(frozen=True)
class Rollout:
    """What the serving concern found, that the rollout's progress and the phase read."""

    active: str | None
    want: int
    ready: int
    settled: bool
    failure: ServingFailure | None

    @property
    def available(self) -> bool:
        return self.ready >= 1


# ---- engines ---------------------------------------------------------------------------------------------
def engines_part(draft: Draft, engines: Mapping[str, EngineStatus], unplaced: str | None) -> None:
    """``status.engines`` and EnginesReady: failed, building, pending (and why), or built; a failed build stalls."""
    draft.status.engines = EnginesStatus(redrafter=engines["redrafter"], base=engines["base"])
    failed, building, pending = (_in_state(engines, s) for s in ("Failed", "Building", "Pending"))
    marks = draft.marks
    if failed:
        message = "; ".join(f"{v}: {engines[v].message or ''}" for v in failed)
        marks.mark("EnginesReady", "False", "BuildFailed", message)
        marks.stall("EnginesReady", "BuildFailed", message)
    elif building:
        retrying = [v for v in building if (engines[v].message or "").startswith("Job ")]
        marks.mark(
            "EnginesReady",
            "False",
            "BuildRetrying" if retrying else "Building",
            "; ".join(
                f"{v}: Job {engines[v].job}" + (f" (previous: {engines[v].message})" if v in retrying else "")
                for v in building
            ),
        )
    elif pending:
        marks.mark(
            "EnginesReady",
            "False",
            NO_MATCHING_GPU_NODES if unplaced else "Pending",
            "; ".join(f"{v}: {'pending' if engines[v].message is None else engines[v].message}" for v in pending),
        )
    else:
        marks.mark("EnginesReady", "True", "EnginesBuilt", ", ".join(f"{v} {engines[v].key}" for v in VARIANTS))


def _in_state(engines: Mapping[str, EngineStatus], state: str) -> list[str]:
    return [v for v in VARIANTS if engines[v].state == state]


# ---- serving ---------------------------------------------------------------------------------------------
def serving_part(draft: Draft, name: str, observed: Observed, d: Decided, applied: Mapping[str, str]) -> Rollout:
    """``serving``, ``activeEngine`` and Available: what the Service reaches, and why not; a failure stalls.

    ``applied`` maps each Deployment this step applies to its manifest hash: a Deployment not known to carry it
    (``observed.applied``) has not seen this step's spec yet, so its rollout is not complete however Ready it is.
    """
    step, targets, engines = d.step, d.targets, d.engines
    active = step.pool
    active_dep: DeploymentFact | None = observed.deployments.get(active) if active else None
    want = step.replicas.get(active, 0) if active else targets.replicas.get(targets.active, 0)
    ready = active_dep.ready_replicas if active_dep and observed.service_pool == active else 0
    current_key = bool(active_dep and active_dep.key == engines[active].key) if active else False
    current_spec = bool(
        active_dep
        and (
            active_dep.name not in applied
            or active_dep.name not in observed.applied
            or observed.applied[active_dep.name] == applied[active_dep.name]
        )
    )
    rolled = bool(active_dep and active_dep.rolled_out and active_dep.replicas == want and current_spec)
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
            if v != active and dep and d.deploy[v] is not None and dep.replicas != step.replicas.get(v, 0):
                settled = False
    running = [v for v in VARIANTS if step.replicas.get(v, 0) > 0 and d.deploy[v] is not None]
    failure = None if settled else serving_failure(observed, running)
    out = Rollout(active, want, ready, settled, failure)

    marks = draft.marks
    target_state = engines[targets.active].state
    if out.available:
        marks.mark(
            "Available",
            "True",
            "MinimumReplicasAvailable",
            f"{ready}/{want} {active} replicas Ready behind Service {names.service_name(name)}",
        )
    elif want == 0 and active and prewarm(d.spec):
        marks.mark(
            "Available",
            "False",
            "Prewarmed",
            "engines built and validated, not serving: "
            "serving.replicas is 0 with autoscaling Disabled; scale up to serve at once",
        )
    elif want == 0 and active:
        marks.mark("Available", "False", "ScaledToZero", "serving.replicas is 0")
    elif active is None:
        reason = "EngineFailed" if target_state == "Failed" else "EngineNotReady"
        marks.mark("Available", "False", reason, f"the {targets.active} engine is {target_state}")
    elif failure:
        marks.mark("Available", "False", failure.reason, f"0/{want} {active} replicas Ready; {failure.summary}")
    else:
        marks.mark("Available", "False", "NoReadyReplicas", f"0/{want} {active} replicas Ready")
    if failure:
        marks.stall("Available", failure.reason, failure.summary)

    draft.status.serving = ServingStatus(
        replicas=want,
        ready_replicas=ready,
        selector=names.selector_string(names.traffic_selector(name, active or targets.active)),
        service=names.service_name(name),
        failure=failure.as_status() if failure else None,
    )
    if active:
        draft.status.active_engine = "redrafter" if active == "redrafter" else "base"
    return out


# ---- validation ------------------------------------------------------------------------------------------
def validation_part(draft: Draft, validation: ValidationStatus | None, d: Decided) -> str | None:
    """``validation`` as this step left it (:mod:`.validation` marks Validated); a failed validation stalls.

    Returns why the current pair is not promoted when its validation Failed, for the rollout's progress."""
    if validation is not None:
        draft.status.validation = validation
    if d.gate is None or d.gate.state != "Failed":
        return None
    reason, message = (validation.reason, validation.message) if validation else (None, None)
    serving = f"the promoted ReDrafter engine {d.stable} keeps serving" if d.stable else "serving base"
    invalid = (
        f"the ReDrafter engine {d.engines['redrafter'].key} failed validation against base "
        f"{d.engines['base'].key} ({reason}: {message}); {serving} until a retry passes "
        f"(annotation {ANNOTATION_RETRY_VALIDATION})"
    )
    draft.marks.stall("Validated", "ValidationFailed", invalid)
    return invalid


# ---- the rollout's progress ------------------------------------------------------------------------------
def progress_part(
    draft: Draft, name: str, d: Decided, r: Rollout, invalid: str | None, refused: Sequence[str] = ()
) -> None:
    """Progressing: building, validating, switching, rolling out, or Complete (or why it stopped: children the
    API server refused to apply stall it)."""
    marks, engines, step, targets = draft.marks, d.engines, d.step, d.targets
    building = _in_state(engines, "Building")
    if refused:
        message = "the API server refused to apply " + "; ".join(refused)
        marks.mark("Progressing", "False", APPLY_REFUSED, message)
        marks.stall("Progressing", APPLY_REFUSED, message)
    elif targets.active in _in_state(engines, "Failed") and not r.available:
        marks.mark("Progressing", "False", "BuildFailed", f"the {targets.active} engine could not be built")
    elif r.failure:  # the kubelet retries, so it is still progressing, until the Deployment's deadline says not
        marks.mark(
            "Progressing", "False" if r.failure.deadline_exceeded else "True", r.failure.reason, r.failure.summary
        )
    elif invalid and not step.switching:
        marks.mark("Progressing", "False", "ValidationFailed", invalid)
    elif d.gate and d.gate.state in ("Pending", "Running") and not step.switching:  # not promoted yet
        where = f" on Deployment {names.candidate_name(name)}" if d.candidate else ""
        serving = (
            f"the promoted ReDrafter engine {d.stable} keeps serving"
            if d.stable
            else f"the {r.active or targets.active} engine serves meanwhile"
        )
        marks.mark(
            "Progressing",
            "True",
            "Validating",
            f"validating the ReDrafter engine {engines['redrafter'].key}{where} against base "
            f"{engines['base'].key}; {serving}",
        )
    elif r.settled and not building:
        marks.mark("Progressing", "False", "Complete", f"serving the {r.active} engine {engines[str(r.active)].key}")
    elif step.switching:
        marks.mark("Progressing", "True", "Switching", step.message)
    elif building:
        marks.mark("Progressing", "True", "Building", f"building the {' and '.join(building)} engine(s)")
    elif d.unplaced and r.active is None:  # nothing serves yet and nothing can be built: waiting for a node
        marks.mark("Progressing", "True", NO_MATCHING_GPU_NODES, d.unplaced)
    else:
        marks.mark(
            "Progressing", "True", "RollingOut", f"waiting for {r.active or targets.active} replicas to be Ready"
        )
    draft.phase = _phase(d, r, invalid)


def _phase(d: Decided, r: Rollout, invalid: str | None) -> Phase:
    """The summary ``kubectl get`` prints, from the engines and the rollout."""
    engines, failed = d.engines, _in_state(d.engines, "Failed")
    phase: Phase
    if (r.available or r.want == 0) and r.settled:  # scaled to zero on purpose is a settled state too
        phase = "Degraded" if failed else ("Prewarmed" if r.want == 0 and prewarm(d.spec) else "Serving")
    elif r.available:
        phase = "Degraded" if failed else ("Serving" if r.ready >= r.want else "Deploying")
    elif d.targets.active in failed or (r.active and engines[r.active].state == "Failed"):
        phase = "Failed"
    elif r.active is not None:
        phase = "Deploying"
    elif engines[d.targets.active].state == "Building":
        phase = "Building"
    else:
        phase = "Pending"
    return "Degraded" if invalid and phase == "Serving" else phase  # serving base: ReDrafter failed validation


# ---- speculation -----------------------------------------------------------------------------------------
def speculation_part(
    draft: Draft, spec: ReDrafterDeploymentSpec, report: SpeculationReport | None, measured: ValidationStatus | None
) -> list[EventSpec]:
    """``speculation``, ``policy``, ``history`` and SpeculationHealthy: the monitor's report, folded in.

    Before the first measurement SpeculationHealthy is NotMeasured (SpeculationDisabled with mode Never); the
    crossover a passed validation measured beats the cost model's. Returns the report's Events."""
    if spec.speculation.mode == "Never":
        draft.marks.mark(
            "SpeculationHealthy", "False", "SpeculationDisabled", "speculation.mode is Never: serving the base engine"
        )
    elif (prev := draft.old_condition("SpeculationHealthy")) is None or prev.reason == "SpeculationDisabled":
        draft.marks.mark("SpeculationHealthy", "Unknown", "NotMeasured", "no acceptance measurement yet")
    events: list[EventSpec] = []
    if report is not None:
        draft.status = draft.status.overlay(report.status)
        draft.marks.set(report.condition)
        events += report.events
    if measured is not None and measured.state == "Passed" and measured.crossover_concurrency is not None:
        draft.status.speculation = draft.status.speculation.model_copy(
            update={"crossover_concurrency": measured.crossover_concurrency}
        )
    return events


# ---- placement -------------------------------------------------------------------------------------------
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


def placement_part(draft: Draft, p: Plan, observed: Observed) -> EventSpec | None:
    """Schedulable (and the Event of its change) from this step's GPU Jobs' placement.

    False with NoMatchingGPUNodes when a Job this step needs fits no node; True once one does, or once no Job
    waits any more. Not set while nodes are not watched (the check is off), and left as it was when this step
    created no GPU Job.
    """
    if observed.nodes is None:
        return None
    old = draft.old_condition("Schedulable")
    was_false = bool(old and old.status == "False")
    if p.unplaced:
        message = _grouped(p.unplaced)
        draft.marks.mark("Schedulable", "False", NO_MATCHING_GPU_NODES, message)
        return None if was_false else EventSpec("Warning", NO_MATCHING_GPU_NODES, message)
    if p.placed:
        cond = draft.marks.mark("Schedulable", "True", "MatchingGPUNodes", _grouped(p.placed))
    elif was_false:
        cond = draft.marks.mark("Schedulable", "True", "NoJobWaiting", "no GPU Job waits for a node")
    else:
        return None
    return EventSpec("Normal", "GPUNodesFound", f"GPU Jobs can be placed now: {cond.message}") if was_false else None


def prewarm(spec: ReDrafterDeploymentSpec) -> bool:
    """Build (and validate) ahead of a launch: zero replicas that no autoscaler will raise."""
    return spec.serving.replicas == 0 and spec.autoscaling.mode == "Disabled"


# ---- the whole status ------------------------------------------------------------------------------------
def finish(draft: Draft, generation: int, now: str) -> ReDrafterDeploymentStatus:
    """The status the concerns filled: their conditions and the derived Ready/Reconciling/Stalled merged over the
    observed ones (a transition time moves only when a status flips), the phase, the generation acted on."""
    status = draft.status
    status.conditions = CONDITIONS.conditions(status.conditions, draft.marks, generation=generation, now=now)
    status.observed_generation = generation
    if draft.phase is not None:
        status.phase = draft.phase
    return status


def invalid_plan(observed: Mapping[str, Any], generation: int, errors: list[str], now: str) -> Plan:
    """Invalid spec: say exactly which fields are wrong; leave running children alone."""
    draft = Draft.of(observed)
    message = "; ".join(errors)
    draft.marks.mark("SpecValid", "False", "InvalidSpec", message)
    draft.marks.mark("Progressing", "False", "InvalidSpec", "fix the spec; nothing is changed until it is valid")
    draft.marks.stall("SpecValid", "InvalidSpec", message)
    kept = draft.before.phase if "phase" in draft.before.model_fields_set else None
    draft.phase = kept if kept in ("Serving", "Prewarmed", "Degraded") else "Failed"
    p = Plan(status=finish(draft, generation, now))
    prev = draft.old_condition("SpecValid")
    if not prev or prev.status != "False" or prev.message != message:
        p.events.append(EventSpec("Warning", "InvalidSpec", message))
    status_events(draft.before, p.status, p, skip_spec=True)
    return p


def status_events(
    old: ReDrafterDeploymentStatus, new: ReDrafterDeploymentStatus, p: Plan, skip_spec: bool = False
) -> None:
    """The Events the change from ``old`` to ``new`` means: spec valid again, a switch, a serving failure (once
    per cause), a phase change."""
    if not skip_spec:
        prev = next((c for c in old.conditions if c.type == "SpecValid"), None)
        if prev and prev.status == "False":
            p.events.append(EventSpec("Normal", "SpecValid", "spec is valid again"))
    if old.active_engine and new.active_engine and old.active_engine != new.active_engine:
        p.events.append(
            EventSpec(
                "Normal",
                "Switched",
                f"Service now selects the {new.active_engine} engine (was {old.active_engine})",
            )
        )
    failure = ServingFailure.from_status(new.serving)
    before = ServingFailure.from_status(old.serving)
    if failure and (
        before is None
        or (before.reason, before.pod, before.deployment) != (failure.reason, failure.pod, failure.deployment)
    ):
        p.events.append(EventSpec("Warning", failure.reason, failure.summary))  # once per cause, not per reconcile
    old_phase, new_phase = (s.phase if "phase" in s.model_fields_set else None for s in (old, new))
    if old_phase != new_phase:
        detail = _phase_detail(new)
        p.events.append(
            EventSpec(
                "Warning" if new.phase in ("Failed", "Degraded") else "Normal",
                f"Phase{new.phase}",
                f"phase {old_phase or 'None'} -> {new_phase}" + (f": {detail}" if detail else ""),
            )
        )


def _phase_detail(new: ReDrafterDeploymentStatus) -> str:
    """What a phase Event adds: the Ready replicas when Serving, the cause when Failed."""
    if new.phase == "Serving":
        serving = new.serving
        return f"{serving.ready_replicas}/{serving.replicas} {new.active_engine} replicas Ready"
    if new.phase == "Failed":
        causes = (c for c in new.conditions if c.type in ("EnginesReady", "SpecValid") and c.status == "False")
        return next((c.message for c in causes), "")
    return ""
