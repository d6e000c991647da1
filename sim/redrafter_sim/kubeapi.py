"""A small JSON client of the Kubernetes REST API for the simulated kubelet, router and demo.

They talk to the API over HTTP like their real counterparts (kubelet, kube-proxy, a dashboard), so
they work against any server URL: the in-process emulator, or one in another process. Only what they
need: get, list with a label selector, create, merge-patch (also on ``/status``), delete.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp

Obj = dict[str, Any]


class ApiStatusError(RuntimeError):
    """The server answered with an error Status."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(f"{code} {reason}: {message}")
        self.code = code
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class Kind:
    """Where a kind lives in the REST API."""

    api_version: str
    plural: str
    namespaced: bool = True

    def path(self, namespace: str | None = None, name: str | None = None, subresource: str | None = None) -> str:
        group_version = self.api_version
        root = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
        parts = [root]
        if self.namespaced and namespace:
            parts.append(f"namespaces/{quote(namespace)}")
        parts.append(self.plural)
        if name:
            parts.append(quote(name))
        if subresource:
            parts.append(subresource)
        return "/".join(parts)


PODS = Kind("v1", "pods")
SERVICES = Kind("v1", "services")
ENDPOINTS = Kind("v1", "endpoints")
CONFIGMAPS = Kind("v1", "configmaps")
SECRETS = Kind("v1", "secrets")
EVENTS = Kind("v1", "events")
JOBS = Kind("batch/v1", "jobs")
DEPLOYMENTS = Kind("apps/v1", "deployments")
CRDS = Kind("apiextensions.k8s.io/v1", "customresourcedefinitions", namespaced=False)


class KubeApi:
    """``async with KubeApi(url) as api``: one aiohttp session for every call."""

    def __init__(self, url: str, timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> "KubeApi":
        self._session = aiohttp.ClientSession(timeout=self._timeout)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _call(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Obj:
        if self._session is None:
            raise RuntimeError("KubeApi is not open (use `async with`)")
        headers = {"Accept": "application/json"}
        if json is not None:
            headers["Content-Type"] = content_type
        async with self._session.request(method, self.url + path, json=json, params=params, headers=headers) as resp:
            body = await resp.json(content_type=None) if resp.content_length != 0 else {}
            if resp.status >= 400:
                body = body if isinstance(body, dict) else {}
                raise ApiStatusError(resp.status, body.get("reason", ""), body.get("message", str(body)))
            return body if isinstance(body, dict) else {}

    async def get(self, kind: Kind, name: str, namespace: str | None = None) -> Obj | None:
        """The object, or None when it does not exist."""
        try:
            return await self._call("GET", kind.path(namespace, name))
        except ApiStatusError as exc:
            if exc.code == 404:
                return None
            raise

    async def list(self, kind: Kind, namespace: str | None = None, label_selector: str | None = None) -> list[Obj]:
        params = {"labelSelector": label_selector} if label_selector else None
        body = await self._call("GET", kind.path(namespace), params=params)
        return list(body.get("items") or [])

    async def create(self, kind: Kind, body: Obj, namespace: str | None = None) -> Obj:
        ns = namespace or body.get("metadata", {}).get("namespace")
        return await self._call("POST", kind.path(ns), json=body)

    async def patch(
        self, kind: Kind, name: str, namespace: str | None, patch: Obj, subresource: str | None = None
    ) -> Obj:
        """JSON merge patch (``subresource="status"`` for the status subresource)."""
        return await self._call(
            "PATCH", kind.path(namespace, name, subresource), json=patch, content_type="application/merge-patch+json"
        )

    async def delete(self, kind: Kind, name: str, namespace: str | None = None) -> bool:
        """Delete in the background (dependents garbage-collected); False when already gone."""
        try:
            await self._call("DELETE", kind.path(namespace, name), json={"propagationPolicy": "Background"})
            return True
        except ApiStatusError as exc:
            if exc.code == 404:
                return False
            raise
