"""The speculation policy in the controller: a thin shell around :func:`redrafter_operator.policy.step`.

Every ``spec.speculation.interval``, per ReDrafterDeployment (an :class:`~.resource_io.Evaluator` in the
controller's timer slot):

1. list the serving pods (``LABEL_DEPLOYMENT=<name>``, component serving) -> Ready scrape targets, and
   every pod's readiness for the autoscaler (pods still starting count as the HPA counts them);
2. read them (pod scrape, or Prometheus per ``spec.metrics``); a source that fails as a whole is the
   policy's ``error`` input (an *Error* measurement: inconclusive, never a switch), never a crash;
3. ``policy.step`` with the state persisted in ``status.policy`` (or this process's newer copy), the
   spec replicas of the active Deployment and the engines that can serve;
4. write status only when something changed: timestamps alone do not count, so ``lastEvaluated`` is the
   evaluation that last changed status and a resource at rest costs no writes (a timestamp heartbeat would
   cost N writes per period at scale; ``redrafter_operator_speculation_evaluations_total`` counts every
   evaluation):
   ``status.policy`` (everything the policy needs to resume after an operator restart),
   ``status.speculation`` (measured values, decision, reason), the ``SpeculationHealthy`` condition,
   and on a switch a bounded ``status.history`` entry;
5. hand the plan to the reconciler (``Controller.set_targets``, through the validation gate of
   :mod:`.validation` when one is configured), which applies it blue/green: the target pool comes up
   and Ready before the Service moves, the old pool scales down after;
6. on a switch: an Event (reason SwitchToBase / SwitchToRedrafter, message = why) and the
   ``redrafter_operator_speculation_switches_total`` counter; the Service move itself is the
   reconciler's ``Switched`` Event and ``redrafter_operator_engine_switches_total``.

Nothing is evaluated before something serves (``status.activeEngine``), for an invalid spec, or for a
resource being deleted. With ``mode: Never`` the reconciler owns the SpeculationHealthy condition.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from typing import Any, Callable, Mapping

from pydantic import ValidationError

from engine_jobs.contract import METRICS_PORT, VARIANTS

from ..api.spec import ReDrafterDeploymentSpec
from ..api.status import HISTORY_LIMIT
from ..metrics import PrometheusError, Reading, source_for, statuses_from_pods, targets_from_pods
from ..policy import Evaluation, PolicyState, due, step
from ..render import names
from .apply import ApiError, merge_patch
from .conditions import Cond, merge_conditions
from .plan_types import READY_STATES, ServingTargets
from .resource_io import Host, Key, current_resource, interval_of, post_events, variant_deployments, write_status

log = logging.getLogger("redrafter_operator.controller.speculation")

HISTORY_REASON_LIMIT = 512
CONDITION = "SpeculationHealthy"


def rfc3339(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


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


def newer_state(memory: PolicyState | None, stored: PolicyState | None) -> PolicyState | None:
    """This process's state unless status holds a later evaluation (e.g. written by a peer operator)."""
    if memory is None or stored is None:
        return memory or stored
    mine, theirs = memory.speculation.last_evaluated or 0.0, stored.speculation.last_evaluated or 0.0
    return stored if theirs > mine else memory


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
    if (status.get("validation") or {}).get("state") != "Passed":
        return None
    value = (status.get("speculation") or {}).get("crossoverConcurrency")
    return float(value) if isinstance(value, (int, float)) else None


def status_fragment(
    spec: ReDrafterDeploymentSpec,
    old: Mapping[str, Any],
    ev: Evaluation,
    state: PolicyState,
    *,
    previous_engine: str,
    now: str,
    generation: int,
) -> dict[str, Any]:
    """status.speculation / policy / conditions (/ history on a switch) after one evaluation (pure)."""
    d = ev.speculation
    speculation = {**(old.get("speculation") or {}), **d.status(now)}
    validation = old.get("validation") or {}
    measured = (old.get("speculation") or {}).get("crossoverConcurrency")
    if validation.get("state") == "Passed" and measured is not None:
        speculation["crossoverConcurrency"] = measured  # measured by the validation Job beats the cost model
    # exclude_none: a merge patch deletes null fields, so stored state never has them (else it always differs)
    out: dict[str, Any] = {"speculation": speculation, "policy": state.model_dump(mode="json", exclude_none=True)}
    if spec.speculation.mode != "Never":  # with Never the reconciler says SpeculationDisabled
        cond = Cond(CONDITION, d.healthy, d.reason, d.message)
        out["conditions"] = merge_conditions(old.get("conditions") or [], [cond], generation=generation, now=now)
    if d.switched:
        entry = {
            "time": now,
            "from": previous_engine,
            "to": d.engine,
            "reason": f"{d.reason}: {d.message}"[:HISTORY_REASON_LIMIT],
        }
        out["history"] = (list(old.get("history") or []) + [entry])[-HISTORY_LIMIT:]
    return out


def status_patch(old: Mapping[str, Any], fragment: Mapping[str, Any], *, now: float) -> dict[str, Any] | None:
    """The merge patch to write, or None when nothing but timestamps changed."""
    current = {k: old.get(k) for k in fragment}
    patch = merge_patch(current, dict(fragment))
    if not patch or merge_patch(_volatile_free(current, now), _volatile_free(fragment, now)) is None:
        return None
    return patch


