"""The built-in controllers the emulated API server lacks, played on demand by tests and the demo.

Job controller (a Job finishes: conditions, counts, and a Pod carrying the termination message),
Deployment controller + kubelet (Pods per replica, Ready, podIP; Deployment status), Endpoints
controller (Ready Pods behind a Service), and the CronJob controller (:mod:`.cronjobs`, Jobs on
schedule, with an injectable clock). They write straight into the emulator object (thread-safe, and
not in its HTTP request log, so write counts in tests only see the operator).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import hashlib
import json
from collections.abc import Iterator
from typing import Any, Mapping

from . import podfailurepolicy
from .apiserver import ApiError, ApiServerEmulator
from .cronjobs import CronJobController
from .endpoints import endpoints_for
from .failures import POD_CAUSES, Fault, pod_status, progress_deadline_exceeded, replica_failure
from .objects import condition_true, failed_create_event, pod_ip, replica_failure_condition

JOB_NAME_LABELS = ("job-name", "batch.kubernetes.io/job-name")
JOB_UID_LABELS = ("controller-uid", "batch.kubernetes.io/controller-uid")
TEMPLATE_HASH = "pod-template-hash"


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _owner_ref(obj: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _condition(ctype: str, status: str, reason: str = "", message: str = "") -> dict[str, Any]:
    now = _now()
    return {
        "type": ctype,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": now,
        "lastProbeTime": now,
        "lastUpdateTime": now,
    }


def _keep_transitions(old: list[dict[str, Any]] | None, new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Conditions whose status did not change keep their timestamps, so a repeated pass writes nothing."""
    previous = {c.get("type"): c for c in old or []}
    result = []
    for cond in new:
        before = previous.get(cond["type"])
        if before is not None and before.get("status") == cond["status"] and before.get("reason") == cond["reason"]:
            cond = {
                **cond,
                **{k: before[k] for k in ("lastTransitionTime", "lastProbeTime", "lastUpdateTime") if k in before},
            }
        result.append(cond)
    return result


def template_hash(template: dict[str, Any]) -> str:
    """A stable short hash of a pod template (what the Deployment controller puts on its Pods)."""
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]


# ----------------------------------------------------------------------------- Jobs


def _create_pod(emu: ApiServerEmulator, owner: dict[str, Any], component: str, pod: dict[str, Any]) -> dict[str, Any]:
    """Create a controller's Pod; a rejection (PodSecurity: 403) becomes a FailedCreate Event on the owner
    and is raised again, as the real controller's sync fails."""
    try:
        return emu.create_object(pod)
    except ApiError as exc:
        if exc.code == 403:
            _record(emu, failed_create_event(owner, exc.message, component))
        raise


def _record(emu: ApiServerEmulator, event: dict[str, Any]) -> None:
    """Post ``event``, or count it on the same earlier one (the event recorder's aggregation)."""
    for seen in emu.list_objects("v1", "Event", event["metadata"]["namespace"]):
        if (
            all(seen.get(k) == event[k] for k in ("reason", "message"))
            and seen["involvedObject"].get("uid") == event["involvedObject"]["uid"]
        ):
            emu.patch_object(
                "v1",
                "Event",
                seen["metadata"]["name"],
                seen["metadata"]["namespace"],
                {"count": int(seen.get("count") or 1) + 1, "lastTimestamp": event["lastTimestamp"]},
            )
            return
    emu.create_object(event)


