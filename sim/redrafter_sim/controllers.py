"""The built-in controllers the emulated API server lacks, played on demand by tests and the demo.

Job controller (a Job finishes: conditions, counts, and a Pod carrying the termination message),
Deployment controller + kubelet (Pods per replica, Ready, podIP; Deployment status), Endpoints
controller (Ready Pods behind a Service). They write straight into the emulator object (thread-safe, and
not in its HTTP request log, so write counts in tests only see the operator).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import hashlib
import json
from collections.abc import Iterator
from typing import Any

from .apiserver import ApiError, ApiServerEmulator
from .endpoints import endpoints_for
from .objects import condition_true

JOB_NAME_LABELS = ("job-name", "batch.kubernetes.io/job-name")
JOB_UID_LABELS = ("controller-uid", "batch.kubernetes.io/controller-uid")
TEMPLATE_HASH = "pod-template-hash"


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _owner_ref(obj: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}


def _condition(ctype: str, status: str, reason: str = "", message: str = "") -> dict[str, Any]:
    now = _now()
    return {"type": ctype, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": now, "lastProbeTime": now, "lastUpdateTime": now}


def _keep_transitions(old: list[dict[str, Any]] | None, new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Conditions whose status did not change keep their timestamps, so a repeated pass writes nothing."""
    previous = {c.get("type"): c for c in old or []}
    result = []
    for cond in new:
        before = previous.get(cond["type"])
        if before is not None and before.get("status") == cond["status"] and before.get("reason") == cond["reason"]:
            cond = {**cond, **{k: before[k] for k in ("lastTransitionTime", "lastProbeTime", "lastUpdateTime")
                               if k in before}}
        result.append(cond)
    return result


def template_hash(template: dict[str, Any]) -> str:
    """A stable short hash of a pod template (what the Deployment controller puts on its Pods)."""
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]


def pod_ip(uid: str) -> str:
    """A deterministic address in 10.244.0.0/16 for a Pod uid."""
    digest = hashlib.sha256(uid.encode()).digest()
    return f"10.244.{digest[0]}.{max(digest[1], 1)}"


# ----------------------------------------------------------------------------- Jobs


def _job_pod(emu: ApiServerEmulator, job: dict[str, Any], phase: str, exit_code: int | None,
             message: str | None) -> dict[str, Any]:
    """Create (or update) the Job's single Pod with a terminated or running container state."""
    name, namespace = job["metadata"]["name"], job["metadata"]["namespace"]
    template = (job.get("spec") or {}).get("template") or {}
    labels = {**((template.get("metadata") or {}).get("labels") or {}),
              **{k: name for k in JOB_NAME_LABELS}, **{k: job["metadata"]["uid"] for k in JOB_UID_LABELS}}
    pod_name = f"{name}-{job['metadata']['uid'][:5]}"
    pod = emu.find_object("v1", "Pod", pod_name, namespace)
    if pod is None:
        pod = emu.create_object({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod_name, "namespace": namespace, "labels": labels,
                         "ownerReferences": [_owner_ref(job)]},
            "spec": {**(template.get("spec") or {}), "nodeName": "sim-node"},
        })
    containers = (pod.get("spec") or {}).get("containers") or [{"name": "main", "image": ""}]
    if exit_code is None:
        state: dict[str, Any] = {"running": {"startedAt": _now()}}
    else:
        state = {"terminated": {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error",
                                "startedAt": _now(), "finishedAt": _now()}}
        if message is not None:
            state["terminated"]["message"] = message
    statuses = [{"name": c["name"], "image": c.get("image", ""), "ready": exit_code is None, "restartCount": 0,
                 "state": state if i == 0 else {"terminated": {"exitCode": 0, "reason": "Completed"}}}
                for i, c in enumerate(containers)]
    status = {"phase": phase, "podIP": pod_ip(pod["metadata"]["uid"]), "startTime": _now(),
              "containerStatuses": statuses}
    return emu.patch_object("v1", "Pod", pod_name, namespace, {"status": status}, subresource="status")


