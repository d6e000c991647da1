"""Operator-wide defaults (Helm values -> env) fill unset images and the cache claim, and reach keys."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from redrafter_operator.api.defaults import (
    DEFAULT_BUILDER_IMAGE,
    ENV_BUILDER_IMAGE,
    ENV_CACHE_CLAIM,
    OperatorDefaults,
)
from redrafter_operator.api.spec import ReDrafterDeploymentSpec

ROOT = Path(__file__).resolve().parents[2]
SPEC = {"model": {"base": {"source": "hf://org/base"}, "drafter": {"source": "pvc://drafters/d"}}}

_PROBE = (
    "import json,sys; from redrafter_operator.api.spec import ReDrafterDeploymentSpec as S;"
    "from redrafter_operator.api.engine_key import engine_key;"
    "from redrafter_operator.render.build import build_job; from redrafter_operator.render.common import Owner;"
    "s=S.model_validate(json.loads(sys.argv[1]));"
    "job=build_job(Owner('x','ns','uid',s),'redrafter')['spec']['template']['spec'];"
    "print(json.dumps({'key':engine_key(s,'redrafter'),'image':job['containers'][0]['image'],"
    "'claim':[v for v in job['volumes'] if v['name']=='cache'][0]['persistentVolumeClaim']['claimName'],"
    "'serving':s.serving.image}))"
)


def probe(spec: dict, **env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("REDRAFTER_DEFAULT_")}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(spec)],
        capture_output=True,
        text=True,
        check=True,
        env={**clean, **env},
    )
    return json.loads(out.stdout)


def test_builtin_defaults_without_environment():
    got = probe(SPEC)
    assert got["image"] == DEFAULT_BUILDER_IMAGE and got["claim"] == "engine-cache"


def test_environment_defaults_fill_unset_fields_and_move_the_key():
    plain = probe(SPEC)
    custom = probe(
        SPEC,
        **{
            ENV_BUILDER_IMAGE: "registry.local/builder:trtllm1.0.0",
            ENV_CACHE_CLAIM: "team-cache",
            "REDRAFTER_DEFAULT_SERVING_IMAGE": "registry.local/triton:25.09",
        },
    )
    assert custom["image"] == "registry.local/builder:trtllm1.0.0"
    assert custom["claim"] == "team-cache" and custom["serving"] == "registry.local/triton:25.09"
    assert custom["key"] != plain["key"], "the builder image pins TensorRT-LLM: it must be part of the key"


def test_explicit_spec_values_win_over_environment():
    spec = {**SPEC, "engine": {"builderImage": "mine/builder:1"}}
    got = probe(spec, **{ENV_BUILDER_IMAGE: "registry.local/builder:2"})
    assert got["image"] == "mine/builder:1"


def test_malformed_environment_value_names_the_variable():
    with pytest.raises(ValueError, match=ENV_CACHE_CLAIM):
        OperatorDefaults.from_env({ENV_CACHE_CLAIM: "Not_A_Claim"})


def test_crd_leaves_defaulted_fields_to_the_operator():
    crd = yaml.safe_load((ROOT / "crds" / "redrafter.dev_redrafterdeployments.yaml").read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert "default" not in spec["engine"]["properties"]["builderImage"]
    assert "default" not in spec["engine"]["properties"]["cache"]["properties"]["claimName"]
    assert "default" not in spec["serving"]["properties"]["image"]
    assert ReDrafterDeploymentSpec.model_validate(SPEC).engine.builder_image  # resolved in the model
