"""Validation before promotion, in the controller: the shell around ``evaluate.gate.validation_step``.

When ``spec.validation.enabled`` and both engines are Ready/Cached, every VALIDATION_INTERVAL seconds per
resource (an :class:`~.resource_io.Evaluator` in the controller's timer slot):

1. while ``status.validation`` is not Passed for the current (ReDrafter key, base key) pair, both variant
   Deployments keep >= 1 replica (the Job compares the two variant Services' greedy outputs);
2. ``pods_ready`` = both variant Deployments rolled out on the new keys with >= 1 Ready pod;
3. ``validation_step`` with the observed Job ``validation_job_name(name, rkey, bkey, attempt)`` and its pod;
   ``create_job`` -> ``render.validation.validation_job`` (image: spec.validation.image, else
   $REDRAFTER_OPERATOR_IMAGE, the operator's own); status.validation, the ``Validated`` condition,
   ``status.speculation.crossoverConcurrency`` when measured, and the step's Events;
4. the promotion gate, applied to the serving targets (:class:`Promotion`) — ReDrafter is *promoted*
   (may take the stable Service, or serve live traffic as a canary) only once its pair Passed:

   * Pending/Running: no switch to ReDrafter (the Service stays where it is; ReDrafter already serving
     before the base engine existed keeps serving: nothing could be validated then); a fallback to base
     is never held; a Service not yet serving starts on base, the reference engine; no canary; both
     variants >= 1 replica;
   * Failed: the Service serves base (greedy ReDrafter must reproduce base's outputs; a divergent
     engine is wrong, not slow), ReDrafter scales to zero, no canary; Validated=False with the verdict.
     Retry: set annotation ``redrafter.dev/retry-validation`` to a new value (attempt + 1).

   A ReDrafter engine that passed before (``status.validation.promoted``) is *stable*: while a newer
   ReDrafter engine is validated, the primary Deployment keeps running the promoted one (the policy
   goes on choosing between it and base) and the new engine runs on the candidate Deployment
   ``<name>-redrafter-candidate``, in no traffic pool, with its own Service for the Job. Pending/
   Running only keep base >= 1 replica; Failed keeps the promoted engine serving (the candidate
   scales to zero). A pass makes the new pair the promoted one: the primary rolls to it.

Nothing happens before both engines are built (there is no reference to compare with), nor with
validation disabled. Passed/Failed pairs cost no API call (status says it all); a Running one costs one
GET of its Job per interval (+ one pod LIST once it finished).
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from typing import Any, Mapping

from ..api.spec import ReDrafterDeploymentSpec
from ..evaluate.gate import ValidationStep, validation_step
from ..render.common import Owner
from ..render.validation import DEFAULT_OPERATOR_IMAGE, validation_job, validation_job_name
from .apply import ApiError, merge_patch
from .conditions import Cond, merge_conditions
from .gate import ANNOTATION_RETRY_VALIDATION, Gate, engine_pair, gate_of, gated_targets, pods_ready
from .plan_types import ServingTargets
from .resource_io import Host, Key, current_resource, now_rfc3339, post_events, variant_deployments, write_status
from .targets import default_targets

log = logging.getLogger("redrafter_operator.controller.validation")

ENV_OPERATOR_IMAGE = "REDRAFTER_OPERATOR_IMAGE"
VALIDATION_INTERVAL = 1.0  # the ticker's granularity: a Job starts as soon as both variants are Ready
#: a resource with nothing to validate now (validation disabled, an engine not built, its pair settled) is looked at
#: this often; any change of the resource wakes the evaluator at once (``wakes_on_change``)
SETTLED_INTERVAL = 30.0
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"


# ---- pure parts ----------------------------------------------------------------------------------
def validation_fragment(old: Mapping[str, Any], step: ValidationStep, *, generation: int, now: str) -> dict[str, Any]:
    """status.validation / conditions (/ speculation.crossoverConcurrency) after one step (pure)."""
    out: dict[str, Any] = {}
    if step.status is not None:
        out["validation"] = {k: v for k, v in step.status.items() if v is not None}
    if step.condition is not None:
        c = step.condition
        out["conditions"] = merge_conditions(
            old.get("conditions") or [],
            [Cond(c.type, c.status, c.reason, c.message)],  # type: ignore[arg-type]
            generation=generation,
            now=now,
        )
    if "validation" in out:  # the last pair that passed outlives the record of newer pairs
        state = out["validation"]
        promoted = (old.get("validation") or {}).get("promoted")
        if state.get("state") == "Passed":
            promoted = {"redrafterKey": state["redrafterKey"], "baseKey": state["baseKey"]}
        if promoted:
            out["validation"]["promoted"] = promoted
    if step.crossover is not None and step.crossover != float("inf"):
        out["speculation"] = {**(old.get("speculation") or {}), "crossoverConcurrency": round(step.crossover, 4)}
    return out


def may_be_validating(body: Mapping[str, Any]) -> bool:
    """Whether an evaluation of ``body`` may have work to do: validation enabled, both engines built, and
    their pair neither Passed nor Failed-without-a-new-retry-token (what :meth:`ValidationEvaluator.evaluate`
    returns early for, read from the raw body; an unreadable spec counts as enabled)."""
    enabled = ((body.get("spec") or {}).get("validation") or {}).get("enabled", True)
    status = body.get("status") or {}
    pair = engine_pair(status) if enabled is not False else None
    if pair is None:
        return False
    state = gate_of(status, pair).state
    if state == "Passed":
        return False
    retry = ((body.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_RETRY_VALIDATION) or None
    return not (state == "Failed" and (not retry or retry == (status.get("validation") or {}).get("retryToken")))


def latest_pod(pods: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The Job's most recent pod (its verdict is the current one)."""
    if not pods:
        return None
    return max(
        pods,
        key=lambda p: (
            (p.get("metadata") or {}).get("creationTimestamp") or "",
            (p.get("metadata") or {}).get("name") or "",
        ),
    )


