"""A small JSON client of the Kubernetes REST API for the simulated node, router and demo.

They talk to the API like their real counterparts (kubelet, kube-proxy, a dashboard): to kube-apiserver over
TLS with the credentials of a kubeconfig (:meth:`KubeApi.from_kubeconfig`: the cluster's CA, a client certificate or a bearer token).
Only what they need: get, list with label and field selectors, watch (resumed from the last resourceVersion,
re-listed after 410 Gone), create (also on a subresource), merge or strategic-merge patch (also on
``/status``), delete with a grace period and a UID precondition.
"""

from __future__ import annotations

import asyncio
import json as jsonlib
import logging
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import yaml

log = logging.getLogger("redrafter.sim.kubeapi")

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
NODES = Kind("v1", "nodes", namespaced=False)
PVCS = Kind("v1", "persistentvolumeclaims")
PVS = Kind("v1", "persistentvolumes", namespaced=False)
SERVICE_ACCOUNTS = Kind("v1", "serviceaccounts")
LEASES = Kind("coordination.k8s.io/v1", "leases")
ENDPOINT_SLICES = Kind("discovery.k8s.io/v1", "endpointslices")
JOBS = Kind("batch/v1", "jobs")
DEPLOYMENTS = Kind("apps/v1", "deployments")
CRDS = Kind("apiextensions.k8s.io/v1", "customresourcedefinitions", namespaced=False)


@dataclass(frozen=True)
class Credentials:
    """How to reach and authenticate to the API server: its CA, and a client certificate or a bearer token."""

    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    token: str | None = None

    def ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca) if self.ca else None)
        if self.cert and self.key:
            ctx.load_cert_chain(str(self.cert), str(self.key))
        return ctx


def read_kubeconfig(path: Path) -> tuple[str, Credentials]:
    """(server URL, credentials) of the kubeconfig's current context: file references as written by
    :mod:`.controlplane` (``certificate-authority``, ``client-certificate``, ``client-key``) or ``token``."""
    doc = yaml.safe_load(Path(path).read_text())
    context_name = doc.get("current-context")
    context = next((c["context"] for c in doc.get("contexts") or [] if c["name"] == context_name), None)
    if context is None:
        raise ValueError(f"kubeconfig {path}: no current context {context_name!r}")
    cluster = next(c["cluster"] for c in doc["clusters"] if c["name"] == context["cluster"])
    user: dict[str, Any] = (
        next((u["user"] for u in doc.get("users") or [] if u["name"] == context.get("user")), {}) or {}
    )

    def file(value: str | None) -> Path | None:
        return None if not value else (Path(path).parent / value if not Path(value).is_absolute() else Path(value))

    return cluster["server"], Credentials(
        ca=file(cluster.get("certificate-authority")),
        cert=file(user.get("client-certificate")),
        key=file(user.get("client-key")),
        token=user.get("token"),
    )


