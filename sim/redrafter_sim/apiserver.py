"""An in-memory Kubernetes API server for tests and the demo: kmock's KubernetesEmulator made realistic.

kmock 0.8 stores objects as plain JSON; kopf, kubectl, kubernetes-asyncio and Helm need more (see
DESIGN.md "Test infrastructure"). This subclass replaces its request handling with a store that keeps
uid/resourceVersion/generation, preconditions, status and scale subresources, selectors, watches that
resume from a resourceVersion, owner-reference garbage collection, CRD installation (schema pruning,
defaulting, validation, printer columns as Tables) and real Status error bodies. It also keeps a request
log and can inject faults, so tests can count writes and exercise retries. kmock's Server still serves it.

Thread-safety: the store is guarded by a threading lock and watch queues are fed with
``call_soon_threadsafe``, so tests may read and write objects directly from any thread.
"""

from __future__ import annotations

import asyncio
import collections
import json
import random
import re
import string
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp.web
import attrs
import yaml
from kmock import KubernetesEmulator

from . import admission_podsecurity as podsecurity
from . import apiserver_protobuf as protobuf
from . import apiserver_resources as res
from . import podfailurepolicy
from .apiserver_leases import LeaseDecodeError, decode_lease, lease_causes
from .apiserver_objects import (as_type as _as_type, builtin_defaults as _builtin_defaults, clone as _clone,
                                events_v1_to_core as _events_v1_to_core, now as _now, set_path as _set_path,
                                spec_part as _spec_part, without_rv as _without_rv)
from .apiserver_patch import (PatchError, PatchTestFailed, json_patch, merge_patch, remove_unapplied,
                              strategic_merge_patch)
from .apiserver_resources import ResourceType
from .apiserver_schema import Cause, apply_defaults, prune, validate, validate_rules
from .apiserver_selectors import Matcher, jsonpath, parse_field_selector, parse_label_selector
from .apiserver_table import table, wants_table

StoreKey = tuple[str, str]  # (group, plural) shared by all versions of a kind
ObjKey = tuple[str | None, str]  # (namespace, name)

REASONS = {400: "BadRequest", 404: "NotFound", 405: "MethodNotAllowed", 409: "Conflict", 410: "Expired",
           415: "UnsupportedMediaType", 422: "Invalid", 429: "TooManyRequests", 500: "InternalError",
           503: "ServiceUnavailable", 504: "Timeout"}
PATCH_TYPES = {
    "application/json-patch+json": "json",
    "application/merge-patch+json": "merge",
    "application/strategic-merge-patch+json": "strategic",
    "application/apply-patch+yaml": "apply",
    "application/apply-patch+json": "apply",
}
TRUE_VALUES = ("1", "t", "T", "true", "TRUE", "True")  # Go's strconv.ParseBool
NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
HISTORY = 100_000  # watch events kept for resuming from a resourceVersion; older ones answer 410 Expired


class ApiError(Exception):
    """An error the server answers with a metav1.Status body."""

    def __init__(self, code: int, message: str, *, reason: str | None = None,
                 details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason or REASONS.get(code, "InternalError")
        self.message = message
        self.details = details

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                "message": self.message, "reason": self.reason, "code": self.code}
        if self.details:
            body["details"] = self.details
        return body


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
    """The next ``remaining`` requests matching (method, path) fail with ``status``."""

    method: str
    path: re.Pattern[str]
    status: int
    remaining: int
    message: str = "injected fault"

    def matches(self, method: str, path: str) -> bool:
        return self.remaining > 0 and self.method in ("*", method) and self.path.search(path) is not None


@dataclass(frozen=True)
class Event:
    rv: int
    store: StoreKey
    type: str  # ADDED | MODIFIED | DELETED
    obj: dict[str, Any]
    old: dict[str, Any] | None


@dataclass(eq=False)
class Watcher:
    """An open watch stream: what it selects and the queue its events arrive on (in its own loop)."""

    rtype: ResourceType
    namespace: str | None
    labels: Matcher
    fields: Matcher
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[Event | None] = field(default_factory=asyncio.Queue)
    transport: Any = None
    as_table: bool = False  # kubectl get -w asks for meta.k8s.io Tables

    def translate(self, event: Event) -> tuple[str, dict[str, Any]] | None:
        """The event as this watcher sees it: filtered, and ADDED/DELETED when selection changes."""
        def selected(obj: dict[str, Any] | None) -> bool:
            if obj is None:
                return False
            ns = obj["metadata"].get("namespace")
            return (self.namespace is None or ns == self.namespace) and self.labels(obj) and self.fields(obj)
        now, before = selected(event.obj), selected(event.old)
        if event.type == "MODIFIED" and now != before:
            kind = "ADDED" if now else "DELETED"
        elif now:
            kind = event.type
        else:
            return None
        return kind, _as_type(event.obj, self.rtype)


