"""Which engine keys a ReDrafterDeployment still needs: the input of the cache collection.

A key is referenced when the spec asks for it (computed from the spec, so a spec change not yet
reconciled already counts), when status names it (current build, the pair under validation, the last
promoted pair), or when a serving Deployment runs it (labelled with its key: the previous engine keeps
serving while a new one builds). Over-listing only keeps an engine longer; under-listing deletes one in
use, so every source is listed. The document format is engine_jobs.cache_index's.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import ValidationError

from engine_jobs.contract import VARIANTS

from ..api.engine_key import drafter_key, engine_key
from ..api.spec import ReDrafterDeploymentSpec
from .names import LABEL_DEPLOYMENT, LABEL_ENGINE_KEY


def _ref(key: Any, namespace: str, name: str, role: str) -> dict[str, str] | None:
    return {"key": key, "namespace": namespace, "name": name, "role": role} if isinstance(key, str) and key else None


def spec_cache(body: Mapping[str, Any]) -> tuple[str, str] | None:
    """(claim, subPath) of the resource's engine cache, or None for a spec that does not validate."""
    try:
        spec = ReDrafterDeploymentSpec.from_wire(body.get("spec") or {})
    except ValidationError:
        return None
    return spec.engine.cache.claim_name, spec.engine.cache.sub_path


def resource_references(body: Mapping[str, Any], keys: Mapping[str, str] | None = None) -> list[dict[str, str]]:
    """Every key one ReDrafterDeployment names in its spec or status. ``keys``: the spec's engine key per
    variant when the caller has them (the controller computes them once per change of the spec; empty for an
    invalid spec), else computed here."""
    meta = body.get("metadata") or {}
    ns, name = meta.get("namespace") or "default", meta.get("name") or "?"
    out: list[dict[str, str] | None] = []
    if keys is None:
        try:
            spec = ReDrafterDeploymentSpec.from_wire(body.get("spec") or {})
            keys = {v: engine_key(spec, v) for v in VARIANTS}
            if (trained := drafter_key(spec)) is not None:
                keys["drafter"] = trained
        except ValidationError:
            keys = {}  # an invalid spec builds nothing; its status still counts
    out += [_ref(keys.get(v), ns, name, f"spec.{v}") for v in VARIANTS]
    out.append(_ref(keys.get("drafter"), ns, name, "spec.drafter"))  # a trained drafter (model.drafter.train)
    status = body.get("status") or {}
    out.append(_ref((status.get("drafter") or {}).get("key"), ns, name, "status.drafter"))
    engines = status.get("engines") or {}
    out += [_ref((engines.get(v) or {}).get("key"), ns, name, f"status.engines.{v}") for v in VARIANTS]
    validation = status.get("validation") or {}
    out += [_ref(validation.get(f"{v}Key"), ns, name, f"status.validation.{v}") for v in VARIANTS]
    promoted = validation.get("promoted") or {}
    out += [_ref(promoted.get(f"{v}Key"), ns, name, f"status.validation.promoted.{v}") for v in VARIANTS]
    return [r for r in out if r is not None]


def serving_references(deployments: Iterable[Mapping[str, Any]]) -> list[dict[str, str]]:
    """Keys that Deployments labelled with an engine key are running."""
    out = []
    for dep in deployments:
        meta = dep.get("metadata") or {}
        labels = meta.get("labels") or {}
        ref = _ref(
            labels.get(LABEL_ENGINE_KEY),
            meta.get("namespace") or "default",
            labels.get(LABEL_DEPLOYMENT) or meta.get("name") or "?",
            f"serving:{meta.get('name', '?')}",
        )
        if ref is not None:
            out.append(ref)
    return out


def references_document(
    resources: Iterable[Mapping[str, Any]],
    deployments: Iterable[Mapping[str, Any]],
    keys: Mapping[tuple[str, str], Mapping[str, str]] | None = None,
) -> str:
    """The JSON the collection reads (sorted, so an unchanged cluster writes an unchanged ConfigMap).
    ``keys``: each resource's engine keys by (namespace, name), when the caller has them."""

    def known(body: Mapping[str, Any]) -> Mapping[str, str] | None:
        meta = body.get("metadata") or {}
        return None if keys is None else keys.get((meta.get("namespace") or "default", meta.get("name") or "?"))

    refs = [r for body in resources for r in resource_references(body, known(body))] + serving_references(deployments)
    unique = sorted({tuple(sorted(r.items())) for r in refs})
    return json.dumps({"references": [dict(r) for r in unique]}, indent=1, sort_keys=True)