# ---- the promotion hub ---------------------------------------------------------------------------
class Promotion:
    """Combines the speculation policy's targets with the validation gate into what the reconciler gets."""

    def __init__(self) -> None:
        self.policy: dict[Key, ServingTargets] = {}
        self.gates: dict[Key, Gate | None] = {}
        self._gated: set[Key] = set()  # resources whose published targets the gate changed

    def allows_redrafter(self, key: Key) -> bool:
        """May the policy switch to ReDrafter (a validated engine: the new one, or the promoted one)?"""
        gate = self.gates.get(key)
        return gate is None or gate.promote or gate.stable is not None

    def set_policy(
        self,
        controller: Host,
        key: Key,
        targets: ServingTargets,
        spec: ReDrafterDeploymentSpec,
        status: Mapping[str, Any],
    ) -> None:
        self.policy[key] = targets
        self.publish(controller, key, spec, status)

    def set_gate(
        self, controller: Host, key: Key, gate: Gate | None, spec: ReDrafterDeploymentSpec, status: Mapping[str, Any]
    ) -> None:
        self.gates[key] = gate
        self.publish(controller, key, spec, status)

    def publish(self, controller: Host, key: Key, spec: ReDrafterDeploymentSpec, status: Mapping[str, Any]) -> None:
        for k in [k for k in {*self.policy, *self.gates} if k not in controller.bodies]:
            self.policy.pop(k, None)
            self.gates.pop(k, None)
        self._gated &= set(controller.bodies)
        policy = self.policy.get(key)
        if key in self.gates:
            gate = self.gates[key]
        else:  # the gate has not run for this resource yet (e.g. just after a restart): status tells
            pair = engine_pair(status) if spec.validation.enabled else None
            gate = gate_of(status, pair) if pair else None
        if gate is None or gate.promote:
            if policy is not None or key in self._gated:  # never clear targets someone else set
                controller.set_targets(key[0], key[1], policy)
            self._gated.discard(key)
            return
        self._gated.add(key)
        base = policy or default_targets(spec, status)
        controller.set_targets(key[0], key[1], gated_targets(base, gate, status.get("activeEngine")))


