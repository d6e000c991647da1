"""Binds the planner to the serving renderers of render/serving.py (the planner stays render-agnostic)."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from engine_jobs.contract import Variant

from ..render import inference_pool, names, serving
from ..render.common import Owner
from .plan_types import Renderers, ServiceRenderer


def _variant(owner: Owner, variant: Variant, key: str, replicas: int) -> list[dict[str, Any]]:
    """serving.json first (the pods mount it), then the Deployment that serves ``key``."""
    return [serving.serving_configmap(owner, variant, key), serving.serving_deployment(owner, variant, key, replicas)]


def _canary(owner: Owner, key: str, replicas: int) -> list[dict[str, Any]]:
    return [serving.canary_deployment(owner, key, replicas)]


def _candidate(owner: Owner, key: str, replicas: int) -> list[dict[str, Any]]:
    """Its own serving.json (the primary's stays on the promoted engine), Deployment and Service. A candidate
    drafts at every batch: its validation measures the crossover that becomes its in-engine limit."""
    owner = replace(owner, in_engine_concurrency=None)
    return [
        serving.serving_configmap(owner, "redrafter", key, names.candidate_config_name(owner.name)),
        serving.candidate_deployment(owner, key, replicas),
        serving.candidate_service(owner),
    ]


def _services(operator_namespace: str | None) -> ServiceRenderer:
    def render(owner: Owner, pool: Variant) -> list[dict[str, Any]]:
        """The Services, then the optional NetworkPolicies (admitting the operator's namespace to scrape)."""
        return [*serving.services(owner, pool), *serving.network_policies(owner, operator_namespace)]

    return render


def _inference_pool(owner: Owner, pool: Variant) -> list[dict[str, Any]]:
    return [inference_pool.inference_pool(owner, pool)]


def default_renderers(operator_namespace: str | None = None) -> Renderers:
    """``operator_namespace``: where the operator runs (default: its own pod's, $POD_NAMESPACE)."""
    namespace = operator_namespace or os.environ.get("POD_NAMESPACE")
    return Renderers(
        variant=_variant,
        services=_services(namespace),
        canary=_canary,
        candidate=_candidate,
        inference_pool=_inference_pool,
    )
