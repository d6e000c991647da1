"""Engine cache retention: per cache claim, a references ConfigMap and a collection CronJob; their results
as Events and metrics.

Runs as an evaluator (a periodic slot per resource); only the first resource (by name) using a claim in
a namespace acts for that claim, so each claim is handled once per interval.

* References: every key any known ReDrafterDeployment (all watched namespaces) names in its spec or
  status, plus the keys the serving Deployments run. Over-listing only keeps an engine longer.
* Retention: the resources on the claim that enable one; when they disagree the collection keeps the
  most (largest keep, largest maxAge, the first resource's schedule). None enabled: no CronJob.
* Results: each finished collection Job's termination message (JSON, engine_jobs.cache_gc.Report)
  becomes an Event on every resource using the claim and updates ``redrafter_engine_cache_bytes`` and
  ``redrafter_engine_cache_reclaimed_bytes_total``; the Job is then annotated as reported.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from engine_jobs.progress import human_bytes

from ..api import API_VERSION, KIND
from ..api.spec import ReDrafterDeploymentSpec
from ..api.types import parse_duration
from ..render import cache_jobs, names
from ..render.cache_refs import references_document
from .apply import ApiError, Applier, ChildState, manifest_hash
from .metrics import OperatorMetrics
from .resource_io import Host, Key, current_resource, index_entries, post_events
from .validation import DEFAULT_OPERATOR_IMAGE, ENV_OPERATOR_IMAGE

log = logging.getLogger("redrafter_operator.controller")

INTERVAL_SECONDS = 60.0
RECHECK_SECONDS = 600.0  # an unchanged CronJob is re-applied this often (someone may have deleted it)
ANNOTATION_REPORTED = f"{names.DOMAIN}/reported"


def _spec(body: Mapping[str, Any]) -> ReDrafterDeploymentSpec | None:
    if (body.get("metadata") or {}).get("deletionTimestamp"):
        return None
    try:
        return ReDrafterDeploymentSpec.model_validate(dict(body.get("spec") or {}))
    except ValidationError:
        return None


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


def owner_refs(users: list[tuple[Key, Mapping[str, Any]]]) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": key[1],
            "uid": (body.get("metadata") or {}).get("uid"),
            "blockOwnerDeletion": False,
        }
        for key, body in users
        if (body.get("metadata") or {}).get("uid")
    ]


def report_event(report: Mapping[str, Any], claim: str) -> tuple[str, str, str]:
    """``removedPartials`` (abandoned partial builds, variant "partial") is absent from an older image's report."""
    removed = report.get("removed") or []
    count = int(report.get("removedCount", len(removed)))
    partials = int(report.get("removedPartials") or 0)
    keys = ", ".join(
        str(r.get("key")) + (" (partial)" if r.get("variant") == "partial" else "") for r in removed[:10]
    ) + (" ..." if count > 10 else "")
    what = f"{count - partials} engine(s)" + (f" and {partials} abandoned partial build(s)" if partials else "")
    return (
        "Normal",
        "EngineCacheCollected",
        f"collection of cache claim {claim} removed {what}, freed "
        f"{human_bytes(int(report.get('freedBytes') or 0))}{': ' + keys if count else ''}; "
        f"{report.get('kept', 0)} kept, {human_bytes(int(report.get('cacheBytes') or 0))} in the cache",
    )