def start_job(emu: ApiServerEmulator, name: str, namespace: str) -> dict[str, Any]:
    """The Job's Pod is running: status.active=1, startTime, a Running Pod."""
    job = emu.get_object("batch/v1", "Job", name, namespace)
    _job_pod(emu, job, "Running", None, None)
    return emu.patch_object("batch/v1", "Job", name, namespace,
                            {"status": {"active": 1, "startTime": _now()}}, subresource="status")


def complete_job(emu: ApiServerEmulator, name: str, namespace: str, *, message: str = "") -> dict[str, Any]:
    """The Job succeeded: Complete (and SuccessCriteriaMet) conditions, succeeded=1, a Succeeded Pod
    whose first container terminated with exit code 0 and ``message`` as its termination message."""
    job = emu.get_object("batch/v1", "Job", name, namespace)
    _job_pod(emu, job, "Succeeded", 0, message)
    status = {
        "active": 0, "succeeded": 1, "failed": 0, "ready": 0, "startTime": (job.get("status") or {}).get(
            "startTime", _now()), "completionTime": _now(),
        "conditions": [_condition("SuccessCriteriaMet", "True", "CompletionsReached", "Reached expected number of "
                                  "succeeded pods"),
                       _condition("Complete", "True", "CompletionsReached", "Reached expected number of "
                                  "succeeded pods")],
    }
    return emu.patch_object("batch/v1", "Job", name, namespace, {"status": status}, subresource="status")


def fail_job(emu: ApiServerEmulator, name: str, namespace: str, *, reason: str = "BackoffLimitExceeded",
             message: str = "Job has reached the specified backoff limit", exit_code: int = 1,
             termination_message: str | None = None) -> dict[str, Any]:
    """The Job failed: FailureTarget and Failed conditions with ``reason``/``message``, failed=1, and a Failed
    Pod whose container terminated with ``exit_code`` and ``termination_message``."""
    job = emu.get_object("batch/v1", "Job", name, namespace)
    _job_pod(emu, job, "Failed", exit_code, termination_message)
    status = {
        "active": 0, "succeeded": 0, "failed": 1, "ready": 0,
        "startTime": (job.get("status") or {}).get("startTime", _now()),
        "conditions": [_condition("FailureTarget", "True", reason, message),
                       _condition("Failed", "True", reason, message)],
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
        "phase": "Running", "podIP": pod_ip(pod["metadata"]["uid"]),
        "podIPs": [{"ip": pod_ip(pod["metadata"]["uid"])}], "hostIP": "192.168.0.10", "startTime": _now(),
        "conditions": [_condition(t, "True" if (ready or t == "PodScheduled") else "False")
                       for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")],
        "containerStatuses": [{"name": c["name"], "image": c.get("image", ""), "ready": ready, "restartCount": 0,
                               "started": True, "state": {"running": {"startedAt": _now()}}} for c in containers],
    }
    return emu.patch_object("v1", "Pod", pod["metadata"]["name"], pod["metadata"]["namespace"], {"status": status},
                            subresource="status")


def is_pod_ready(pod: dict[str, Any]) -> bool:
    return condition_true(pod, "Ready")


def sync_deployment_pods(emu: ApiServerEmulator, name: str, namespace: str, *, ready: bool = True,
                         max_ready: int | None = None) -> list[dict[str, Any]]:
    """Make the Deployment's Pods match spec.replicas and its current template (old-template Pods are
    replaced), mark up to ``max_ready`` of them Ready (all if None), and write the Deployment status."""
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
    taken = {p["metadata"]["name"] for p in pods}
    index = 0
    while len(pods) < replicas:
        pod_name = f"{name}-{current_hash[:8]}-{index}"
        index += 1
        if pod_name in taken:
            continue
        labels = {**((template.get("metadata") or {}).get("labels") or {}), TEMPLATE_HASH: current_hash}
        pods.append(emu.create_object({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod_name, "namespace": namespace, "labels": labels,
                         "annotations": (template.get("metadata") or {}).get("annotations") or {},
                         "ownerReferences": [_owner_ref(deploy)]},
            "spec": {**(template.get("spec") or {}), "nodeName": "sim-node"},
        }))
    limit = len(pods) if max_ready is None else max_ready
    pods = [_set_pod_ready(emu, p, ready and i < limit) for i, p in enumerate(pods)]
    ready_count = sum(1 for p in pods if is_pod_ready(p))
    mark_deployment_ready(emu, name, namespace, ready_replicas=ready_count)
    return pods


