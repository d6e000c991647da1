"""The operator's own Prometheus metrics (not the serving metrics, which live in ``metrics/``).

One CollectorRegistry per running operator (not the global default), so several operators in one
test process, or a restart, never collide on metric names.
"""

from __future__ import annotations

from typing import Any, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ..api.spec import Speculation
from ..api.status import DrafterStatus, EngineState, Phase, ValidationState

PHASES: tuple[str, ...] = Phase.__args__  # type: ignore[attr-defined]
ENGINE_STATES: tuple[str, ...] = EngineState.__args__  # type: ignore[attr-defined]
VALIDATION_STATES: tuple[str, ...] = ValidationState.__args__  # type: ignore[attr-defined]
DRAFTER_STATES: tuple[str, ...] = DrafterStatus.model_fields["state"].annotation.__args__  # type: ignore[union-attr]
#: status.drafter's numbers exported as gauges (the dashboard's training panel)
DRAFTER_GAUGES = {
    "step": "Optimizer steps the training Job reported.",
    "totalSteps": "Optimizer steps the training Job plans.",
    "loss": "Latest training loss of the drafter.",
    "heldOutAcceptance": "Held-out acceptance of the trained drafter (greedy, accepted / drafted tokens).",
}
ENGINES: tuple[str, ...] = ("redrafter", "base")
#: per-resource gauges: the facts the dashboard and the alert rules ask about each ReDrafterDeployment
RESOURCE_LABELS = ["namespace", "name"]
WRITE_VERBS = {"POST", "PUT", "PATCH", "DELETE"}


class OperatorMetrics:
    """Reconciles, errors, durations, engine builds by result, phase per resource, switches, API calls."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.reconciles = Counter(
            "redrafter_operator_reconciles_total", "Reconciles by result (ok, error).", ["result"], registry=r
        )
        self.errors = Counter(
            "redrafter_operator_reconcile_errors_total", "Failed reconciles by error reason.", ["reason"], registry=r
        )
        self.duration = Histogram(
            "redrafter_operator_reconcile_duration_seconds",
            "Time of one reconcile.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.builds = Counter(
            "redrafter_operator_engine_builds_total",
            "Engine build outcomes by variant and result (started, succeeded, failed, cached).",
            ["variant", "result"],
            registry=r,
        )
        self.phase = Gauge(
            "redrafter_operator_resource_phase",
            "1 for the current phase of each resource.",
            ["namespace", "name", "phase"],
            registry=r,
        )
        self.switches = Counter(
            "redrafter_operator_engine_switches_total",
            "Service moves between engines.",
            [*RESOURCE_LABELS, "from_engine", "to_engine"],
            registry=r,
        )
        self.active_engine = Gauge(
            "redrafter_operator_active_engine",
            "1 for the engine the Service of each resource selects.",
            [*RESOURCE_LABELS, "engine"],
            registry=r,
        )
        self.fallback = Gauge(
            "redrafter_operator_speculation_fallback",
            "1 while a resource serves the base engine although speculation.mode is not Never "
            "(acceptance fell, the ReDrafter engine failed or is not validated).",
            RESOURCE_LABELS,
            registry=r,
        )
        self.engine_state = Gauge(
            "redrafter_operator_engine_state",
            "1 for the build state of each engine.",
            [*RESOURCE_LABELS, "variant", "state"],
            registry=r,
        )
        self.drafter_state = Gauge(
            "redrafter_operator_drafter_state",
            "1 for the state of the drafter the operator trains (model.drafter.train).",
            [*RESOURCE_LABELS, "state"],
            registry=r,
        )
        self.drafter_step = Gauge(
            "redrafter_operator_drafter_step", DRAFTER_GAUGES["step"], RESOURCE_LABELS, registry=r
        )
        self.drafter_total_steps = Gauge(
            "redrafter_operator_drafter_total_steps", DRAFTER_GAUGES["totalSteps"], RESOURCE_LABELS, registry=r
        )
        self.drafter_loss = Gauge(
            "redrafter_operator_drafter_loss", DRAFTER_GAUGES["loss"], RESOURCE_LABELS, registry=r
        )
        self.drafter_held_out_acceptance = Gauge(
            "redrafter_operator_drafter_held_out_acceptance",
            DRAFTER_GAUGES["heldOutAcceptance"],
            RESOURCE_LABELS,
            registry=r,
        )
        self._drafter = {
            "step": self.drafter_step,
            "totalSteps": self.drafter_total_steps,
            "loss": self.drafter_loss,
            "heldOutAcceptance": self.drafter_held_out_acceptance,
        }
        self.validation_state = Gauge(
            "redrafter_operator_validation_state",
            "1 for the state of the newest engine pair's validation.",
            [*RESOURCE_LABELS, "state"],
            registry=r,
        )
        self.cache_bytes = Gauge(
            "redrafter_engine_cache_bytes",
            "Bytes of engines in each cache claim after its last collection.",
            ["claim"],
            registry=r,
        )
        self.cache_reclaimed = Counter(
            "redrafter_engine_cache_reclaimed_bytes", "Bytes the engine cache collections removed.", registry=r
        )
        self.replicas = Gauge(
            "redrafter_operator_serving_replicas",
            "Desired replicas of the active engine.",
            [*RESOURCE_LABELS, "engine"],
            registry=r,
        )
        self.ready_replicas = Gauge(
            "redrafter_operator_serving_ready_replicas",
            "Ready replicas of the active engine.",
            [*RESOURCE_LABELS, "engine"],
            registry=r,
        )
        self.min_acceptance = Gauge(
            "redrafter_operator_min_acceptance_rate",
            "spec.speculation.minAcceptanceRate of each resource.",
            RESOURCE_LABELS,
            registry=r,
        )
        self.speculation_evaluations = Counter(
            "redrafter_operator_speculation_evaluations_total",
            "Speculation policy evaluations by measurement outcome (Successful, Failed, Inconclusive, Error).",
            ["outcome"],
            registry=r,
        )
        self.speculation_switches = Counter(
            "redrafter_operator_speculation_switches_total",
            "Speculation policy decisions to switch engines, by target engine and reason.",
            ["to_engine", "reason"],
            registry=r,
        )
        self.monitor_runs = Counter(
            "redrafter_operator_monitor_runs_total",
            "Runs of the periodic monitors (SpeculationMonitor per resource, RetentionMonitor per operator).",
            ["monitor"],
            registry=r,
        )
        self.api_requests = Counter(
            "redrafter_operator_api_requests_total",
            "Requests the reconciler sent to the API server (excl. kopf's watches).",
            ["verb", "resource", "code"],
            registry=r,
        )
        self.queue_depth = Gauge(
            "redrafter_operator_workqueue_depth", "Resources waiting to be reconciled.", registry=r
        )
        self.resources = Gauge("redrafter_operator_resources", "ReDrafterDeployments watched.", registry=r)
        self.leader = Gauge(
            "redrafter_operator_leader",
            "1 while this replica runs the reconcile loops (holds the leader Lease, or standalone).",
            registry=r,
        )

    def on_request(self, verb: str, resource: str, code: int) -> None:
        self.api_requests.labels(verb, resource, str(code)).inc()

    def set_phase(self, namespace: str, name: str, phase: str | None) -> None:
        _one_of(self.phase, (namespace, name), PHASES, phase)

    def observe_resource(self, namespace: str, name: str, spec: Mapping[str, Any], status: Mapping[str, Any]) -> None:
        """Export what the status just written says about one resource (and the threshold its spec sets)."""
        self.set_phase(namespace, name, status.get("phase"))
        key = (namespace, name)
        active = status.get("activeEngine")
        _one_of(self.active_engine, key, ENGINES, active)
        speculation = spec.get("speculation") or {}
        mode = speculation.get("mode", Speculation.model_fields["mode"].default)
        self.fallback.labels(*key).set(1 if active == "base" and mode != "Never" else 0)
        engines = status.get("engines") or {}
        for variant in ENGINES:
            _one_of(self.engine_state, (*key, variant), ENGINE_STATES, (engines.get(variant) or {}).get("state"))
        _one_of(self.validation_state, key, VALIDATION_STATES, (status.get("validation") or {}).get("state"))
        drafter = status.get("drafter") or {}
        _one_of(self.drafter_state, key, DRAFTER_STATES, drafter.get("state"))
        for field, gauge in self._drafter.items():
            value = drafter.get(field)
            if isinstance(value, (int, float)):
                gauge.labels(*key).set(float(value))
            else:
                _remove(gauge, key)
        serving = status.get("serving") or {}
        for gauge, field in ((self.replicas, "replicas"), (self.ready_replicas, "readyReplicas")):
            _one_of(gauge, key, ENGINES, active, float(serving.get(field, 0)))
        threshold = speculation.get("minAcceptanceRate", Speculation.model_fields["min_acceptance_rate"].default)
        self.min_acceptance.labels(*key).set(float(threshold))

    def on_transition(self, namespace: str, name: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
        """Count what changed between the observed and the written status: build outcomes and engine switches."""
        for variant, result in build_outcomes(old, new):
            self.builds.labels(variant, result).inc()
        before, after = old.get("activeEngine"), new.get("activeEngine")
        if before and after and before != after:
            self.switches.labels(namespace, name, before, after).inc()

    def forget_resource(self, namespace: str, name: str) -> None:
        """Drop every per-resource series of a deleted resource (a stale 1 would keep alerts firing)."""
        self.set_phase(namespace, name, None)
        key = (namespace, name)
        _one_of(self.active_engine, key, ENGINES, None)
        _one_of(self.validation_state, key, VALIDATION_STATES, None)
        _one_of(self.drafter_state, key, DRAFTER_STATES, None)
        for gauge in self._drafter.values():
            _remove(gauge, key)
        for variant in ENGINES:
            _one_of(self.engine_state, (*key, variant), ENGINE_STATES, None)
        for gauge in (self.replicas, self.ready_replicas):
            _one_of(gauge, key, ENGINES, None)
        for gauge in (self.fallback, self.min_acceptance):
            _remove(gauge, key)

    def writes(self) -> float:
        """Total write requests so far (bench and tests read this)."""
        return sum(
            s.value
            for m in self.api_requests.collect()
            for s in m.samples
            if s.name.endswith("_total") and s.labels.get("verb") in WRITE_VERBS
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)


def build_outcomes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(variant, succeeded | cached | failed) for each engine whose build state moved between two statuses.

    A build attempt failed when the engine turns Failed, or when a Building engine moves on to a later
    attempt's Job (the earlier one failed and was retried).
    """
    out = []
    for variant in ENGINES:
        was = (old.get("engines") or {}).get(variant) or {}
        now = (new.get("engines") or {}).get(variant) or {}
        state, job = now.get("state"), now.get("job")
        if (was.get("state"), was.get("job")) == (state, job):
            continue
        if state == "Ready":
            out.append((variant, "succeeded"))
        elif state == "Cached":
            out.append((variant, "cached"))
        elif state == "Failed" and was.get("state") != "Failed":
            out.append((variant, "failed"))
        elif state == "Building" and was.get("state") == "Building" and was.get("job"):
            if int(now.get("attempts") or 0) > int(was.get("attempts") or 0):
                out.append((variant, "failed"))
    return out


def _remove(gauge: Gauge, labels: tuple[str, ...]) -> None:
    try:
        gauge.remove(*labels)
    except KeyError:
        pass


def _one_of(gauge: Gauge, prefix: tuple[str, ...], values: tuple[str, ...], current: Any, value: float = 1.0) -> None:
    """Keep only the series whose last label is ``current`` (set to ``value``); none when it is unknown."""
    for v in values:
        if v == current:
            gauge.labels(*prefix, v).set(value)
        else:
            _remove(gauge, (*prefix, v))
