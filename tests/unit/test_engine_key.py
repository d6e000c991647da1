"""Engine keys: stable across processes, sensitive to every build input, blind to serving fields."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest

from redrafter_operator.api.engine_key import build_inputs, engine_key
from redrafter_operator.api.spec import ReDrafterDeploymentSpec

BASE = {
    "model": {
        "base": {"source": "hf://meta-llama/Meta-Llama-3-8B-Instruct", "credentialsSecret": "hf-token"},
        "drafter": {"source": "pvc://drafters/llama3-8b"},
    },
    "engine": {"build": {"gpuProduct": "NVIDIA-A100-SXM4-80GB"}},
}


def keys(raw: dict) -> tuple[str, str]:
    spec = ReDrafterDeploymentSpec.model_validate(raw)
    return engine_key(spec, "redrafter"), engine_key(spec, "base")


def patched(path: str, value) -> dict:
    out = copy.deepcopy(BASE)
    node = out
    *parents, leaf = path.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    node[leaf] = value
    return out


def test_same_inputs_same_key_in_another_process():
    code = (
        "import json,sys; from redrafter_operator.api.spec import ReDrafterDeploymentSpec as S;"
        "from redrafter_operator.api.engine_key import engine_key;"
        "s=S.model_validate(json.loads(sys.argv[1]));"
        "print(engine_key(s,'redrafter'), engine_key(s,'base'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps(BASE)],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "123", "PATH": ""},
    )
    assert tuple(out.stdout.split()) == keys(BASE)


def test_variants_have_different_keys():
    r, b = keys(BASE)
    assert r != b and len(r) == 20


# Inputs that change both engines (the base engine is part of every build).
BOTH = [
    ("model.base.source", "hf://meta-llama/Llama-3.1-8B-Instruct"),
    ("model.base.revision", "0123abc"),
    ("model.tokenizer", {"source": "pvc://tok/llama"}),
    ("model.architecture", "llama"),
    ("precision.dtype", "float16"),
    ("precision.quantization", "fp8"),
    ("parallelism.tensor", 2),
    ("engine.maxBatchSize", 16),
    ("engine.maxInputLen", 1024),
    ("engine.maxSeqLen", 8192),
    ("engine.maxNumTokens", 4096),
    ("engine.pagedContextFmha", False),
    ("engine.builderImage", "registry.local/builder:trtllm-0.21"),
    ("engine.build.gpuProduct", "NVIDIA-H100-80GB-HBM3"),
]
# Inputs of the drafter only: the base engine's key must not move (its cache stays valid).
REDRAFTER_ONLY = [
    ("model.drafter.source", "pvc://drafters/other"),
    ("redrafter.numBeams", 4),
    ("redrafter.draftLenPerBeam", 4),
    ("redrafter.greedySearch", False),
]
# Serving, autoscaling, speculation and scheduling fields never rebuild.
NEITHER = [
    ("serving.replicas", 3),
    ("serving.image", "registry.local/triton:25.06"),
    ("serving.triton", {"kvCacheFreeGpuMemFraction": 0.5, "enableChunkedContext": False}),
    ("serving.rollout", {"strategy": "Recreate"}),
    ("autoscaling", {"maxReplicas": 8, "mode": "External"}),
    ("speculation", {"mode": "Never", "minAcceptanceRate": 0.5}),
    ("model.base.credentialsSecret", "other-token"),
    ("engine.cache", {"claimName": "other-cache"}),
    ("engine.build.activeDeadlineSeconds", 600),
    ("engine.build.nodeSelector", {"pool": "gpu"}),
    ("engine.build.retries", 5),
]


@pytest.mark.parametrize("path,value", BOTH, ids=[p for p, _ in BOTH])
def test_build_input_changes_both_keys(path, value):
    r0, b0 = keys(BASE)
    r1, b1 = keys(patched(path, value))
    assert r1 != r0 and b1 != b0


@pytest.mark.parametrize("path,value", REDRAFTER_ONLY, ids=[p for p, _ in REDRAFTER_ONLY])
def test_drafter_input_changes_only_the_redrafter_key(path, value):
    r0, b0 = keys(BASE)
    r1, b1 = keys(patched(path, value))
    assert r1 != r0 and b1 == b0


@pytest.mark.parametrize("path,value", NEITHER, ids=[p for p, _ in NEITHER])
def test_non_build_fields_keep_keys(path, value):
    assert keys(patched(path, value)) == keys(BASE)


def test_every_build_input_is_covered_by_a_test():
    """A new build input must get a row above (so nobody adds one without checking key sensitivity)."""
    spec = ReDrafterDeploymentSpec.model_validate(BASE)
    assert set(build_inputs(spec, "redrafter")) == {
        "contract",
        "variant",
        "base",
        "tokenizer",
        "architecture",
        "dtype",
        "quantization",
        "tensorParallel",
        "maxBatchSize",
        "maxInputLen",
        "maxSeqLen",
        "maxNumTokens",
        "pagedContextFmha",
        "builderImage",
        "gpuProduct",
        "drafter",
        "redrafter",
    }
