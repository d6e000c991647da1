"""The emulated API server's object store: CRUD with Kubernetes semantics, admission, garbage collection.

Objects live as plain JSON per (group, plural); every write goes through ``_create``/``_update``/``_delete``,
which keep uid/resourceVersion/generation, preconditions, the status and scale subresources, CRD
installation and owner-reference garbage collection, and emit the watch events ``apiserver_http`` streams.
Errors are ``ApiError``s, answered with real metav1.Status bodies.
"""

from __future__ import annotations

import asyncio
import collections
import random
import re
import string
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any

from . import admission_podsecurity as podsecurity
from . import apiserver_apply as ssa
from . import apiserver_cronjobs as cronjobs
from . import apiserver_resources as res
from . import podfailurepolicy
from .apiserver_leases import LeaseDecodeError, decode_lease, lease_causes
from .apiserver_objects import as_type as _as_type
from .apiserver_objects import builtin_defaults as _builtin_defaults
from .apiserver_objects import clone as _clone
from .apiserver_objects import events_v1_to_core as _events_v1_to_core
from .apiserver_objects import now as _now
from .apiserver_objects import set_path as _set_path
from .apiserver_objects import spec_part as _spec_part
from .apiserver_objects import without_rv as _without_rv
from .apiserver_patch import PatchError, PatchTestFailed, json_patch, merge_patch, strategic_merge_patch
from .apiserver_resources import ResourceType
from .apiserver_schema import Cause, apply_defaults, prune, validate, validate_rules
from .apiserver_selectors import Matcher, jsonpath

StoreKey = tuple[str, str]  # (group, plural) shared by all versions of a kind
ObjKey = tuple[str | None, str]  # (namespace, name)

REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}
NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


