"""What every renderer needs: the owning resource, object metadata and owner references."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..api import API_VERSION, KIND
from ..api.spec import ReDrafterDeploymentSpec


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

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> "Owner":
        """From a raw object (kopf body or YAML); raises pydantic.ValidationError on a bad spec."""
        meta = body.get("metadata", {})
        return cls(
            name=meta["name"],
            namespace=meta.get("namespace") or "default",
            uid=meta.get("uid") or "00000000-0000-0000-0000-000000000000",
            spec=ReDrafterDeploymentSpec.from_wire(body.get("spec") or {}),
            generation=int(meta.get("generation") or 1),
            in_engine_concurrency=in_engine_concurrency(body.get("status") or {}),
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


def in_engine_concurrency(status: Mapping[str, Any]) -> int | None:
    """The promoted pair's measured crossover, floored: the PyTorch backend's speculative engine drafts only up
    to it (``max_concurrency``). None before a pass with a measurement."""
    promoted = (status.get("validation") or {}).get("promoted") or {}
    crossover = promoted.get("crossoverConcurrency")
    if not isinstance(crossover, (int, float)) or not math.isfinite(crossover) or crossover < 1:
        return None
    return int(crossover)


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
