"""What the reconciler and the monitors share: the newest body and parsed spec of each resource, the status
last written, the kopf indexes, Events, the clock, and the hand-over of a monitor's reports.

It sits below both: the monitors (:mod:`.speculation`, :mod:`.retention`) see the running controller only
through :class:`Host`, so they never import the kopf shell or the reconciler, and a test can hand them a
small fake with the same attributes. Monitors read; only the reconciler writes (status, children, Events).
"""

from __future__ import annotations

import logging
from typing import Any, Mapping, Protocol, cast

import kopf

from engine_jobs.contract import VARIANTS

from ..api import GROUP, PLURAL, VERSION
from ..api.spec import ReDrafterDeploymentSpec
from ..api.types import parse_duration
from ..render import names
from .clock import Clock, rfc3339
from .workqueue import ResourceKey

log = logging.getLogger("redrafter_operator.controller")

DEFAULT_INTERVAL_SECONDS = 30.0


class Host(Protocol):
    """What a monitor may use of the running controller (:class:`~.reconciler.Controller` has it all)."""

    @property
    def bodies(self) -> Mapping[ResourceKey, dict[str, Any]]:
        """The newest body per resource, as the watch delivered it."""

    @property
    def written(self) -> Mapping[ResourceKey, dict[str, Any]]:
        """The status last written per resource, until the watch echoes it."""

    indexes: Mapping[str, Any]  # the kopf indexes by id
    clock: Clock

    def spec_of(self, key: ResourceKey) -> ReDrafterDeploymentSpec | None:
        """The resource's parsed spec (parsed once per change of the spec), None when invalid or absent."""

    def engine_keys_of(self, key: ResourceKey) -> Mapping[str, str]:
        """Each variant's engine key, computed once per change of the spec ({} when invalid or absent)."""

    def hand_over(self, key: ResourceKey, report: Any) -> None:
        """A monitor's newest report for ``key`` (one per report type); the reconciler folds it into its
        next plan, and is woken when the report differs from the last one."""


class Monitor(Protocol):
    """Periodic work that measures what the API does not hold (pod metrics; the cache's references) and hands
    the reconciler a typed report. It writes nothing. ``per_resource``: one slot per resource (``run`` gets its
    key); otherwise one slot for the whole controller (``run`` gets None)."""

    per_resource: bool

    def interval(self, host: Host, key: ResourceKey | None) -> float: ...

    def forget(self, key: ResourceKey) -> None:
        """Drop what it remembers of a deleted resource."""

    async def run(self, host: Host, key: ResourceKey | None) -> None: ...


def now_rfc3339(clock: Clock) -> str:
    return rfc3339(clock.time())


def interval_of(spec: ReDrafterDeploymentSpec | None) -> float:
    """spec.speculation.interval in seconds (30 s when unset or invalid)."""
    try:
        return parse_duration(spec.speculation.interval) if spec is not None else DEFAULT_INTERVAL_SECONDS
    except ValueError:
        return DEFAULT_INTERVAL_SECONDS


def status_path(namespace: str, name: str) -> str:
    return f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}/status"


def current_status(host: Host, key: ResourceKey) -> dict[str, Any]:
    """The status as the reconciler last wrote it (the watch may not have echoed it yet), else as watched."""
    body = host.bodies.get(key) or {}
    return dict(host.written.get(key) or body.get("status") or {})


def post_event(body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
    """An Event on the resource (kopf's poster batches and retries them)."""
    try:
        if type_ == "Warning":
            kopf.warn(cast(kopf.Body, dict(body)), reason=reason, message=message)
        else:
            kopf.info(cast(kopf.Body, dict(body)), reason=reason, message=message)
    except LookupError:  # outside a running kopf operator (unit use): log only
        pass
    (log.warning if type_ == "Warning" else log.info)(
        "%s/%s %s: %s", body.get("metadata", {}).get("namespace"), body.get("metadata", {}).get("name"), reason, message
    )


def index_entries(indexes: Mapping[str, Any], index: str, key: Any) -> list[Any]:
    """The facts one kopf index holds under ``key`` (none when the index or the key is absent)."""
    idx = indexes.get(index)
    if idx is None or key not in idx:
        return []
    return list(idx[key])


def variant_deployments(indexes: Mapping[str, Any], ns: str, name: str) -> dict[str, Any]:
    """The variant Deployments' facts from the reconciler's index (spec replicas, engine key), and the
    candidate's (key ``candidate``) when there is one."""
    out: dict[str, Any] = {}
    wanted: dict[str, str] = {
        **{v: names.serving_deployment_name(name, v) for v in VARIANTS},
        "candidate": names.candidate_name(name),
    }
    for v, dep_name in wanted.items():
        facts = index_entries(indexes, "rdd_deployments", ("name", ns, dep_name))
        if facts:
            out[v] = facts[0]
    return out


__all__ = [
    "Host",
    "Monitor",
    "current_status",
    "index_entries",
    "interval_of",
    "now_rfc3339",
    "post_event",
    "status_path",
    "variant_deployments",
]
