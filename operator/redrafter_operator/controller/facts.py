"""Observed facts: the small, immutable summaries of child objects the planner decides from.

The kopf indexes keep these (not whole bodies), so memory stays flat with hundreds of resources and
the planner's inputs are plain values that unit tests can write by hand.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

from ..render import names

JobState = Literal["Running", "Succeeded", "Failed"]

FIELD_MANAGER = names.MANAGED_BY  # the operator's server-side apply field manager
ANNOTATION_ATTEMPT = f"{names.DOMAIN}/attempt"
ANNOTATION_ARTIFACT = f"{names.DOMAIN}/artifact"
ANNOTATION_RETRY_TOKEN = f"{names.DOMAIN}/retry-token"  # retry-build annotation value a Job was created under
ANNOTATION_CACHE_CLAIM = f"{names.DOMAIN}/cache-claim"
JOB_NAME_LABELS = ("batch.kubernetes.io/job-name", "job-name")


def manifest_hash(manifest: Mapping[str, Any]) -> str:
    """Stable hash of what the operator wants an object to be (labels, annotations, spec, data)."""
    meta = manifest.get("metadata", {})
    relevant = {
        "labels": meta.get("labels") or {},
        "annotations": meta.get("annotations") or {},
        "ownerReferences": meta.get("ownerReferences") or [],
        **{k: v for k, v in manifest.items() if k not in ("metadata", "status", "apiVersion", "kind")},
    }
    text = json.dumps(relevant, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def owned_fields(body: Mapping[str, Any]) -> str:
    """Fingerprint of the fields the operator's server-side apply owns on an object ("" if none).

    The API server moves a field out of this set when anyone else changes or removes it (an Update
    takes the fields it changes), so a changed fingerprint is drift of exactly the fields the operator
    manages, seen from the watch without comparing whole objects.
    """
    for entry in body.get("metadata", {}).get("managedFields") or []:
        if entry.get("manager") == FIELD_MANAGER and entry.get("operation") == "Apply" and not entry.get("subresource"):
            text = json.dumps(entry.get("fieldsV1") or {}, sort_keys=True, separators=(",", ":"))
            return hashlib.sha256(text.encode()).hexdigest()[:16]
    return ""


def _labels(body: Mapping[str, Any]) -> Mapping[str, str]:
    return body.get("metadata", {}).get("labels") or {}


def _annotations(body: Mapping[str, Any]) -> Mapping[str, str]:
    return body.get("metadata", {}).get("annotations") or {}


@dataclass(frozen=True)
class JobFact:
    """One build Job as far as the planner cares."""

    name: str
    namespace: str
    owner: str  # LABEL_DEPLOYMENT value (the resource that created it)
    variant: str
    key: str
    attempt: int
    retry_token: str
    claim: str
    artifact: str
    state: JobState
    reason: str = ""
    message: str = ""

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> "JobFact":
        meta = body.get("metadata", {})
        labels, ann = _labels(body), _annotations(body)
        status = body.get("status") or {}
        state: JobState = "Running"
        reason = message = ""
        for cond in status.get("conditions") or []:
            if cond.get("status") != "True":
                continue
            if cond.get("type") in ("Complete", "SuccessCriteriaMet"):
                state = "Succeeded"
            elif cond.get("type") == "Failed":
                state, reason, message = "Failed", cond.get("reason") or "Failed", cond.get("message") or ""
        if state == "Running" and (status.get("succeeded") or 0) >= 1 and not status.get("active"):
            state = "Succeeded"
        claim = ann.get(ANNOTATION_CACHE_CLAIM) or _cache_claim(body)
        try:
            attempt = int(ann.get(ANNOTATION_ATTEMPT, "0"))
        except ValueError:
            attempt = 0
        return cls(
            name=meta.get("name", ""),
            namespace=meta.get("namespace", ""),
            owner=labels.get(names.LABEL_DEPLOYMENT, ""),
            variant=labels.get(names.LABEL_VARIANT, ""),
            key=labels.get(names.LABEL_ENGINE_KEY, ""),
            attempt=attempt,
            retry_token=ann.get(ANNOTATION_RETRY_TOKEN, ""),
            claim=claim,
            artifact=ann.get(ANNOTATION_ARTIFACT, ""),
            state=state,
            reason=reason,
            message=message,
        )


def _cache_claim(body: Mapping[str, Any]) -> str:
    volumes = body.get("spec", {}).get("template", {}).get("spec", {}).get("volumes") or []
    for vol in volumes:
        if vol.get("name") == "cache":
            return (vol.get("persistentVolumeClaim") or {}).get("claimName", "")
    return ""


@dataclass(frozen=True)
class PodFact:
    """A build Pod's outcome: the termination message its container wrote (reason + stderr tail)."""

    job: str
    phase: str
    message: str
    started: str = ""

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> "PodFact":
        labels = _labels(body)
        job = next((labels[k] for k in JOB_NAME_LABELS if labels.get(k)), "")
        if not job:
            job = next((r.get("name", "") for r in body.get("metadata", {}).get("ownerReferences") or []
                        if r.get("kind") == "Job"), "")
        status = body.get("status") or {}
        message = ""
        for cs in status.get("containerStatuses") or []:
            term = (cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get("terminated") or {}
            if term.get("message") or term.get("reason"):
                message = (term.get("message") or term.get("reason") or "").strip()
                if term.get("exitCode", 0) != 0:
                    break
        return cls(job=job, phase=status.get("phase", ""), message=message,
                   started=body.get("metadata", {}).get("creationTimestamp", ""))


@dataclass(frozen=True)
class DeploymentFact:
    """One serving Deployment: which engine it runs and whether its rollout is done."""

    name: str
    variant: str
    key: str
    replicas: int
    ready_replicas: int
    updated_replicas: int
    total_replicas: int
    generation: int
    observed_generation: int
    owned_fields: str = ""  # see owned_fields()
    resource_version: str = ""

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> "DeploymentFact":
        meta = body.get("metadata", {})
        status = body.get("status") or {}
        spec_replicas = (body.get("spec") or {}).get("replicas")
        return cls(
            name=meta.get("name", ""),
            variant=_labels(body).get(names.LABEL_VARIANT, ""),
            key=_labels(body).get(names.LABEL_ENGINE_KEY, ""),
            replicas=1 if spec_replicas is None else int(spec_replicas),
            ready_replicas=int(status.get("readyReplicas") or 0),
            updated_replicas=int(status.get("updatedReplicas") or 0),
            total_replicas=int(status.get("replicas") or 0),
            generation=int(meta.get("generation") or 0),
            observed_generation=int(status.get("observedGeneration") or 0),
            owned_fields=owned_fields(body),
            resource_version=meta.get("resourceVersion", ""),
        )

    @property
    def rolled_out(self) -> bool:
        """The controller saw the latest spec, every replica runs it, all are Ready, no old ones left."""
        return (
            self.observed_generation >= self.generation
            and self.updated_replicas >= self.replicas
            and self.ready_replicas >= self.replicas
            and self.total_replicas <= self.replicas
        )


@dataclass(frozen=True)
class ObjectFact:
    """Any other child (ConfigMap, Service): what the operator owns of it and, for Services, the traffic pool."""

    kind: str
    name: str
    owned_fields: str = ""  # see owned_fields()
    resource_version: str = ""
    pool: str = ""

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> "ObjectFact":
        selector = (body.get("spec") or {}).get("selector") or {}
        return cls(
            kind=body.get("kind", ""),
            name=body.get("metadata", {}).get("name", ""),
            owned_fields=owned_fields(body),
            resource_version=body.get("metadata", {}).get("resourceVersion", ""),
            pool=selector.get(names.LABEL_TRAFFIC, "") if isinstance(selector, dict) else "",
        )


@dataclass(frozen=True)
class SharedArtifact:
    """What the namespace knows about one artifact (claim + path), from any resource's Jobs or status."""

    ready_by: str = ""  # a succeeded Job or a resource whose status shows the engine Ready
    building_job: str = ""  # a Job (any owner) currently building it


@dataclass
class Observed:
    """Everything the planner needs to know about the cluster for one resource."""

    jobs: list[JobFact] = field(default_factory=list)  # this resource's build Jobs
    pods: dict[str, PodFact] = field(default_factory=dict)  # build Pod outcome by Job name
    deployments: dict[str, DeploymentFact] = field(default_factory=dict)  # by variant, and "canary" / "candidate"
    service_pool: str | None = None  # traffic pool the stable Service selects now (None: no Service)
    shared: dict[str, SharedArtifact] = field(default_factory=dict)  # by variant
