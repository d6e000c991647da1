"""What every renderer needs: the owning resource, object metadata and owner references."""

from __future__ import annotations

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
    #: the crossover concurrency the last passed validation measured (floored), which the PyTorch path's
    #: speculative engine gets as max_concurrency; None until one was measured
    in_engine_concurrency: int | None = None

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> "Owner":
        """From a raw object (kopf body or YAML); raises pydantic.ValidationError on a bad spec."""
        meta = body.get("metadata", {})
        return cls(
            name=meta["name"],
            namespace=meta.get("namespace") or "default",
            uid=meta.get("uid") or "00000000-0000-0000-0000-000000000000",
            spec=ReDrafterDeploymentSpec.model_validate(body.get("spec") or {}),
            generation=int(meta.get("generation") or 1),
            in_engine_concurrency=_measured_crossover(body.get("status") or {}),
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


def _measured_crossover(status: dict[str, Any]) -> int | None:
    validation = status.get("validation") or {}
    crossover = validation.get("crossoverConcurrency")
    if validation.get("state") != "Passed" or not isinstance(crossover, (int, float)) or crossover < 1:
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
