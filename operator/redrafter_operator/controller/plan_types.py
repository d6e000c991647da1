"""The planner's inputs and outputs: plain values, so every controller module can share them.

The reconciler builds a :class:`Resource` from the watched body, the policy and the validation gate
express what serving should converge to as :class:`ServingTargets`, and the planner returns a
:class:`Plan` (status, children, Events). Nothing here does I/O or imports another controller module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Mapping, Protocol

from engine_jobs.contract import Variant

from ..api.status import ReDrafterDeploymentStatus
from ..render import names
from ..render.common import Owner

READY_STATES = ("Ready", "Cached")  # engine states that can serve


# ---- inputs ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Resource:
    """The ReDrafterDeployment as last observed: identity, raw spec, annotations and status."""

    name: str
    namespace: str
    uid: str
    generation: int
    spec: Mapping[str, Any]
    annotations: Mapping[str, str]
    status: Mapping[str, Any]

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> "Resource":
        meta = body.get("metadata") or {}
        return cls(
            name=meta.get("name", ""),
            namespace=meta.get("namespace") or "default",
            uid=meta.get("uid") or "",
            generation=int(meta.get("generation") or 1),
            spec=body.get("spec") or {},
            annotations=dict(meta.get("annotations") or {}),
            status=body.get("status") or {},
        )

    @cached_property
    def observed_status(self) -> ReDrafterDeploymentStatus:
        """The status, typed: parsed once, for every rule that reads what the operator decided before."""
        return ReDrafterDeploymentStatus.observed(self.status)

    @property
    def retry_token(self) -> str:
        return self.annotations.get(names.ANNOTATION_RETRY_BUILD, "")


@dataclass(frozen=True)
class ServingTargets:
    """The seam for the speculation policy and autoscaler: what serving should converge to.

    ``active`` is the engine the stable Service should end up selecting; ``replicas`` the replicas
    per variant once any switch is complete. The planner applies it blue/green (or Recreate):
    the target comes up and Ready before the Service moves, the other variant scales down after.
    """

    active: Variant
    replicas: Mapping[str, int]
    canary: int = 0  # ReDrafter canary replicas in the base pool (rendered only if the renderer supports it)


class ServingRenderer(Protocol):
    """Renders the serving children of one variant serving engine ``key`` (render/serving.py)."""

    def __call__(self, owner: Owner, variant: Variant, key: str, replicas: int) -> list[dict[str, Any]]: ...


class ServiceRenderer(Protocol):
    def __call__(self, owner: Owner, pool: Variant) -> list[dict[str, Any]]: ...


class CanaryRenderer(Protocol):
    def __call__(self, owner: Owner, key: str, replicas: int) -> list[dict[str, Any]]: ...


@dataclass(frozen=True)
class Renderers:
    variant: ServingRenderer
    services: ServiceRenderer
    canary: CanaryRenderer | None = None  # ReDrafter pods in the base pool (policy-driven; none without it)
    candidate: CanaryRenderer | None = None  # a new ReDrafter engine under validation, in no pool
    inference_pool: ServiceRenderer | None = None  # the InferencePool <name> (with spec.routing.inferencePool)


# ---- outputs -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class EventSpec:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass
class Plan:
    status: ReDrafterDeploymentStatus
    create: list[dict[str, Any]] = field(default_factory=list)  # create-only, in order (build ConfigMap, Job)
    apply: list[dict[str, Any]] = field(default_factory=list)  # create-or-patch, in order
    delete: list[dict[str, Any]] = field(default_factory=list)  # children no longer wanted (apiVersion, kind, metadata)
    events: list[EventSpec] = field(default_factory=list)
    claims: list[tuple[str, str, str]] = field(default_factory=list)  # (claim, artifact path, job) builds started
    #: merge patches of metadata.annotations on children (a collection Job marked reported), in order
    annotate: list[tuple[dict[str, Any], dict[str, str]]] = field(default_factory=list)
    #: GPU Jobs this step wanted to create, as (what, placement message): ``placed`` could run on some node,
    #: ``unplaced`` on none (not created: the resource waits for a node)
    placed: list[tuple[str, str]] = field(default_factory=list)
    unplaced: list[tuple[str, str]] = field(default_factory=list)