# ---- the evaluator -------------------------------------------------------------------------------
class ValidationEvaluator:
    """Runs the validation gate of each resource (see the module docs).

    Every VALIDATION_INTERVAL while a validation may be under way; otherwise every SETTLED_INTERVAL, and at once
    whenever the resource changes (``wakes_on_change``: what unsettles it — a new engine pair, the retry
    annotation, validation turned on — is a change of the resource), so that thousands of settled resources
    cost next to nothing between changes."""

    wakes_on_change = True

    def __init__(
        self, promotion: Promotion, *, operator_image: str | None = None, interval_seconds: float = VALIDATION_INTERVAL
    ) -> None:
        self.promotion = promotion
        self.operator_image = operator_image or os.environ.get(ENV_OPERATOR_IMAGE) or DEFAULT_OPERATOR_IMAGE
        self.interval_seconds = interval_seconds

    def interval(self, body: Mapping[str, Any]) -> float:
        return self.interval_seconds if may_be_validating(body) else max(self.interval_seconds, SETTLED_INTERVAL)

    async def evaluate(self, controller: Host, body: Mapping[str, Any]) -> None:
        view = current_resource(controller, body)
        if view is None:
            return
        key, body, meta, spec, status = view.key, view.body, view.meta, view.spec, view.status
        ns, name = key
        pair = engine_pair(status) if spec.validation.enabled else None
        if pair is None:
            if self.promotion.gates.get(key) is not None or key not in self.promotion.gates:
                self.promotion.set_gate(controller, key, None, spec, status)
            return
        retry = (meta.get("annotations") or {}).get(ANNOTATION_RETRY_VALIDATION) or None
        gate = gate_of(status, pair)
        prev = status.get("validation") or {}
        if gate.state == "Passed" or (gate.state == "Failed" and (not retry or retry == prev.get("retryToken"))):
            if self.promotion.gates.get(key) != gate:  # settled: status says it all, no API call
                self.promotion.set_gate(controller, key, gate, spec, status)
            return
        # Keep both variants up before looking at their pods (the gate raises their replicas to >= 1).
        if self.promotion.gates.get(key) is None or self.promotion.gates[key].promote:
            self.promotion.set_gate(controller, key, gate, spec, status)
        ready = pods_ready(variant_deployments(controller, ns, name), pair, candidate=gate.stable is not None)
        same = prev.get("redrafterKey") == pair[0] and prev.get("baseKey") == pair[1]
        attempt = int(prev.get("attempt", 0)) if same else 0
        job_name = validation_job_name(name, pair[0], pair[1], attempt)
        job = await self._get(controller, f"/apis/batch/v1/namespaces/{ns}/jobs/{job_name}") if ready else None
        pod = None
        if job is not None and any(
            c.get("status") == "True" and c.get("type") in ("Complete", "Failed")
            for c in (job.get("status") or {}).get("conditions") or []
        ):
            found = await controller.client.request(
                "GET", f"/api/v1/namespaces/{ns}/pods", query=[("labelSelector", f"{JOB_NAME_LABEL}={job_name}")]
            )
            pod = latest_pod(list(found.get("items") or []))
        now = now_rfc3339()
        step = validation_step(
            enabled=True,
            redrafter_key=pair[0],
            base_key=pair[1],
            pods_ready=ready,
            previous=prev,
            job=job,
            pod=pod,
            job_name=job_name,
            now=now,
            retry_token=retry,
        )
        if step.create_job:
            owner = Owner(name, ns, meta.get("uid") or "", spec, int(meta.get("generation") or 1))
            manifest = validation_job(
                owner,
                redrafter_key=pair[0],
                base_key=pair[1],
                operator_image=self.operator_image,
                attempt=step.attempt,
                candidate=gate.stable is not None,
            )
            try:
                created = await controller.client.request("POST", f"/apis/batch/v1/namespaces/{ns}/jobs", manifest)
            except ApiError as exc:
                if exc.status != 409:  # AlreadyExists: a previous evaluation (or peer) created it
                    raise
                created = manifest
            # Step again with the Job observed, so status says "running" at once (one write, not two).
            events = step.events
            step = validation_step(
                enabled=True,
                redrafter_key=pair[0],
                base_key=pair[1],
                pods_ready=ready,
                previous={**prev, **(step.status or {})},
                job=created,
                pod=None,
                job_name=created["metadata"]["name"],
                now=now,
                retry_token=retry,
            )
            step = replace(step, events=[*events, *step.events])
        fragment = validation_fragment(status, step, generation=int(meta.get("generation") or 1), now=now)
        patch = merge_patch({k: status.get(k) for k in fragment}, fragment)
        if patch:
            await write_status(controller, key, patch)
        post_events(controller, body, step.events)
        new_status = {**status, **fragment}
        self.promotion.set_gate(controller, key, gate_of(new_status, pair), spec, new_status)

    async def _get(self, controller: Host, path: str) -> dict[str, Any] | None:
        try:
            return await controller.client.request("GET", path)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise


__all__ = ["Promotion", "ValidationEvaluator", "latest_pod", "may_be_validating", "validation_fragment"]
