"""Object shapes the simulated kubelet writes: Pods with their status, as the real kubelet reports them."""

from __future__ import annotations

import datetime
import hashlib
import json
import secrets
import string
from collections.abc import Mapping
from typing import Any

NODE_NAME = "sim-node-0"
HOST_IP = "127.0.0.1"
POD_TEMPLATE_HASH = "pod-template-hash"
_ALNUM = string.ascii_lowercase + string.digits


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def suffix(n: int = 5) -> str:
    return "".join(secrets.choice(_ALNUM) for _ in range(n))


def template_hash(template: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]


def owner_ref(owner: Mapping[str, Any]) -> dict[str, Any]:
    meta = owner["metadata"]
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def pod_manifest(
    owner: Mapping[str, Any], name: str, template: Mapping[str, Any], extra_labels: Mapping[str, str]
) -> dict[str, Any]:
    meta = template.get("metadata") or {}
    spec = dict(template.get("spec") or {})
    spec["nodeName"] = NODE_NAME
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": owner["metadata"]["namespace"],
            "labels": {**(meta.get("labels") or {}), **extra_labels},
            "annotations": dict(meta.get("annotations") or {}),
            "ownerReferences": [owner_ref(owner)],
        },
        "spec": spec,
    }


def _conditions(ready: bool, since: str) -> list[dict[str, Any]]:
    flag = "True" if ready else "False"
    return [
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": since},
        {"type": "Initialized", "status": "True", "lastTransitionTime": since},
        {"type": "ContainersReady", "status": flag, "lastTransitionTime": since},
        {"type": "Ready", "status": flag, "lastTransitionTime": since},
    ]


def running_status(container: str, ip: str, started: str, ready: bool, restarts: int, image: str) -> dict[str, Any]:
    return {
        "phase": "Running",
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "hostIP": HOST_IP,
        "startTime": started,
        "conditions": _conditions(ready, now()),
        "containerStatuses": [
            {
                "name": container,
                "ready": ready,
                "started": True,
                "restartCount": restarts,
                "image": image,
                "imageID": image,
                "containerID": f"sim://{container}-{restarts}",
                "state": {"running": {"startedAt": started}},
            }
        ],
    }


def waiting_status(
    container: str, reason: str, message: str, restarts: int, image: str, started: str
) -> dict[str, Any]:
    return {
        "phase": "Pending",
        "hostIP": HOST_IP,
        "startTime": started,
        "conditions": _conditions(False, now()),
        "containerStatuses": [
            {
                "name": container,
                "ready": False,
                "started": False,
                "restartCount": restarts,
                "image": image,
                "imageID": "",
                "state": {"waiting": {"reason": reason, "message": message}},
            }
        ],
    }


def terminated_status(
    container: str, ip: str, started: str, exit_code: int, message: str, image: str
) -> dict[str, Any]:
    finished = now()
    return {
        "phase": "Succeeded" if exit_code == 0 else "Failed",
        "podIP": ip,
        "hostIP": HOST_IP,
        "startTime": started,
        "conditions": _conditions(False, finished),
        "containerStatuses": [
            {
                "name": container,
                "ready": False,
                "started": False,
                "restartCount": 0,
                "image": image,
                "imageID": image,
                "containerID": f"sim://{container}",
                "state": {
                    "terminated": {
                        "exitCode": exit_code,
                        "reason": "Completed" if exit_code == 0 else "Error",
                        "message": message,
                        "startedAt": started,
                        "finishedAt": finished,
                    }
                },
            }
        ],
    }


def condition_true(obj: Mapping[str, Any], ctype: str) -> bool:
    return any(
        c.get("type") == ctype and c.get("status") == "True" for c in (obj.get("status") or {}).get("conditions") or []
    )


def failed_create_event(owner: Mapping[str, Any], message: str, component: str) -> dict[str, Any]:
    """The Warning Event a workload controller records when the API server rejects its Pod
    (``Error creating: <the API server's message>``, reason FailedCreate, as in the real controllers)."""
    meta, t = owner["metadata"], now()
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{meta['name']}.{suffix(10)}", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": owner["apiVersion"],
            "kind": owner["kind"],
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta["uid"],
        },
        "reason": "FailedCreate",
        "message": f"Error creating: {message}",
        "type": "Warning",
        "source": {"component": component},
        "reportingComponent": component,
        "firstTimestamp": t,
        "lastTimestamp": t,
        "count": 1,
    }


def replica_failure_condition(message: str) -> dict[str, Any]:
    """Deployment condition ReplicaFailure (copied by the Deployment controller from its ReplicaSet)."""
    t = now()
    return {
        "type": "ReplicaFailure",
        "status": "True",
        "reason": "FailedCreate",
        "message": message,
        "lastUpdateTime": t,
        "lastTransitionTime": t,
    }


def pod_ip(uid: str) -> str:
    """A deterministic address in 127.244.0.0/16 for a Pod uid: on loopback, so an operator that scrapes a Pod
    nobody serves is refused at once on this machine (a cluster's 10.244.0.0/16 could reach a real network)."""
    digest = hashlib.sha256(uid.encode()).digest()
    return f"127.244.{digest[0]}.{max(digest[1], 1)}"
