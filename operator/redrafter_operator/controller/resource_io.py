"""The resource I/O the reconciler and the evaluators share: the newest body, status writes, Events,
serving targets, intervals and the child Deployments seen by the indexes.

It sits below both: the evaluators (:mod:`.speculation`, :mod:`.validation`) see the running controller
only through :class:`Host`, so they never import the kopf shell or the reconciler, and a test can hand
them a small fake that has the same attributes.
"""

from __future__ import annotations

import contextvars
import datetime as dt
import logging
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Protocol

import kopf
from pydantic import ValidationError

from engine_jobs.contract import VARIANTS

from ..api import GROUP, PLURAL, VERSION
from ..api.spec import ReDrafterDeploymentSpec
from ..api.types import parse_duration
from ..render import names
from .apply import ApiError, KubeClient
from .plan_types import ServingTargets

log = logging.getLogger("redrafter_operator.controller")

Key = tuple[str, str]  # (namespace, name)
DEFAULT_INTERVAL_SECONDS = 30.0


class Host(Protocol):
    """What an evaluator may use of the running controller (:class:`~.reconciler.Controller` has it all)."""

    client: KubeClient
    bodies: dict[Key, dict[str, Any]]  # newest body per resource, as the watch delivered it
    written: dict[Key, dict[str, Any]]  # the status last written, until the watch echoes it
    indexes: Mapping[str, Any]  # the kopf indexes by id
    posting_vars: list[tuple[contextvars.ContextVar[Any], Any]]  # kopf's Event queue (see post_events)

    def set_targets(self, namespace: str, name: str, targets: ServingTargets | None) -> None:
        """Ask for an active engine + replicas per variant; the next reconcile applies it blue/green."""


class Evaluator(Protocol):
    """A per-resource periodic task (the speculation policy / autoscaler plugs in here).

    An evaluator with a true ``wakes_on_change`` attribute is also due at once whenever the resource changes
    (spec, metadata or status), so its ``interval`` may be long while nothing is under way."""

    def interval(self, body: Mapping[str, Any]) -> float: ...

    async def evaluate(self, controller: Host, body: Mapping[str, Any]) -> None: ...


def now_rfc3339() -> str:
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def interval_of(body: Mapping[str, Any]) -> float:
    """spec.speculation.interval in seconds (30 s when unset or invalid) — for evaluators."""
    try:
        return parse_duration(((body.get("spec") or {}).get("speculation") or {}).get("interval", "30s"))
    except ValueError:
        return DEFAULT_INTERVAL_SECONDS


def status_path(namespace: str, name: str) -> str:
    return f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}/status"


@dataclass(frozen=True)
class Current:
    """A resource as an evaluator sees it: the newest body the watch delivered and the status the
    reconciler or an evaluator last wrote (which the watch may not have echoed yet)."""

    key: Key
    body: Mapping[str, Any]
    meta: Mapping[str, Any]
    spec: ReDrafterDeploymentSpec
    status: dict[str, Any]


def current_resource(controller: Host, body: Mapping[str, Any]) -> Current | None:
    """The resource now, or None while it is being deleted or its spec is invalid (the reconciler says why)."""
    meta = body.get("metadata") or {}
    key: Key = (meta.get("namespace") or "default", meta.get("name", ""))
    body = controller.bodies.get(key) or body
    meta = body.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return None
    try:
        spec = ReDrafterDeploymentSpec.model_validate(dict(body.get("spec") or {}))
    except ValidationError:
        return None
    return Current(key, body, meta, spec, dict(controller.written.get(key) or body.get("status") or {}))


async def write_status(controller: Host, key: Key, patch: Mapping[str, Any]) -> None:
    """An evaluator's merge patch of ``status`` (a deleted resource is not an error; others raise ApiError).

    The reconciler plans from its last written status until the watch echoes it, so the response
    becomes that view: its next status patch then keeps what the evaluator wrote.
    """
    try:
        resp = await controller.client.request(
            "PATCH", status_path(*key), {"status": dict(patch)}, content_type="application/merge-patch+json"
        )
    except ApiError as exc:
        if exc.status == 404:
            return
        raise
    written = {k: v for k, v in (resp.get("status") or {}).items() if k != "kopf"}
    if written and key in controller.bodies:
        controller.written[key] = written


def post_event(body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
    """An Event on the resource (kopf's poster batches and retries them)."""
    try:
        if type_ == "Warning":
            kopf.warn(dict(body), reason=reason, message=message)
        else:
            kopf.info(dict(body), reason=reason, message=message)
    except LookupError:  # outside a running kopf operator (unit use): log only
        pass
    (log.warning if type_ == "Warning" else log.info)(
        "%s/%s %s: %s", body.get("metadata", {}).get("namespace"), body.get("metadata", {}).get("name"), reason, message
    )


def post_events(controller: Host, body: Mapping[str, Any], events: Iterable[tuple[str, str, str]]) -> None:
    """Events (type, reason, message) from an evaluator, through kopf's queue.

    kopf.info/warn find their queue through context variables set per watched object; evaluators run
    outside those tasks, so they adopt the variables the controller captured from a handler.
    """
    for var, value in controller.posting_vars:
        var.set(value)
    for type_, reason, message in events:
        post_event(body, type_, reason, message)


def index_entries(indexes: Mapping[str, Any], index: str, key: Any) -> list[Any]:
    """The facts one kopf index holds under ``key`` (none when the index or the key is absent)."""
    idx = indexes.get(index)
    if idx is None or key not in idx:
        return []
    return list(idx[key])


def variant_deployments(controller: Host, ns: str, name: str) -> dict[str, Any]:
    """The variant Deployments' facts from the reconciler's index (spec replicas, engine key), and the
    candidate's (key ``candidate``) when there is one."""
    out: dict[str, Any] = {}
    wanted = {**{v: names.serving_deployment_name(name, v) for v in VARIANTS}, "candidate": names.candidate_name(name)}
    for v, dep_name in wanted.items():
        facts = index_entries(controller.indexes, "rdd_deployments", ("name", ns, dep_name))
        if facts:
            out[v] = facts[0]
    return out


__all__ = [
    "Current",
    "Evaluator",
    "Host",
    "Key",
    "current_resource",
    "index_entries",
    "interval_of",
    "now_rfc3339",
    "post_event",
    "post_events",
    "status_path",
    "variant_deployments",
    "write_status",
]