class CacheRetention:
    """The evaluator keeping each claim's references ConfigMap and collection CronJob, and reporting results."""

    def __init__(
        self, metrics: OperatorMetrics, *, operator_image: str | None = None, interval_seconds: float = INTERVAL_SECONDS
    ) -> None:
        self.metrics = metrics
        self.interval_seconds = interval_seconds
        self.operator_image = operator_image
        self._applier: Applier | None = None
        self._applied: dict[tuple[str, str], tuple[str, float]] = {}  # (ns, name) -> (digest, when)
        self._absent: set[tuple[str, str]] = set()  # CronJobs deleted (or found absent) by this process

    def interval(self, body: Mapping[str, Any]) -> float:
        return self.interval_seconds

    def _image(self) -> str:
        return self.operator_image or os.environ.get(ENV_OPERATOR_IMAGE) or DEFAULT_OPERATOR_IMAGE

    async def evaluate(self, controller: Host, body: Mapping[str, Any]) -> None:
        cur = current_resource(controller, body)
        if cur is None:
            return
        ns, claim = cur.key[0], cur.spec.engine.cache.claim_name
        users = sorted(
            (
                (k, b)
                for k, b in controller.bodies.items()
                if k[0] == ns and (s := _spec(b)) is not None and s.engine.cache.claim_name == claim
            ),
            key=lambda kb: kb[0][1],
        )
        if not users or users[0][0] != cur.key:
            return  # the first resource on the claim acts for it
        if self._applier is None:
            self._applier = Applier(controller.client, lambda m: _child_state(controller, m))
        name = cache_jobs.collection_name(claim)
        specs = [s for _, b in users if (s := _spec(b)) is not None]
        owners = owner_refs(users)
        retention = merged_retention(specs)
        if retention is not None:
            self._absent.discard((ns, name))
            await self._ensure(
                cache_jobs.references_config_map(
                    name=name, namespace=ns, claim=claim, document=self._references(controller), owners=owners
                )
            )
            keep, max_age, schedule = retention
            await self._ensure(
                cache_jobs.collection_cronjob(
                    namespace=ns,
                    claim=claim,
                    sub_path=cur.spec.engine.cache.sub_path,
                    image=self._image(),
                    schedule=schedule,
                    keep=keep,
                    max_age=max_age,
                    owners=owners,
                )
            )
        elif (ns, name) not in self._absent:  # once per process: it may be left from an earlier retention
            await self._delete(controller, f"/apis/batch/v1/namespaces/{ns}/cronjobs/{name}")
            self._absent.add((ns, name))
        await self.report(controller, ns, claim, users)

    def _references(self, controller: Host) -> str:
        bodies = []
        for key, body in controller.bodies.items():
            status = controller.written.get(key) or body.get("status") or {}
            bodies.append({**body, "status": status})
        idx = controller.indexes.get("rdd_deployments") or {}
        deployments = [
            {"metadata": {"name": fact.name, "namespace": k[1], "labels": {names.LABEL_ENGINE_KEY: fact.key}}}
            for k in list(idx)
            if isinstance(k, tuple) and k[0] == "name"
            for fact in index_entries(controller.indexes, "rdd_deployments", k)
            if fact.key
        ]
        return references_document(bodies, deployments)

    async def _ensure(self, manifest: dict[str, Any]) -> None:
        ref = (manifest["metadata"]["namespace"], f"{manifest['kind']}/{manifest['metadata']['name']}")
        digest = manifest_hash(manifest)
        last = self._applied.get(ref)
        if last and last[0] == digest and time.monotonic() - last[1] < RECHECK_SECONDS:
            return  # CronJobs are not watched: remember what this process applied
        assert self._applier is not None
        await self._applier.ensure(manifest)
        self._applied[ref] = (digest, time.monotonic())

    async def _delete(self, controller: Host, path: str) -> None:
        """Delete if present: a read first, so that an operator restart writes nothing when nothing changed."""
        try:
            await controller.client.request("GET", path)
            await controller.client.request("DELETE", path, {"propagationPolicy": "Background"})
        except ApiError as exc:
            if exc.status != 404:
                raise
        ns, name = path.split("/namespaces/", 1)[1].split("/cronjobs/")
        self._applied.pop((ns, f"CronJob/{name}"), None)

    async def report(self, controller: Host, ns: str, claim: str, users: list[tuple[Key, Mapping[str, Any]]]) -> None:
        """Events and metrics for each finished, unreported collection Job of the claim."""
        for verb, statuses in (("gc", "containerStatuses"), (cache_jobs.VERB_BEFORE_BUILD, "initContainerStatuses")):
            selector = f"{cache_jobs.LABEL_CLAIM}={names.label_value(claim)},{cache_jobs.LABEL_VERB}={verb}"
            jobs = (
                await controller.client.request(
                    "GET", f"/apis/batch/v1/namespaces/{ns}/jobs", query=[("labelSelector", selector)]
                )
            ).get("items") or []
            await self._report_jobs(controller, ns, claim, users, jobs, statuses)

    async def _report_jobs(
        self,
        controller: Host,
        ns: str,
        claim: str,
        users: list[tuple[Key, Mapping[str, Any]]],
        jobs: list[dict[str, Any]],
        statuses: str,
    ) -> None:
        for job in jobs:
            meta = job.get("metadata") or {}
            if (meta.get("annotations") or {}).get(ANNOTATION_REPORTED):
                continue
            conds = {
                c.get("type"): c for c in (job.get("status") or {}).get("conditions") or [] if c.get("status") == "True"
            }
            if "Complete" not in conds and "Failed" not in conds:
                continue
            event = await self._outcome(
                controller, ns, meta["name"], claim, failed="Failed" in conds, statuses=statuses
            )
            for _, body in users:
                post_events(controller, body, [event])
            await controller.client.request(
                "PATCH",
                f"/apis/batch/v1/namespaces/{ns}/jobs/{meta['name']}",
                {"metadata": {"annotations": {ANNOTATION_REPORTED: "true"}}},
                content_type="application/merge-patch+json",
            )

    async def _outcome(
        self, controller: Host, ns: str, job: str, claim: str, *, failed: bool, statuses: str
    ) -> tuple[str, str, str]:
        pods = (
            await controller.client.request(
                "GET", f"/api/v1/namespaces/{ns}/pods", query=[("labelSelector", f"job-name={job}")]
            )
        ).get("items") or []
        message = ""
        for pod in pods:
            for cs in (pod.get("status") or {}).get(statuses) or []:
                message = ((cs.get("state") or {}).get("terminated") or {}).get("message") or message
        try:
            report = json.loads(message)
            if not isinstance(report, dict) or "freedBytes" not in report:
                raise ValueError
        except ValueError:
            text = " ".join(message.split())[:512] or "no termination message"
            return (
                "Warning",
                "EngineCacheCollectionFailed",
                f"collection Job {job} of cache claim {claim} "
                f"{'failed' if failed else 'reported nothing readable'}: {text}",
            )
        self.metrics.cache_bytes.labels(claim).set(int(report.get("cacheBytes") or 0))
        self.metrics.cache_reclaimed.inc(int(report.get("freedBytes") or 0))
        return report_event(report, claim)


def _child_state(controller: Host, manifest: Mapping[str, Any]) -> ChildState | None:
    """What the watch-fed ConfigMap index shows of the references ConfigMap (CronJobs are not indexed: None,
    and :meth:`CacheRetention._ensure` re-applies them every RECHECK_SECONDS instead)."""
    if manifest["kind"] != "ConfigMap":
        return None
    meta = manifest["metadata"]
    facts = index_entries(controller.indexes, "rdd_configmaps", ("name", meta["namespace"], meta["name"]))
    return ChildState(facts[0].resource_version, facts[0].owned_fields) if facts else None
