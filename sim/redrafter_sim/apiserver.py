"""An in-memory Kubernetes API server for tests and the demo: kmock's KubernetesEmulator made realistic.

kmock 0.8 stores objects as plain JSON; kopf, kubectl, kubernetes-asyncio and Helm need more (see
docs/development.md "The API server"). This subclass replaces its request handling with a store that keeps
uid/resourceVersion/generation, preconditions, status and scale subresources, selectors, watches that
resume from a resourceVersion, owner-reference garbage collection, CRD installation (schema pruning,
defaulting, validation, printer columns as Tables) and real Status error bodies. It also keeps a request
log and can inject faults, so tests can count writes and exercise retries. kmock's Server still serves it.

Where each behaviour lives: ``apiserver_store`` (objects, CRUD, admission, garbage collection),
``apiserver_http`` (routing, discovery, watch streams, request log), ``apiserver_apply`` (server-side apply:
managedFields, conflicts, removal of unapplied fields), ``apiserver_patch`` (the other patch formats),
``apiserver_schema`` (CRD schemas), ``apiserver_resources`` (kinds and discovery documents); this module
holds the state and the API tests call directly.

Thread-safety: the store is guarded by a threading lock and watch queues are fed with
``call_soon_threadsafe``, so tests may read and write objects directly from any thread.
"""

from __future__ import annotations

import collections
import re
import threading
from collections.abc import Iterator
from typing import Any

import attrs
from kmock import KubernetesEmulator

from . import apiserver_resources as res
from . import nodes
from .apiserver_http import Fault, HttpFrontend, RequestRecord
from .apiserver_objects import as_type as _as_type
from .apiserver_resources import ResourceType
from .apiserver_selectors import parse_field_selector, parse_label_selector
from .apiserver_store import EXPIRED, ApiError, Event, ObjKey, StoreKey, Watcher

__all__ = ["ApiError", "ApiServerEmulator", "Fault", "RequestRecord"]

DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
HISTORY = 100_000  # watch events kept for resuming from a resourceVersion; older ones answer 410 Expired