class ApiError(Exception):
    """An error the server answers with a metav1.Status body."""

    def __init__(
        self, code: int, message: str, *, reason: str | None = None, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason or REASONS.get(code, "InternalError")
        self.message = message
        self.details = details

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            body["details"] = self.details
        return body


@dataclass(frozen=True)
class Event:
    rv: int
    store: StoreKey
    type: str  # ADDED | MODIFIED | DELETED
    obj: dict[str, Any]
    old: dict[str, Any] | None


EXPIRED = "EXPIRED"  # queued to a watcher: answer ERROR 410 Expired, then end the stream


@dataclass(eq=False)
class Watcher:
    """An open watch stream: what it selects and the queue its events arrive on (in its own loop)."""

    rtype: ResourceType
    namespace: str | None
    labels: Matcher
    fields: Matcher
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[Event | str | None] = field(default_factory=asyncio.Queue)  # None: end; EXPIRED: 410
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


class ObjectStore:
    """The store and its write paths; ApiServerEmulator holds the state (attrs fields) named here."""

    _types: dict[tuple[str, str, str], ResourceType]
    _store: dict[StoreKey, dict[ObjKey, dict[str, Any]]]
    _rv: int
    _history: collections.deque[Event]
    _watchers: set[Watcher]
    _mutex: threading.RLock
    _owned: dict[str, set[tuple[StoreKey, ObjKey]]]
    _namespaced: dict[StoreKey, dict[str | None, set[ObjKey]]]  # the keys of each namespace, per store
    auto_create_namespaces: bool

    def _bucket(self, rtype: ResourceType) -> dict[ObjKey, dict[str, Any]]:
        return self._store[rtype.storage_key]

    def _put(self, rtype: ResourceType, key: ObjKey, obj: dict[str, Any]) -> None:
        """Store an object and keep the owner index (owner uid -> dependents) in step."""
        self._unindex(rtype.storage_key, key)
        self._bucket(rtype)[key] = obj
        self._namespaced[rtype.storage_key].setdefault(key[0], set()).add(key)
        for ref in obj["metadata"].get("ownerReferences") or []:
            if ref.get("uid"):
                self._owned.setdefault(ref["uid"], set()).add((rtype.storage_key, key))

    def _remove(self, rtype: ResourceType, key: ObjKey) -> dict[str, Any]:
        self._unindex(rtype.storage_key, key)
        obj = self._bucket(rtype).pop(key)
        keys = self._namespaced[rtype.storage_key].get(key[0])
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._namespaced[rtype.storage_key][key[0]]
        return obj

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
        return ApiError(
            404, f'{res_name} "{name}" not found', details={"name": name, "group": rtype.group, "kind": rtype.plural}
        )

    def _invalid(self, rtype: ResourceType, name: str, causes: list[Cause]) -> ApiError:
        qualified = f"{rtype.kind}.{rtype.group}" if rtype.group else rtype.kind
        joined = ", ".join(f"{c.field}: {c.message}" if c.field else c.message for c in causes)
        return ApiError(
            422,
            f'{qualified} "{name}" is invalid: {joined if len(causes) == 1 else "[" + joined + "]"}',
            details={"name": name, "group": rtype.group, "kind": rtype.kind, "causes": [c.as_dict() for c in causes]},
        )

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

    def _list(
        self,
        rtype: ResourceType,
        namespace: str | None,
        labels: Matcher,
        fields: Matcher,
    ) -> list[dict[str, Any]]:
        with self._mutex:
            bucket = self._bucket(rtype)
            if namespace is not None and rtype.namespaced:  # a key range, as etcd's: only this namespace's objects
                keys = sorted(self._namespaced[rtype.storage_key].get(namespace, ()), key=lambda k: k[1])
            else:
                keys = sorted(
                    (k for k in bucket if namespace is None or k[0] == namespace), key=lambda k: (k[0] or "", k[1])
                )
            objs = [o for o in (bucket[k] for k in keys) if labels(o) and fields(o)]
            return [_as_type(o, rtype) for o in objs]

    def _resource_versions(self, rtype: ResourceType) -> dict[ObjKey, str]:
        with self._mutex:
            return {k: o["metadata"].get("resourceVersion", "") for k, o in self._bucket(rtype).items()}

    def _check_namespace(self, rtype: ResourceType, namespace: str | None) -> None:
        if not rtype.namespaced:
            return
        if not namespace:
            raise ApiError(400, "the namespace of the object is not set")
        ns_type = self._types[("", "v1", "namespaces")]
        if (None, namespace) not in self._bucket(ns_type):
            if not self.auto_create_namespaces:
                raise ApiError(
                    404, f'namespaces "{namespace}" not found', details={"name": namespace, "kind": "namespaces"}
                )
            self._create(ns_type, None, {"metadata": {"name": namespace}})

    def _admit(self, rtype: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None = None) -> dict[str, Any]:
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
        if rtype.storage_key == ("batch", "cronjobs") and (causes := cronjobs.validate(obj, old)):
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
                raise self._invalid(
                    rtype,
                    name,
                    [
                        Cause(
                            "metadata.name",
                            "FieldValueInvalid",
                            f'Invalid value: "{name}": must be spec.names.plural+"."+spec.group',
                        )
                    ],
                )
            names = obj["spec"]["names"]
            obj["status"] = {
                "acceptedNames": {k: v for k, v in names.items()},
                "storedVersions": [v["name"] for v in obj["spec"]["versions"] if v.get("storage", True)],
                "conditions": [
                    {"type": t, "status": "True", "reason": r, "message": m, "lastTransitionTime": _now()}
                    for t, r, m in (
                        ("NamesAccepted", "NoConflicts", "no conflicts found"),
                        ("Established", "InitialNamesAccepted", "the initial names have been accepted"),
                    )
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

    def _create(
        self,
        rtype: ResourceType,
        namespace: str | None,
        body: dict[str, Any],
        dry_run: bool = False,
        *,
        manager: str | None = None,
        applied: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """POST (``manager`` owns what it set) or an apply that creates (``applied``: the configuration)."""
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
                raise self._invalid(
                    rtype,
                    "",
                    [Cause("metadata.name", "FieldValueRequired", "Required value: name or generateName is required")],
                )
            if not NAME_RE.match(name) or len(name) > 253:
                raise self._invalid(
                    rtype,
                    name,
                    [
                        Cause(
                            "metadata.name",
                            "FieldValueInvalid",
                            f'Invalid value: "{name}": a lowercase RFC 1123 '
                            "subdomain must consist of lower case alphanumeric characters, "
                            "'-' or '.'",
                        )
                    ],
                )
            self._check_namespace(rtype, namespace)
            key = self._key(rtype, namespace, name)
            if key in self._bucket(rtype):
                res_name = f"{rtype.plural}.{rtype.group}" if rtype.group else rtype.plural
                raise ApiError(
                    409,
                    f'{res_name} "{name}" already exists',
                    reason="AlreadyExists",
                    details={"name": name, "group": rtype.group, "kind": rtype.plural},
                )
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
            obj["metadata"].pop("managedFields", None)
            if manager:
                obj["metadata"]["managedFields"] = ssa.created(
                    obj,
                    applied,
                    manager=manager,
                    api_version=rtype.api_version,
                    now=_now(),
                    status_subresource=rtype.status_subresource,
                )
            if dry_run:
                return _as_type(obj, rtype)
            obj["metadata"]["resourceVersion"] = self._next_rv()
            self._put(rtype, key, obj)
            if rtype.storage_key == res.CRD_STORAGE_KEY:
                self._install_crd(obj)
            self._emit(rtype, "ADDED", obj, None)
            return _as_type(obj, rtype)

    def _update(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str,
        new: dict[str, Any],
        subresource: str | None,
        requested_rv: str | None,
        dry_run: bool = False,
        *,
        manager: str | None = None,
        applied: bool = False,
    ) -> dict[str, Any]:
        """Common tail of PUT and PATCH: subresource rules, preconditions, generation, field ownership,
        no-op detection. ``manager`` records an Update; ``applied``: ``new`` carries its managedFields
        from server-side apply; neither (the emulator's own writes): ownership is kept as it was."""
        with self._mutex:
            key = self._key(rtype, namespace, name)
            old = self._bucket(rtype).get(key)
            if old is None:
                raise self._not_found(rtype, name)
            if requested_rv and requested_rv != old["metadata"]["resourceVersion"]:
                res_name = f"{rtype.plural}.{rtype.group}" if rtype.group else rtype.plural
                raise ApiError(
                    409,
                    f'Operation cannot be fulfilled on {res_name} "{name}": the object has been '
                    "modified; please apply your changes to the latest version and try again",
                    details={"name": name, "group": rtype.group, "kind": rtype.plural},
                )
            if not isinstance(new, dict):
                raise ApiError(400, "the body of the request was in an unknown format")
            if subresource == "status":
                merged = _clone(old)
                if "status" in new:
                    merged["status"] = new["status"]
                else:
                    merged.pop("status", None)
                if applied:
                    merged["metadata"]["managedFields"] = (new.get("metadata") or {}).get("managedFields")
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
                raise self._invalid(
                    rtype, name, [Cause("metadata.name", "FieldValueInvalid", "Invalid value: field is immutable")]
                )
            for k in (
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "namespace",
                "name",
            ):
                if k in old["metadata"]:
                    meta[k] = old["metadata"][k]
                else:
                    meta.pop(k, None)
            if rtype.generation_tracked:
                meta["generation"] = old["metadata"].get("generation", 1)
            else:
                meta.pop("generation", None)
            if subresource is None:
                _builtin_defaults(rtype, new)  # defaulting runs on every write (a removed default comes back)
            new = self._admit(rtype, new, old)
            if rtype.generation_tracked and _spec_part(new) != _spec_part(old):
                new["metadata"]["generation"] = meta["generation"] + 1
            new["apiVersion"], new["kind"] = rtype.api_version, rtype.kind
            meta = new["metadata"]
            meta["resourceVersion"] = old["metadata"]["resourceVersion"]
            if manager:
                meta["managedFields"] = ssa.update(
                    old,
                    new,
                    manager=manager,
                    api_version=rtype.api_version,
                    now=_now(),
                    subresource=subresource,
                    status_subresource=rtype.status_subresource,
                )
            elif not applied:
                if old["metadata"].get("managedFields"):
                    meta["managedFields"] = old["metadata"]["managedFields"]
                else:
                    meta.pop("managedFields", None)
            if not meta.get("managedFields"):
                meta.pop("managedFields", None)
            unchanged = _without_rv(new) == _without_rv(old) and ssa.same_ownership(
                meta.get("managedFields"), old["metadata"].get("managedFields")
            )
            if unchanged or dry_run:
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

    def _replace(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str,
        body: Any,
        subresource: str | None,
        params: dict[str, str],
    ) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise ApiError(400, "the body of the request was in an unknown format")
        if rtype.group == "events.k8s.io":
            body = _events_v1_to_core(body)
        if subresource == "scale":
            return self._write_scale(rtype, namespace, name, body, params)
        rv = (body.get("metadata") or {}).get("resourceVersion")
        return self._update(
            rtype, namespace, name, body, subresource, rv, "dryRun" in params, manager=params.get("fieldManager")
        )

    def _patch(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str,
        patch_type: str,
        patch: Any,
        subresource: str | None,
        params: dict[str, str],
    ) -> dict[str, Any]:
        if patch_type == "apply" and subresource != "scale":
            return self._server_side_apply(rtype, namespace, name, patch, subresource, params)
        with self._mutex:
            stored = self._bucket(rtype).get(self._key(rtype, namespace, name))
            if stored is None:
                raise self._not_found(rtype, name)
            current = _as_type(stored, rtype)
            if subresource == "scale":
                scale = self._scale_of(rtype, current)
                return self._write_scale(rtype, namespace, name, self._apply(patch_type, scale, patch), params)
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
            return self._update(
                rtype,
                namespace,
                name,
                new,
                subresource,
                requested_rv,
                "dryRun" in params,
                manager=params.get("fieldManager"),
            )

    def _server_side_apply(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str,
        config: Any,
        subresource: str | None,
        params: dict[str, str],
    ) -> dict[str, Any]:
        """PATCH application/apply-patch+yaml: create, or merge with ownership and conflicts (apiserver_apply)."""
        manager = params.get("fieldManager", "")
        if not isinstance(config, dict):
            raise ApiError(400, "the body of the request was in an unknown format")
        if not config.get("apiVersion") or not config.get("kind"):
            raise ApiError(400, "apiVersion and kind must be set in an apply configuration")
        if (config.get("metadata") or {}).get("name", name) != name:
            raise ApiError(400, "the name of the object does not match the name on the URL")
        dry_run = "dryRun" in params
        with self._mutex:
            stored = self._bucket(rtype).get(self._key(rtype, namespace, name))
            if stored is None:
                if subresource is not None:
                    raise self._not_found(rtype, name)
                body = {**config, "metadata": {**(config.get("metadata") or {}), "name": name}}
                return self._create(rtype, namespace, body, dry_run, manager=manager, applied=config)
            live = _as_type(stored, rtype)
            try:
                new = ssa.apply(
                    live,
                    config,
                    manager=manager,
                    api_version=rtype.api_version,
                    now=_now(),
                    subresource=subresource,
                    status_subresource=rtype.status_subresource,
                    force=params.get("force", "") in ("1", "t", "T", "true", "TRUE", "True"),
                )
            except ssa.ApplyConflicts as exc:
                raise ApiError(409, exc.message(), reason="Conflict", details={"causes": exc.causes()}) from None
            requested_rv = (config.get("metadata") or {}).get("resourceVersion")
            return self._update(rtype, namespace, name, new, subresource, requested_rv, dry_run, applied=True)

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
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {
                k: obj["metadata"][k]
                for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                if k in obj["metadata"]
            },
            "spec": {"replicas": spec[0] if spec else 0},
            "status": {"replicas": status[0] if status else 0},
        }
        if rtype.scale.label_selector_path:
            sel = jsonpath(obj, rtype.scale.label_selector_path)
            if sel:
                scale["status"]["selector"] = sel[0]
        return scale

    def _write_scale(
        self, rtype: ResourceType, namespace: str | None, name: str, scale: Any, params: dict[str, str]
    ) -> dict[str, Any]:
        if rtype.scale is None:
            raise ApiError(404, f"the server could not find the requested resource ({rtype.plural}/scale)")
        replicas = ((scale or {}).get("spec") or {}).get("replicas")
        if not isinstance(replicas, int) or replicas < 0:
            raise ApiError(
                422,
                f'Scale.autoscaling "{name}" is invalid: spec.replicas: Invalid value: '
                f"{replicas!r}: must be greater than or equal to 0",
                reason="Invalid",
            )
        with self._mutex:
            current = self._get(rtype, namespace, name)
            _set_path(current, rtype.scale.spec_replicas_path, replicas)
            rv = ((scale or {}).get("metadata") or {}).get("resourceVersion")
            updated = self._update(
                rtype, namespace, name, current, "scale", rv, "dryRun" in params, manager=params.get("fieldManager")
            )
            return self._scale_of(rtype, updated)

    def _delete(
        self, rtype: ResourceType, namespace: str | None, name: str, options: dict[str, Any], dry_run: bool = False
    ) -> dict[str, Any]:
        with self._mutex:
            key = self._key(rtype, namespace, name)
            obj = self._bucket(rtype).get(key)
            if obj is None:
                raise self._not_found(rtype, name)
            pre = options.get("preconditions") or {}
            if (
                pre.get("uid")
                and pre["uid"] != obj["metadata"]["uid"]
                or pre.get("resourceVersion")
                and pre["resourceVersion"] != obj["metadata"]["resourceVersion"]
            ):
                raise ApiError(
                    409,
                    f'Operation cannot be fulfilled on {rtype.plural} "{name}": Precondition failed',
                    details={"name": name, "kind": rtype.plural},
                )
            if dry_run:
                return _as_type(obj, rtype)
            propagation = options.get("propagationPolicy") or (
                "Orphan" if options.get("orphanDependents") else "Background"
            )
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
                self._update(
                    rtype, key[0], key[1], {**obj, "metadata": {**obj["metadata"], "ownerReferences": kept}}, None, None
                )
            elif not any(self._uid_alive(r.get("uid", "")) for r in refs if r.get("uid") != owner_uid):
                self._delete(rtype, key[0], key[1], {})

    def _uid_alive(self, uid: str) -> bool:
        return any(o["metadata"].get("uid") == uid for bucket in self._store.values() for o in bucket.values())