def mark_deployment_ready(emu: ApiServerEmulator, name: str, namespace: str, *,
                          ready_replicas: int | None = None) -> dict[str, Any]:
    """Deployment status as its controller would write it once ``ready_replicas`` (default: all) are up."""
    deploy = emu.get_object("apps/v1", "Deployment", name, namespace)
    replicas = (deploy.get("spec") or {}).get("replicas", 1)
    ready = replicas if ready_replicas is None else ready_replicas
    available = ready >= replicas
    status = {
        "observedGeneration": deploy["metadata"].get("generation", 1),
        "replicas": replicas, "updatedReplicas": replicas, "readyReplicas": ready, "availableReplicas": ready,
        "unavailableReplicas": max(replicas - ready, 0),
        "conditions": _keep_transitions((deploy.get("status") or {}).get("conditions"), [
            _condition("Available", "True" if available else "False",
                       "MinimumReplicasAvailable" if available else "MinimumReplicasUnavailable",
                       "Deployment has minimum availability." if available else
                       "Deployment does not have minimum availability."),
            _condition("Progressing", "True", "NewReplicaSetAvailable" if available else "ReplicaSetUpdated",
                       f'ReplicaSet "{name}" has successfully progressed.'),
        ]),
    }
    return emu.patch_object("apps/v1", "Deployment", name, namespace, {"status": status}, subresource="status")


# ----------------------------------------------------------------------------- Services


def sync_endpoints(emu: ApiServerEmulator, service: str, namespace: str) -> dict[str, Any]:
    """Write the Service's Endpoints as the simulated node's endpoints controller computes them."""
    svc = emu.get_object("v1", "Service", service, namespace)
    body = endpoints_for(svc, emu.list_objects("v1", "Pod", namespace))
    if emu.find_object("v1", "Endpoints", service, namespace) is None:
        return emu.create_object(body)
    return emu.patch_object("v1", "Endpoints", service, namespace,
                            {"subsets": body["subsets"], "metadata": {"labels": body["metadata"]["labels"]}})


def ready_endpoint_ips(emu: ApiServerEmulator, service: str, namespace: str) -> list[str]:
    """IPs of the Ready addresses currently behind a Service (empty if it has no Endpoints)."""
    ep = emu.find_object("v1", "Endpoints", service, namespace)
    return [a["ip"] for s in (ep or {}).get("subsets") or [] for a in s.get("addresses") or []]


# ----------------------------------------------------------------------------- all together


def reconcile_once(emu: ApiServerEmulator, namespace: str | None = None, *, pods_ready: bool = True) -> None:
    """One pass of the Deployment and Endpoints controllers over every Deployment and Service; one deleted
    while the pass runs is skipped, as a real controller drops a key whose object is gone."""
    for deploy in emu.list_objects("apps/v1", "Deployment", namespace):
        if not deploy["metadata"].get("deletionTimestamp"):
            with _unless_gone():
                sync_deployment_pods(emu, deploy["metadata"]["name"], deploy["metadata"]["namespace"],
                                     ready=pods_ready)
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


async def run_controllers(emu: ApiServerEmulator, stop: asyncio.Event, interval: float = 0.2,
                          namespace: str | None = None) -> None:
    """Run ``reconcile_once`` every ``interval`` seconds until ``stop`` is set (for the demo)."""
    while not stop.is_set():
        reconcile_once(emu, namespace)
        try:
            await asyncio.wait_for(stop.wait(), interval)
        except TimeoutError:
            pass
