"""Engine cache retention: per cache claim, the facts its collection children are rendered from; the
collections' results as Events and metrics.

A monitor, once for the whole controller every minute (not per resource: the work is per claim, and the
references are every resource's): it groups the resources by (namespace, claim) from the parsed specs the
controller keeps, and hands the first resource (by name) on each claim a :class:`~.reports.RetentionReport`
with the claim's :class:`~.reports.ClaimFacts`; that resource's plan renders the references ConfigMap and the
collection CronJob from them (:mod:`.collection`). It reads only the indexes and writes nothing.

* References: every key any known ReDrafterDeployment (all watched namespaces) names in its spec or
  status, plus the keys the serving Deployments run. Over-listing only keeps an engine longer.
* Results: each finished collection Job's termination message (JSON, engine_jobs.cache_gc.Report), read
  from the watched Job and Pod, becomes an Event on every resource using the claim and updates
  ``redrafter_engine_cache_bytes`` and ``redrafter_engine_cache_reclaimed_bytes_total``; the reconciler then
  annotates the Job as reported.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from engine_jobs.progress import human_bytes

from ..api.spec import ReDrafterDeploymentSpec
from ..render import cache_jobs, names
from ..render.cache_refs import references_document
from .facts import ANNOTATION_REPORTED, RunJobFact, RunPodFact
from .metrics import OperatorMetrics
from .plan_types import EventSpec
from .reports import ClaimFacts, ClaimUser, RetentionReport
from .resource_io import Host, current_status, index_entries
from .validation import operator_image
from .workqueue import ResourceKey

log = logging.getLogger("redrafter_operator.controller")

INTERVAL_SECONDS = 60.0


def report_event(report: Mapping[str, Any], claim: str) -> EventSpec:
    """``removedPartials`` (abandoned partial builds, variant "partial") is absent from an older image's report."""
    removed = report.get("removed") or []
    count = int(report.get("removedCount", len(removed)))
    partials = int(report.get("removedPartials") or 0)
    keys = ", ".join(
        str(r.get("key")) + (" (partial)" if r.get("variant") == "partial" else "") for r in removed[:10]
    ) + (" ..." if count > 10 else "")
    what = f"{count - partials} engine(s)" + (f" and {partials} abandoned partial build(s)" if partials else "")
    return EventSpec(
        "Normal",
        "EngineCacheCollected",
        f"collection of cache claim {claim} removed {what}, freed "
        f"{human_bytes(int(report.get('freedBytes') or 0))}{': ' + keys if count else ''}; "
        f"{report.get('kept', 0)} kept, {human_bytes(int(report.get('cacheBytes') or 0))} in the cache",
    )


