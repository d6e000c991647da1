"""What the monitors hand the planner (pure values): each monitor's newest report for one resource.

The monitors (:mod:`.speculation`, :mod:`.retention`, :mod:`.training`) read metrics, indexes and pods; the
planner reads only these reports, so it imports no monitor and no API client.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine_jobs.contract import TrainingProgress

from ..api.spec import ReDrafterDeploymentSpec
from ..api.status import ReDrafterDeploymentStatus
from .conditions import Cond
from .plan_types import EventSpec, ServingTargets


@dataclass(frozen=True)
class SpeculationReport:
    """One evaluation, for the reconciler to fold in: status parts, the condition, the targets, the Events."""

    uid: str
    status: ReDrafterDeploymentStatus  # the parts it sets: speculation, policy (, history on a switch)
    condition: Cond | None
    targets: ServingTargets
    events: tuple[EventSpec, ...] = field(default=())


@dataclass(frozen=True)
class TrainingReport:
    """What the training monitor read from a running training pod (its progress, or why it could not)."""

    key: str  # the drafter key the Job trains
    job: str
    progress: TrainingProgress | None = None
    error: str = ""
    at: str = ""  # when it was read (RFC 3339)


@dataclass(frozen=True)
class ClaimUser:
    """A resource on a cache claim: it owns the claim's collection children (with every other user)."""

    name: str
    uid: str
    spec: ReDrafterDeploymentSpec


@dataclass(frozen=True)
class ClaimFacts:
    """What the planner renders a claim's collection children from (:mod:`.collection`).

    ``users``: every resource on the claim, the one acting for it first; ``document``: the references every
    known resource names (render.cache_refs); ``cronjob_seen``: the index shows the claim's CronJob, so a
    claim whose users no longer enable a retention has one to delete.
    """

    namespace: str
    claim: str
    users: tuple[ClaimUser, ...]
    document: str
    image: str
    cronjob_seen: bool = False


@dataclass(frozen=True)
class RetentionReport:
    """The claim's facts for the resource that acts for the claim, and the collections' Events for every user."""

    claim: ClaimFacts | None = None
    events: tuple[EventSpec, ...] = ()
    annotate: tuple[tuple[dict[str, Any], dict[str, str]], ...] = field(default=())  # (Job ref, annotations)


__all__ = ["ClaimFacts", "ClaimUser", "RetentionReport", "SpeculationReport", "TrainingReport"]
