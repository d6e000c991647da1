"""The endpoints controller: every Service with a selector gets an Endpoints object listing the Pods it
selects (Ready ones under ``addresses``, others under ``notReadyAddresses``), as kube-controller-manager
does. The router (kube-proxy's role) reads them. :func:`endpoints_for` is the one implementation: the
in-process emulator's controllers (:mod:`.controllers`) write what it returns too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from .kubeapi import ENDPOINTS, PODS, SERVICES, ApiStatusError, KubeApi
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


class EndpointsController:
    def __init__(self, api: KubeApi) -> None:
        self.api = api
        self._written: dict[tuple[str, str], Any] = {}

    async def sync(self) -> None:
        services = [s for s in await self.api.list(SERVICES) if (s.get("spec") or {}).get("selector")]
        pods = await self.api.list(PODS)
        for svc in services:
            want = endpoints_for(svc, pods)
            key = (svc["metadata"]["namespace"], svc["metadata"]["name"])
            if self._written.get(key) == want["subsets"]:
                continue
            with contextlib.suppress(ApiStatusError):
                have = await self.api.get(ENDPOINTS, key[1], key[0])
                if have is None:
                    await self.api.create(ENDPOINTS, want, key[0])
                elif (have.get("subsets") or []) != want["subsets"]:
                    await self.api.patch(ENDPOINTS, key[1], key[0], {"subsets": want["subsets"]})
                self._written[key] = want["subsets"]
