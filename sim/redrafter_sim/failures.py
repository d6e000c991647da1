"""Serving failures as the real scheduler, kubelet and Deployment controller write them (Kubernetes 1.30).

The simulated controllers (:mod:`.controllers`) and the tests build failing Pods and Deployments from
these, so the operator reads exactly the shapes a cluster produces:

* scheduler: ``PodScheduled=False`` reason ``Unschedulable``, message from the framework's diagnosis
  (pkg/scheduler/framework/types.go FitError.Error: "0/N nodes are available: ..." then the
  preemption postfilter's "preemption: ..." text);
* kubelet: ``containerStatuses[].state.waiting`` reason ErrImagePull / ImagePullBackOff
  (pkg/kubelet/images/image_manager.go: 'Back-off pulling image "%s"'), CreateContainerConfigError
  (pkg/kubelet/kubelet_pods.go: 'secret "%s" not found' / 'configmap "%s" not found'), CrashLoopBackOff
  (pkg/kubelet/kuberuntime/kuberuntime_manager.go: "back-off %s restarting failed container=%s pod=%s",
  the pod formatted name_namespace(uid)) with the previous run in ``lastState.terminated`` (reason
  Error, or OOMKilled with exit code 137);
* Deployment controller (pkg/controller/deployment/util/deployment_util.go): ``ReplicaFailure=True``
  reason FailedCreate carrying the API server's rejection of the ReplicaSet's Pod (quota, Pod Security),
  and ``Progressing=False`` reason ProgressDeadlineExceeded, 'ReplicaSet "%s" has timed out progressing.'.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any, Literal, Mapping

PodCause = Literal[
    "Unschedulable", "ErrImagePull", "ImagePullBackOff", "CrashLoopBackOff", "OOMKilled", "CreateContainerConfigError"
]
DeploymentCause = Literal["FailedCreate"]
Cause = Literal[PodCause, DeploymentCause]
POD_CAUSES: tuple[str, ...] = PodCause.__args__  # type: ignore[attr-defined]

GPU_RESOURCE = "nvidia.com/gpu"


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Fault:
    """What goes wrong for a Deployment's Pods; ``detail`` is the cause-specific part of the message
    (the missing Secret, the image, the quota rejection); ``nodes`` the nodes the scheduler tried."""

    cause: Cause
    detail: str = ""
    nodes: int = 3
    restarts: int = 3


def unschedulable_message(nodes: int, resource: str = GPU_RESOURCE) -> str:
    return (
        f"0/{nodes} nodes are available: {nodes} Insufficient {resource}. preemption: 0/{nodes} nodes are "
        f"available: {nodes} No preemption victims found for incoming pod."
    )


def _container_status(
    container: Mapping[str, Any], state: dict[str, Any], *, restarts: int = 0, last: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "name": container["name"],
        "image": container.get("image", ""),
        "imageID": "",
        "ready": False,
        "restartCount": restarts,
        "started": False,
        "state": state,
        "lastState": last or {},
    }


def _pod_conditions(scheduled: bool, t: str, container_names: list[str]) -> list[dict[str, Any]]:
    unready = f"containers with unready status: [{' '.join(container_names)}]"
    return [
        {"type": "PodReadyToStartContainers", "status": "True", "lastProbeTime": None, "lastTransitionTime": t},
        {"type": "Initialized", "status": "True", "lastProbeTime": None, "lastTransitionTime": t},
        {
            "type": "Ready",
            "status": "False",
            "reason": "ContainersNotReady",
            "message": unready,
            "lastProbeTime": None,
            "lastTransitionTime": t,
        },
        {
            "type": "ContainersReady",
            "status": "False",
            "reason": "ContainersNotReady",
            "message": unready,
            "lastProbeTime": None,
            "lastTransitionTime": t,
        },
        {
            "type": "PodScheduled",
            "status": "True" if scheduled else "False",
            "lastProbeTime": None,
            "lastTransitionTime": t,
        },
    ]


def pod_status(
    pod: Mapping[str, Any], fault: Fault, *, host_ip: str = "192.168.0.10", pod_ip: str = "127.244.0.2"
) -> dict[str, Any]:
    """The whole ``status`` of ``pod`` failing with ``fault.cause`` (a pod cause)."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    containers = spec.get("containers") or [{"name": "main", "image": ""}]
    first = containers[0]
    t = _now()
    if fault.cause == "Unschedulable":
        return {
            "phase": "Pending",
            "qosClass": "Burstable",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "lastProbeTime": None,
                    "lastTransitionTime": t,
                    "message": fault.detail or unschedulable_message(fault.nodes),
                }
            ],
        }
    image = first.get("image", "")
    pod_ref = f"{meta.get('name', '')}_{meta.get('namespace', '')}({meta.get('uid', '')})"
    last: dict[str, Any] | None = None
    restarts = 0
    phase = "Pending"
    if fault.cause == "ErrImagePull":
        state = {
            "waiting": {
                "reason": "ErrImagePull",
                "message": fault.detail
                or (
                    f'rpc error: code = NotFound desc = failed to pull and unpack image "{image}": failed to resolve '
                    f'reference "{image}": {image}: not found'
                ),
            }
        }
    elif fault.cause == "ImagePullBackOff":
        state = {"waiting": {"reason": "ImagePullBackOff", "message": f'Back-off pulling image "{image}"'}}
    elif fault.cause == "CreateContainerConfigError":
        state = {
            "waiting": {
                "reason": "CreateContainerConfigError",
                "message": fault.detail or 'secret "hf-token" not found',
            }
        }
    else:  # CrashLoopBackOff / OOMKilled: the container ran, died, and the kubelet backs off restarting it
        oom = fault.cause == "OOMKilled"
        restarts, phase = fault.restarts, "Running"
        state, last = crash_loop_states(
            first["name"],
            pod_ref,
            restarts,
            exit_code=137 if oom else 1,
            reason="OOMKilled" if oom else "Error",
            message="" if oom else fault.detail or "engine failed to load",
            container_id=f"containerd://{meta.get('uid', '')[:12]}",
            at=t,
        )
    statuses = [
        _container_status(
            c,
            state if i == 0 else {"waiting": {"reason": "PodInitializing"}},
            restarts=restarts if i == 0 else 0,
            last=last if i == 0 else None,
        )
        for i, c in enumerate(containers)
    ]
    return {
        "phase": phase,
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "podIP": pod_ip,
        "podIPs": [{"ip": pod_ip}],
        "startTime": t,
        "qosClass": "Burstable",
        "conditions": _pod_conditions(True, t, [c["name"] for c in containers]),
        "containerStatuses": statuses,
    }


