"""Specs the unit tests (the operator's model) and the integration tests (the real API server) both judge: a
minimal resource, the corpus of invalid ones with the field each error must name, and the policy's cases."""

from __future__ import annotations

import copy
from typing import Any

MINIMAL: dict[str, Any] = {
    "apiVersion": "redrafter.dev/v1alpha1",
    "kind": "ReDrafterDeployment",
    "metadata": {"name": "t", "namespace": "default"},
    "spec": {
        "model": {
            "base": {"source": "hf://meta-llama/Meta-Llama-3-8B-Instruct"},
            "drafter": {"source": "pvc://drafters/llama3-8b"},
        }
    },
}

DELETE = object()  # as a value of with_change: remove the field


def with_change(doc: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    """A copy of ``doc`` with the field at ``dotted`` set to ``value`` (or removed, for DELETE)."""
    out = copy.deepcopy(doc)
    node = out
    *parents, leaf = dotted.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    if value is DELETE:
        node.pop(leaf)
    else:
        node[leaf] = value
    return out


# (case id, field to set, value, field the error must name)
INVALID: list[tuple[str, str, Any, str]] = [
    ("no-model", "spec.model", DELETE, "spec.model"),
    ("no-drafter", "spec.model.drafter", DELETE, "spec.model.drafter"),
    ("unknown-scheme", "spec.model.base.source", "ftp://host/model", "spec.model.base.source"),
    ("dotdot-segment", "spec.model.drafter.source", "pvc://drafters/../etc", "spec.model.drafter.source"),
    ("shell-metachar", "spec.model.base.source", "hf://org/name;rm -rf /", "spec.model.base.source"),
    ("absolute-subpath", "spec.model.drafter.source", "pvc:///etc/passwd", "spec.model.drafter.source"),
    ("revision-on-pvc", "spec.model.drafter.revision", "v1", "spec.model.drafter.revision"),
    ("bad-secret-name", "spec.model.base.credentialsSecret", "HF_Token", "spec.model.base.credentialsSecret"),
    ("dtype-float32", "spec.precision.dtype", "float32", "spec.precision.dtype"),
    ("quant-int4", "spec.precision.quantization", "int4_awq", "spec.precision.quantization"),
    ("zero-beams", "spec.redrafter.numBeams", 0, "spec.redrafter.numBeams"),
    ("tree-too-big", "spec.redrafter", {"numBeams": 8, "draftLenPerBeam": 9}, "spec.redrafter"),
    ("pipeline-like-tp3", "spec.parallelism.tensor", 3, "spec.parallelism.tensor"),
    ("input-ge-seq", "spec.engine", {"maxInputLen": 4096, "maxSeqLen": 4096}, "spec.engine"),
    ("tokens-lt-batch", "spec.engine", {"maxBatchSize": 64, "maxNumTokens": 32}, "spec.engine"),
    ("cache-dotdot", "spec.engine.cache", {"subPath": "engines/../other"}, "spec.engine.cache.subPath"),
    ("unknown-field", "spec.engine.maxBatchSizes", 8, "spec.engine"),
    ("min-gt-max", "spec.autoscaling", {"minReplicas": 5, "maxReplicas": 2}, "spec.autoscaling"),
    ("autoscaling-mode", "spec.autoscaling.mode", "Auto", "spec.autoscaling.mode"),
    ("bad-interval", "spec.speculation.interval", "30 seconds", "spec.speculation.interval"),
    ("zero-interval", "spec.speculation.interval", "0s", "spec.speculation.interval"),
    ("zero-cooldown", "spec.speculation.cooldown", "0m0s", "spec.speculation.cooldown"),
    ("acceptance-gt-1", "spec.speculation.minAcceptanceRate", 1.5, "spec.speculation.minAcceptanceRate"),
    ("static-batching", "spec.serving.triton", {"batchingStrategy": "v1"}, "spec.serving.triton.batchingStrategy"),
    (
        "kv-fraction-0",
        "spec.serving.triton",
        {"kvCacheFreeGpuMemFraction": 0},
        "spec.serving.triton.kvCacheFreeGpuMemFraction",
    ),
    ("negative-replicas", "spec.serving.replicas", -1, "spec.serving.replicas"),
    ("rollout-strategy", "spec.serving.rollout", {"strategy": "Canary"}, "spec.serving.rollout.strategy"),
    ("string-bool", "spec.validation.enabled", "true", "spec.validation.enabled"),
    ("string-int", "spec.engine.maxBatchSize", "8", "spec.engine.maxBatchSize"),
]

# spec.speculation: whether a spec with it is valid (the model and the CRD's CEL enforce the same rules).
SPECULATION: list[tuple[dict[str, Any], bool]] = [
    ({"minAcceptanceRate": 0.95}, True),  # + default hysteresis 0.05 = 1.0
    ({"minAcceptanceRate": 0.96}, False),
    ({"minAcceptanceRate": 0.5, "acceptanceHysteresis": 0.6}, False),
    ({"minAcceptanceRate": 1, "acceptanceHysteresis": 0}, True),  # whole numbers in number fields
    ({"minAcceptanceRate": 0}, True),
    ({"minAcceptanceRate": 1}, False),
    ({"costModel": {"tokenCost": 0.01, "drafterOverhead": 0.2, "verifiedTokensPerRequest": 9}}, True),
    ({"costModel": {"tokenCost": 0}}, False),
]


def names_field(errors: list[str], field: str) -> bool:
    """True when some error (``path: message``) is about ``field``: at its path, or at its parent naming it."""
    parent, leaf = field.rsplit(".", 1)
    return any(e.startswith(field) or (e.startswith(parent + ":") and leaf in e) for e in errors)
