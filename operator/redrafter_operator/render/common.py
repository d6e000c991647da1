"""What every renderer needs: the owning resource, object metadata and owner references."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..api import API_VERSION, KIND
from ..api.spec import ReDrafterDeploymentSpec
from ..api.status import PromotedEngines, ReDrafterDeploymentStatus


@dataclass(frozen=True)
class Owner:
    """The ReDrafterDeployment being rendered: identity plus its validated spec."""

    name: str
    namespace: str
    uid: str
    spec: ReDrafterDeploymentSpec
    generation: int = 1
    #: the promoted pair's measured crossover (floored), which the PyTorch path's speculative engine gets as
    #: max_concurrency; None until one was measured (:func:`in_engine_concurrency`)
    in_engine_concurrency: int | None = None
    #: the promoted pair's measured draft_len_schedule ({batch size: draft length}), when its sweep found a
    #: shorter draft paying at middle batch sizes (:func:`in_engine_schedule`); None: max_concurrency alone
    in_engine_schedule: dict[int, int] | None = None

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> "Owner":
        """From a raw object (kopf body or YAML); raises pydantic.ValidationError on a bad spec."""
        meta = body.get("metadata", {})
        validation = ReDrafterDeploymentStatus.observed(body.get("status") or {}).validation
        promoted = validation.promoted if validation else None
        return cls(
            name=meta["name"],
            namespace=meta.get("namespace") or "default",
            uid=meta.get("uid") or "00000000-0000-0000-0000-000000000000",
            spec=ReDrafterDeploymentSpec.from_wire(body.get("spec") or {}),
            generation=int(meta.get("generation") or 1),
            in_engine_concurrency=in_engine_concurrency(promoted),
            in_engine_schedule=in_engine_schedule(promoted),
        )

    def owner_reference(self) -> dict[str, Any]:
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


def in_engine_concurrency(promoted: PromotedEngines | None) -> int | None:
    """The promoted pair's measured crossover, floored: the PyTorch backend's speculative engine drafts only up
    to it (``max_concurrency``). None before a pass with a measurement."""
    crossover = promoted.crossover_concurrency if promoted else None
    if crossover is None or not math.isfinite(crossover) or crossover < 1:
        return None
    return int(crossover)


def in_engine_schedule(promoted: PromotedEngines | None) -> dict[int, int] | None:
    """The promoted pair's measured draft_len_schedule, sorted; None when there is none or it does not map
    positive batch sizes to non-negative draft lengths."""
    schedule = promoted.draft_len_schedule if promoted else None
    if not schedule or any(k < 1 or v < 0 for k, v in schedule.items()):
        return None
    return dict(sorted(schedule.items()))


def metadata(
    owner: Owner, name: str, labels: dict[str, str], annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": owner.namespace,
        "labels": dict(labels),
        "ownerReferences": [owner.owner_reference()],
    }
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta
