"""The operator's own Prometheus metrics (not the serving metrics, which live in ``metrics/``).

One CollectorRegistry per running operator (not the global default), so several operators in one
test process, or a restart, never collide on metric names.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ..api.status import Phase

PHASES: tuple[str, ...] = Phase.__args__  # type: ignore[attr-defined]
WRITE_VERBS = {"POST", "PUT", "PATCH", "DELETE"}


class OperatorMetrics:
    """Reconciles, errors, durations, engine builds by result, phase per resource, switches, API calls."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.reconciles = Counter("redrafter_operator_reconciles_total", "Reconciles by result (ok, error).",
                                  ["result"], registry=r)
        self.errors = Counter("redrafter_operator_reconcile_errors_total", "Failed reconciles by error reason.",
                              ["reason"], registry=r)
        self.duration = Histogram("redrafter_operator_reconcile_duration_seconds", "Time of one reconcile.",
                                  buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10), registry=r)
        self.builds = Counter("redrafter_operator_engine_builds_total",
                              "Engine build outcomes by variant and result (started, succeeded, failed, cached).",
                              ["variant", "result"], registry=r)
        self.phase = Gauge("redrafter_operator_resource_phase", "1 for the current phase of each resource.",
                           ["namespace", "name", "phase"], registry=r)
        self.switches = Counter("redrafter_operator_engine_switches_total", "Service moves between engines.",
                                ["from_engine", "to_engine"], registry=r)
        self.speculation_evaluations = Counter(
            "redrafter_operator_speculation_evaluations_total",
            "Speculation policy evaluations by measurement outcome (Successful, Failed, Inconclusive, Error).",
            ["outcome"], registry=r)
        self.speculation_switches = Counter(
            "redrafter_operator_speculation_switches_total",
            "Speculation policy decisions to switch engines, by target engine and reason.",
            ["to_engine", "reason"], registry=r)
        self.api_requests = Counter("redrafter_operator_api_requests_total",
                                    "Requests the reconciler sent to the API server (excl. kopf's watches).",
                                    ["verb", "resource", "code"], registry=r)
        self.queue_depth = Gauge("redrafter_operator_workqueue_depth", "Resources waiting to be reconciled.",
                                 registry=r)
        self.resources = Gauge("redrafter_operator_resources", "ReDrafterDeployments watched.", registry=r)
        self.leader = Gauge("redrafter_operator_leader",
                            "1 while this replica runs the reconcile loops (holds the leader Lease, or standalone).",
                            registry=r)

    def on_request(self, verb: str, resource: str, code: int) -> None:
        self.api_requests.labels(verb, resource, str(code)).inc()

    def set_phase(self, namespace: str, name: str, phase: str | None) -> None:
        for p in PHASES:
            if p == phase:
                self.phase.labels(namespace, name, p).set(1)
            else:
                try:
                    self.phase.remove(namespace, name, p)
                except KeyError:
                    pass

    def writes(self) -> float:
        """Total write requests so far (bench and tests read this)."""
        return sum(s.value for m in self.api_requests.collect() for s in m.samples
                   if s.name.endswith("_total") and s.labels.get("verb") in WRITE_VERBS)

    def render(self) -> bytes:
        return generate_latest(self.registry)
