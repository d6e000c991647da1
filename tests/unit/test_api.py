"""The API: invalid specs are rejected by the operator's model with a message naming the field; the committed CRD
is the generated one and is a valid CRD. The same corpus against the real API server: tests/integration/
test_crd_validation.py."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from harness.specs import INVALID, MINIMAL, names_field, with_change
from redrafter_operator.api import spec_errors
from redrafter_operator.api.crd import crd, crd_yaml
from redrafter_operator.api.types import parse_duration, parse_source

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "crds" / "redrafter.dev_redrafterdeployments.yaml"
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


@pytest.fixture(scope="module")
def committed_crd() -> dict:
    return yaml.safe_load(CRD_FILE.read_text())


def test_committed_crd_is_the_generated_one():
    assert CRD_FILE.read_text() == crd_yaml(), "run `make crd` and commit crds/"


def test_crd_is_a_valid_crd(committed_crd):
    kubernetes_validate.validate(committed_crd, "1.30", strict=True)
    version = committed_crd["spec"]["versions"][0]
    assert version["subresources"]["scale"]["labelSelectorPath"] == ".status.serving.selector"
    assert [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")] == [
        "Phase",
        "Engine",
        "Drafter",
        "Ready",
        "Reason",
        "Acceptance",
        "Age",
    ]


def test_crd_is_structural(committed_crd):
    """No $ref/anyOf/additionalProperties:false beside properties; every field has a type."""

    def walk(node, path):
        assert "$ref" not in node and "anyOf" not in node and "allOf" not in node, path
        if "properties" in node:
            assert node.get("additionalProperties") in (None,), path
            for name, sub in node["properties"].items():
                assert "type" in sub or sub.get("x-kubernetes-preserve-unknown-fields"), f"{path}.{name}"
                walk(sub, f"{path}.{name}")
        if "items" in node:
            walk(node["items"], path + "[]")

    walk(committed_crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"], "")


def test_every_spec_field_is_documented(committed_crd):
    spec = committed_crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    missing = []

    def walk(node, path):
        for name, sub in node.get("properties", {}).items():
            if not sub.get("description"):
                missing.append(f"{path}.{name}")
            walk(sub, f"{path}.{name}")

    walk(spec, "spec")
    assert not missing


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_examples_are_valid(example):
    doc = yaml.safe_load(example.read_text())
    assert spec_errors(doc["spec"]) == []


def test_minimal_is_valid():
    assert spec_errors(MINIMAL["spec"]) == []


@pytest.mark.parametrize("case,field,value,named", INVALID, ids=[c[0] for c in INVALID])
def test_invalid_spec_rejected_by_model_naming_the_field(case, field, value, named):
    doc = with_change(MINIMAL, field, value)
    errors = spec_errors(doc["spec"])
    assert errors, f"{case}: the operator's model accepted it"
    assert names_field(errors, named), errors


def test_at_least_fifteen_distinct_invalid_specs():
    assert len({c[0] for c in INVALID}) >= 15


@pytest.mark.parametrize(
    "uri",
    [
        "hf://a/b/c",
        "s3://BadBucket/x",
        "pvc://Claim/x",
        "pvc://x/-rf",
        "hf://org/name$(id)",
        "hf://org/na me",
        "pvc://x//y",
        "hf://",
        "s3://bucket/a\nb",
        "file:///etc/passwd",
        "pvc://x/./y",
    ],
)
def test_source_parser_rejects(uri):
    with pytest.raises(ValueError):
        parse_source(uri)


def test_source_parser_parts():
    assert parse_source("pvc://drafters/llama/v1").path == "llama/v1"
    assert parse_source("s3://my-bucket/prefix/x").authority == "my-bucket"
    assert parse_source("hf://meta-llama/Meta-Llama-3-8B-Instruct").authority == "meta-llama/Meta-Llama-3-8B-Instruct"


@pytest.mark.parametrize("text,seconds", [("30s", 30), ("10m", 600), ("1h30m", 5400), ("250ms", 0.25), ("0s", 0)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


def test_crd_function_matches_yaml():
    assert yaml.safe_load(crd_yaml()) == crd()


@pytest.mark.parametrize("value", ["v1", "V1"])
def test_static_batching_error_says_why_and_what_to_use(value):
    doc = with_change(MINIMAL, "spec.serving.triton", {"batchingStrategy": value})
    errors = spec_errors(doc["spec"])
    assert any("static batching" in e and "inflight_fused_batching" in e for e in errors), errors


@pytest.mark.parametrize("field", ["spec.speculation", "spec.engine.maxBatchSize", "spec.method"])
def test_a_null_field_is_absent_as_the_api_server_prunes_it(field):
    assert spec_errors(with_change(MINIMAL, field, None)["spec"]) == []


def test_a_whole_float_is_the_integer_the_api_server_accepts():
    assert spec_errors(with_change(MINIMAL, "spec.engine.maxBatchSize", 8.0)["spec"]) == []
    assert spec_errors(with_change(MINIMAL, "spec.engine.maxBatchSize", 8.5)["spec"])
