"""Binds the planner to the serving renderers of render/serving.py (the planner stays render-agnostic)."""

from __future__ import annotations

from typing import Any

from engine_jobs.contract import Variant

from ..render import serving
from ..render.common import Owner
from .planner import Renderers


def _variant(owner: Owner, variant: Variant, key: str, replicas: int) -> list[dict[str, Any]]:
    """serving.json first (the pods mount it), then the Deployment that serves ``key``."""
    return [serving.serving_configmap(owner, variant, key), serving.serving_deployment(owner, variant, key, replicas)]


def _canary(owner: Owner, key: str, replicas: int) -> list[dict[str, Any]]:
    return [serving.canary_deployment(owner, key, replicas)]


def default_renderers() -> Renderers:
    return Renderers(variant=_variant, services=serving.services, canary=_canary)
