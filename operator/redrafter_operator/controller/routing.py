"""The InferencePool's place in a plan step (pure): render it with the Service, or delete it, and its condition.

The InferencePool <name> selects what the stable Service <name> selects, so gateways and Service clients
always reach the same engine. Its ``InferencePoolReady`` condition says whether the pool is observed on
the step's traffic pool, or why not (moving, or the InferencePool CRD not installed in the cluster).
"""

from __future__ import annotations

from typing import Any

from engine_jobs.contract import OPENAI_PORT

from ..api.spec import ReDrafterDeploymentSpec
from ..api.status import Condition
from ..render import inference_pool as ip
from ..render import names
from .conditions import Cond
from .facts import Observed
from .plan_types import EventSpec

CONDITION = "InferencePoolReady"
REASON_CRD_MISSING = "CRDNotInstalled"
CRD_MISSING_MESSAGE = (
    f"the {ip.KIND} CRD ({ip.PLURAL}.{ip.GROUP}, {ip.VERSION}) is not installed in the cluster: install "
    "it from kubernetes-sigs/gateway-api-inference-extension v1.0.0 or later, or set "
    "spec.routing.inferencePool.enabled: false"
)


def enabled(spec: ReDrafterDeploymentSpec) -> bool:
    return spec.routing.inference_pool.enabled


def stale_pool(name: str, namespace: str) -> dict[str, Any]:
    """The reference the reconciler deletes once the feature is turned off (nothing would move it any more)."""
    return {
        "apiVersion": ip.API_VERSION,
        "kind": ip.KIND,
        "metadata": {"name": names.service_name(name), "namespace": namespace},
    }


def condition(spec: ReDrafterDeploymentSpec, name: str, observed: Observed, pool: str | None) -> Cond | None:
    """``InferencePoolReady`` for this step (None when the feature is off: the condition is removed)."""
    if not enabled(spec):
        return None
    if observed.routing_api_missing:
        return Cond(CONDITION, "False", REASON_CRD_MISSING, CRD_MISSING_MESSAGE)
    if pool is None:
        return Cond(
            CONDITION, "False", "NoServingPool", "no engine serves yet: the InferencePool is created with the Service"
        )
    if observed.routing_pool == pool:
        return Cond(
            CONDITION,
            "True",
            "Selecting",
            f"{ip.KIND} {names.service_name(name)} selects the {pool} pods on port {OPENAI_PORT}",
        )
    return Cond(CONDITION, "False", "Moving", f"moving {ip.KIND} {names.service_name(name)} to the {pool} pods")


def crd_missing_event(prev: Condition | None, cond: Cond | None) -> EventSpec | None:
    """A Warning the first time the InferencePool write finds no such API (not once per reconcile); ``prev``:
    the observed InferencePoolReady condition."""
    if cond is None or cond.reason != REASON_CRD_MISSING:
        return None
    if prev and prev.reason == REASON_CRD_MISSING:
        return None
    return EventSpec("Warning", "InferencePoolCRDMissing", CRD_MISSING_MESSAGE)