def crash_loop_states(
    container: str,
    pod_ref: str,
    restarts: int,
    *,
    exit_code: int,
    reason: str,
    message: str,
    container_id: str,
    at: str,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(state, lastState) of a container the kubelet backs off restarting: 10 s doubling per restart, at most
    5 min (pkg/kubelet/kubelet.go backOffPeriod / MaxContainerBackOff); ``pod_ref`` is name_namespace(uid)."""
    backoff = min(300, 10 * 2 ** max(0, restarts - 1))
    delay = f"{backoff // 60}m{backoff % 60}s" if backoff >= 60 else f"{backoff}s"
    state = {
        "waiting": {
            "reason": "CrashLoopBackOff",
            "message": f"back-off {delay} restarting failed container={container} pod={pod_ref}",
        }
    }
    last = {
        "terminated": {
            "exitCode": exit_code,
            "reason": reason,
            "startedAt": at,
            "finishedAt": at,
            "containerID": container_id,
            **({"message": message} if message else {}),
        }
    }
    return state, last


def missing_env_source(container: Mapping[str, Any], exists: Any) -> str:
    """The kubelet's CreateContainerConfigError message for the first env source that does not exist
    ('secret "x" not found' / 'configmap "x" not found'), "" when all exist; ``exists(kind, name)``
    answers for Secret/ConfigMap. Optional references never block."""
    refs: list[tuple[str, str, bool]] = []
    for env in container.get("env") or []:
        source = env.get("valueFrom") or {}
        for key, kind in (("secretKeyRef", "Secret"), ("configMapKeyRef", "ConfigMap")):
            if key in source:
                refs.append((kind, source[key].get("name", ""), bool(source[key].get("optional"))))
    for env_from in container.get("envFrom") or []:
        for key, kind in (("secretRef", "Secret"), ("configMapRef", "ConfigMap")):
            if key in env_from:
                refs.append((kind, env_from[key].get("name", ""), bool(env_from[key].get("optional"))))
    for kind, name, optional in refs:
        if not optional and not exists(kind, name):
            return f'{kind.lower()} "{name}" not found'
    return ""


def replica_failure(pod_name: str, detail: str = "") -> dict[str, Any]:
    """The Deployment's ReplicaFailure condition when the API server rejects its ReplicaSet's Pod."""
    t = _now()
    return {
        "type": "ReplicaFailure",
        "status": "True",
        "reason": "FailedCreate",
        "lastUpdateTime": t,
        "lastTransitionTime": t,
        "message": f'pods "{pod_name}" is forbidden: '
        + (
            detail
            or (
                "exceeded quota: gpu-quota, requested: requests.nvidia.com/gpu=1, used: requests.nvidia.com/gpu=4, "
                "limited: requests.nvidia.com/gpu=4"
            )
        ),
    }


def progress_deadline_exceeded(replicaset: str) -> dict[str, Any]:
    t = _now()
    return {
        "type": "Progressing",
        "status": "False",
        "reason": "ProgressDeadlineExceeded",
        "lastUpdateTime": t,
        "lastTransitionTime": t,
        "message": f'ReplicaSet "{replicaset}" has timed out progressing.',
    }