def _job_pod(
    emu: ApiServerEmulator, job: dict[str, Any], phase: str, exit_code: int | None, message: str | None
) -> dict[str, Any]:
    """Create (or update) the Job's single Pod with a terminated or running container state."""
    name, namespace = job["metadata"]["name"], job["metadata"]["namespace"]
    template = (job.get("spec") or {}).get("template") or {}
    labels = {
        **((template.get("metadata") or {}).get("labels") or {}),
        **{k: name for k in JOB_NAME_LABELS},
        **{k: job["metadata"]["uid"] for k in JOB_UID_LABELS},
    }
    pod_name = f"{name}-{job['metadata']['uid'][:5]}"
    pod = emu.find_object("v1", "Pod", pod_name, namespace)
    if pod is None:
        pod = _create_pod(
            emu,
            job,
            "job-controller",
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": pod_name,
                    "namespace": namespace,
                    "labels": labels,
                    "ownerReferences": [_owner_ref(job)],
                },
                "spec": {**(template.get("spec") or {}), "nodeName": "sim-node"},
            },
        )
    containers = (pod.get("spec") or {}).get("containers") or [{"name": "main", "image": ""}]
    if exit_code is None:
        state: dict[str, Any] = {"running": {"startedAt": _now()}}
    else:
        state = {
            "terminated": {
                "exitCode": exit_code,
                "reason": "Completed" if exit_code == 0 else "Error",
                "startedAt": _now(),
                "finishedAt": _now(),
            }
        }
        if message is not None:
            state["terminated"]["message"] = message
    statuses = [
        {
            "name": c["name"],
            "image": c.get("image", ""),
            "ready": exit_code is None,
            "restartCount": 0,
            "state": state if i == 0 else {"terminated": {"exitCode": 0, "reason": "Completed"}},
        }
        for i, c in enumerate(containers)
    ]
    status = {
        "phase": phase,
        "podIP": pod_ip(pod["metadata"]["uid"]),
        "startTime": _now(),
        "containerStatuses": statuses,
    }
    return emu.patch_object("v1", "Pod", pod_name, namespace, {"status": status}, subresource="status")


def start_job(emu: ApiServerEmulator, name: str, namespace: str) -> dict[str, Any]:
    """The Job's Pod is running: status.active=1, startTime, a Running Pod."""
    job = emu.get_object("batch/v1", "Job", name, namespace)
    _job_pod(emu, job, "Running", None, None)
    return emu.patch_object(
        "batch/v1", "Job", name, namespace, {"status": {"active": 1, "startTime": _now()}}, subresource="status"
    )


def complete_job(emu: ApiServerEmulator, name: str, namespace: str, *, message: str = "") -> dict[str, Any]:
    """The Job succeeded: Complete (and SuccessCriteriaMet) conditions, succeeded=1, a Succeeded Pod
    whose first container terminated with exit code 0 and ``message`` as its termination message."""
    job = emu.get_object("batch/v1", "Job", name, namespace)
    _job_pod(emu, job, "Succeeded", 0, message)
    status = {
        "active": 0,
        "succeeded": 1,
        "failed": 0,
        "ready": 0,
        "startTime": (job.get("status") or {}).get("startTime", _now()),
        "completionTime": _now(),
        "conditions": [
            _condition("SuccessCriteriaMet", "True", "CompletionsReached", "Reached expected number of succeeded pods"),
            _condition("Complete", "True", "CompletionsReached", "Reached expected number of succeeded pods"),
        ],
    }
    return emu.patch_object("batch/v1", "Job", name, namespace, {"status": status}, subresource="status")


def fail_job(
    emu: ApiServerEmulator,
    name: str,
    namespace: str,
    *,
    reason: str = "BackoffLimitExceeded",
    message: str = "Job has reached the specified backoff limit",
    exit_code: int = 1,
    termination_message: str | None = None,
) -> dict[str, Any]:
    """The Job failed: FailureTarget and Failed conditions with ``reason``/``message``, failed=1, and a Failed
    Pod whose container terminated with ``exit_code`` and ``termination_message``.

    As the real Job controller, the Job's podFailurePolicy decides first: an exit code one of its FailJob
    rules matches fails the Job with reason PodFailurePolicy and the controller's message, whatever
    ``reason`` says (a Job with that policy cannot end any other way for that code)."""
    job = emu.get_object("batch/v1", "Job", name, namespace)
    pod = _job_pod(emu, job, "Failed", exit_code, termination_message)
    action, why = podfailurepolicy.match(job, pod)
    if action == podfailurepolicy.FAIL_JOB:
        reason, message = podfailurepolicy.REASON, why
    status = {
        "active": 0,
        "succeeded": 0,
        "failed": 1,
        "ready": 0,
        "startTime": (job.get("status") or {}).get("startTime", _now()),
        "conditions": [
            _condition("FailureTarget", "True", reason, message),
            _condition("Failed", "True", reason, message),
        ],
    }
    return emu.patch_object("batch/v1", "Job", name, namespace, {"status": status}, subresource="status")


