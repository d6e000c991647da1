"""The validation gate's pure logic: may the ReDrafter engine be promoted, and what it does to targets.

The planner (every reconcile, from status) and the speculation monitor (which engines the policy may switch
to) decide with these functions, from status alone, so a restarted operator gates from its first reconcile.
The validation step itself is planned in :mod:`.validation`; the rules are described there too.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

from engine_jobs.contract import VARIANTS

from ..api.spec import ReDrafterDeploymentSpec
from ..render import names
from .plan_types import READY_STATES, ServingTargets

ANNOTATION_RETRY_VALIDATION = f"{names.DOMAIN}/retry-validation"


@dataclass(frozen=True)
class Gate:
    """Whether ReDrafter may be promoted, and the validation state behind it."""

    promote: bool
    state: str  # Pending | Running | Passed | Failed
    stable: str | None = None  # the promoted ReDrafter key that keeps serving while a newer one is validated


def engine_pair(status: Mapping[str, Any]) -> tuple[str, str] | None:
    """(ReDrafter key, base key) when both engines are Ready/Cached, else None (nothing to validate)."""
    engines = status.get("engines") or {}
    keys = []
    for v in ("redrafter", "base"):
        e = engines.get(v) or {}
        if e.get("state") not in READY_STATES or not e.get("key"):
            return None
        keys.append(str(e["key"]))
    return keys[0], keys[1]


def gate_of(status: Mapping[str, Any], pair: tuple[str, str]) -> Gate:
    """The gate as status.validation shows it for ``pair`` (a pair not validated yet is Pending)."""
    v = status.get("validation") or {}
    promoted = (v.get("promoted") or {}).get("redrafterKey")
    stable = str(promoted) if promoted and promoted != pair[0] else None
    if v.get("redrafterKey") != pair[0] or v.get("baseKey") != pair[1]:
        return Gate(False, "Pending", stable)
    state = str(v.get("state") or "Pending")
    return Gate(True, state) if state == "Passed" else Gate(False, state, stable)


def gated_targets(targets: ServingTargets, gate: Gate | None, current_pool: str | None) -> ServingTargets:
    """The serving targets with the promotion gate applied (the rules: :mod:`.validation`'s docs)."""
    if gate is None or gate.promote:
        return targets
    if gate.stable:  # the promoted engine serves as the policy says; base stays up as the reference
        if gate.state == "Failed":
            return targets
        return replace(targets, replicas={**targets.replicas, "base": max(1, int(targets.replicas.get("base", 0)))})
    size = int(targets.replicas.get(targets.active, 0))
    if gate.state == "Failed":
        return ServingTargets(active="base", replicas={"base": size, "redrafter": 0}, canary=0)
    if targets.active == "base":  # a fallback to the reference engine is never held; ReDrafter stays up to validate
        return ServingTargets(
            active="base",
            replicas={"base": size, "redrafter": max(1, int(targets.replicas.get("redrafter", 0)))},
            canary=0,
        )
    stay = current_pool if current_pool in VARIANTS else "base"
    other = "base" if stay == "redrafter" else "redrafter"
    # the other variant: one pod to validate against (its standby size if larger), not the policy's full size
    spare = 0 if other == targets.active else int(targets.replicas.get(other, 0))
    return ServingTargets(active=stay, replicas={stay: max(size, 1), other: max(1, spare)}, canary=0)


def gate_from_status(
    targets: ServingTargets, spec: ReDrafterDeploymentSpec, status: Mapping[str, Any]
) -> ServingTargets:
    """``targets`` with the gate status implies (the planner's defaults, before any evaluation)."""
    pair = engine_pair(status) if spec.validation.enabled else None
    if pair is None:
        return targets
    return gated_targets(targets, gate_of(status, pair), status.get("activeEngine"))


def validated_engines(spec: ReDrafterDeploymentSpec, status: Mapping[str, Any]) -> frozenset[str]:
    """The variants the policy may switch to: ReDrafter only once validated (the new engine, or the promoted one)."""
    pair = engine_pair(status) if spec.validation.enabled else None
    if pair is None:
        return frozenset(VARIANTS)
    gate = gate_of(status, pair)
    return frozenset(VARIANTS) if gate.promote or gate.stable is not None else frozenset({"base"})


def pods_ready(deployments: Mapping[str, Any], pair: tuple[str, str], candidate: bool = False) -> bool:
    """Both Deployments under test (the candidate's for ReDrafter when ``candidate``) rolled out on the
    pair's keys with >= 1 Ready pod."""
    for variant, key in zip(("redrafter", "base"), pair):
        dep = deployments.get("candidate" if candidate and variant == "redrafter" else variant)
        if dep is None or dep.key != key or not dep.rolled_out or dep.ready_replicas < 1:
            return False
    return True


def promotion_state(
    spec: ReDrafterDeploymentSpec, status: Mapping[str, Any], engines: Mapping[str, Mapping[str, Any]]
) -> tuple[Gate | None, str | None]:
    """(the validation gate of the current engine pair or None, the stable ReDrafter key or None).

    Stable: the promoted ReDrafter engine (status.validation.promoted) while a different ReDrafter
    engine is built or validated: it keeps serving from the primary Deployment.
    """
    if not spec.validation.enabled:
        return None, None
    pair = engine_pair({"engines": engines})
    if pair is not None:
        gate = gate_of(status, pair)
        return gate, gate.stable
    promoted = ((status.get("validation") or {}).get("promoted") or {}).get("redrafterKey")
    key = (engines.get("redrafter") or {}).get("key")
    return None, (str(promoted) if promoted and promoted != key else None)
