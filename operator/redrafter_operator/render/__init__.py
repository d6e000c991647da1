"""Pure builders: (resource, facts) -> the Kubernetes manifests the operator creates."""

from __future__ import annotations

from typing import Any

from engine_jobs.contract import VARIANTS, Variant

from .build import build_configmap, build_job
from .common import Owner


def render_all(owner: Owner, active: Variant = "redrafter") -> list[dict[str, Any]]:
    """Every child object of one resource, as the operator would create it on a fresh cluster."""
    out: list[dict[str, Any]] = []
    for variant in VARIANTS:
        out += [build_configmap(owner, variant), build_job(owner, variant)]
    return out
