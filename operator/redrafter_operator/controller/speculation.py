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
from ..api.status import HISTORY_LIMIT
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
def stored_state(status: Mapping[str, Any]) -> PolicyState | None:
    """The policy state persisted in status.policy (None when absent or unreadable: start afresh)."""
    raw = status.get("policy")
    if not raw:
        return None
    try:
        return PolicyState.model_validate(raw)
    except ValidationError as exc:
        log.warning("status.policy is unreadable (%s); the policy starts afresh", exc)
        return None


def _volatile_free(fragment: Mapping[str, Any], now: float) -> Any:
    """The fragment without fields that change on every evaluation by themselves (timestamps), and without an
    autoscaler settle window that has expired (the autoscaler treats it as none: clearing it alone is no change)."""
    out = {k: v for k, v in fragment.items()}
    if isinstance(out.get("speculation"), dict):
        out["speculation"] = {k: v for k, v in out["speculation"].items() if k != "lastEvaluated"}
    policy = out.get("policy")
    if isinstance(policy, dict):
        policy = dict(policy)
        if isinstance(policy.get("speculation"), dict):
            policy["speculation"] = {k: v for k, v in policy["speculation"].items() if k != "last_evaluated"}
        autoscaler = policy.get("autoscaler")
        if (
            isinstance(autoscaler, dict)
            and isinstance(autoscaler.get("settle"), list)
            and autoscaler["settle"]
            and isinstance(autoscaler["settle"][0], (int, float))
            and now >= autoscaler["settle"][0]
        ):
            policy["autoscaler"] = {k: v for k, v in autoscaler.items() if k != "settle"}
        window = policy.get("window")
        if isinstance(window, dict):
            pods = {p: {k: v for k, v in (m or {}).items() if k != "t"} for p, m in (window.get("pods") or {}).items()}
            policy["window"] = {"pods": pods}
        out["policy"] = policy
    return out


def measured_crossover(status: Mapping[str, Any]) -> float | None:
    """The validation Job's measured crossover, once the current pair passed (else the cost model's own)."""
    validation = status.get("validation") or {}
    if validation.get("state") != "Passed":
        return None
    value = validation.get("crossoverConcurrency", (status.get("speculation") or {}).get("crossoverConcurrency"))
    return float(value) if isinstance(value, (int, float)) else None


def report_fields(
    spec: ReDrafterDeploymentSpec,
    old: Mapping[str, Any],
    ev: Evaluation,
    state: PolicyState,
    *,
    previous_engine: str,
    now: str,
) -> tuple[dict[str, Any], Cond | None]:
    """status.speculation / policy (/ history on a switch), and the SpeculationHealthy condition (pure)."""
    d = ev.speculation
    speculation = {**(old.get("speculation") or {}), **d.status(now)}
    measured = measured_crossover(old)
    if measured is not None:
        speculation["crossoverConcurrency"] = measured  # measured by the validation Job beats the cost model
    # exclude_none: a merge patch deletes null fields, so stored state never has them (else it always differs)
    out: dict[str, Any] = {"speculation": speculation, "policy": state.model_dump(mode="json", exclude_none=True)}
    cond = Cond(CONDITION, d.healthy, d.reason, d.message) if spec.speculation.mode != "Never" else None
    if d.switched:
        entry = {
            "time": now,
            "from": previous_engine,
            "to": d.engine,
            "reason": f"{d.reason}: {d.message}"[:HISTORY_REASON_LIMIT],
        }
        out["history"] = (list(old.get("history") or []) + [entry])[-HISTORY_LIMIT:]
    return out, cond


def changed(old: Mapping[str, Any], fields: Mapping[str, Any], *, now: float) -> bool:
    """Whether ``fields`` change ``old`` in more than timestamps (what is worth a status write)."""
    current = {k: old.get(k) for k in fields}
    return merge_patch(_volatile_free(current, now), _volatile_free(fields, now)) is not None


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
        status = current_status(host, key)
        last = self._reports.get(key)
        if last is not None and last.uid == uid:  # newer than status until the reconciler wrote it
            status = {**status, **last.fields}
        if status.get("activeEngine") not in VARIANTS:
            return  # nothing serves yet: nothing to measure
        mem = self._states.get(key)
        state = mem[1] if mem and mem[0] == uid else stored_state(status)
        now = host.clock.time()
        # a mode that pins the other engine is followed at once, not at the end of the interval
        pin = pinned_engine(spec)
        repinned = state is not None and pin is not None and state.speculation.engine != pin
        if state is not None and not repinned and not due(spec, state.speculation, now):
            return
        previous = state.speculation.engine if state else str(status["activeEngine"])

        pods = [p.pod for p in index_entries(host.indexes, "rdd_serving_pods", ("owner", ns, names.label_value(name)))]
        reading, error = await self._read(spec, name, ns, pods)
        deployments = variant_deployments(host.indexes, ns, name)
        available = frozenset(
            v
            for v in VARIANTS
            if ((status.get("engines") or {}).get(v) or {}).get("state") in READY_STATES
            or (deployments.get(v) is not None and bool(getattr(deployments[v], "key", "")))
        )
        available &= validated_engines(spec, status)  # not validated: a switch to it is held (TargetNotReady)
        serving = str(status["activeEngine"])  # the pool taking the traffic (the gate may hold it on base)
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
        # fields that changed only in timestamps keep the last report's (lastEvaluated: the last real change)
        if last is not None and last.uid == uid and not changed(status, fields, now=now):
            fields = dict(last.fields)
        if (
            last is None
            or (uid, fields, cond, targets) != (last.uid, last.fields, last.condition, last.targets)
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