# ----------------------------------------------------------------------------- Deployments and Pods


def _deployment_pods(emu: ApiServerEmulator, deploy: dict[str, Any]) -> list[dict[str, Any]]:
    uid = deploy["metadata"]["uid"]
    pods = emu.list_objects("v1", "Pod", deploy["metadata"]["namespace"])
    return [p for p in pods if any(r.get("uid") == uid for r in p["metadata"].get("ownerReferences") or [])]


def _set_pod_ready(emu: ApiServerEmulator, pod: dict[str, Any], ready: bool) -> dict[str, Any]:
    if (pod.get("status") or {}).get("podIP") and is_pod_ready(pod) == ready:
        return pod  # already in the wanted state: no write
    containers = (pod.get("spec") or {}).get("containers") or []
    status = {
        "phase": "Running",
        "podIP": pod_ip(pod["metadata"]["uid"]),
        "podIPs": [{"ip": pod_ip(pod["metadata"]["uid"])}],
        "hostIP": "192.168.0.10",
        "startTime": _now(),
        "conditions": [
            _condition(t, "True" if (ready or t == "PodScheduled") else "False")
            for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
        ],
        "containerStatuses": [
            {
                "name": c["name"],
                "image": c.get("image", ""),
                "ready": ready,
                "restartCount": 0,
                "started": True,
                "state": {"running": {"startedAt": _now()}},
            }
            for c in containers
        ],
    }
    return emu.patch_object(
        "v1", "Pod", pod["metadata"]["name"], pod["metadata"]["namespace"], {"status": status}, subresource="status"
    )


def is_pod_ready(pod: dict[str, Any]) -> bool:
    return condition_true(pod, "Ready")


def _fault_signature(status: dict[str, Any]) -> tuple[Any, ...]:
    """What distinguishes one failure shape from another (a repeated pass over the same fault writes nothing)."""
    cs = (status.get("containerStatuses") or [{}])[0]
    sched = next((c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), {})
    return (
        status.get("phase"),
        sched.get("status"),
        ((cs.get("state") or {}).get("waiting") or {}).get("reason"),
        ((cs.get("lastState") or {}).get("terminated") or {}).get("reason"),
    )


def _set_pod_failed(emu: ApiServerEmulator, pod: dict[str, Any], fault: Fault) -> dict[str, Any]:
    status = pod_status(pod, fault, pod_ip=pod_ip(pod["metadata"]["uid"]))
    if fault.cause == "Unschedulable":  # never bound to a node: no IPs, no container statuses
        status = {
            **status,
            "podIP": None,
            "podIPs": None,
            "hostIP": None,
            "hostIPs": None,
            "startTime": None,
            "containerStatuses": None,
        }
    if _fault_signature(pod.get("status") or {}) == _fault_signature(status):
        return pod
    return emu.patch_object(
        "v1", "Pod", pod["metadata"]["name"], pod["metadata"]["namespace"], {"status": status}, subresource="status"
    )


