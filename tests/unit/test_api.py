"""The API: invalid specs are rejected by both the CRD schema (incl. CEL) and the operator's model,
each with a message naming the field; the committed CRD is the generated one and is a valid CRD."""

from __future__ import annotations

import copy
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from redrafter_operator.api import spec_errors
from redrafter_operator.api.crd import crd, crd_yaml
from redrafter_operator.api.schema_check import validate_resource
from redrafter_operator.api.spec import ReDrafterDeploymentSpec
from redrafter_operator.api.types import parse_duration, parse_source

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "crds" / "redrafter.dev_redrafterdeployments.yaml"
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))

MINIMAL = {
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


def _set(doc: dict, dotted: str, value) -> dict:
    out = copy.deepcopy(doc)
    node = out
    *parents, leaf = dotted.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    if value is _DELETE:
        node.pop(leaf)
    else:
        node[leaf] = value
    return out


_DELETE = object()

# (case id, field to set, value, field the error must name)
INVALID = [
    ("no-model", "spec.model", _DELETE, "spec.model"),
    ("no-drafter", "spec.model.drafter", _DELETE, "spec.model.drafter"),
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
]


def names_field(errors: list[str], field: str) -> bool:
    """True when some error is about ``field``: at its path, or at its parent naming it."""
    parent, leaf = field.rsplit(".", 1)
    return any(e.startswith(field) or (e.startswith(parent + ":") and leaf in e) for e in errors)


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
def test_examples_are_valid(example, committed_crd):
    doc = yaml.safe_load(example.read_text())
    assert validate_resource(committed_crd, doc) == []
    assert spec_errors(doc["spec"]) == []


def test_defaults_agree_between_crd_and_model(committed_crd):
    """The API server and the operator fill the same defaults."""
    from redrafter_operator.api.schema_check import apply_defaults, crd_schema

    server_side = apply_defaults(crd_schema(committed_crd), copy.deepcopy(MINIMAL))["spec"]
    model = ReDrafterDeploymentSpec.model_validate(MINIMAL["spec"]).wire()
    assert ReDrafterDeploymentSpec.model_validate(server_side).wire() == model
    assert server_side["speculation"]["interval"] == "30s"
    assert "claimName" not in server_side["engine"]["cache"]  # left to the operator (api/defaults.py)


def test_minimal_is_valid(committed_crd):
    assert validate_resource(committed_crd, MINIMAL) == []
    assert spec_errors(MINIMAL["spec"]) == []


@pytest.mark.parametrize("case,field,value,named", INVALID, ids=[c[0] for c in INVALID])
def test_invalid_spec_rejected_by_model_naming_the_field(case, field, value, named):
    doc = _set(MINIMAL, field, value)
    errors = spec_errors(doc["spec"])
    assert errors, f"{case}: the operator's model accepted it"
    assert names_field(errors, named), errors


@pytest.mark.parametrize("case,field,value,named", INVALID, ids=[c[0] for c in INVALID])
def test_invalid_spec_rejected_by_crd_naming_the_field(case, field, value, named, committed_crd):
    doc = _set(MINIMAL, field, value)
    errors = validate_resource(committed_crd, doc)
    assert errors, f"{case}: the CRD schema accepted it"
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
def test_static_batching_error_says_why_and_what_to_use(value, committed_crd):
    doc = _set(MINIMAL, "spec.serving.triton", {"batchingStrategy": value})
    errors = spec_errors(doc["spec"])
    assert any("static batching" in e and "inflight_fused_batching" in e for e in errors), errors
    crd_errors = validate_resource(committed_crd, doc)
    assert any("inflight_fused_batching" in e for e in crd_errors), crd_errors