class KubeApi:
    """``async with KubeApi(url) as api``: one aiohttp session for every call."""

    def __init__(self, url: str, timeout: float = 10.0, credentials: Credentials | None = None) -> None:
        self.url = url.rstrip("/")
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._credentials = credentials
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    def from_kubeconfig(cls, path: Path, timeout: float = 10.0) -> "KubeApi":
        url, credentials = read_kubeconfig(path)
        return cls(url, timeout, credentials)

    async def __aenter__(self) -> "KubeApi":
        connector = None
        headers = {}
        if self._credentials is not None:
            connector = aiohttp.TCPConnector(ssl=self._credentials.ssl_context())
            if self._credentials.token:
                headers["Authorization"] = f"Bearer {self._credentials.token}"
        self._session = aiohttp.ClientSession(timeout=self._timeout, connector=connector, headers=headers)
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

    async def list(
        self,
        kind: Kind,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[Obj]:
        return list((await self.list_body(kind, namespace, label_selector, field_selector)).get("items") or [])

    async def list_body(
        self,
        kind: Kind,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> Obj:
        """The whole List (``metadata.resourceVersion`` is where a watch of it starts)."""
        params = {k: v for k, v in (("labelSelector", label_selector), ("fieldSelector", field_selector)) if v}
        return await self._call("GET", kind.path(namespace), params=params or None)

    async def watch(
        self,
        kind: Kind,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_seconds: int = 300,
    ) -> AsyncIterator[tuple[str, Obj]]:
        """List, then watch, forever: ``("ADDED" | "MODIFIED" | "DELETED", object)``.

        The list's objects come first as ADDED (a re-list repeats them: consumers are level-based). A watch
        that ends is resumed from the last resourceVersion seen; 410 Gone (the version was compacted away)
        re-lists, as client-go's reflector does. Bookmarks are requested and only move the resourceVersion.
        """
        if self._session is None:
            raise RuntimeError("KubeApi is not open (use `async with`)")
        selectors = {k: v for k, v in (("labelSelector", label_selector), ("fieldSelector", field_selector)) if v}
        version = ""
        while True:
            if not version:
                body = await self.list_body(kind, namespace, label_selector, field_selector)
                version = str((body.get("metadata") or {}).get("resourceVersion") or "")
                for item in body.get("items") or []:
                    yield "ADDED", item
            params = {
                **selectors,
                "watch": "1",
                "resourceVersion": version,
                "allowWatchBookmarks": "true",
                "timeoutSeconds": str(timeout_seconds),
            }
            timeout = aiohttp.ClientTimeout(total=None, sock_read=timeout_seconds + 30)
            try:
                async with self._session.get(
                    self.url + kind.path(namespace),
                    params=params,
                    timeout=timeout,
                    headers={"Accept": "application/json"},
                ) as resp:
                    if resp.status == 410:
                        version = ""
                        continue
                    if resp.status >= 400:
                        body = await resp.json(content_type=None)
                        body = body if isinstance(body, dict) else {}
                        raise ApiStatusError(resp.status, body.get("reason", ""), body.get("message", str(body)))
                    async for line in resp.content:
                        if not line.strip():
                            continue
                        event = jsonlib.loads(line)
                        obj = event.get("object") or {}
                        if event.get("type") == "ERROR":
                            if obj.get("code") == 410:
                                version = ""
                            break
                        version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                        if event.get("type") != "BOOKMARK":
                            yield str(event.get("type")), obj
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:  # a cut watch: resume after a moment
                log.debug("watch of %s ended: %s", kind.plural, exc)
                await asyncio.sleep(0.5)

    async def create(
        self,
        kind: Kind,
        body: Obj,
        namespace: str | None = None,
        subresource: str | None = None,
        name: str | None = None,
    ) -> Obj:
        """Create ``body`` (``name`` + ``subresource``: on an object's subresource, e.g. a TokenRequest)."""
        ns = namespace or body.get("metadata", {}).get("namespace")
        return await self._call("POST", kind.path(ns, name, subresource), json=body)

    async def patch(
        self,
        kind: Kind,
        name: str,
        namespace: str | None,
        patch: Obj,
        subresource: str | None = None,
        *,
        strategic: bool = False,
    ) -> Obj:
        """JSON merge patch, or a strategic merge patch of a built-in kind (lists merged by key, as a
        Pod's conditions by type); ``subresource="status"`` for the status subresource."""
        content_type = "application/strategic-merge-patch+json" if strategic else "application/merge-patch+json"
        return await self._call("PATCH", kind.path(namespace, name, subresource), json=patch, content_type=content_type)

    async def delete(
        self,
        kind: Kind,
        name: str,
        namespace: str | None = None,
        *,
        grace_period_seconds: int | None = None,
        uid: str | None = None,
    ) -> bool:
        """Delete in the background (dependents garbage-collected); False when already gone (or, with
        ``uid`` as precondition, when the name now holds another object)."""
        options: Obj = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
        if grace_period_seconds is not None:
            options["gracePeriodSeconds"] = grace_period_seconds
        if uid is not None:
            options["preconditions"] = {"uid": uid}
        try:
            await self._call("DELETE", kind.path(namespace, name), json=options)
            return True
        except ApiStatusError as exc:
            if exc.code == 404 or (uid is not None and exc.code == 409):
                return False
            raise
