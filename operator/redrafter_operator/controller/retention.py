"""Engine cache retention: per cache claim, a references ConfigMap and a collection CronJob; their results
as Events and metrics.

A monitor, once for the whole controller every minute (not per resource: the work is per claim, and the
references are every resource's): it groups the resources by (namespace, claim) from the parsed specs the
controller keeps, and hands the first resource (by name) on each claim a :class:`RetentionReport` with the
claim's children; that resource's reconcile applies them. It reads only the indexes and writes nothing.

* References: every key any known ReDrafterDeployment (all watched namespaces) names in its spec or
  status, plus the keys the serving Deployments run. Over-listing only keeps an engine longer.
* Retention: the resources on the claim that enable one; when they disagree the collection keeps the
  most (largest keep, largest maxAge, the first resource's schedule). None enabled: the CronJob is deleted
  if the index shows one (an earlier retention's).
* Results: each finished collection Job's termination message (JSON, engine_jobs.cache_gc.Report), read
  from the watched Job and Pod, becomes an Event on every resource using the claim and updates
  ``redrafter_engine_cache_bytes`` and ``redrafter_engine_cache_reclaimed_bytes_total``; the reconciler then
  annotates the Job as reported.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from engine_jobs.progress import human_bytes

from ..api import API_VERSION, KIND
from ..api.spec import ReDrafterDeploymentSpec
from ..api.types import parse_duration
from ..render import cache_jobs, names
from ..render.cache_refs import references_document
from .facts import ANNOTATION_REPORTED, RunJobFact, RunPodFact
from .metrics import OperatorMetrics
from .plan_types import EventSpec
from .resource_io import Host, current_status, index_entries
from .validation import operator_image
from .workqueue import ResourceKey

log = logging.getLogger("redrafter_operator.controller")

INTERVAL_SECONDS = 60.0


def merged_retention(specs: list[ReDrafterDeploymentSpec]) -> tuple[int | None, str | None, str] | None:
    """(keep, max age in whole seconds, schedule) keeping the union of what the claim's resources keep, or None.

    An engine is kept when it is among the ``keep`` most recent *or* younger than ``maxAge``, so the union
    of several retentions is the largest keep with the largest maxAge.
    """
    enabled = [s.engine.cache.retention for s in specs if s.engine.cache.retention.enabled]
    if not enabled:
        return None
    keeps = [r.keep for r in enabled if r.keep is not None]
    ages = [parse_duration(r.max_age) for r in enabled if r.max_age is not None]
    return (max(keeps) if keeps else None, f"{int(max(ages))}s" if ages else None, enabled[0].schedule)


def owner_refs(users: list[tuple[str, str, ReDrafterDeploymentSpec]]) -> list[dict[str, Any]]:
    """Every resource on the claim owns its collection children (none is the controller: they are shared)."""
    return [
        {"apiVersion": API_VERSION, "kind": KIND, "name": name, "uid": uid, "blockOwnerDeletion": False}
        for name, uid, _ in users
        if uid
    ]


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


@dataclass(frozen=True)
class RetentionReport:
    """A claim's collection children for the resource that acts for the claim, and Events for every user."""

    apply: tuple[dict[str, Any], ...] = ()  # the references ConfigMap and the CronJob
    delete: tuple[dict[str, Any], ...] = ()  # a CronJob no resource on the claim asks for any more
    events: tuple[EventSpec, ...] = ()
    annotate: tuple[tuple[dict[str, Any], dict[str, str]], ...] = field(default=())  # (Job ref, annotations)


def collection_children(
    namespace: str, claim: str, users: list[tuple[str, str, ReDrafterDeploymentSpec]], document: str, image: str
) -> RetentionReport | None:
    """The claim's references ConfigMap and collection CronJob for its users (name, uid, spec; the first acts
    for the claim), or None when none of them enables a retention."""
    retention = merged_retention([s for _, _, s in users])
    if retention is None:
        return None
    name = cache_jobs.collection_name(claim)
    owners = owner_refs(users)
    keep, max_age, schedule = retention
    return RetentionReport(
        apply=(
            cache_jobs.references_config_map(
                name=name, namespace=namespace, claim=claim, document=document, owners=owners
            ),
            cache_jobs.collection_cronjob(
                namespace=namespace,
                claim=claim,
                sub_path=users[0][2].engine.cache.sub_path,
                image=image,
                schedule=schedule,
                keep=keep,
                max_age=max_age,
                owners=owners,
            ),
        )
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
            report = self._children(host, ns, claim, users, document)
            host.hand_over(
                users[0][0],
                RetentionReport(report.apply, report.delete, tuple(e for e, _ in events), tuple(a for _, a in events)),
            )
            for k, _ in users[1:]:
                if events:
                    host.hand_over(k, RetentionReport(events=tuple(e for e, _ in events)))

    def _children(
        self, host: Host, ns: str, claim: str, users: list[tuple[ResourceKey, ReDrafterDeploymentSpec]], document: str
    ) -> RetentionReport:
        named = [(k[1], (host.bodies[k].get("metadata") or {}).get("uid") or "", s) for k, s in users]
        report = collection_children(ns, claim, named, document, self.image or operator_image())
        if report is not None:
            return report
        name = cache_jobs.collection_name(claim)
        if index_entries(host.indexes, "rdd_cronjobs", ("name", ns, name)):  # an earlier retention's
            return RetentionReport(
                delete=({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": name, "namespace": ns}},)
            )
        return RetentionReport()

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


__all__ = [
    "RetentionMonitor",
    "RetentionReport",
    "collection_children",
    "merged_retention",
    "owner_refs",
    "report_event",
]
