"""The speculation policy in the controller: a monitor around :func:`redrafter_operator.policy.step`.

Every ``spec.speculation.interval``, per ReDrafterDeployment (a :class:`~.resource_io.Monitor` slot):

1. the serving pods from the watch-fed pod index (no API request) -> Ready scrape targets, and every
   pod's readiness for the autoscaler (pods still starting count as the HPA counts them);
2. read them (pod scrape, or Prometheus per ``spec.metrics``); a source that fails as a whole is the
   policy's ``error`` input (an *Error* measurement: inconclusive, never a switch), never a crash;
3. ``policy.step`` with the state persisted in ``status.policy`` (or this monitor's newer copy), the
   spec replicas of the active Deployment and the engines that can serve (ReDrafter only once validated);
4. hand the reconciler a :class:`SpeculationReport`: ``status.speculation`` (measured values, decision,
   reason), ``status.policy`` (everything the policy needs to resume after an operator restart), the
   ``SpeculationHealthy`` condition, on a switch a bounded ``status.history`` entry, the serving targets
   and the Events (SwitchToBase / SwitchToRedrafter, Scaling). A report that differs from the last one only
   in timestamps is not handed over: ``lastEvaluated`` is the evaluation that last changed status, and a
   resource at rest costs no writes (``redrafter_operator_speculation_evaluations_total`` counts every
   evaluation).

The monitor writes nothing: the reconciler folds the report into its one status patch and applies the
targets blue/green. Nothing is evaluated before something serves (``status.activeEngine``), for an invalid
spec, or for a resource being deleted. With ``mode: Never`` the planner owns the SpeculationHealthy condition.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Mapping

from pydantic import ValidationError

from engine_jobs.contract import METRICS_PORT, VARIANTS

from ..api.spec import ReDrafterDeploymentSpec
from ..api.status import HISTORY_LIMIT, EnginesStatus, HistoryEntry, ReDrafterDeploymentStatus
from ..metrics import PrometheusError, Reading, source_for, statuses_from_pods, targets_from_pods
from ..policy import Evaluation, PolicyState, due, pinned_engine, step
from ..render import names
from .apply import merge_patch
from .clock import rfc3339
from .conditions import Cond
from .plan_types import READY_STATES, EventSpec, ServingTargets
from .reports import SpeculationReport
from .resource_io import Host, current_status, index_entries, interval_of, variant_deployments
from .validation import validated_engines
from .workqueue import ResourceKey

log = logging.getLogger("redrafter_operator.controller.speculation")

HISTORY_REASON_LIMIT = 512
CONDITION = "SpeculationHealthy"


# ---- pure parts ----------------------------------------------------------------------------------
def stored_state(status: ReDrafterDeploymentStatus) -> PolicyState | None:
    """The policy state persisted in status.policy (None when absent or unreadable: start afresh)."""
    if not status.policy:
        return None
    try:
        return PolicyState.model_validate(status.policy)
    except ValidationError as exc:
        log.warning("status.policy is unreadable (%s); the policy starts afresh", exc)
        return None


def _without(mapping: Mapping[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in mapping.items() if k not in keys}


def _policy_at_rest(policy: Mapping[str, Any], now: float) -> dict[str, Any]:
    """The persisted policy state without what changes by itself: the evaluation's and the counter marks'
    times, and an autoscaler settle window that has expired (the autoscaler treats it as none)."""
    rest = dict(policy)
    if isinstance(rest.get("speculation"), dict):
        rest["speculation"] = _without(rest["speculation"], "last_evaluated")
    autoscaler = rest.get("autoscaler")
    if isinstance(autoscaler, dict):
        settle = autoscaler.get("settle")
        if isinstance(settle, list) and settle and isinstance(settle[0], (int, float)) and now >= settle[0]:
            rest["autoscaler"] = _without(autoscaler, "settle")
    window = rest.get("window")
    if isinstance(window, dict):
        rest["window"] = {p: _without(m or {}, "t") for p, m in (window.get("pods") or {}).items()}
    return rest


def _at_rest(status: ReDrafterDeploymentStatus, now: float) -> dict[str, Any]:
    """``status`` in wire form without the fields that change on every evaluation by themselves."""
    rest = status.model_copy()
    if "speculation" in status.model_fields_set:
        rest.speculation = status.speculation.model_copy(update={"last_evaluated": None})
    if status.policy is not None:
        rest.policy = _policy_at_rest(status.policy, now)
    return rest.wire()


def measured_crossover(status: ReDrafterDeploymentStatus) -> float | None:
    """The validation Job's measured crossover, once the current pair passed (else the cost model's own)."""
    validation = status.validation
    if validation is None or validation.state != "Passed":
        return None
    if validation.crossover_concurrency is not None:
        return validation.crossover_concurrency
    return status.speculation.crossover_concurrency


def report_fields(
    spec: ReDrafterDeploymentSpec,
    old: ReDrafterDeploymentStatus,
    ev: Evaluation,
    state: PolicyState,
    *,
    previous_engine: str,
    now: str,
) -> tuple[ReDrafterDeploymentStatus, Cond | None]:
    """status.speculation / policy (/ history on a switch), and the SpeculationHealthy condition (pure)."""
    d = ev.speculation
    speculation = old.speculation.overlay(d.status(now))
    measured = measured_crossover(old)
    if measured is not None:
        speculation.crossover_concurrency = measured  # measured by the validation Job beats the cost model
    # exclude_none: a merge patch deletes null fields, so stored state never has them (else it always differs)
    out = ReDrafterDeploymentStatus(speculation=speculation, policy=state.model_dump(mode="json", exclude_none=True))
    cond = Cond(CONDITION, d.healthy, d.reason, d.message) if spec.speculation.mode != "Never" else None
    if d.switched:
        entry = HistoryEntry(
            time=now, from_=previous_engine, to=d.engine, reason=f"{d.reason}: {d.message}"[:HISTORY_REASON_LIMIT]
        )
        out.history = [*old.history, entry][-HISTORY_LIMIT:]
    return out, cond


def changed(old: ReDrafterDeploymentStatus, new: ReDrafterDeploymentStatus, *, now: float) -> bool:
    """Whether the parts ``new`` sets change ``old`` in more than timestamps (what is worth a status write)."""
    after = _at_rest(new, now)
    before = _at_rest(old, now)
    return merge_patch({k: before.get(k) for k in after}, after) is not None


def _built(engines: EnginesStatus, variant: str) -> bool:
    engine = engines.redrafter if variant == "redrafter" else engines.base
    return engine is not None and engine.state in READY_STATES


# ---- the monitor ---------------------------------------------------------------------------------
class SpeculationMonitor:
    """Evaluates the speculation policy and autoscaler of each resource (see the module docs)."""

    per_resource = True

    def __init__(self, *, metrics_port: int = METRICS_PORT, metrics: Any = None) -> None:
        self.metrics_port = metrics_port
        self.metrics = metrics
        #: called with ((namespace, name), evaluation) after every evaluation (tests, the demo's timeline)
        self.observers: list[Callable[[ResourceKey, Evaluation], None]] = []
        self._states: dict[ResourceKey, tuple[str, PolicyState]] = {}  # newest state per resource (uid, state)
        self._reports: dict[ResourceKey, SpeculationReport] = {}  # last report handed over
        self._scaled: dict[ResourceKey, tuple[str, int]] = {}  # last (engine, replicas) the autoscaler decided

    def interval(self, host: Host, key: ResourceKey | None) -> float:
        return interval_of(host.spec_of(key) if key is not None else None)

    def forget(self, key: ResourceKey) -> None:
        for memory in (self._states, self._reports, self._scaled):
            memory.pop(key, None)

    async def run(self, host: Host, key: ResourceKey | None) -> None:
        if key is None:
            return
        body = host.bodies.get(key)
        spec = host.spec_of(key)
        if body is None or spec is None or (body.get("metadata") or {}).get("deletionTimestamp"):
            return
        meta = body.get("metadata") or {}
        ns, name = key
        uid = meta.get("uid") or ""
        status = ReDrafterDeploymentStatus.observed(current_status(host, key))
        last = self._reports.get(key)
        if last is not None and last.uid == uid:  # newer than status until the reconciler wrote it
            status = status.overlay(last.status)
        serving = status.active_engine  # the pool taking the traffic (the gate may hold it on base)
        if serving is None:
            return  # nothing serves yet: nothing to measure
        mem = self._states.get(key)
        state = mem[1] if mem and mem[0] == uid else stored_state(status)
        now = host.clock.time()
        # a mode that pins the other engine is followed at once, not at the end of the interval
        pin = pinned_engine(spec)
        repinned = state is not None and pin is not None and state.speculation.engine != pin
        if state is not None and not repinned and not due(spec, state.speculation, now):
            return
        previous = state.speculation.engine if state else serving

        pods = [p.pod for p in index_entries(host.indexes, "rdd_serving_pods", ("owner", ns, names.label_value(name)))]
        reading, error = await self._read(spec, name, ns, pods)
        deployments = variant_deployments(host.indexes, ns, name)
        available = frozenset(
            v
            for v in VARIANTS
            if _built(status.engines, v)
            or (deployments.get(v) is not None and bool(getattr(deployments[v], "key", "")))
        )
        available &= validated_engines(spec, status)  # not validated: a switch to it is held (TargetNotReady)
        dep = deployments.get(serving)
        observed = int(dep.replicas) if dep is not None else spec.serving.replicas
        ev, new = step(
            spec,
            state,
            reading,
            now,
            current_replicas=observed,
            error=error,
            available=available,
            measured_crossover=measured_crossover(status),
            serving=serving,
            pods=statuses_from_pods(pods),
        )
        current = ev.current_replicas
        self._states[key] = (uid, new)

        fields, cond = report_fields(spec, status, ev, new, previous_engine=previous, now=rfc3339(now))
        plan = ev.plan(spec, current)
        targets = ServingTargets(
            active="base" if plan.active == "base" else "redrafter", replicas=dict(plan.replicas), canary=plan.canary
        )
        events = self._account(key, spec, ev, previous, serving, current, plan.replicas.get(plan.active, current))
        # parts that changed only in timestamps keep the last report's (lastEvaluated: the last real change)
        if last is not None and last.uid == uid and not changed(status, fields, now=now):
            fields = last.status
        if (
            last is None
            or (uid, fields.wire(), cond, targets) != (last.uid, last.status.wire(), last.condition, last.targets)
            or events
        ):
            report = SpeculationReport(uid, fields, cond, targets, tuple(events))
            self._reports[key] = report
            host.hand_over(key, report)
        for observer in self.observers:
            observer(key, ev)

    # ---- I/O -------------------------------------------------------------------------------------
    async def _read(
        self, spec: ReDrafterDeploymentSpec, name: str, ns: str, pods: list[dict[str, Any]]
    ) -> tuple[Reading | None, str | None]:
        """A reading, or (None, why) when the source failed as a whole (the policy's Error input)."""
        try:
            targets = targets_from_pods(pods, self.metrics_port)
            return await source_for(spec, name, ns).read(targets), None
        except PrometheusError as exc:
            return None, str(exc)
        except Exception as exc:  # noqa: BLE001 - a metrics failure is input to the policy, never a crash
            log.warning("%s/%s: metrics read failed: %s", ns, name, exc)
            return None, f"{type(exc).__name__}: {exc}"

    def _account(
        self,
        key: ResourceKey,
        spec: ReDrafterDeploymentSpec,
        ev: Evaluation,
        previous: str,
        serving: str,
        current: int,
        replicas: int,
    ) -> list[EventSpec]:
        """Count the evaluation; the Events a switch or an autoscaler decision means (once each)."""
        d = ev.speculation
        m = self.metrics
        events: list[EventSpec] = []
        if m is not None:
            m.speculation_evaluations.labels(d.measurement.outcome).inc()
        if d.switched:
            if m is not None:
                m.speculation_switches.labels(d.engine, d.reason).inc()
            events.append(
                EventSpec(
                    "Warning" if d.engine == "base" else "Normal",
                    d.action,
                    f"{previous} -> {d.engine}: {d.reason}: {d.message}",
                )
            )
        # one Event per autoscaler decision (not per evaluation while the Deployment catches up)
        last = self._scaled.get(key)
        self._scaled[key] = (serving, replicas)
        if (
            spec.autoscaling.mode == "Operator"
            and not d.switched
            and replicas != current
            and last != (serving, replicas)
        ):
            s = ev.scale
            events.append(
                EventSpec("Normal", "Scaling", f"{serving} replicas {current} -> {replicas}: {s.reason}: {s.message}")
            )
        return events


__all__ = ["SpeculationMonitor", "SpeculationReport", "changed", "report_fields", "stored_state"]
