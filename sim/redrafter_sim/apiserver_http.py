"""The emulated API server's HTTP side: request log and fault injection, routing, discovery, watch streams.

``HttpFrontend.__call__`` is what kmock's Server calls for every request: it logs it, applies injected
faults, routes it to the object store and answers errors as metav1.Status. Watches stream the store's
events (initial state or history after a resourceVersion, then live), filtered per watcher.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass
from typing import Any

import aiohttp.web
import yaml

from . import apiserver_authz as authz
from . import apiserver_protobuf as protobuf
from . import apiserver_resources as res
from .apiserver_resources import ResourceType
from .apiserver_selectors import Matcher, parse_field_selector, parse_label_selector
from .apiserver_store import EXPIRED, ApiError, Event, ObjectStore, Watcher
from .apiserver_table import table, wants_table

PATCH_TYPES = {
    "application/json-patch+json": "json",
    "application/merge-patch+json": "merge",
    "application/strategic-merge-patch+json": "strategic",
    "application/apply-patch+yaml": "apply",
    "application/apply-patch+json": "apply",
}
TRUE_VALUES = ("1", "t", "T", "true", "TRUE", "True")  # Go's strconv.ParseBool
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass
class RequestRecord:
    """One HTTP request as the tests see it (no bodies: they may carry secrets)."""

    method: str
    path: str
    query: dict[str, str]
    content_type: str
    kind: str  # "read" | "write" | "watch"
    timestamp: float
    user_agent: str
    status: int = 0
    user: str = ""  # who the bearer token authenticates (see ``add_token``); "" for anonymous requests

    @property
    def is_write(self) -> bool:
        return self.kind == "write"


@dataclass
class Fault:
    """The next ``remaining`` requests matching (method, path) fail with ``status``; ``status`` 0 lets them
    through, only ``delay`` seconds late. ``retry_after``: the Retry-After a 429 or 503 carries (seconds)."""

    method: str
    path: re.Pattern[str]
    status: int
    remaining: int
    message: str = "injected fault"
    delay: float = 0.0
    retry_after: int | None = None

    def matches(self, method: str, path: str) -> bool:
        return self.remaining > 0 and self.method in ("*", method) and self.path.search(path) is not None


class HttpFrontend(ObjectStore):
    """HTTP handling over the object store (the request log and faults live in ApiServerEmulator's fields)."""

    _log: list[RequestRecord]
    _faults: list[Fault]
    _tokens: dict[str, str]
    internal_errors: list[Exception]

    async def __call__(self, raw: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:  # type: ignore[override]
        body = await raw.read()
        query = dict(raw.query)
        method = raw.method.upper()
        kind = (
            "watch"
            if method == "GET" and query.get("watch", "") in TRUE_VALUES
            else "read"
            if method in ("GET", "HEAD", "OPTIONS")
            else "write"
        )
        scheme, _, token = raw.headers.get("Authorization", "").partition(" ")
        with self._mutex:
            user = self._tokens.get(token, "") if scheme.lower() == "bearer" else ""
        record = RequestRecord(
            method,
            raw.path,
            query,
            raw.headers.get("Content-Type", ""),
            kind,
            time.time(),
            raw.headers.get("User-Agent", ""),
            user=user,
        )
        with self._mutex:
            self._log.append(record)
            fault = next((f for f in self._faults if f.matches(method, raw.path)), None)
            if fault is not None:
                fault.remaining -= 1
        try:
            if fault is not None and fault.delay:
                await asyncio.sleep(fault.delay)
            if fault is not None and fault.status:
                details = {"retryAfterSeconds": fault.retry_after} if fault.retry_after is not None else None
                raise ApiError(fault.status, fault.message, details=details)
            response = await self._route(raw, method, query, body)
        except ApiError as exc:
            response = aiohttp.web.json_response(exc.status(), status=exc.code)
            if fault is not None and fault.retry_after is not None:
                response.headers["Retry-After"] = str(fault.retry_after)
        except Exception as exc:  # a bug in the emulator must reach the client as a 500, not a hang
            self.internal_errors.append(exc)
            response = aiohttp.web.json_response(
                ApiError(500, f"emulator error: {type(exc).__name__}: {exc}").status(), status=500
            )
        record.status = response.status
        return response

    async def _route(
        self, raw: aiohttp.web.BaseRequest, method: str, query: dict[str, str], body: bytes
    ) -> aiohttp.web.StreamResponse:
        parts = [p for p in raw.path.split("/") if p]
        if method == "GET":
            doc = self._discovery(parts)
            if doc is not None:
                return doc if isinstance(doc, aiohttp.web.StreamResponse) else aiohttp.web.json_response(doc)
        if len(parts) >= 2 and parts[0] == "api":
            group, version, rest = "", parts[1], parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis":
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise ApiError(404, "the server could not find the requested resource")
        namespace: str | None = None
        if len(rest) >= 3 and rest[0] == "namespaces" and not (len(rest) == 3 and rest[2] in ("status", "finalize")):
            namespace, rest = rest[1], rest[2:]
        if group == "" and namespace and len(rest) >= 3 and rest[0] == "services" and rest[2] == "proxy":
            return await self._service_proxy(raw, method, namespace, rest[1], "/".join(rest[3:]))
        if not rest or len(rest) > 3:
            raise ApiError(404, "the server could not find the requested resource")
        if (group, version) == (authz.GROUP, "v1") and namespace is None and rest[0] in authz.REVIEWS:
            if len(rest) != 1 or method != "POST":
                raise ApiError(405, f"{method} is not allowed on {rest[0]}: they are create-only")
            return aiohttp.web.json_response(self._access_review(rest[0], self._body(body, raw), raw), status=201)
        plural, name, sub = rest[0], rest[1] if len(rest) > 1 else None, rest[2] if len(rest) > 2 else None
        with self._mutex:
            rtype = self._types.get((group, version, plural))
        if rtype is None:
            raise ApiError(404, "the server could not find the requested resource")
        if sub is not None and not (
            (sub == "status" and rtype.status_subresource) or (sub == "scale" and rtype.scale is not None)
        ):
            raise ApiError(404, "the server could not find the requested resource")
        if rtype.namespaced is False:
            namespace = None
        accept = raw.headers.get("Accept", "")
        if method in ("POST", "PUT", "PATCH"):
            query = {**query, "fieldManager": self._field_manager(raw, method, query)}
        labels = parse_label_or_400(query.get("labelSelector"), parse_label_selector)
        fields = parse_label_or_400(query.get("fieldSelector"), parse_field_selector)

        if method == "GET" and query.get("watch", "") in TRUE_VALUES:
            if name is not None:
                fields = _and(fields, parse_field_selector(f"metadata.name={name}"))
            return await self._watch(raw, rtype, namespace, labels, fields, query)
        if method == "GET" and name is None:
            items = self._list(rtype, namespace, labels, fields)
            rv = str(self._rv)
            if wants_table(accept):
                return aiohttp.web.json_response(table(rtype, items, rv, query.get("includeObject", "Metadata")))
            return aiohttp.web.json_response(
                {
                    "kind": f"{rtype.kind}List",
                    "apiVersion": rtype.api_version,
                    "metadata": {"resourceVersion": rv},
                    "items": items,
                }
            )
        if name is None and method == "POST":
            return aiohttp.web.json_response(
                self._create(
                    rtype, namespace, self._body(body, raw), dry_run="dryRun" in query, manager=query["fieldManager"]
                ),
                status=201,
            )
        if name is None and method == "DELETE":
            items = self._list(rtype, namespace, labels, fields)
            for item in items:
                self._delete(rtype, namespace, item["metadata"]["name"], {}, dry_run="dryRun" in query)
            return aiohttp.web.json_response(
                {
                    "kind": f"{rtype.kind}List",
                    "apiVersion": rtype.api_version,
                    "metadata": {"resourceVersion": str(self._rv)},
                    "items": items,
                }
            )
        if name is None:
            raise ApiError(405, f"{method} is not supported on a collection")
        if method == "GET":
            obj = self._get(rtype, namespace, name)
            if sub == "scale":
                return aiohttp.web.json_response(self._scale_of(rtype, obj))
            if wants_table(accept):
                return aiohttp.web.json_response(
                    table(rtype, [obj], obj["metadata"]["resourceVersion"], query.get("includeObject", "Metadata"))
                )
            return aiohttp.web.json_response(obj)
        if method == "PUT":
            return aiohttp.web.json_response(self._replace(rtype, namespace, name, self._body(body, raw), sub, query))
        if method == "PATCH":
            ctype = raw.headers.get("Content-Type", "").split(";")[0].strip()
            patch_type = PATCH_TYPES.get(ctype)
            if patch_type is None:
                raise ApiError(
                    415,
                    f"the body of the request was in an unknown format - accepted media types "
                    f"include: {', '.join(PATCH_TYPES)}",
                )
            data = self._body(body, raw)
            with self._mutex:
                existed = self._key(rtype, namespace, name) in self._bucket(rtype)
                result = self._patch(rtype, namespace, name, patch_type, data, sub, query)
            return aiohttp.web.json_response(result, status=200 if existed else 201)
        if method == "DELETE":
            options = self._body(body, raw) if body else {}
            if "propagationPolicy" in query:
                options["propagationPolicy"] = query["propagationPolicy"]
            result = self._delete(
                rtype, namespace, name, options if isinstance(options, dict) else {}, dry_run="dryRun" in query
            )
            return aiohttp.web.json_response(result)
        raise ApiError(405, f"method {method} is not allowed")

    async def _service_proxy(
        self, raw: aiohttp.web.BaseRequest, method: str, namespace: str, ref: str, path: str
    ) -> aiohttp.web.StreamResponse:
        """``services/[scheme:]name[:port]/proxy/path``: the request, forwarded to a ready address of the
        Service's Endpoints on the port matching the Service port (by name or number; the only one when
        unnamed), as the API server's service proxy does (GET and HEAD only here)."""
        if method not in ("GET", "HEAD"):
            raise ApiError(405, f"method {method} is not allowed on the emulator's service proxy")
        parts = ref.split(":")
        scheme = parts.pop(0) if len(parts) == 3 else "http"
        name, port = parts[0], parts[1] if len(parts) > 1 else ""
        service = self._get(self._types[("", "v1", "services")], namespace, name)
        ports = (service.get("spec") or {}).get("ports") or []
        chosen = [p for p in ports if port in (p.get("name"), str(p.get("port")))] if port else ports[:1]
        if len(chosen) != 1 or (not port and len(ports) > 1):
            raise ApiError(503, f'no endpoints available for service "{ref}"', reason="ServiceUnavailable")
        try:
            endpoints = self._get(self._types[("", "v1", "endpoints")], namespace, name)
        except ApiError:
            endpoints = {}
        target = None
        for subset in endpoints.get("subsets") or []:
            addresses = subset.get("addresses") or []
            for p in subset.get("ports") or []:
                if addresses and (p.get("name") or "") == (chosen[0].get("name") or ""):
                    target = (addresses[0]["ip"], int(p["port"]))
                    break
            if target:
                break
        if target is None:
            raise ApiError(503, f'no endpoints available for service "{ref}"', reason="ServiceUnavailable")
        url = f"{scheme}://{target[0]}:{target[1]}/{path}"
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
                async with session.request(method, url, params=dict(raw.query)) as upstream:
                    body = await upstream.read()
                    return aiohttp.web.Response(
                        status=upstream.status,
                        body=body,
                        headers={"Content-Type": upstream.headers.get("Content-Type", "text/plain")},
                    )
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise ApiError(503, f"error trying to reach service: {exc}", reason="ServiceUnavailable") from None

    def _access_review(self, plural: str, body: Any, raw: aiohttp.web.BaseRequest) -> dict[str, Any]:
        """A (Self)SubjectAccessReview answered from the stored RBAC objects (:mod:`.apiserver_authz`)."""
        spec = dict((body or {}).get("spec") or {}) if isinstance(body, dict) else {}
        self_review = plural == "selfsubjectaccessreviews"
        problem = authz.invalid(spec, self_review)
        if problem:
            raise ApiError(422, f'{authz.KINDS[plural]}.authorization.k8s.io "" is invalid: {problem}')
        admin = False
        if self_review:
            scheme, _, token = raw.headers.get("Authorization", "").partition(" ")
            with self._mutex:
                user = self._tokens.get(token, "") if scheme.lower() == "bearer" else ""
            admin = not user
            spec = {**spec, "user": user, "groups": authz.user_groups(user)} if user else spec
        if admin:
            status: dict[str, Any] = {"allowed": True, "reason": authz.ADMIN_REASON}
        else:
            with self._mutex:
                listed = {
                    kind: self._list(self._types[("rbac.authorization.k8s.io", "v1", kind)], None, _all, _all)
                    for kind in ("roles", "clusterroles", "rolebindings", "clusterrolebindings")
                }
            status = authz.review(
                spec,
                roles=listed["roles"],
                cluster_roles=listed["clusterroles"],
                role_bindings=listed["rolebindings"],
                cluster_role_bindings=listed["clusterrolebindings"],
            )
        return {
            "kind": authz.KINDS[plural],
            "apiVersion": f"{authz.GROUP}/v1",
            "metadata": {"creationTimestamp": None},
            "spec": spec,
            "status": status,
        }

    @staticmethod
    def _field_manager(raw: aiohttp.web.BaseRequest, method: str, query: dict[str, str]) -> str:
        """The writer's field manager: ``fieldManager``, else the User-Agent up to its first "/" (as
        k8s.io/apiserver handlers prefixFromUserAgent); an apply must name one, only an apply may force."""
        is_apply = (
            method == "PATCH" and PATCH_TYPES.get(raw.headers.get("Content-Type", "").split(";")[0].strip()) == "apply"
        )
        causes = []
        if is_apply and not query.get("fieldManager"):
            causes.append("fieldManager: Required value: is required for apply patch")
        if not is_apply and "force" in query:
            causes.append("force: Forbidden: may not be specified for non-apply patch")
        if causes:
            joined = causes[0] if len(causes) == 1 else "[" + ", ".join(causes) + "]"
            raise ApiError(422, f'PatchOptions.meta.k8s.io "" is invalid: {joined}')
        manager = query.get("fieldManager") or raw.headers.get("User-Agent", "").split("/")[0]
        return "".join(c for c in manager if c.isprintable())[:128]

    @staticmethod
    def _body(body: bytes, raw: aiohttp.web.BaseRequest) -> Any:
        ctype = raw.headers.get("Content-Type", "")
        if "protobuf" in ctype:
            try:
                return protobuf.decode(body)
            except ValueError as exc:
                raise ApiError(415, f"unsupported protobuf body: {exc}") from None
        if not body:
            return {}
        try:
            if "yaml" in ctype:
                try:
                    return json.loads(body)  # JSON is YAML, and most clients send apply configurations as JSON
                except ValueError:
                    return yaml.load(body, Loader=_YAML_LOADER)
            return json.loads(body)
        except (ValueError, yaml.YAMLError) as exc:
            raise ApiError(400, f"the body of the request was in an unknown format: {exc}") from None

    def _discovery(self, parts: list[str]) -> dict[str, Any] | aiohttp.web.StreamResponse | None:
        with self._mutex:
            types = list(self._types.values())
        if not parts:
            paths = {"/api", "/api/v1", "/apis", "/version", "/healthz", "/livez", "/readyz"}
            for t in types:
                if t.group:
                    paths |= {f"/apis/{t.group}", f"/apis/{t.group}/{t.version}"}
            return {"paths": sorted(paths)}
        if parts == ["version"]:
            return {
                "major": "1",
                "minor": "33",
                "gitVersion": "v1.33.0-redrafter-sim",
                "platform": "linux/amd64",
                "gitCommit": "0000000",
                "gitTreeState": "clean",
                "buildDate": "2025-01-01T00:00:00Z",
                "goVersion": "go1.24",
                "compiler": "gc",
            }
        if parts[0] in ("healthz", "livez", "readyz") and len(parts) == 1:
            return aiohttp.web.Response(text="ok")
        if parts == ["api"]:
            return res.api_versions_doc()
        if parts == ["apis"]:
            return res.api_group_list_doc(types)
        if len(parts) == 2 and parts[0] == "api":
            doc = res.resource_list_doc("", parts[1], types)
            if doc is None:
                raise ApiError(404, "the server could not find the requested resource")
            return doc
        if len(parts) == 2 and parts[0] == "apis":
            doc = res.api_group_doc(parts[1], types)
            if doc is None:
                raise ApiError(404, "the server could not find the requested resource")
            return doc
        if len(parts) == 3 and parts[0] == "apis":
            doc = res.resource_list_doc(parts[1], parts[2], types)
            if doc is None:
                raise ApiError(404, "the server could not find the requested resource")
            return doc
        if parts == ["openapi", "v3"]:
            return res.openapi_v3_root(types)
        if len(parts) >= 4 and parts[:2] == ["openapi", "v3"]:
            gv = parts[2:]
            doc = res.openapi_v3_doc("" if gv[0] == "api" else gv[1], gv[-1], types) if len(gv) in (2, 3) else None
            if doc is None:
                raise ApiError(404, "the server could not find the requested resource")
            return doc
        if parts[0] == "openapi":
            raise ApiError(404, "the emulator serves no OpenAPI documents")
        return None

    def _initial_events(self, watcher: Watcher, resource_version: str | None) -> list[Event] | None:
        """Events a new watch starts with: current state (no rv) or history after rv (None: too old)."""
        if not resource_version or resource_version == "0":
            bucket = self._bucket(watcher.rtype)
            return [
                Event(int(o["metadata"]["resourceVersion"]), watcher.rtype.storage_key, "ADDED", o, None)
                for _, o in sorted(bucket.items(), key=lambda kv: (kv[0][0] or "", kv[0][1]))
            ]
        try:
            since = int(resource_version)
        except ValueError:
            raise ApiError(400, f"invalid resourceVersion {resource_version!r}") from None
        if self._history and self._history[0].rv > since + 1 and len(self._history) == self._history.maxlen:
            return None
        return [e for e in self._history if e.rv > since and e.store == watcher.rtype.storage_key]

    async def _watch(
        self,
        raw: aiohttp.web.BaseRequest,
        rtype: ResourceType,
        namespace: str | None,
        labels: Matcher,
        fields: Matcher,
        query: dict[str, str],
    ) -> aiohttp.web.StreamResponse:
        watcher = Watcher(rtype, namespace, labels, fields, asyncio.get_running_loop())
        watcher.transport = raw.transport
        watcher.as_table = wants_table(raw.headers.get("Accept", ""))
        with self._mutex:
            initial_rv = None if query.get("sendInitialEvents") == "true" else query.get("resourceVersion")
            initial = self._initial_events(watcher, initial_rv)
            start_rv = self._rv
            self._watchers.add(watcher)
        response = aiohttp.web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        try:
            await response.prepare(raw)
            if initial is None:
                gone = ApiError(410, "too old resource version", reason="Expired").status()
                await response.write(json.dumps({"type": "ERROR", "object": gone}).encode() + b"\n")
                return response
            for event in initial:
                await self._send(response, watcher, event)
            if query.get("sendInitialEvents") == "true":  # streaming list (WatchList): mark the end of state
                bookmark = {
                    "kind": rtype.kind,
                    "apiVersion": rtype.api_version,
                    "metadata": {
                        "resourceVersion": str(start_rv),
                        "annotations": {"k8s.io/initial-events-end": "true"},
                    },
                }
                await response.write(json.dumps({"type": "BOOKMARK", "object": bookmark}).encode() + b"\n")
            timeout = float(query.get("timeoutSeconds") or 0) or None
            deadline = None if timeout is None else asyncio.get_running_loop().time() + timeout
            while True:
                remaining = None if deadline is None else deadline - asyncio.get_running_loop().time()
                if remaining is not None and remaining <= 0:
                    break
                try:
                    event = await asyncio.wait_for(watcher.queue.get(), remaining)
                except TimeoutError:
                    break
                if event is None:
                    break
                if event is EXPIRED:  # the stream's resourceVersion fell out of the history window
                    gone = ApiError(410, "too old resource version", reason="Expired").status()
                    await response.write(json.dumps({"type": "ERROR", "object": gone}).encode() + b"\n")
                    break
                await self._send(response, watcher, event)
            await response.write_eof()
        except (ConnectionResetError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            with self._mutex:
                self._watchers.discard(watcher)
        return response

    @staticmethod
    async def _send(response: aiohttp.web.StreamResponse, watcher: Watcher, event: Event) -> None:
        translated = watcher.translate(event)
        if translated is not None:
            kind, obj = translated
            if watcher.as_table:
                obj = table(watcher.rtype, [obj], obj["metadata"]["resourceVersion"])
            await response.write(json.dumps({"type": kind, "object": obj}).encode() + b"\n")


def _all(obj: Any) -> bool:
    return True


def _and(a: Matcher, b: Matcher) -> Matcher:
    return lambda obj: a(obj) and b(obj)


def parse_label_or_400(selector: str | None, parser: Any) -> Matcher:
    try:
        matcher: Matcher = parser(selector)
    except ValueError as exc:
        raise ApiError(400, str(exc)) from None
    return matcher
