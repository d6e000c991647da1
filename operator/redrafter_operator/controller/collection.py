"""A cache claim's collection children (pure): the references ConfigMap and the collection CronJob.

Rendered by the planner from the retention monitor's :class:`~.reports.ClaimFacts`, so every child the
operator applies is decided in one place.

* Retention: the resources on the claim that enable one; when they disagree the collection keeps the
  most (largest keep, largest maxAge, the first resource's schedule). None enabled: the CronJob is deleted
  if the index shows one (an earlier retention's).
"""

from __future__ import annotations

from typing import Any

from ..api import API_VERSION, KIND
from ..api.spec import ReDrafterDeploymentSpec
from ..api.types import parse_duration
from ..render import cache_jobs
from .reports import ClaimFacts, ClaimUser


def merged_retention(specs: list[ReDrafterDeploymentSpec]) -> tuple[int | None, str | None, str] | None:
    """(keep, max age in whole seconds, schedule) keeping the union of what the claim's resources keep, or None.

    An engine is kept when it is among the ``keep`` most recent *or* younger than ``maxAge``, so the union
    of several retentions is the largest keep with the largest maxAge.
    """
    enabled = [s.engine.cache.retention for s in specs if s.engine.cache.retention.enabled]
    if not enabled:
        return None
    keeps = [r.keep for r in enabled if r.keep is not None]
    ages = [parse_duration(r.max_age) for r in enabled if r.max_age is not None]
    return (max(keeps) if keeps else None, f"{int(max(ages))}s" if ages else None, enabled[0].schedule)


def owner_refs(users: tuple[ClaimUser, ...]) -> list[dict[str, Any]]:
    """Every resource on the claim owns its collection children (none is the controller: they are shared)."""
    return [
        {"apiVersion": API_VERSION, "kind": KIND, "name": u.name, "uid": u.uid, "blockOwnerDeletion": False}
        for u in users
        if u.uid
    ]


def collection_children(facts: ClaimFacts) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(children to apply, children to delete) for the claim: its ConfigMap and CronJob while a user enables a
    retention, else the CronJob to delete when one is seen."""
    retention = merged_retention([u.spec for u in facts.users])
    name = cache_jobs.collection_name(facts.claim)
    if retention is None:
        if not facts.cronjob_seen:
            return [], []
        return [], [
            {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": name, "namespace": facts.namespace}}
        ]
    owners = owner_refs(facts.users)
    keep, max_age, schedule = retention
    return [
        cache_jobs.references_config_map(
            name=name, namespace=facts.namespace, claim=facts.claim, document=facts.document, owners=owners
        ),
        cache_jobs.collection_cronjob(
            namespace=facts.namespace,
            claim=facts.claim,
            sub_path=facts.users[0].spec.engine.cache.sub_path,
            image=facts.image,
            schedule=schedule,
            keep=keep,
            max_age=max_age,
            owners=owners,
        ),
    ], []


__all__ = ["collection_children", "merged_retention", "owner_refs"]