def sync_deployment_pods(
    emu: ApiServerEmulator,
    name: str,
    namespace: str,
    *,
    ready: bool = True,
    max_ready: int | None = None,
    fault: Fault | None = None,
    deadline_seconds: float | None = None,
) -> list[dict[str, Any]]:
    """Make the Deployment's Pods match spec.replicas and its current template (old-template Pods are
    replaced), mark up to ``max_ready`` of them Ready (all if None), and write the Deployment status.

    ``fault`` makes the current template's Pods fail as the scheduler/kubelet would report it, or (cause
    FailedCreate) the API server reject them; ``deadline_seconds`` overrides the Deployment's
    progressDeadlineSeconds (a test cannot wait ten minutes)."""
    deploy = emu.get_object("apps/v1", "Deployment", name, namespace)
    spec = deploy.get("spec") or {}
    replicas = spec.get("replicas", 1)
    template = spec.get("template") or {}
    current_hash = template_hash(template)
    pods = _deployment_pods(emu, deploy)
    for pod in pods:
        if pod["metadata"].get("labels", {}).get(TEMPLATE_HASH) != current_hash:
            emu.delete_object("v1", "Pod", pod["metadata"]["name"], namespace)
    pods = [p for p in _deployment_pods(emu, deploy) if p["metadata"]["labels"].get(TEMPLATE_HASH) == current_hash]
    pods.sort(key=lambda p: p["metadata"]["name"])
    for extra in pods[replicas:]:
        emu.delete_object("v1", "Pod", extra["metadata"]["name"], namespace)
    pods = pods[:replicas]
    failure: str | None = None  # why admission rejected a Pod (the ReplicaSet's ReplicaFailure)
    taken = {p["metadata"]["name"] for p in pods}
    index = 0
    while len(pods) < replicas:
        pod_name = f"{name}-{current_hash[:8]}-{index}"
        index += 1
        if pod_name in taken:
            continue
        if fault is not None and fault.cause == "FailedCreate":  # a quota admission says no: the Pod never exists
            failure = replica_failure(pod_name, fault.detail)["message"]
            break
        labels = {**((template.get("metadata") or {}).get("labels") or {}), TEMPLATE_HASH: current_hash}
        try:
            pods.append(
                _create_pod(
                    emu,
                    deploy,
                    "replicaset-controller",
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "metadata": {
                            "name": pod_name,
                            "namespace": namespace,
                            "labels": labels,
                            "annotations": (template.get("metadata") or {}).get("annotations") or {},
                            "ownerReferences": [_owner_ref(deploy)],
                        },
                        "spec": {**(template.get("spec") or {}), "nodeName": "sim-node"},
                    },
                )
            )
        except ApiError as exc:
            if exc.code != 403:
                raise
            failure = exc.message
            break
    limit = len(pods) if max_ready is None else max_ready
    if fault is not None and fault.cause in POD_CAUSES:
        pods = [_set_pod_failed(emu, p, fault) for p in pods]
    else:
        pods = [_set_pod_ready(emu, p, ready and i < limit) for i, p in enumerate(pods)]
    ready_count = sum(1 for p in pods if is_pod_ready(p))
    mark_deployment_ready(
        emu,
        name,
        namespace,
        ready_replicas=ready_count,
        existing=len(pods),
        failure=failure,
        deadline_seconds=deadline_seconds,
    )
    return pods


def _age_seconds(timestamp: str | None) -> float:
    if not timestamp:
        return 0.0
    then = datetime.datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
    return (datetime.datetime.now(datetime.UTC) - then).total_seconds()


def mark_deployment_ready(
    emu: ApiServerEmulator,
    name: str,
    namespace: str,
    *,
    ready_replicas: int | None = None,
    existing: int | None = None,
    failure: str | None = None,
    deadline_seconds: float | None = None,
) -> dict[str, Any]:
    """Deployment status as its controller would write it once ``ready_replicas`` (default: all) are up.

    ``failure``: why a Pod could not be created (condition ReplicaFailure, reason FailedCreate); a rollout
    that has not become available within the progress deadline gets Progressing=False ProgressDeadlineExceeded."""
    deploy = emu.get_object("apps/v1", "Deployment", name, namespace)
    spec = deploy.get("spec") or {}
    replicas = spec.get("replicas", 1)
    ready = replicas if ready_replicas is None else ready_replicas
    count = replicas if existing is None else existing
    available = ready >= replicas
    old_conditions = (deploy.get("status") or {}).get("conditions")
    progressing = _condition(
        "Progressing",
        "True",
        "NewReplicaSetAvailable" if available else "ReplicaSetUpdated",
        f'ReplicaSet "{name}-{template_hash(spec.get("template") or {})[:8]}" has '
        + ("successfully progressed." if available else "is progressing."),
    )
    if not available:
        deadline = deadline_seconds if deadline_seconds is not None else spec.get("progressDeadlineSeconds", 600)
        since = next((c for c in old_conditions or [] if c.get("type") == "Progressing"), {})
        if since.get("reason") == "ProgressDeadlineExceeded" or (
            since.get("reason") == "ReplicaSetUpdated" and _age_seconds(since.get("lastTransitionTime")) > deadline
        ):
            progressing = progress_deadline_exceeded(f"{name}-{template_hash(spec.get('template') or {})[:8]}")
    conditions = [
        _condition(
            "Available",
            "True" if available else "False",
            "MinimumReplicasAvailable" if available else "MinimumReplicasUnavailable",
            "Deployment has minimum availability." if available else "Deployment does not have minimum availability.",
        ),
        progressing,
    ]
    if failure:
        conditions.append(replica_failure_condition(failure))
    status = {
        "observedGeneration": deploy["metadata"].get("generation", 1),
        "replicas": count,
        "updatedReplicas": count,
        "readyReplicas": ready,
        "availableReplicas": ready,
        "unavailableReplicas": max(replicas - ready, 0),
        "conditions": _keep_transitions(old_conditions, conditions),
    }
    return emu.patch_object("apps/v1", "Deployment", name, namespace, {"status": status}, subresource="status")