# ---- the evaluator -------------------------------------------------------------------------------
class SpeculationEvaluator:
    """Evaluates the speculation policy and autoscaler of each resource (see the module docs)."""

    def __init__(
        self, *, metrics_port: int = METRICS_PORT, clock: Callable[[], float] = time.time, promotion: Any = None
    ) -> None:
        self.metrics_port = metrics_port
        self.clock = clock
        #: the validation gate's hub (controller/validation.Promotion); None: targets go straight to the reconciler
        self.promotion = promotion
        #: called with ((namespace, name), evaluation) after every evaluation (tests, the demo's timeline)
        self.observers: list[Callable[[Key, Evaluation], None]] = []
        self._states: dict[Key, tuple[str, PolicyState]] = {}  # newest state per resource (uid, state)
        self._scaled: dict[Key, tuple[str, int]] = {}  # last (engine, replicas) the autoscaler decided

    def interval(self, body: Mapping[str, Any]) -> float:
        return interval_of(body)

    async def evaluate(self, controller: Host, body: Mapping[str, Any]) -> None:
        for k in [k for k in self._states if k not in controller.bodies]:
            del self._states[k]
            self._scaled.pop(k, None)
        view = current_resource(controller, body)
        if view is None:
            return
        key, body, meta, spec, status = view.key, view.body, view.meta, view.spec, view.status
        ns, name = key
        uid = meta.get("uid") or ""
        if status.get("activeEngine") not in VARIANTS:
            return  # nothing serves yet: nothing to measure
        mem = self._states.get(key)
        state = newer_state(mem[1] if mem and mem[0] == uid else None, stored_state(status))
        now = self.clock()
        if state is not None and not due(spec, state.speculation, now):
            return
        previous = state.speculation.engine if state else str(status["activeEngine"])

        pods = await self._pods(controller, ns, name)
        if pods is None:
            return
        reading, error = await self._read(spec, name, ns, pods)
        deployments = variant_deployments(controller, ns, name)
        available = frozenset(
            v
            for v in VARIANTS
            if ((status.get("engines") or {}).get(v) or {}).get("state") in READY_STATES
            or (deployments.get(v) is not None and getattr(deployments[v], "key", ""))
        )
        if self.promotion is not None and not self.promotion.allows_redrafter(key):
            available -= {"redrafter"}  # not validated: a switch to it is held (TargetNotReady)
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

        fragment = status_fragment(
            spec,
            status,
            ev,
            new,
            previous_engine=previous,
            now=rfc3339(now),
            generation=int(meta.get("generation") or 1),
        )
        patch = status_patch(status, fragment, now=now)
        if patch:
            await self._write(controller, key, patch)
        plan = ev.plan(spec, current)
        targets = ServingTargets(active=plan.active, replicas=dict(plan.replicas), canary=plan.canary)
        if self.promotion is not None:
            self.promotion.set_policy(controller, key, targets, spec, status)
        else:
            controller.set_targets(ns, name, targets)
        self._account(
            controller, key, body, spec, ev, previous, serving, current, plan.replicas.get(plan.active, current)
        )
        for observer in self.observers:
            observer(key, ev)

    # ---- I/O -------------------------------------------------------------------------------------
    async def _pods(self, controller: Host, ns: str, name: str) -> list[dict[str, Any]] | None:
        selector = names.selector_string(
            {names.LABEL_DEPLOYMENT: names.label_value(name), names.LABEL_COMPONENT: "serving"}
        )
        try:
            found = await controller.client.request(
                "GET", f"/api/v1/namespaces/{ns}/pods", query=[("labelSelector", selector)]
            )
        except ApiError as exc:
            log.warning("%s/%s: cannot list serving pods (%s); evaluation skipped", ns, name, exc)
            return None
        return list(found.get("items") or [])

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

    async def _write(self, controller: Host, key: Key, patch: Mapping[str, Any]) -> None:
        try:
            await write_status(controller, key, patch)
        except ApiError as exc:  # retried on the next evaluation: the fragment still differs from status
            log.warning("%s/%s: status write failed (%s); retried next interval", key[0], key[1], exc)

    def _account(
        self,
        controller: Host,
        key: Key,
        body: Mapping[str, Any],
        spec: ReDrafterDeploymentSpec,
        ev: Evaluation,
        previous: str,
        serving: str,
        current: int,
        replicas: int,
    ) -> None:
        d = ev.speculation
        m = getattr(controller, "metrics", None)
        if m is not None and hasattr(m, "speculation_evaluations"):
            m.speculation_evaluations.labels(d.measurement.outcome).inc()
        if d.switched:
            if m is not None and hasattr(m, "speculation_switches"):
                m.speculation_switches.labels(d.engine, d.reason).inc()
            post_events(
                controller,
                body,
                [
                    (
                        "Warning" if d.engine == "base" else "Normal",
                        d.action,
                        f"{previous} -> {d.engine}: {d.reason}: {d.message}",
                    )
                ],
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
            post_events(
                controller,
                body,
                [("Normal", "Scaling", f"{serving} replicas {current} -> {replicas}: {s.reason}: {s.message}")],
            )


__all__ = ["SpeculationEvaluator", "newer_state", "status_fragment", "status_patch", "stored_state"]
