"""Observed facts: the small, immutable summaries of child objects the planner decides from.

The kopf indexes keep these (not whole bodies), so memory stays flat with hundreds of resources and
the planner's inputs are plain values that unit tests can write by hand.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

from ..render import cache_jobs, names
from ..render.placement import Node
from .fingerprints import owned_content, owned_fields

JobState = Literal["Running", "Succeeded", "Failed"]

ANNOTATION_ATTEMPT = f"{names.DOMAIN}/attempt"
ANNOTATION_ARTIFACT = f"{names.DOMAIN}/artifact"
ANNOTATION_RETRY_TOKEN = f"{names.DOMAIN}/retry-token"  # retry-build annotation value a Job was created under
ANNOTATION_CACHE_CLAIM = f"{names.DOMAIN}/cache-claim"
ANNOTATION_REPORTED = f"{names.DOMAIN}/reported"  # a collection Job whose outcome was posted as an Event
JOB_NAME_LABELS = ("batch.kubernetes.io/job-name", "job-name")
#: Job condition reason when a podFailurePolicy FailJob rule ended the Job, and the Job controller's
#: message ("Container build for pod ns/p failed with exit code 2 matching FailJob rule at index 0")
REASON_POD_FAILURE_POLICY = "PodFailurePolicy"
_FAIL_JOB_EXIT_CODE = re.compile(r"failed with exit code (\d+) matching FailJob rule")


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
    #: the exit code when the build Job's podFailurePolicy failed it (a code no retry can fix), else None
    final_exit_code: int | None = None
    #: the Job collected unreferenced engines before building (the retry after an out-of-disk failure)
    collected: bool = False

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
            final_exit_code=_fail_job_exit_code(reason, message),
            collected=labels.get(cache_jobs.LABEL_VERB) == cache_jobs.VERB_BEFORE_BUILD,
        )


def _fail_job_exit_code(reason: str, message: str) -> int | None:
    if reason != REASON_POD_FAILURE_POLICY:
        return None
    m = _FAIL_JOB_EXIT_CODE.search(message)
    return int(m.group(1)) if m else None


def _cache_claim(body: Mapping[str, Any]) -> str:
    volumes = body.get("spec", {}).get("template", {}).get("spec", {}).get("volumes") or []
    for vol in volumes:
        if vol.get("name") == "cache":
            return str((vol.get("persistentVolumeClaim") or {}).get("claimName", ""))
    return ""


@dataclass(frozen=True)
class PodFact:
    """A build Pod's outcome: the termination message its container wrote (reason + stderr tail)."""

    job: str
    phase: str
    message: str
    started: str = ""
    ip: str = ""  # where a running training pod serves its progress

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> "PodFact":
        labels = _labels(body)
        job = next((labels[k] for k in JOB_NAME_LABELS if labels.get(k)), "")
        if not job:
            job = next(
                (
                    r.get("name", "")
                    for r in body.get("metadata", {}).get("ownerReferences") or []
                    if r.get("kind") == "Job"
                ),
                "",
            )
        status = body.get("status") or {}
        message = ""
        for cs in status.get("containerStatuses") or []:
            term = (cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get("terminated") or {}
            if term.get("message") or term.get("reason"):
                message = (term.get("message") or term.get("reason") or "").strip()
                if term.get("exitCode", 0) != 0:
                    break
        return cls(
            job=job,
            phase=status.get("phase", ""),
            message=message,
            started=body.get("metadata", {}).get("creationTimestamp", ""),
            ip=status.get("podIP", ""),
        )


#: container waiting reasons the kubelet writes when a container cannot start (pkg/kubelet/images/types.go,
#: pkg/kubelet/kuberuntime/kuberuntime_container.go, pkg/kubelet/container/sync_result.go at Kubernetes
#: v1.30); ContainerCreating / PodInitializing are the normal way up and are not failures
FAILED_WAITING = (
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
    "CrashLoopBackOff",
)


@dataclass(frozen=True)
class ServingPodFact:
    """A serving Pod, and why it cannot serve when the scheduler or the kubelet says so.

    ``reason``/``message`` are empty for a Pod on its normal way up (scheduled, pulling, loading the
    engine); a failure is what the scheduler (PodScheduled=False, Unschedulable) or the kubelet
    (a container waiting for one of :data:`FAILED_WAITING`, or last killed for memory) wrote.
    """

    name: str
    owner: str  # LABEL_DEPLOYMENT value
    variant: str
    role: str
    ready: bool
    reason: str = ""
    message: str = ""
    #: the Pod as the metrics readers need it (name, uid, labels, IP, phase, conditions, container starts):
    #: the speculation monitor scrapes from the index instead of listing Pods. Compared (kopf keeps an index
    #: value only when it differs from the stored one, so a new podIP must make the fact differ).
    pod: Mapping[str, Any] = field(default_factory=dict, hash=False, repr=False)

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> "ServingPodFact":
        labels = _labels(body)
        status = body.get("status") or {}
        conditions = {c.get("type"): c for c in status.get("conditions") or []}
        ready = (conditions.get("Ready") or {}).get("status") == "True"
        reason, message = ("", "") if ready else _pod_failure(status, conditions)
        meta = body.get("metadata", {})
        pod = {
            "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "labels", "deletionTimestamp") if k in meta},
            "status": {
                k: status[k] for k in ("phase", "podIP", "startTime", "conditions", "containerStatuses") if k in status
            },
        }
        return cls(
            name=meta.get("name", ""),
            owner=labels.get(names.LABEL_DEPLOYMENT, ""),
            variant=labels.get(names.LABEL_VARIANT, ""),
            role=labels.get(names.LABEL_ROLE, ""),
            ready=ready,
            reason=reason,
            message=message,
            pod=pod,
        )


def _pod_failure(status: Mapping[str, Any], conditions: Mapping[str, Mapping[str, Any]]) -> tuple[str, str]:
    """(reason, message) of a Pod that is not Ready because something failed, ("", "") otherwise."""
    scheduled = conditions.get("PodScheduled") or {}
    if scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
        return "Unschedulable", scheduled.get("message") or "no node can run the pod"
    for cs in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        name = cs.get("name", "")
        state, last = cs.get("state") or {}, (cs.get("lastState") or {}).get("terminated") or {}
        term = state.get("terminated") or {}
        waiting = state.get("waiting") or {}
        restarts = int(cs.get("restartCount") or 0)
        if term.get("reason") == "OOMKilled" or (last.get("reason") == "OOMKilled" and not cs.get("ready")):
            code = (term or last).get("exitCode", 137)
            return "OOMKilled", (
                f"container {name} was killed for exceeding its memory limit (OOMKilled, exit code "
                f"{code}), restarted {restarts} times"
            )
        if waiting.get("reason") in FAILED_WAITING:
            detail = waiting.get("message") or ""
            if waiting["reason"] == "CrashLoopBackOff" and last:
                detail = _exited(name, last, restarts) + (f"; {detail}" if detail else "")
            return waiting["reason"], detail or f"container {name} is waiting: {waiting['reason']}"
        if last.get("exitCode") and restarts and not cs.get("ready"):
            # between two back-offs the kubelet runs the container again (state running, not Ready): the
            # same crash loop, not a recovery, until the container stays up and gets Ready
            return "CrashLoopBackOff", _exited(name, last, restarts)
    return "", ""


def _exited(container: str, last: Mapping[str, Any], restarts: int) -> str:
    why = (last.get("message") or last.get("reason") or "").strip()
    return (
        f"container {container} exited with code {last.get('exitCode')}"
        + (f" ({why})" if why else "")
        + f", restarted {restarts} times"
    )


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
    owned_content: str = ""  # see owned_content()
    failure_reason: str = ""  # ReplicaFailure=True or Progressing=False ProgressDeadlineExceeded
    failure_message: str = ""

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> "DeploymentFact":
        meta = body.get("metadata", {})
        status = body.get("status") or {}
        spec_replicas = (body.get("spec") or {}).get("replicas")
        failure_reason, failure_message = _deployment_failure(status)
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
            owned_content=owned_content(body),
            failure_reason=failure_reason,
            failure_message=failure_message,
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


def _deployment_failure(status: Mapping[str, Any]) -> tuple[str, str]:
    """What the Deployment controller reports as stuck (pkg/controller/deployment/util/deployment_util.go,
    Kubernetes v1.30): ReplicaFailure=True (the ReplicaSet's FailedCreate: admission, quota, Pod Security)
    or Progressing=False with reason ProgressDeadlineExceeded."""
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    failure = conditions.get("ReplicaFailure") or {}
    if failure.get("status") == "True":
        return failure.get("reason") or "ReplicaFailure", failure.get("message") or ""
    progressing = conditions.get("Progressing") or {}
    if progressing.get("status") == "False" and progressing.get("reason") == "ProgressDeadlineExceeded":
        return "ProgressDeadlineExceeded", progressing.get("message") or ""
    return "", ""


@dataclass(frozen=True)
class ObjectFact:
    """Any other child (ConfigMap, Service, NetworkPolicy, InferencePool): what the operator owns of it and, for
    what selects serving pods (a Service's ``selector``, an InferencePool's ``selector.matchLabels``), the traffic
    pool."""

    kind: str
    name: str
    owned_fields: str = ""  # see owned_fields()
    resource_version: str = ""
    pool: str = ""
    owned_content: str = ""  # see owned_content()

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> "ObjectFact":
        selector = (body.get("spec") or {}).get("selector") or {}
        if isinstance(selector, dict) and isinstance(selector.get("matchLabels"), dict):
            selector = selector["matchLabels"]
        return cls(
            kind=body.get("kind", ""),
            name=body.get("metadata", {}).get("name", ""),
            owned_fields=owned_fields(body),
            resource_version=body.get("metadata", {}).get("resourceVersion", ""),
            pool=selector.get(names.LABEL_TRAFFIC, "") if isinstance(selector, dict) else "",
            owned_content=owned_content(body),
        )


@dataclass(frozen=True)
class RunJobFact:
    """A validation or cache-collection Job: whether and how it finished, and whether
    the operator already reported its outcome (the ``redrafter.dev/reported`` annotation)."""

    name: str
    namespace: str
    owner: str  # LABEL_DEPLOYMENT value (validation Jobs)
    claim: str  # the cache-claim label value (collection Jobs)
    verb: str  # the cache-verb label value (collection Jobs)
    result: tuple[str, str] | None  # ("Complete" | "Failed", reason) once finished
    reported: bool = False

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> "RunJobFact":
        labels, meta = _labels(body), body.get("metadata", {})
        result = None
        for cond in (body.get("status") or {}).get("conditions") or []:
            if cond.get("type") in ("Complete", "Failed") and cond.get("status") == "True":
                result = (str(cond["type"]), str(cond.get("reason") or cond["type"]))
                break
        return cls(
            name=meta.get("name", ""),
            namespace=meta.get("namespace", ""),
            owner=labels.get(names.LABEL_DEPLOYMENT, ""),
            claim=labels.get(cache_jobs.LABEL_CLAIM, ""),
            verb=labels.get(cache_jobs.LABEL_VERB, ""),
            result=result,
            reported=bool(_annotations(body).get(ANNOTATION_REPORTED)),
        )


@dataclass(frozen=True)
class RunPodFact:
    """A validation or collection Job's Pod: the termination message of each container (its verdict or report)."""

    job: str
    name: str
    created: str
    messages: Mapping[str, str]  # container name -> terminated.message (init containers included)

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> "RunPodFact":
        meta, status, labels = body.get("metadata", {}), body.get("status") or {}, _labels(body)
        job = next((labels[k] for k in JOB_NAME_LABELS if labels.get(k)), "")
        messages = {}
        for cs in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
            term = (cs.get("state") or {}).get("terminated") or {}
            if term.get("message"):
                messages[str(cs.get("name", ""))] = str(term["message"])
        return cls(job=job, name=meta.get("name", ""), created=meta.get("creationTimestamp", ""), messages=messages)


@dataclass(frozen=True)
class SharedArtifact:
    """What the namespace knows about one artifact (claim + path), from any resource's Jobs or status."""

    ready_by: str = ""  # a succeeded Job or a resource whose status shows the engine Ready
    building_job: str = ""  # a Job (any owner) currently building it
    built_message: str = ""  # termination message of the succeeded Job's Pod (size and built-at)


@dataclass
class Observed:
    """Everything the planner needs to know about the cluster for one resource."""

    jobs: list[JobFact] = field(default_factory=list)  # this resource's build Jobs
    pods: dict[str, PodFact] = field(default_factory=dict)  # build Pod outcome by Job name
    deployments: dict[str, DeploymentFact] = field(default_factory=dict)  # by variant, and "canary" / "candidate"
    serving_pods: list[ServingPodFact] = field(default_factory=list)  # this resource's serving Pods
    service_pool: str | None = None  # traffic pool the stable Service selects now (None: no Service)
    routing_pool: str | None = None  # traffic pool the InferencePool <name> selects now (None: none observed)
    routing_api_missing: bool = False  # the InferencePool write found no such API (its CRD is not installed)
    #: the children whose apply the API server refused for good this step (invalid, forbidden): "Kind name: why".
    #: A same-named object the operator does not own, whose fields the apply cannot merge with, is the usual cause.
    refused: list[str] = field(default_factory=list)
    shared: dict[str, SharedArtifact] = field(default_factory=dict)  # by variant
    #: Deployment name -> hash of the manifest the observed object is known to carry (the applier's last
    #: server-side apply, once the watch shows its result and nobody changed the operator's fields since);
    #: "" = not known to carry one. A name left out is not tracked and taken as current.
    applied: dict[str, str] = field(default_factory=dict)
    #: validation Jobs of this resource by name, and the newest Pod of each (its verdict)
    validation_jobs: dict[str, RunJobFact] = field(default_factory=dict)
    validation_pods: dict[str, RunPodFact] = field(default_factory=dict)
    #: the cluster's nodes, for the placement check before a GPU Job is created (None: not watched, so
    #: not checked: the operator runs with the check off, e.g. on a cluster whose GPU nodes scale from zero)
    nodes: tuple[Node, ...] | None = None
