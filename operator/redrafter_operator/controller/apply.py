"""Writing to the API: a small REST client (kubernetes-asyncio for auth/TLS) and create-or-patch.

Why not the generated typed APIs: the operator writes half a dozen kinds as plain dicts; one generic
path-based client keeps the retry policy (409/429/5xx/connection errors, jittered backoff) and the
write accounting in one place. A child whose applied-hash annotation matches the desired manifest
is never written: that is what makes an idle operator and a re-applied spec cost zero writes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import aiohttp
from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio import config as k8s_config

from .facts import ANNOTATION_APPLIED_HASH, manifest_hash

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
RETRYABLE = {409, 429, 500, 502, 503, 504}
BACKOFF = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2)  # ~6 s in total, then the reconcile is requeued


class ApiError(Exception):
    """A non-2xx answer of the API server (after retries), with its Status reason."""

    def __init__(self, status: int, reason: str, message: str, method: str = "", path: str = ""):
        super().__init__(f"{method} {path}: {status} {reason}: {message}")
        self.status, self.reason, self.message = status, reason, message


# Which REST path each kind lives under (only the kinds the operator writes).
_KINDS: dict[tuple[str, str], tuple[str, str]] = {
    ("v1", "ConfigMap"): ("/api/v1", "configmaps"),
    ("v1", "Service"): ("/api/v1", "services"),
    ("apps/v1", "Deployment"): ("/apis/apps/v1", "deployments"),
    ("batch/v1", "Job"): ("/apis/batch/v1", "jobs"),
    ("networking.k8s.io/v1", "NetworkPolicy"): ("/apis/networking.k8s.io/v1", "networkpolicies"),
    ("inference.networking.k8s.io/v1", "InferencePool"): ("/apis/inference.networking.k8s.io/v1", "inferencepools"),
    ("batch/v1", "CronJob"): ("/apis/batch/v1", "cronjobs"),
}


def object_path(manifest: Mapping[str, Any], *, collection: bool = False) -> str:
    meta = manifest["metadata"]
    prefix, plural = _KINDS[(manifest["apiVersion"], manifest["kind"])]
    base = f"{prefix}/namespaces/{meta['namespace']}/{plural}"
    return base if collection else f"{base}/{meta['name']}"


def resource_name(manifest: Mapping[str, Any]) -> str:
    return _KINDS[(manifest["apiVersion"], manifest["kind"])][1]


async def load_configuration(kubeconfig: str | None = None, context: str | None = None) -> k8s_client.Configuration:
    """In-cluster service account first (unless a kubeconfig is named), else the kubeconfig."""
    cfg = k8s_client.Configuration()
    if not kubeconfig:
        try:
            k8s_config.load_incluster_config(client_configuration=cfg)
            return cfg
        except k8s_config.ConfigException:
            pass
    await k8s_config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=cfg)
    return cfg


WriteHook = Callable[[str, str, int], None]  # (verb, resource, status code)


class KubeClient:
    """Generic JSON REST calls with retries. ``on_request`` sees every request (for metrics).

    ``may_write`` fences writes: when it answers False (a leader whose Lease may have lapsed), a write is
    refused before it is sent, with reason NotLeader.
    """

    def __init__(self, configuration: k8s_client.Configuration, on_request: WriteHook | None = None,
                 backoff: tuple[float, ...] = BACKOFF, may_write: Callable[[], bool] | None = None):
        self._api = k8s_client.ApiClient(configuration=configuration)
        self._on_request = on_request
        self._backoff = backoff
        self._may_write = may_write

    async def close(self) -> None:
        await self._api.close()

    async def request(self, method: str, path: str, body: Any = None, *, content_type: str = "application/json",
                      query: list[tuple[str, str]] | None = None, retry_conflict: bool = True) -> dict[str, Any]:
        resource = path.rsplit("/namespaces/", 1)[-1].split("/")[1] if "/namespaces/" in path else path
        for attempt in range(len(self._backoff) + 1):
            if method != "GET" and self._may_write is not None and not self._may_write():
                raise ApiError(0, "NotLeader", "this replica no longer holds the leader lease", method, path)
            try:
                resp = await self._api.call_api(
                    path, method, query_params=query or [], body=body,
                    header_params={"Content-Type": content_type, "Accept": "application/json"},
                    auth_settings=["BearerToken"], _preload_content=False, _return_http_data_only=True,
                    _request_timeout=30,
                )
                status = resp.status
                raw = await resp.read()
                resp.release()
            except (OSError, asyncio.TimeoutError, aiohttp.ClientError, k8s_client.exceptions.ApiException) as exc:
                status, raw = 0, str(exc).encode()
                if isinstance(exc, k8s_client.exceptions.ApiException) and exc.status:
                    status, raw = exc.status, (exc.body or b"") if isinstance(exc.body, bytes) else str(exc.body or "").encode()
            if self._on_request:
                self._on_request(method, resource, status)
            if 200 <= status < 300:
                return json.loads(raw) if raw else {}
            try:
                payload = json.loads(raw) if raw else {}
            except ValueError:
                payload = {}
            reason = payload.get("reason") or ("ConnectionError" if status == 0 else str(status))
            message = payload.get("message") or raw.decode(errors="replace")[:300]
            retryable = status == 0 or (status in RETRYABLE and (retry_conflict or status != 409))
            if status == 409 and reason == "AlreadyExists":
                retryable = False
            if not retryable or attempt == len(self._backoff):
                raise ApiError(status, reason, message, method, path)
            delay = self._backoff[attempt] * (0.5 + random.random())
            log.debug("%s %s -> %s %s; retrying in %.2fs", method, path, status, reason, delay)
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")


@dataclass
class _Applied:
    hash: str
    at: float


class Applier:
    """create-or-patch with a dry comparison against the applied-hash annotation.

    ``observed_hash`` answers from the watch-fed indexes; right after a write (before its watch
    event arrives) a short-lived memory of what this process applied avoids a second write.
    """

    def __init__(self, client: KubeClient, observed_hash: Callable[[Mapping[str, Any]], str | None],
                 memory_seconds: float = 60.0):
        self.client = client
        self._observed = observed_hash
        self._applied: dict[tuple[str, str, str], _Applied] = {}
        self._memory = memory_seconds

    @staticmethod
    def _ref(m: Mapping[str, Any]) -> tuple[str, str, str]:
        return (m["kind"], m["metadata"]["namespace"], m["metadata"]["name"])

    def forget(self, namespace: str, name_prefix: str = "") -> None:
        for ref in [r for r in self._applied if r[1] == namespace and r[2].startswith(name_prefix)]:
            del self._applied[ref]

    def _state(self, manifest: Mapping[str, Any], digest: str) -> str:
        """'same' (nothing to do), 'differs' (exists, patch it) or 'unknown' (create, or patch on 409)."""
        mem = self._applied.get(self._ref(manifest))
        if mem and mem.hash == digest and time.monotonic() - mem.at < self._memory:
            return "same"  # written by us a moment ago; the watch has not echoed it yet
        observed = self._observed(manifest)
        if observed is None:
            return "unknown"
        return "same" if observed == digest else "differs"

    async def ensure(self, manifest: dict[str, Any]) -> bool:
        """Make the object match ``manifest``; True if anything was written."""
        digest = manifest_hash(manifest)
        state = self._state(manifest, digest)
        if state == "same":
            return False
        body = {**manifest, "metadata": {**manifest["metadata"],
                                         "annotations": {**(manifest["metadata"].get("annotations") or {}),
                                                         ANNOTATION_APPLIED_HASH: digest}}}
        if state == "differs":
            try:
                await self.client.request("PATCH", object_path(manifest), body, content_type=MERGE_PATCH)
            except ApiError as exc:
                if exc.status != 404:
                    raise
                await self.client.request("POST", object_path(manifest, collection=True), body)
        else:
            try:
                await self.client.request("POST", object_path(manifest, collection=True), body)
            except ApiError as exc:
                if exc.status != 409:
                    raise
                current = await self.client.request("GET", object_path(manifest))
                if (current.get("metadata", {}).get("annotations") or {}).get(ANNOTATION_APPLIED_HASH) != digest:
                    await self.client.request("PATCH", object_path(manifest), body, content_type=MERGE_PATCH)
        self._applied[self._ref(manifest)] = _Applied(digest, time.monotonic())
        return True

    def deleted(self, obj: Mapping[str, Any]) -> None:
        """A child observed deleted: what this process wrote to it no longer holds (the next ensure recreates it)."""
        self._applied.pop(self._ref(obj), None)

    async def delete(self, manifest: Mapping[str, Any]) -> None:
        """Delete a child no longer wanted (already gone is fine), forgetting what this process applied to it."""
        self.deleted(manifest)
        try:
            await self.client.request("DELETE", object_path(manifest))
        except ApiError as exc:
            if exc.status != 404:
                raise

    async def create(self, manifest: dict[str, Any]) -> bool:
        """Create-only (Jobs, build ConfigMaps): an existing object with that name is left as it is."""
        ref = self._ref(manifest)
        mem = self._applied.get(ref)
        if self._observed(manifest) is not None or (mem and time.monotonic() - mem.at < self._memory):
            return False
        try:
            await self.client.request("POST", object_path(manifest, collection=True), manifest)
        except ApiError as exc:
            if exc.status != 409:
                raise
            self._applied[ref] = _Applied("", time.monotonic())
            return False
        self._applied[ref] = _Applied("", time.monotonic())
        return True


def merge_patch(old: Any, new: Any) -> Any:
    """The RFC 7386 merge patch turning ``old`` into ``new`` (None when they are equal)."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return None if old == new else new
    out: dict[str, Any] = {}
    for key in old.keys() - new.keys():
        out[key] = None
    for key, value in new.items():
        if key not in old:
            out[key] = value
        else:
            sub = merge_patch(old[key], value)
            if sub is not None or (value is None and old[key] is not None):
                out[key] = sub
    return out or None