@attrs.define(kw_only=True)
class ApiServerEmulator(KubernetesEmulator):
    """A stateful, realistic-enough Kubernetes API server (see module docstring)."""

    auto_create_namespaces: bool = True  # the real server answers 404 for a missing namespace
    history_size: int = HISTORY  # watch events kept for resuming from a resourceVersion
    _types: dict[tuple[str, str, str], ResourceType] = attrs.field(factory=dict, init=False, repr=False)
    _store: dict[StoreKey, dict[ObjKey, dict[str, Any]]] = attrs.field(
        factory=lambda: collections.defaultdict(dict), init=False, repr=False)
    _rv: int = attrs.field(default=1, init=False, repr=False)
    _history: collections.deque[Event] = attrs.field(factory=collections.deque, init=False, repr=False)
    _watchers: set[Watcher] = attrs.field(factory=set, init=False, repr=False)
    _mutex: threading.RLock = attrs.field(factory=threading.RLock, init=False, repr=False)
    _log: list[RequestRecord] = attrs.field(factory=list, init=False, repr=False)
    _faults: list[Fault] = attrs.field(factory=list, init=False, repr=False)
    _tokens: dict[str, str] = attrs.field(factory=dict, init=False, repr=False)  # bearer token -> user name
    _owned: dict[str, set[tuple[StoreKey, ObjKey]]] = attrs.field(factory=dict, init=False, repr=False)
    # Last configuration each field manager applied (server-side apply ownership, simplified).
    _applied: dict[tuple[StoreKey, ObjKey, str], Any] = attrs.field(factory=dict, init=False, repr=False)
    internal_errors: list[Exception] = attrs.field(factory=list, init=False, repr=False)  # emulator bugs (answered 500)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._history = collections.deque(maxlen=self.history_size)
        for rtype in res.BUILTINS:
            self._types[(rtype.group, rtype.version, rtype.plural)] = rtype
        ns_type = self.resource_type("v1", "Namespace")
        for name in DEFAULT_NAMESPACES:
            self._create(ns_type, None, {"metadata": {"name": name}})

    # ------------------------------------------------------------------ test-facing API
    @property
    def request_log(self) -> list[RequestRecord]:
        """A snapshot of every HTTP request served so far."""
        with self._mutex:
            return list(self._log)

    def writes(self, since: int = 0) -> list[RequestRecord]:
        """Write requests from log position ``since`` on (use ``len(request_log)`` as a mark)."""
        return [r for r in self.request_log[since:] if r.is_write]

    def requests(self, since: int = 0, *, kind: str | None = None, method: str | None = None,
                 path: str | None = None, user_agent: str | None = None) -> list[RequestRecord]:
        """Logged requests from position ``since`` filtered by kind (read/write/watch), method, a path regex
        and a User-Agent prefix (kopf sends ``kopf/<version>``)."""
        pattern = re.compile(path) if path else None
        return [r for r in self.request_log[since:]
                if (kind is None or r.kind == kind) and (method is None or r.method == method.upper())
                and (pattern is None or pattern.search(r.path)) and
                (user_agent is None or r.user_agent.startswith(user_agent))]

    def add_token(self, token: str, user: str) -> None:
        """Authenticate ``token`` as ``user`` (a static token file): requests carrying it are logged with
        ``RequestRecord.user``, so a test tells apart processes that share a User-Agent. Requests without a
        known token stay anonymous (this server does not authorize)."""
        with self._mutex:
            self._tokens[token] = user

    def clear_faults(self) -> None:
        with self._mutex:
            self._faults.clear()

    def clear_log(self) -> None:
        with self._mutex:
            self._log.clear()

    def inject(self, method: str, path_regex: str, status: int, times: int = 1,
               message: str = "injected fault") -> Fault:
        """Make the next ``times`` requests matching ``method`` ('*' for any) and the path regex fail."""
        fault = Fault(method.upper() if method != "*" else "*", re.compile(path_regex), status, times, message)
        with self._mutex:
            self._faults.append(fault)
        return fault

    def drop_watches(self, abort: bool = False) -> int:
        """End every open watch stream (cleanly, or by closing the TCP connection); returns how many."""
        with self._mutex:
            watchers = list(self._watchers)
        for w in watchers:
            if abort and w.transport is not None:
                w.loop.call_soon_threadsafe(w.transport.close)
            w.loop.call_soon_threadsafe(w.queue.put_nowait, None)
        return len(watchers)

    @property
    def resource_version(self) -> int:
        return self._rv

    def resource_type(self, api_version: str, kind_or_plural: str) -> ResourceType:
        """Look a served type up by apiVersion and Kind (or plural)."""
        group, _, version = api_version.rpartition("/")
        with self._mutex:
            for t in self._types.values():
                if t.group == group and t.version == version and kind_or_plural in (t.kind, t.plural):
                    return t
        raise KeyError(f"{api_version} {kind_or_plural} is not served")

    def get_object(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        """A deep copy of a stored object (KeyError if absent)."""
        rtype = self.resource_type(api_version, kind)
        try:
            return self._get(rtype, namespace, name)
        except ApiError as exc:
            raise KeyError(exc.message) from None

    def find_object(self, api_version: str, kind: str, name: str,
                    namespace: str | None = None) -> dict[str, Any] | None:
        try:
            return self.get_object(api_version, kind, name, namespace)
        except KeyError:
            return None

    def list_objects(self, api_version: str, kind: str, namespace: str | None = None,
                     label_selector: str | None = None, field_selector: str | None = None) -> list[dict[str, Any]]:
        rtype = self.resource_type(api_version, kind)
        return self._list(rtype, namespace, parse_label_selector(label_selector),
                          parse_field_selector(field_selector))

    def create_object(self, body: dict[str, Any]) -> dict[str, Any]:
        """Create from a full manifest (apiVersion/kind/metadata) as a POST would."""
        rtype = self.resource_type(body["apiVersion"], body["kind"])
        return self._create(rtype, body.get("metadata", {}).get("namespace"), body)

    def patch_object(self, api_version: str, kind: str, name: str, namespace: str | None,
                     patch: Any, *, subresource: str | None = None, patch_type: str = "merge") -> dict[str, Any]:
        """Patch as a PATCH request would (patch_type: merge | strategic | json | apply)."""
        rtype = self.resource_type(api_version, kind)
        return self._patch(rtype, namespace, name, patch_type, patch, subresource, {})

    def delete_object(self, api_version: str, kind: str, name: str, namespace: str | None = None,
                      propagation: str = "Background") -> dict[str, Any]:
        rtype = self.resource_type(api_version, kind)
        return self._delete(rtype, namespace, name, {"propagationPolicy": propagation})

    # ------------------------------------------------------------------ store internals
    def _bucket(self, rtype: ResourceType) -> dict[ObjKey, dict[str, Any]]:
        return self._store[rtype.storage_key]

    def _put(self, rtype: ResourceType, key: ObjKey, obj: dict[str, Any]) -> None:
        """Store an object and keep the owner index (owner uid -> dependents) in step."""
        self._unindex(rtype.storage_key, key)
        self._bucket(rtype)[key] = obj
        for ref in obj["metadata"].get("ownerReferences") or []:
            if ref.get("uid"):
                self._owned.setdefault(ref["uid"], set()).add((rtype.storage_key, key))

    def _remove(self, rtype: ResourceType, key: ObjKey) -> dict[str, Any]:
        self._unindex(rtype.storage_key, key)
        for applied in [k for k in self._applied if k[0] == rtype.storage_key and k[1] == key]:
            del self._applied[applied]
        return self._bucket(rtype).pop(key)

    def _unindex(self, store: StoreKey, key: ObjKey) -> None:
        old = self._store[store].get(key)
        for ref in (old or {}).get("metadata", {}).get("ownerReferences") or []:
            dependents = self._owned.get(ref.get("uid", ""))
            if dependents is not None:
                dependents.discard((store, key))
                if not dependents:
                    del self._owned[ref["uid"]]

    def _key(self, rtype: ResourceType, namespace: str | None, name: str) -> ObjKey:
        return (namespace if rtype.namespaced else None, name)

    def _not_found(self, rtype: ResourceType, name: str) -> ApiError:
        res_name = f"{rtype.plural}.{rtype.group}" if rtype.group else rtype.plural
        return ApiError(404, f'{res_name} "{name}" not found',
                        details={"name": name, "group": rtype.group, "kind": rtype.plural})

    def _invalid(self, rtype: ResourceType, name: str, causes: list[Cause]) -> ApiError:
        qualified = f"{rtype.kind}.{rtype.group}" if rtype.group else rtype.kind
        joined = ", ".join(f"{c.field}: {c.message}" if c.field else c.message for c in causes)
        return ApiError(422, f'{qualified} "{name}" is invalid: {joined if len(causes) == 1 else "[" + joined + "]"}',
                        details={"name": name, "group": rtype.group, "kind": rtype.kind,
                                 "causes": [c.as_dict() for c in causes]})

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _emit(self, rtype: ResourceType, kind: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        event = Event(int(obj["metadata"]["resourceVersion"]), rtype.storage_key, kind, obj, old)
        self._history.append(event)
        for w in self._watchers:
            if w.rtype.storage_key == rtype.storage_key:
                try:
                    w.loop.call_soon_threadsafe(w.queue.put_nowait, event)
                except RuntimeError:  # the watcher's loop is closed; its stream is gone
                    pass

    def _get(self, rtype: ResourceType, namespace: str | None, name: str) -> dict[str, Any]:
        with self._mutex:
            obj = self._bucket(rtype).get(self._key(rtype, namespace, name))
            if obj is None:
                raise self._not_found(rtype, name)
            return _as_type(obj, rtype)

    def _list(self, rtype: ResourceType, namespace: str | None, labels: Matcher, fields: Matcher,
              ) -> list[dict[str, Any]]:
        with self._mutex:
            objs = [o for (ns, _), o in sorted(self._bucket(rtype).items(), key=lambda kv: (kv[0][0] or "", kv[0][1]))
                    if (namespace is None or ns == namespace) and labels(o) and fields(o)]
            return [_as_type(o, rtype) for o in objs]

    def _check_namespace(self, rtype: ResourceType, namespace: str | None) -> None:
        if not rtype.namespaced:
            return
        if not namespace:
            raise ApiError(400, "the namespace of the object is not set")
        ns_type = self._types[("", "v1", "namespaces")]
        if (None, namespace) not in self._bucket(ns_type):
            if not self.auto_create_namespaces:
                raise ApiError(404, f'namespaces "{namespace}" not found',
                               details={"name": namespace, "kind": "namespaces"})
            self._create(ns_type, None, {"metadata": {"name": namespace}})

    def _admit(self, rtype: ResourceType, obj: dict[str, Any],
               old: dict[str, Any] | None = None) -> dict[str, Any]:
        """CRD schema handling (prune, default, validate, CEL rules) and CRD acceptance; raises 422 Invalid."""
        name = obj["metadata"].get("name", "")
        if rtype.storage_key == ("coordination.k8s.io", "leases"):
            try:
                decode_lease(obj)
            except LeaseDecodeError as exc:
                raise ApiError(400, f'Lease in version "{rtype.version}" cannot be handled as a Lease: {exc}') from None
            causes = lease_causes(obj)
            if causes:
                raise self._invalid(rtype, name, causes)
        if rtype.schema is not None:
            obj = apply_defaults(prune(obj, rtype.schema, root=True), rtype.schema)
            causes = validate(obj, rtype.schema) or validate_rules(obj, rtype.schema, old)
            if causes:
                raise self._invalid(rtype, name, causes)
        if rtype.storage_key == ("batch", "jobs") and (causes := podfailurepolicy.validate(obj)):
            raise self._invalid(rtype, name, causes)
        if old is None and (rtype.group, rtype.plural) == ("", "pods"):  # PodSecurity admission, on create
            ns = self._bucket(self._types[("", "v1", "namespaces")]).get((None, obj["metadata"].get("namespace")))
            if forbidden := podsecurity.admit_pod(obj, ((ns or {}).get("metadata") or {}).get("labels") or {}):
                raise ApiError(403, forbidden, reason="Forbidden", details={"name": name, "kind": "pods"})
        if rtype.storage_key == res.CRD_STORAGE_KEY:
            try:
                types = res.types_from_crd(obj)
            except ValueError as exc:
                raise self._invalid(rtype, name, [Cause("spec", "FieldValueInvalid", str(exc))]) from None
            expected = f"{types[0].plural}.{types[0].group}" if types else name
            if name != expected:
                raise self._invalid(rtype, name, [Cause("metadata.name", "FieldValueInvalid",
                                                        f'Invalid value: "{name}": must be spec.names.'
                                                        f'plural+"."+spec.group')])
            names = obj["spec"]["names"]
            obj["status"] = {
                "acceptedNames": {k: v for k, v in names.items()},
                "storedVersions": [v["name"] for v in obj["spec"]["versions"] if v.get("storage", True)],
                "conditions": [
                    {"type": t, "status": "True", "reason": r, "message": m, "lastTransitionTime": _now()}
                    for t, r, m in (("NamesAccepted", "NoConflicts", "no conflicts found"),
                                    ("Established", "InitialNamesAccepted", "the initial names have been accepted"))
                ],
            }
        return obj

    def _install_crd(self, crd: dict[str, Any]) -> None:
        crd_name = crd["metadata"]["name"]
        for key in [k for k, t in self._types.items() if t.crd_name == crd_name]:
            del self._types[key]
        for t in res.types_from_crd(crd):
            self._types[(t.group, t.version, t.plural)] = t

    def _uninstall_crd(self, crd: dict[str, Any]) -> None:
        crd_name = crd["metadata"]["name"]
        types = [t for t in self._types.values() if t.crd_name == crd_name]
        for t in types:
            del self._types[(t.group, t.version, t.plural)]
        if types:
            bucket = self._bucket(types[0])
            for key in list(bucket):
                obj = self._remove(types[0], key)
                obj["metadata"]["resourceVersion"] = self._next_rv()
                self._emit(types[0], "DELETED", obj, obj)

    def _create(self, rtype: ResourceType, namespace: str | None, body: dict[str, Any],
                dry_run: bool = False) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise ApiError(400, "the body of the request was in an unknown format")
        obj = _clone(body)
        if rtype.group == "events.k8s.io":
            obj = _events_v1_to_core(obj)
        meta = obj.setdefault("metadata", {})
        if namespace and meta.get("namespace") and meta["namespace"] != namespace and rtype.namespaced:
            raise ApiError(400, "the namespace of the provided object does not match the namespace sent on the request")
        namespace = (namespace or meta.get("namespace")) if rtype.namespaced else None
        with self._mutex:
            if not meta.get("name") and meta.get("generateName"):
                suffix = "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
                meta["name"] = f"{meta['generateName']}{suffix}"
            name = meta.get("name")
            if not name:
                raise self._invalid(rtype, "", [Cause("metadata.name", "FieldValueRequired",
                                                      "Required value: name or generateName is required")])
            if not NAME_RE.match(name) or len(name) > 253:
                raise self._invalid(rtype, name, [Cause("metadata.name", "FieldValueInvalid",
                                                        f'Invalid value: "{name}": a lowercase RFC 1123 '
                                                        "subdomain must consist of lower case alphanumeric characters, "
                                                        "'-' or '.'")])
            self._check_namespace(rtype, namespace)
            key = self._key(rtype, namespace, name)
            if key in self._bucket(rtype):
                res_name = f"{rtype.plural}.{rtype.group}" if rtype.group else rtype.plural
                raise ApiError(409, f'{res_name} "{name}" already exists', reason="AlreadyExists",
                               details={"name": name, "group": rtype.group, "kind": rtype.plural})
            if rtype.status_subresource and rtype.storage_key != res.CRD_STORAGE_KEY:
                obj.pop("status", None)
            for k in ("resourceVersion", "uid", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink"):
                meta.pop(k, None)
            if rtype.namespaced:
                meta["namespace"] = namespace
            else:
                meta.pop("namespace", None)
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = _now()
            if rtype.generation_tracked:
                meta["generation"] = 1
            else:
                meta.pop("generation", None)
            _builtin_defaults(rtype, obj)
            obj = self._admit(rtype, obj)
            obj["apiVersion"], obj["kind"] = rtype.api_version, rtype.kind
            if dry_run:
                return _as_type(obj, rtype)
            obj["metadata"]["resourceVersion"] = self._next_rv()
            self._put(rtype, key, obj)
            if rtype.storage_key == res.CRD_STORAGE_KEY:
                self._install_crd(obj)
            self._emit(rtype, "ADDED", obj, None)
            return _as_type(obj, rtype)

    def _update(self, rtype: ResourceType, namespace: str | None, name: str, new: dict[str, Any],
                subresource: str | None, requested_rv: str | None, dry_run: bool = False) -> dict[str, Any]:
        """Common tail of PUT and PATCH: subresource rules, preconditions, generation, no-op detection."""
        with self._mutex:
            key = self._key(rtype, namespace, name)
            old = self._bucket(rtype).get(key)
            if old is None:
                raise self._not_found(rtype, name)
            if requested_rv and requested_rv != old["metadata"]["resourceVersion"]:
                res_name = f"{rtype.plural}.{rtype.group}" if rtype.group else rtype.plural
                raise ApiError(409, f'Operation cannot be fulfilled on {res_name} "{name}": the object has been '
                                    "modified; please apply your changes to the latest version and try again",
                               details={"name": name, "group": rtype.group, "kind": rtype.plural})
            if not isinstance(new, dict):
                raise ApiError(400, "the body of the request was in an unknown format")
            if subresource == "status":
                merged = _clone(old)
                if "status" in new:
                    merged["status"] = new["status"]
                else:
                    merged.pop("status", None)
                new = merged
            else:
                new = _clone(new)
                if rtype.status_subresource and rtype.storage_key != res.CRD_STORAGE_KEY:
                    if "status" in old:
                        new["status"] = _clone(old["status"])
                    else:
                        new.pop("status", None)
            meta = new.setdefault("metadata", {})
            if meta.get("name", name) != name:
                raise self._invalid(rtype, name, [Cause("metadata.name", "FieldValueInvalid",
                                                        "Invalid value: field is immutable")])
            for k in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "namespace",
                      "name"):
                if k in old["metadata"]:
                    meta[k] = old["metadata"][k]
                else:
                    meta.pop(k, None)
            if rtype.generation_tracked:
                meta["generation"] = old["metadata"].get("generation", 1)
            else:
                meta.pop("generation", None)
            new = self._admit(rtype, new, old)
            if rtype.generation_tracked and _spec_part(new) != _spec_part(old):
                new["metadata"]["generation"] = meta["generation"] + 1
            new["apiVersion"], new["kind"] = rtype.api_version, rtype.kind
            meta = new["metadata"]
            meta["resourceVersion"] = old["metadata"]["resourceVersion"]
            if _without_rv(new) == _without_rv(old) or dry_run:
                return _as_type(new if dry_run else old, rtype)
            meta["resourceVersion"] = self._next_rv()
            if meta.get("deletionTimestamp") and not meta.get("finalizers"):
                self._remove(rtype, key)  # the last finalizer is gone: the pending deletion completes
                self._finish_delete(rtype, new, "Background")
                return _as_type(new, rtype)
            self._put(rtype, key, new)
            if rtype.storage_key == res.CRD_STORAGE_KEY:
                self._install_crd(new)
            self._emit(rtype, "MODIFIED", new, old)
            return _as_type(new, rtype)

    def _replace(self, rtype: ResourceType, namespace: str | None, name: str, body: Any,
                 subresource: str | None, params: dict[str, str]) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise ApiError(400, "the body of the request was in an unknown format")
        if rtype.group == "events.k8s.io":
            body = _events_v1_to_core(body)
        if subresource == "scale":
            return self._write_scale(rtype, namespace, name, body, params)
        rv = (body.get("metadata") or {}).get("resourceVersion")
        return self._update(rtype, namespace, name, body, subresource, rv, "dryRun" in params)

    def _patch(self, rtype: ResourceType, namespace: str | None, name: str, patch_type: str, patch: Any,
               subresource: str | None, params: dict[str, str]) -> dict[str, Any]:
        with self._mutex:
            key = self._key(rtype, namespace, name)
            stored = self._bucket(rtype).get(key)
            if stored is None and patch_type == "apply" and subresource is None:
                if not isinstance(patch, dict):
                    raise ApiError(400, "the body of the request was in an unknown format")
                body = {**patch, "metadata": {**(patch.get("metadata") or {}), "name": name}}
                created = self._create(rtype, namespace, body, dry_run="dryRun" in params)
                if "dryRun" not in params:
                    self._applied[(rtype.storage_key, key, params.get("fieldManager", ""))] = _clone(patch)
                return created
            if stored is None:
                raise self._not_found(rtype, name)
            current = _as_type(stored, rtype)
            if subresource == "scale":
                scale = self._scale_of(rtype, current)
                return self._write_scale(rtype, namespace, name, self._apply(patch_type, scale, patch), params)
            manager = params.get("fieldManager", "")
            applied_key = (rtype.storage_key, key, manager)
            if patch_type == "apply" and applied_key in self._applied and isinstance(patch, dict):
                current = remove_unapplied(current, self._applied[applied_key], patch)
            try:
                new = self._apply(patch_type, current, patch)
            except PatchTestFailed as exc:
                raise self._invalid(rtype, name, [Cause("", "FieldValueInvalid", str(exc))]) from None
            except PatchError as exc:
                raise ApiError(400, str(exc)) from None
            if rtype.group == "events.k8s.io":
                new = _events_v1_to_core(new)
            requested_rv = None
            if isinstance(patch, dict):
                requested_rv = (patch.get("metadata") or {}).get("resourceVersion")
            elif isinstance(new, dict):
                new_rv = (new.get("metadata") or {}).get("resourceVersion")
                requested_rv = new_rv if new_rv != current["metadata"]["resourceVersion"] else None
            result = self._update(rtype, namespace, name, new, subresource, requested_rv, "dryRun" in params)
            if patch_type == "apply" and "dryRun" not in params and isinstance(patch, dict):
                self._applied[applied_key] = _clone(patch)
            return result

    @staticmethod
    def _apply(patch_type: str, current: Any, patch: Any) -> Any:
        if patch_type == "json":
            return json_patch(current, patch)
        if not isinstance(patch, dict):
            raise PatchError("a merge patch must be a JSON object")
        if patch_type == "strategic" or patch_type == "apply":
            return strategic_merge_patch(current, patch)
        return merge_patch(current, patch)

    def _scale_of(self, rtype: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
        if rtype.scale is None:
            raise ApiError(404, f"the server could not find the requested resource ({rtype.plural}/scale)")
        spec = jsonpath(obj, rtype.scale.spec_replicas_path)
        status = jsonpath(obj, rtype.scale.status_replicas_path)
        scale: dict[str, Any] = {
            "kind": "Scale", "apiVersion": "autoscaling/v1",
            "metadata": {k: obj["metadata"][k] for k in ("name", "namespace", "uid", "resourceVersion",
                                                         "creationTimestamp") if k in obj["metadata"]},
            "spec": {"replicas": spec[0] if spec else 0},
            "status": {"replicas": status[0] if status else 0},
        }
        if rtype.scale.label_selector_path:
            sel = jsonpath(obj, rtype.scale.label_selector_path)
            if sel:
                scale["status"]["selector"] = sel[0]
        return scale

    def _write_scale(self, rtype: ResourceType, namespace: str | None, name: str, scale: Any,
                     params: dict[str, str]) -> dict[str, Any]:
        if rtype.scale is None:
            raise ApiError(404, f"the server could not find the requested resource ({rtype.plural}/scale)")
        replicas = ((scale or {}).get("spec") or {}).get("replicas")
        if not isinstance(replicas, int) or replicas < 0:
            raise ApiError(422, f"Scale.autoscaling \"{name}\" is invalid: spec.replicas: Invalid value: "
                                f"{replicas!r}: must be greater than or equal to 0", reason="Invalid")
        with self._mutex:
            current = self._get(rtype, namespace, name)
            _set_path(current, rtype.scale.spec_replicas_path, replicas)
            rv = ((scale or {}).get("metadata") or {}).get("resourceVersion")
            updated = self._update(rtype, namespace, name, current, None, rv, "dryRun" in params)
            return self._scale_of(rtype, updated)

    def _delete(self, rtype: ResourceType, namespace: str | None, name: str,
                options: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
        with self._mutex:
            key = self._key(rtype, namespace, name)
            obj = self._bucket(rtype).get(key)
            if obj is None:
                raise self._not_found(rtype, name)
            pre = options.get("preconditions") or {}
            if pre.get("uid") and pre["uid"] != obj["metadata"]["uid"] or \
                    pre.get("resourceVersion") and pre["resourceVersion"] != obj["metadata"]["resourceVersion"]:
                raise ApiError(409, f'Operation cannot be fulfilled on {rtype.plural} "{name}": '
                                    "Precondition failed", details={"name": name, "kind": rtype.plural})
            if dry_run:
                return _as_type(obj, rtype)
            propagation = options.get("propagationPolicy") or \
                ("Orphan" if options.get("orphanDependents") else "Background")
            if obj["metadata"].get("finalizers"):
                if not obj["metadata"].get("deletionTimestamp"):
                    old = obj
                    obj = _clone(obj)
                    obj["metadata"]["deletionTimestamp"] = _now()
                    obj["metadata"]["deletionGracePeriodSeconds"] = 0
                    obj["metadata"]["resourceVersion"] = self._next_rv()
                    self._put(rtype, key, obj)
                    self._emit(rtype, "MODIFIED", obj, old)
                return _as_type(obj, rtype)
            self._remove(rtype, key)
            gone = _clone(obj)
            gone["metadata"]["resourceVersion"] = self._next_rv()
            self._finish_delete(rtype, gone, propagation)
            return _as_type(gone, rtype)

    def _finish_delete(self, rtype: ResourceType, gone: dict[str, Any], propagation: str) -> None:
        """After an object leaves the store: DELETED event, CRD removal, namespace and owner cascades."""
        self._emit(rtype, "DELETED", gone, gone)
        if rtype.storage_key == res.CRD_STORAGE_KEY:
            self._uninstall_crd(gone)
        if rtype.storage_key == ("", "namespaces"):
            self._delete_namespace_contents(gone["metadata"]["name"])
        self._collect_dependents(gone["metadata"]["uid"], orphan=propagation == "Orphan")

    def _all_types_by_store(self) -> dict[StoreKey, ResourceType]:
        by_store: dict[StoreKey, ResourceType] = {}
        for t in self._types.values():
            if t.storage_key not in by_store or t.group == t.storage_key[0]:
                by_store[t.storage_key] = t
        return by_store

    def _delete_namespace_contents(self, namespace: str) -> None:
        for store, rtype in self._all_types_by_store().items():
            if rtype.namespaced:
                for ns, name in [k for k in self._store[store] if k[0] == namespace]:
                    self._store[store][(ns, name)]["metadata"].pop("finalizers", None)
                    self._delete(rtype, ns, name, {})

    def _collect_dependents(self, owner_uid: str, orphan: bool) -> None:
        """Garbage collection: dependents whose every owner is gone are deleted (or orphaned)."""
        by_store = self._all_types_by_store()
        for store, key in sorted(self._owned.get(owner_uid, set())):
            obj = self._store[store].get(key)
            rtype = by_store.get(store)
            if obj is None or rtype is None:
                continue
            refs = obj["metadata"].get("ownerReferences") or []
            if orphan:
                kept = [r for r in refs if r.get("uid") != owner_uid]
                self._update(rtype, key[0], key[1],
                             {**obj, "metadata": {**obj["metadata"], "ownerReferences": kept}}, None, None)
            elif not any(self._uid_alive(r.get("uid", "")) for r in refs if r.get("uid") != owner_uid):
                self._delete(rtype, key[0], key[1], {})

    def _uid_alive(self, uid: str) -> bool:
        return any(o["metadata"].get("uid") == uid for bucket in self._store.values() for o in bucket.values())

    # ------------------------------------------------------------------ HTTP
    async def __call__(self, raw: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:  # type: ignore[override]
        body = await raw.read()
        query = dict(raw.query)
        method = raw.method.upper()
        kind = "watch" if method == "GET" and query.get("watch", "") in TRUE_VALUES else \
            "read" if method in ("GET", "HEAD", "OPTIONS") else "write"
        scheme, _, token = raw.headers.get("Authorization", "").partition(" ")
        with self._mutex:
            user = self._tokens.get(token, "") if scheme.lower() == "bearer" else ""
        record = RequestRecord(method, raw.path, query, raw.headers.get("Content-Type", ""), kind, time.time(),
                               raw.headers.get("User-Agent", ""), user=user)
        with self._mutex:
            self._log.append(record)
            fault = next((f for f in self._faults if f.matches(method, raw.path)), None)
            if fault is not None:
                fault.remaining -= 1
        try:
            if fault is not None:
                raise ApiError(fault.status, fault.message)
            response = await self._route(raw, method, query, body)
        except ApiError as exc:
            response = aiohttp.web.json_response(exc.status(), status=exc.code)
        except Exception as exc:  # a bug in the emulator must reach the client as a 500, not a hang
            self.internal_errors.append(exc)
            response = aiohttp.web.json_response(
                ApiError(500, f"emulator error: {type(exc).__name__}: {exc}").status(), status=500)
        record.status = response.status
        return response

    async def _route(self, raw: aiohttp.web.BaseRequest, method: str, query: dict[str, str],
                     body: bytes) -> aiohttp.web.StreamResponse:
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
        if not rest or len(rest) > 3:
            raise ApiError(404, "the server could not find the requested resource")
        plural, name, sub = rest[0], rest[1] if len(rest) > 1 else None, rest[2] if len(rest) > 2 else None
        with self._mutex:
            rtype = self._types.get((group, version, plural))
        if rtype is None:
            raise ApiError(404, "the server could not find the requested resource")
        if sub is not None and not ((sub == "status" and rtype.status_subresource) or
                                    (sub == "scale" and rtype.scale is not None)):
            raise ApiError(404, "the server could not find the requested resource")
        if rtype.namespaced is False:
            namespace = None
        accept = raw.headers.get("Accept", "")
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
            return aiohttp.web.json_response({"kind": f"{rtype.kind}List", "apiVersion": rtype.api_version,
                                              "metadata": {"resourceVersion": rv}, "items": items})
        if name is None and method == "POST":
            return aiohttp.web.json_response(
                self._create(rtype, namespace, self._body(body, raw), dry_run="dryRun" in query), status=201)
        if name is None and method == "DELETE":
            items = self._list(rtype, namespace, labels, fields)
            for item in items:
                self._delete(rtype, namespace, item["metadata"]["name"], {}, dry_run="dryRun" in query)
            return aiohttp.web.json_response({"kind": f"{rtype.kind}List", "apiVersion": rtype.api_version,
                                              "metadata": {"resourceVersion": str(self._rv)}, "items": items})
        if name is None:
            raise ApiError(405, f"{method} is not supported on a collection")
        if method == "GET":
            obj = self._get(rtype, namespace, name)
            if sub == "scale":
                return aiohttp.web.json_response(self._scale_of(rtype, obj))
            if wants_table(accept):
                return aiohttp.web.json_response(table(rtype, [obj], obj["metadata"]["resourceVersion"],
                                                       query.get("includeObject", "Metadata")))
            return aiohttp.web.json_response(obj)
        if method == "PUT":
            return aiohttp.web.json_response(self._replace(rtype, namespace, name, self._body(body, raw), sub, query))
        if method == "PATCH":
            ctype = raw.headers.get("Content-Type", "").split(";")[0].strip()
            patch_type = PATCH_TYPES.get(ctype)
            if patch_type is None:
                raise ApiError(415, f"the body of the request was in an unknown format - accepted media types "
                                    f"include: {', '.join(PATCH_TYPES)}")
            data = self._body(body, raw)
            with self._mutex:
                existed = self._key(rtype, namespace, name) in self._bucket(rtype)
                result = self._patch(rtype, namespace, name, patch_type, data, sub, query)
            return aiohttp.web.json_response(result, status=200 if existed else 201)
        if method == "DELETE":
            options = self._body(body, raw) if body else {}
            if "propagationPolicy" in query:
                options["propagationPolicy"] = query["propagationPolicy"]
            result = self._delete(rtype, namespace, name, options if isinstance(options, dict) else {},
                                  dry_run="dryRun" in query)
            return aiohttp.web.json_response(result)
        raise ApiError(405, f"method {method} is not allowed")

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
                return yaml.safe_load(body)
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
            return {"major": "1", "minor": "33", "gitVersion": "v1.33.0-redrafter-sim", "platform": "linux/amd64",
                    "gitCommit": "0000000", "gitTreeState": "clean", "buildDate": "2025-01-01T00:00:00Z",
                    "goVersion": "go1.24", "compiler": "gc"}
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
            return [Event(int(o["metadata"]["resourceVersion"]), watcher.rtype.storage_key, "ADDED", o, None)
                    for _, o in sorted(bucket.items(), key=lambda kv: (kv[0][0] or "", kv[0][1]))]
        try:
            since = int(resource_version)
        except ValueError:
            raise ApiError(400, f"invalid resourceVersion {resource_version!r}") from None
        if self._history and self._history[0].rv > since + 1 and len(self._history) == self._history.maxlen:
            return None
        return [e for e in self._history if e.rv > since and e.store == watcher.rtype.storage_key]

    async def _watch(self, raw: aiohttp.web.BaseRequest, rtype: ResourceType, namespace: str | None,
                     labels: Matcher, fields: Matcher, query: dict[str, str]) -> aiohttp.web.StreamResponse:
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
                bookmark = {"kind": rtype.kind, "apiVersion": rtype.api_version,
                            "metadata": {"resourceVersion": str(start_rv),
                                         "annotations": {"k8s.io/initial-events-end": "true"}}}
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

    # ------------------------------------------------------------------ conveniences
    def iter_objects(self) -> Iterator[dict[str, Any]]:
        """Every stored object (copies), for debugging and assertions."""
        with self._mutex:
            by_store = self._all_types_by_store()
            items = [(by_store[s], o) for s, bucket in self._store.items() if s in by_store for o in bucket.values()]
        for rtype, obj in items:
            yield _as_type(obj, rtype)


def _and(a: Matcher, b: Matcher) -> Matcher:
    return lambda obj: a(obj) and b(obj)


def parse_label_or_400(selector: str | None, parser: Any) -> Matcher:
    try:
        matcher: Matcher = parser(selector)
    except ValueError as exc:
        raise ApiError(400, str(exc)) from None
    return matcher
