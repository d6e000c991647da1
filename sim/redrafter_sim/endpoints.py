"""A Service's endpoints computed from the Pods it selects (Ready ones under ``addresses``, others under
``notReadyAddresses``), as kube-controller-manager's endpoints controller computes them. The node and the demo's
router (kube-proxy's role) resolve Services with it: the pods here have loopback IPs, which kube-apiserver refuses
in Endpoints and EndpointSlices, so no controller can publish them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .objects import condition_true


def selects(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def _target_port(port: Mapping[str, Any], pod: Mapping[str, Any]) -> int | None:
    target = port.get("targetPort", port.get("port"))
    if isinstance(target, int):
        return target
    if isinstance(target, str) and target.isdigit():
        return int(target)
    for c in (pod.get("spec") or {}).get("containers") or []:
        for p in c.get("ports") or []:
            if p.get("name") == target:
                return int(p["containerPort"])
    return None


def endpoints_for(service: Mapping[str, Any], pods: list[Mapping[str, Any]]) -> dict[str, Any]:
    """The Endpoints object of ``service`` (pure)."""
    meta = service["metadata"]
    selector = (service.get("spec") or {}).get("selector") or {}
    ports = (service.get("spec") or {}).get("ports") or []
    chosen = [
        p
        for p in pods
        if p["metadata"].get("namespace") == meta["namespace"]
        and selects(selector, p["metadata"].get("labels") or {})
        and (p.get("status") or {}).get("podIP")
        and not p["metadata"].get("deletionTimestamp")
    ]
    subsets = []
    if chosen and ports:

        def address(pod: Mapping[str, Any]) -> dict[str, Any]:
            return {
                "ip": pod["status"]["podIP"],
                "nodeName": (pod.get("spec") or {}).get("nodeName", ""),
                "targetRef": {
                    "kind": "Pod",
                    "namespace": pod["metadata"]["namespace"],
                    "name": pod["metadata"]["name"],
                    "uid": pod["metadata"].get("uid", ""),
                },
            }

        ready = sorted((address(p) for p in chosen if condition_true(p, "Ready")), key=lambda a: a["ip"])
        not_ready = sorted((address(p) for p in chosen if not condition_true(p, "Ready")), key=lambda a: a["ip"])
        subset: dict[str, Any] = {
            "ports": [
                {
                    "name": port.get("name", ""),
                    "port": _target_port(port, chosen[0]) or port.get("port"),
                    "protocol": port.get("protocol", "TCP"),
                }
                for port in ports
            ]
        }
        if ready:
            subset["addresses"] = ready
        if not_ready:
            subset["notReadyAddresses"] = not_ready
        subsets.append(subset)
    return {
        "apiVersion": "v1",
        "kind": "Endpoints",
        "metadata": {"name": meta["name"], "namespace": meta["namespace"], "labels": dict(meta.get("labels") or {})},
        "subsets": subsets,
    }