class RetentionMonitor:
    """Keeps each claim's references ConfigMap and collection CronJob planned, and reports collections."""

    per_resource = False

    def __init__(
        self, metrics: OperatorMetrics, *, image: str | None = None, interval_seconds: float = INTERVAL_SECONDS
    ) -> None:
        self.metrics = metrics
        self.interval_seconds = interval_seconds
        self.image = image
        self._reported: set[tuple[str, str]] = set()  # (namespace, Job) reported, until the watch shows it annotated

    def interval(self, host: Host, key: ResourceKey | None) -> float:
        return self.interval_seconds

    def forget(self, key: ResourceKey) -> None:
        pass

    async def run(self, host: Host, key: ResourceKey | None) -> None:
        claims: dict[tuple[str, str], list[tuple[ResourceKey, ReDrafterDeploymentSpec]]] = {}
        for k, body in host.bodies.items():
            spec = host.spec_of(k)
            if spec is not None and not (body.get("metadata") or {}).get("deletionTimestamp"):
                claims.setdefault((k[0], spec.engine.cache.claim_name), []).append((k, spec))
        if not claims:
            return
        document = self._references(host)
        for (ns, claim), users in claims.items():
            users.sort(key=lambda u: u[0][1])
            events = self._collections(host, ns, claim)
            host.hand_over(
                users[0][0],
                RetentionReport(
                    self._facts(host, ns, claim, users, document),
                    tuple(e for e, _ in events),
                    tuple(a for _, a in events),
                ),
            )
            for k, _ in users[1:]:
                if events:
                    host.hand_over(k, RetentionReport(events=tuple(e for e, _ in events)))

    def _facts(
        self, host: Host, ns: str, claim: str, users: list[tuple[ResourceKey, ReDrafterDeploymentSpec]], document: str
    ) -> ClaimFacts:
        """What the planner renders the claim's children from (the first user acts for the claim)."""
        return ClaimFacts(
            namespace=ns,
            claim=claim,
            users=tuple(ClaimUser(k[1], (host.bodies[k].get("metadata") or {}).get("uid") or "", s) for k, s in users),
            document=document,
            image=self.image or operator_image(),
            cronjob_seen=bool(
                index_entries(host.indexes, "rdd_cronjobs", ("name", ns, cache_jobs.collection_name(claim)))
            ),
        )

    def _references(self, host: Host) -> str:
        bodies = [{**body, "status": current_status(host, key)} for key, body in host.bodies.items()]
        idx = host.indexes.get("rdd_deployments") or {}
        deployments = [
            {"metadata": {"name": fact.name, "namespace": k[1], "labels": {names.LABEL_ENGINE_KEY: fact.key}}}
            for k in list(idx)
            if isinstance(k, tuple) and k[0] == "name"
            for fact in index_entries(host.indexes, "rdd_deployments", k)
            if fact.key
        ]
        return references_document(bodies, deployments, {key: host.engine_keys_of(key) for key in host.bodies})

    def _collections(
        self, host: Host, ns: str, claim: str
    ) -> list[tuple[EventSpec, tuple[dict[str, Any], dict[str, str]]]]:
        """An Event and the reported annotation for each finished, unreported collection Job of the claim."""
        out = []
        jobs: list[RunJobFact] = index_entries(host.indexes, "rdd_collection_jobs", (ns, names.label_value(claim)))
        pending = {j.name for j in jobs if not j.reported}  # reported and not yet seen annotated
        self._reported = {r for r in self._reported if r[0] != ns or r[1] in pending}
        for job in sorted(jobs, key=lambda j: j.name):
            if job.reported or job.result is None or (ns, job.name) in self._reported:
                continue
            before_build = job.verb == cache_jobs.VERB_BEFORE_BUILD
            pods: list[RunPodFact] = index_entries(
                host.indexes, "rdd_before_build_pods" if before_build else "rdd_run_pods", (ns, job.name)
            )
            message = ""
            for pod in sorted(pods, key=lambda p: (p.created, p.name)):
                found = (
                    pod.messages.get(cache_jobs.COLLECT_CONTAINER)
                    if before_build
                    else next(iter(pod.messages.values()), None)
                )
                message = found or message
            event = self._outcome(job.name, claim, message, failed=job.result[0] == "Failed")
            self._reported.add((ns, job.name))
            out.append(
                (
                    event,
                    (
                        {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": job.name, "namespace": ns}},
                        {ANNOTATION_REPORTED: "true"},
                    ),
                )
            )
        return out

    def _outcome(self, job: str, claim: str, message: str, *, failed: bool) -> EventSpec:
        try:
            report = json.loads(message)
            if not isinstance(report, dict) or "freedBytes" not in report:
                raise ValueError
        except ValueError:
            text = " ".join(message.split())[:512] or "no termination message"
            return EventSpec(
                "Warning",
                "EngineCacheCollectionFailed",
                f"collection Job {job} of cache claim {claim} "
                f"{'failed' if failed else 'reported nothing readable'}: {text}",
            )
        self.metrics.cache_bytes.labels(claim).set(int(report.get("cacheBytes") or 0))
        self.metrics.cache_reclaimed.inc(int(report.get("freedBytes") or 0))
        return report_event(report, claim)


__all__ = ["RetentionMonitor", "report_event"]
