"""The Gateway API Inference Extension ``InferencePool`` <name>: the gateway's view of the active engine's pods.

Its selector is the stable Service's (the active traffic pool), so the planner moves it in the same
blue/green step as the Service. Its target port is the OpenAI port, which is what inference gateways
route to. The shape follows inference.networking.k8s.io/v1 as released in
kubernetes-sigs/gateway-api-inference-extension v1.0.0
(config/crd/bases/inference.networking.k8s.io_inferencepools.yaml; tests/fixtures/crds/ keeps that CRD).
"""

from __future__ import annotations

from typing import Any

from engine_jobs import contract
from engine_jobs.contract import Variant

from . import names
from .common import Owner, metadata

GROUP = "inference.networking.k8s.io"
VERSION = "v1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "InferencePool"
PLURAL = "inferencepools"


def inference_pool(owner: Owner, pool: Variant) -> dict[str, Any]:
    """``<name>``: every pod of the traffic pool ``pool``, on the OpenAI port, for the user's endpoint picker."""
    cfg = owner.spec.routing.inference_pool
    picker = cfg.endpoint_picker_ref
    if picker is None:  # the API requires a picker when enabled: only a caller bug renders a pool without one
        raise ValueError("spec.routing.inferencePool.endpointPickerRef is required to render the InferencePool")
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": metadata(
            owner,
            names.service_name(owner.name),
            {**names.common_labels(owner.name, "serving"), names.LABEL_TRAFFIC: pool},
        ),
        "spec": {
            "selector": {"matchLabels": names.traffic_selector(owner.name, pool)},
            "targetPorts": [{"number": contract.OPENAI_PORT}],
            "endpointPickerRef": {
                "group": "",  # the core group: the picker is a Service (the CRD's defaults, written out)
                "kind": "Service",
                "name": picker.name,
                "port": {"number": picker.port},
                "failureMode": picker.failure_mode,
            },
        },
    }
