"""Writing to the API: a small REST client (kubernetes-asyncio for auth/TLS) and server-side apply.

Why not the generated typed APIs: the operator writes half a dozen kinds as plain dicts; one generic
path-based client keeps the retry policy (409/429/5xx/connection errors, jittered backoff) and the
write accounting in one place.

Children are server-side applied (field manager ``redrafter-operator``, force): the API server removes
what the operator stops applying and hands back fields someone else changed. An apply is sent only when
the desired manifest changed or the operator's owned fields drifted (``in_sync``), so an idle operator
writes nothing.
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

from .fingerprints import FIELD_MANAGER, manifest_hash, owned_fields, previous_entries

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"  # the body is JSON, which is YAML
JSON_PATCH = "application/json-patch+json"
RETRYABLE = {409, 429, 500, 502, 503, 504}
BACKOFF = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2)  # ~6 s in total, then the reconcile is requeued
ADOPT_ATTEMPTS = 5  # hand-overs raced by another writer (a Deployment's status) before the reconcile fails


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


WriteHook = Callable[[str, str, int], None]  # (verb, resource, status code)


class KubeClient:
    """Generic JSON REST calls with retries. ``on_request`` sees every request (for metrics).

    ``may_write`` fences writes: when it answers False (a leader whose Lease may have lapsed), a write is
    refused before it is sent, with reason NotLeader.
    """

    def __init__(
        self,
        configuration: k8s_client.Configuration,
        on_request: WriteHook | None = None,
        backoff: tuple[float, ...] = BACKOFF,
        may_write: Callable[[], bool] | None = None,
    ):
        self._api = k8s_client.ApiClient(configuration=configuration)
        self._on_request = on_request
        self._backoff = backoff
        self._may_write = may_write

    async def close(self) -> None:
        await self._api.close()

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        query: list[tuple[str, str]] | None = None,
        retry_conflict: bool = True,
    ) -> dict[str, Any]:
        resource = path.rsplit("/namespaces/", 1)[-1].split("/")[1] if "/namespaces/" in path else path
        query = list(query or [])
        if method in ("POST", "PUT", "PATCH") and not any(k == "fieldManager" for k, _ in query):
            query.append(("fieldManager", FIELD_MANAGER))  # managedFields name the operator, not the client library
        for attempt in range(len(self._backoff) + 1):
            if method != "GET" and self._may_write is not None and not self._may_write():
                raise ApiError(0, "NotLeader", "this replica no longer holds the leader lease", method, path)
            try:
                resp = await self._api.call_api(
                    path,
                    method,
                    query_params=query,
                    body=body,
                    header_params={"Content-Type": content_type, "Accept": "application/json"},
                    auth_settings=["BearerToken"],
                    _preload_content=False,
                    _return_http_data_only=True,
                    _request_timeout=30,
                )
                status = resp.status
                raw = await resp.read()
                resp.release()
            except (OSError, asyncio.TimeoutError, aiohttp.ClientError, k8s_client.exceptions.ApiException) as exc:
                status, raw = 0, str(exc).encode()
                if isinstance(exc, k8s_client.exceptions.ApiException) and exc.status:
                    status, raw = (
                        exc.status,
                        (exc.body or b"") if isinstance(exc.body, bytes) else str(exc.body or "").encode(),
                    )
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


@dataclass(frozen=True)
class ChildState:
    """What the watch shows of a child: its resourceVersion and the fingerprint of the fields the
    operator owns (fingerprints.owned_fields)."""

    resource_version: str
    owned_fields: str
    owned_content: str = ""  # fingerprints.owned_content: the manifest hash of what the operator's fields hold


@dataclass
class _Applied:
    digest: str  # manifest_hash of what was applied
    resource_version: str  # of the object the apply produced
    owned_fields: str  # fingerprint right after the apply
    before: str | None  # resourceVersion the watch showed when we applied: that view is stale from then on
    at: float
    generation: int = 0  # metadata.generation of the object the apply produced


class Applier:
    """Server-side apply of children, skipped while the child is known to match.

    In sync means: this process applied exactly this manifest, and the watch shows the object either
    as that apply left it (its resourceVersion), or still as before it (the echo is on its way), or
    later with the operator's owned fields unchanged (status or another manager's fields changed). A
    child this process has not applied (it just started, or took over as leader) is in sync when the
    fields the operator's manager owns on the watched object hold exactly this manifest
    (``ChildState.owned_content``): a restart sends no apply that would change nothing. A deleted child
    is forgotten (:meth:`deleted`) and re-applied.
    """

    def __init__(
        self,
        client: KubeClient,
        observed: Callable[[Mapping[str, Any]], ChildState | None],
        memory_seconds: float = 60.0,
        monotonic: Callable[[], float] = time.monotonic,
    ):
        self.client = client
        self._monotonic = monotonic
        self._observed = observed
        self._applied: dict[tuple[str, str, str], _Applied] = {}
        self._memory = memory_seconds

    @staticmethod
    def _ref(m: Mapping[str, Any]) -> tuple[str, str, str]:
        return (m["kind"], m["metadata"]["namespace"], m["metadata"]["name"])

    def forget(self, namespace: str, name_prefix: str = "") -> None:
        for ref in [r for r in self._applied if r[1] == namespace and r[2].startswith(name_prefix)]:
            del self._applied[ref]

    def in_sync(self, manifest: Mapping[str, Any]) -> bool:
        mem = self._applied.get(self._ref(manifest))
        if mem is None:
            # nothing applied by this process: what the watch shows of the operator's fields decides
            seen = self._observed(manifest)
            return seen is not None and bool(seen.owned_content) and seen.owned_content == manifest_hash(manifest)
        if mem.digest != manifest_hash(manifest):
            return False
        seen = self._observed(manifest)
        if seen is None:  # not echoed yet (a deletion would have forgotten the memory)
            return self._monotonic() - mem.at < self._memory
        if seen.resource_version in (mem.resource_version, mem.before):
            return True
        return seen.owned_fields == mem.owned_fields

    async def ensure(self, manifest: dict[str, Any]) -> bool:
        """Make the object match ``manifest``; True if an apply was sent."""
        if self.in_sync(manifest):
            return False
        seen = self._observed(manifest)
        applied = await self._hand_over(manifest, await self._apply(manifest))
        meta = applied.get("metadata") or {}
        self._applied[self._ref(manifest)] = _Applied(
            manifest_hash(manifest),
            meta.get("resourceVersion", ""),
            owned_fields(applied),
            seen.resource_version if seen else None,
            self._monotonic(),
            int(meta.get("generation") or 0),
        )
        return True

    def carried(self, kind: str, namespace: str, name: str, generation: int, seen: ChildState) -> str:
        """The manifest hash the watched object (``seen``, at ``generation``) is known to carry, "" if none.

        Known means: this process applied it, the watch shows the apply's result or later (a spec the
        apply changed bumps the generation), and the operator's owned fields are as the apply left them.
        Without the applied-hash annotation of merge-patch days, this is what tells a Deployment that
        already runs this step's template from one that still runs the previous one.
        """
        mem = self._applied.get((kind, namespace, name))
        if mem is None:
            return seen.owned_content  # not applied by this process: what the operator's fields hold
        if not mem.digest or generation < mem.generation:
            return ""
        if seen.resource_version != mem.resource_version and seen.owned_fields != mem.owned_fields:
            return ""  # someone changed the operator's fields since: an apply is pending
        return mem.digest

    async def _apply(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        return await self.client.request(
            "PATCH",
            object_path(manifest),
            manifest,
            content_type=APPLY_PATCH,
            query=[("fieldManager", FIELD_MANAGER), ("force", "true")],
        )

    async def _hand_over(self, manifest: Mapping[str, Any], applied: dict[str, Any]) -> dict[str, Any]:
        """The object after the apply, once an earlier version's fields are taken over (:meth:`_adopt`) and the
        apply repeated without them.

        The take-over tests the resourceVersion the apply answered; another writer in between (the Deployment
        controller's status, at once on a real cluster) fails that test with a 422. Then the apply again (it
        changes nothing, and patch is a verb the operator holds, unlike get) answers the current object for
        the next try."""
        for attempt in range(1, ADOPT_ATTEMPTS + 1):
            tested = (applied.get("metadata") or {}).get("resourceVersion")
            try:
                if not await self._adopt(manifest, applied):
                    return applied
                break
            except ApiError as exc:
                if exc.status != 422 or attempt == ADOPT_ATTEMPTS:
                    raise
                applied = await self._apply(manifest)
                if (applied.get("metadata") or {}).get("resourceVersion") == tested:
                    raise  # the object did not change: the take-over itself was refused
        return await self._apply(manifest)

    async def _adopt(self, manifest: Mapping[str, Any], live: Mapping[str, Any]) -> bool:
        """Hand the fields an earlier operator version wrote by create/merge patch (an Update by the client
        library's User-Agent, "OpenAPI-Generator") to this operator's apply, as client-go's csaupgrade does:
        otherwise the apply would share them and never remove the ones it no longer sets. True if it did
        (the caller applies again, which now removes them)."""
        meta = live.get("metadata") or {}
        entries = meta.get("managedFields") or []
        ours = previous_entries(live)
        if not ours:
            return False
        fields: dict[str, Any] = {}
        mine = [
            e
            for e in entries
            if e.get("manager") == FIELD_MANAGER and e.get("operation") == "Apply" and not e.get("subresource")
        ]
        for entry in ours + mine:
            _merge_fields(fields, entry.get("fieldsV1") or {})
        upgraded = [e for e in entries if e not in ours and e not in mine] + [
            {
                "manager": FIELD_MANAGER,
                "operation": "Apply",
                "apiVersion": manifest["apiVersion"],
                "time": (mine or ours)[-1].get("time"),
                "fieldsType": "FieldsV1",
                "fieldsV1": fields,
            }
        ]
        await self.client.request(
            "PATCH",
            object_path(manifest),
            [
                {"op": "test", "path": "/metadata/resourceVersion", "value": meta.get("resourceVersion")},
                {"op": "replace", "path": "/metadata/managedFields", "value": upgraded},
            ],
            content_type=JSON_PATCH,
        )
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
        """Create-only (Jobs, build ConfigMaps): an existing object with that name is left as it is.

        A Job's pod template is immutable and its name carries the engine key, so a different build
        is a different Job: re-applying one could only fail or change nothing.
        """
        ref = self._ref(manifest)
        mem = self._applied.get(ref)
        if self._observed(manifest) is not None or (mem and self._monotonic() - mem.at < self._memory):
            return False
        created = True
        try:
            await self.client.request("POST", object_path(manifest, collection=True), manifest)
        except ApiError as exc:
            # Only AlreadyExists says the object is there. Any other 409 (a Conflict) created nothing: taken for
            # "exists", a build ConfigMap was never written while its Job was, and the Job's pods could not start.
            if exc.status != 409 or exc.reason != "AlreadyExists":
                raise
            created = False
        self._applied[ref] = _Applied("", "", "", None, self._monotonic())
        return created


def _merge_fields(into: dict[str, Any], fields: Mapping[str, Any]) -> None:
    """Union of two fieldsV1 trees (a path is owned if either owns it)."""
    for key, child in fields.items():
        _merge_fields(into.setdefault(key, {}), child)


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
