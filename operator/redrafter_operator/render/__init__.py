"""Pure builders: (resource, facts) -> the Kubernetes manifests the operator creates."""

from __future__ import annotations

from typing import Any

from engine_jobs.contract import VARIANTS, Variant

from ..api.engine_key import engine_key
from . import inference_pool as _inference_pool
from .build import build_configmap, build_job
from .common import Owner
from .serving import network_policies, services, serving_configmap, serving_deployment
from .validation import DEFAULT_OPERATOR_IMAGE, validation_job


def render_all(
    owner: Owner, active: Variant = "redrafter", operator_namespace: str | None = None
) -> list[dict[str, Any]]:
    """Every child of one resource once its engines are built and ``active`` serves traffic.

    The validation Job of the engine pair is included (the operator runs it once both are Ready);
    ``operator_namespace`` is where the operator runs (its metrics scrape passes the NetworkPolicy).
    The operator creates these step by step (builds first, the inactive variant scaled to zero or to a
    standby); this is the whole picture for review, with the replica counts it converges to.
    """
    spec = owner.spec
    standby = 1 if spec.serving.rollout.keep_standby else 0
    out: list[dict[str, Any]] = []
    for variant in VARIANTS:
        out += [build_configmap(owner, variant), build_job(owner, variant)]
    for variant in VARIANTS:
        key = engine_key(spec, variant)
        replicas = spec.serving.replicas if variant == active else standby
        out += [serving_configmap(owner, variant, key), serving_deployment(owner, variant, key, replicas)]
    if spec.validation.enabled:
        out.append(
            validation_job(
                owner,
                redrafter_key=engine_key(spec, "redrafter"),
                base_key=engine_key(spec, "base"),
                operator_image=DEFAULT_OPERATOR_IMAGE,
            )
        )
    out += services(owner, active)
    if spec.routing.inference_pool.enabled:
        out.append(_inference_pool.inference_pool(owner, active))
    return out + network_policies(owner, operator_namespace)