# ----------------------------------------------------------------------------- Services


def sync_endpoints(emu: ApiServerEmulator, service: str, namespace: str) -> dict[str, Any]:
    """Write the Service's Endpoints as the simulated node's endpoints controller computes them."""
    svc = emu.get_object("v1", "Service", service, namespace)
    body = endpoints_for(svc, emu.list_objects("v1", "Pod", namespace))
    if emu.find_object("v1", "Endpoints", service, namespace) is None:
        return emu.create_object(body)
    return emu.patch_object(
        "v1",
        "Endpoints",
        service,
        namespace,
        {"subsets": body["subsets"], "metadata": {"labels": body["metadata"]["labels"]}},
    )


def ready_endpoint_ips(emu: ApiServerEmulator, service: str, namespace: str) -> list[str]:
    """IPs of the Ready addresses currently behind a Service (empty if it has no Endpoints)."""
    ep = emu.find_object("v1", "Endpoints", service, namespace)
    return [a["ip"] for s in (ep or {}).get("subsets") or [] for a in s.get("addresses") or []]


# ----------------------------------------------------------------------------- all together


def reconcile_once(
    emu: ApiServerEmulator,
    namespace: str | None = None,
    *,
    pods_ready: bool = True,
    faults: Mapping[str, Fault] | None = None,
    deadline_seconds: float | None = None,
    cronjobs: CronJobController | None = None,
) -> None:
    """One pass of the Deployment and Endpoints controllers over every Deployment and Service
    (``faults``: by Deployment name, see :func:`sync_deployment_pods`), and of ``cronjobs`` when given;
    one deleted while the pass runs is skipped, as a real controller drops a key whose object is gone."""
    if cronjobs is not None:
        cronjobs.sync()
    for deploy in emu.list_objects("apps/v1", "Deployment", namespace):
        if not deploy["metadata"].get("deletionTimestamp"):
            name = deploy["metadata"]["name"]
            with _unless_gone():
                sync_deployment_pods(
                    emu,
                    name,
                    deploy["metadata"]["namespace"],
                    ready=pods_ready,
                    fault=(faults or {}).get(name),
                    deadline_seconds=deadline_seconds,
                )
    for svc in emu.list_objects("v1", "Service", namespace):
        if (svc.get("spec") or {}).get("selector"):
            with _unless_gone():
                sync_endpoints(emu, svc["metadata"]["name"], svc["metadata"]["namespace"])


@contextlib.contextmanager
def _unless_gone() -> Iterator[None]:
    try:
        yield
    except KeyError:  # get_object of an object deleted since the list
        pass
    except ApiError as exc:
        if exc.code != 404:
            raise


async def run_controllers(
    emu: ApiServerEmulator, stop: asyncio.Event, interval: float = 0.2, namespace: str | None = None
) -> None:
    """Run ``reconcile_once`` every ``interval`` seconds until ``stop`` is set (``redrafter-sim server
    --controllers``), CronJobs on the real clock."""
    cronjobs = CronJobController(emu, namespace=namespace)
    while not stop.is_set():
        reconcile_once(emu, namespace, cronjobs=cronjobs)
        try:
            await asyncio.wait_for(stop.wait(), interval)
        except TimeoutError:
            pass