@attrs.define(kw_only=True)
class ApiServerEmulator(HttpFrontend, KubernetesEmulator):
    """A stateful, realistic-enough Kubernetes API server (see module docstring)."""

    auto_create_namespaces: bool = True  # the real server answers 404 for a missing namespace
    history_size: int = HISTORY  # watch events kept for resuming from a resourceVersion
    _types: dict[tuple[str, str, str], ResourceType] = attrs.field(factory=dict, init=False, repr=False)
    _store: dict[StoreKey, dict[ObjKey, dict[str, Any]]] = attrs.field(
        factory=lambda: collections.defaultdict(dict), init=False, repr=False
    )
    _rv: int = attrs.field(default=1, init=False, repr=False)
    _history: collections.deque[Event] = attrs.field(factory=collections.deque, init=False, repr=False)
    _watchers: set[Watcher] = attrs.field(factory=set, init=False, repr=False)
    _mutex: threading.RLock = attrs.field(factory=threading.RLock, init=False, repr=False)
    _log: list[RequestRecord] = attrs.field(factory=list, init=False, repr=False)
    _faults: list[Fault] = attrs.field(factory=list, init=False, repr=False)
    _tokens: dict[str, str] = attrs.field(factory=dict, init=False, repr=False)  # bearer token -> user name
    _owned: dict[str, set[tuple[StoreKey, ObjKey]]] = attrs.field(factory=dict, init=False, repr=False)
    _namespaced: dict[StoreKey, dict[str | None, set[ObjKey]]] = attrs.field(
        factory=lambda: collections.defaultdict(dict), init=False, repr=False
    )
    internal_errors: list[Exception] = attrs.field(factory=list, init=False, repr=False)  # emulator bugs (answered 500)
    #: (name, GPU product, GPUs) of the GPU nodes registered at start (``()``: a cluster with no nodes)
    gpu_nodes: tuple[tuple[str, str, int], ...] = nodes.DEFAULT_NODES

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._history = collections.deque(maxlen=self.history_size)
        for rtype in res.BUILTINS:
            self._types[(rtype.group, rtype.version, rtype.plural)] = rtype
        ns_type = self.resource_type("v1", "Namespace")
        for name in DEFAULT_NAMESPACES:
            self._create(ns_type, None, {"metadata": {"name": name}})
        for name, product, gpus in self.gpu_nodes:
            self.add_node(name, product, gpus)

    # ------------------------------------------------------------------ test-facing API
    @property
    def request_log(self) -> list[RequestRecord]:
        """A snapshot of every HTTP request served so far."""
        with self._mutex:
            return list(self._log)

    def writes(self, since: int = 0) -> list[RequestRecord]:
        """Write requests from log position ``since`` on (use ``len(request_log)`` as a mark)."""
        return [r for r in self.request_log[since:] if r.is_write]

    def requests(
        self,
        since: int = 0,
        *,
        kind: str | None = None,
        method: str | None = None,
        path: str | None = None,
        user_agent: str | None = None,
    ) -> list[RequestRecord]:
        """Logged requests from position ``since`` filtered by kind (read/write/watch), method, a path regex
        and a User-Agent prefix (kopf sends ``kopf/<version>``)."""
        pattern = re.compile(path) if path else None
        return [
            r
            for r in self.request_log[since:]
            if (kind is None or r.kind == kind)
            and (method is None or r.method == method.upper())
            and (pattern is None or pattern.search(r.path))
            and (user_agent is None or r.user_agent.startswith(user_agent))
        ]

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

    def inject(
        self,
        method: str,
        path_regex: str,
        status: int,
        times: int = 1,
        message: str = "injected fault",
        *,
        delay: float = 0.0,
        retry_after: int | None = None,
    ) -> Fault:
        """Make the next ``times`` requests matching ``method`` ('*' for any) and the path regex fail
        (``status`` 0: let them through ``delay`` seconds late). Set ``remaining`` to 0 to lift it early."""
        fault = Fault(
            method.upper() if method != "*" else "*",
            re.compile(path_regex),
            status,
            times,
            message,
            delay=delay,
            retry_after=retry_after,
        )
        with self._mutex:
            self._faults.append(fault)
        return fault

    def lift_faults(self) -> None:
        """End every injected fault now, whatever it had left."""
        with self._mutex:
            for fault in self._faults:
                fault.remaining = 0

    def expire_watches(self) -> int:
        """Answer every open watch with ERROR 410 Expired (as a real server does when a stream's
        resourceVersion leaves its window) and end it; returns how many."""
        with self._mutex:
            watchers = list(self._watchers)
        for w in watchers:
            w.loop.call_soon_threadsafe(w.queue.put_nowait, EXPIRED)
        return len(watchers)

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

    def find_object(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        try:
            return self.get_object(api_version, kind, name, namespace)
        except KeyError:
            return None

    def list_objects(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[dict[str, Any]]:
        rtype = self.resource_type(api_version, kind)
        return self._list(rtype, namespace, parse_label_selector(label_selector), parse_field_selector(field_selector))

    def resource_versions(self, api_version: str, kind: str) -> dict[ObjKey, str]:
        """(namespace, name) -> resourceVersion of every stored object of a kind, without copying any: a
        cheap way for a simulated controller to find what changed since it last looked."""
        return self._resource_versions(self.resource_type(api_version, kind))

    def create_object(self, body: dict[str, Any], *, field_manager: str | None = None) -> dict[str, Any]:
        """Create from a full manifest (apiVersion/kind/metadata) as a POST would (no field_manager: the
        emulator's own write, which records no managedFields)."""
        rtype = self.resource_type(body["apiVersion"], body["kind"])
        return self._create(rtype, body.get("metadata", {}).get("namespace"), body, manager=field_manager)

    def patch_object(
        self,
        api_version: str,
        kind: str,
        name: str,
        namespace: str | None,
        patch: Any,
        *,
        subresource: str | None = None,
        patch_type: str = "merge",
        field_manager: str | None = None,
        force: bool = False,
    ) -> dict[str, Any]:
        """Patch as a PATCH request would (patch_type: merge | strategic | json | apply; an apply needs a
        field_manager; without one other patches keep ownership as it was, like the emulator's own writes)."""
        rtype = self.resource_type(api_version, kind)
        if patch_type == "apply" and not field_manager:
            raise ValueError("a server-side apply needs a field_manager")
        params = {"fieldManager": field_manager} if field_manager else {}
        if force:
            params["force"] = "true"
        return self._patch(rtype, namespace, name, patch_type, patch, subresource, params)

    def add_node(self, name: str, product: str | None = None, gpus: int = 0, **kwargs: Any) -> dict[str, Any]:
        """Register a Node as its kubelet would: the object, then its status (:func:`.nodes.node`)."""
        body, status = nodes.node(name, product, gpus, **kwargs)
        self.create_object(body)
        return self.patch_object("v1", "Node", name, None, {"status": status}, subresource="status")

    def delete_object(
        self, api_version: str, kind: str, name: str, namespace: str | None = None, propagation: str = "Background"
    ) -> dict[str, Any]:
        rtype = self.resource_type(api_version, kind)
        return self._delete(rtype, namespace, name, {"propagationPolicy": propagation})

    # ------------------------------------------------------------------ conveniences
    def iter_objects(self) -> Iterator[dict[str, Any]]:
        """Every stored object (copies), for debugging and assertions."""
        with self._mutex:
            by_store = self._all_types_by_store()
            items = [(by_store[s], o) for s, bucket in self._store.items() if s in by_store for o in bucket.values()]
        for rtype, obj in items:
            yield _as_type(obj, rtype)
