"""Service routing for the simulated cluster (kube-proxy's role): Service name -> a Ready pod, per request.

The router follows the Service's Endpoints (kept by the simulated node's endpoints controller from the
Service selector and the Pods' Ready condition), refreshed every ``refresh`` seconds, and hands out
backends round-robin. When the operator moves the Service selector from one pool to the other, the
next refresh moves the traffic. Counts per pod show where requests went.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
from dataclasses import dataclass
from typing import Any

import aiohttp

from engine_jobs import contract

from .endpoints import endpoints_for
from .kubeapi import ENDPOINTS, PODS, SERVICES, ApiStatusError, KubeApi


class NoEndpoints(RuntimeError):
    """The Service has no Ready endpoint right now (a client sees connection refused)."""


@dataclass(frozen=True)
class Backend:
    pod: str
    ip: str
    port: int

    @property
    def url(self) -> str:
        return f"{self.ip}:{self.port}"


def backends_from_endpoints(endpoints: dict[str, Any], port_name: str, default_port: int) -> list[Backend]:
    out: list[Backend] = []
    for subset in endpoints.get("subsets") or []:
        ports = subset.get("ports") or []
        port = next((p["port"] for p in ports if p.get("name") == port_name), None)
        if port is None:
            port = next((p["port"] for p in ports if p.get("port") == default_port), default_port)
        for addr in subset.get("addresses") or []:
            out.append(
                Backend(pod=(addr.get("targetRef") or {}).get("name", addr["ip"]), ip=addr["ip"], port=int(port))
            )
    return sorted(out, key=lambda b: (b.ip, b.port))


class ServiceRouter:
    """``async with ServiceRouter(api, "default", "llm") as r: backend = r.pick()``."""

    def __init__(
        self,
        api: KubeApi,
        namespace: str,
        service: str,
        *,
        port_name: str = "grpc",
        default_port: int = contract.GRPC_PORT,
        refresh: float = 0.5,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.service = service
        self.port_name = port_name
        self.default_port = default_port
        self.refresh = refresh
        self.backends: list[Backend] = []
        self.selector: dict[str, str] = {}
        self.sent: collections.Counter[str] = collections.Counter()  # requests per pod
        self._cycle: itertools.cycle[Backend] | None = None
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> "ServiceRouter":
        await self.resolve()
        self._task = asyncio.create_task(self._loop(), name=f"router/{self.service}")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def resolve(self) -> list[Backend]:
        """Re-read the Service and its Endpoints (falls back to the selector when Endpoints are absent)."""
        svc = await self.api.get(SERVICES, self.service, self.namespace)
        if svc is None:
            backends: list[Backend] = []
            self.selector = {}
        else:
            self.selector = dict((svc.get("spec") or {}).get("selector") or {})
            eps = await self.api.get(ENDPOINTS, self.service, self.namespace)
            # a real kube-apiserver refuses the node's loopback pod IPs in Endpoints (ValidateEndpointIP): the
            # endpoints controller's object stays empty, so the Service's selector decides, as it would
            if eps is None or not eps.get("subsets"):
                eps = endpoints_for(svc, await self.api.list(PODS, self.namespace))
            backends = backends_from_endpoints(eps, self.port_name, self.default_port)
        if backends != self.backends:
            self.backends = backends
            self._cycle = itertools.cycle(backends) if backends else None
        return backends

    def pick(self) -> Backend:
        if self._cycle is None:
            raise NoEndpoints(f"service {self.namespace}/{self.service} has no Ready endpoints")
        backend = next(self._cycle)
        self.sent[backend.pod] += 1
        return backend

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.refresh)
            with contextlib.suppress(ApiStatusError, aiohttp.ClientError, OSError, asyncio.TimeoutError):
                await self.resolve()
