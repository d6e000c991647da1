"""The CRDs on the real kube-apiserver: what the unit tests check in the operator's model, the API server checks
the same way, with its structural schema, strict field validation and CEL (cel-go).

- every invalid spec of the shared corpus is refused, the error naming the field;
- the defaults the API server stores are the model's defaults;
- the policy's rules, the InferencePool's endpoint picker and the gRPC-behind-keys rule are the CRD's too;
- every InferencePool the operator renders is accepted by the upstream v1.0.0 CRD (tests/fixtures/crds/), and that
  CRD refuses what a broken renderer would write.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.cluster import Kube, api_causes, run_kubectl, status_message
from harness.specs import INVALID, MINIMAL, SPECULATION, names_field, with_change
from redrafter_operator.api.spec import ReDrafterDeploymentSpec
from redrafter_operator.render.common import Owner
from redrafter_operator.render.inference_pool import inference_pool
from redrafter_sim.controlplane import ControlPlane

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
POOL_CRD = ROOT / "tests" / "fixtures" / "crds" / "inference.networking.k8s.io_inferencepools.yaml"
RDD = "/apis/redrafter.dev/v1alpha1/namespaces/{ns}/redrafterdeployments/"
PICKER = {"name": "llama3-8b-epp", "port": 9002}

pytestmark = pytest.mark.timeout(300)


def in_namespace(kube: Kube, doc: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    out["metadata"]["namespace"] = kube.namespace
    return out


def refused(kube: Kube, doc: dict[str, Any]) -> list[str]:
    """The API server's causes for refusing ``doc`` (server-side dry run); [] where it accepts it."""
    result = kube.apply(in_namespace(kube, doc), dry_run=True, check=False)
    if result.returncode == 0:
        return []
    return api_causes(result) or [status_message(result)]


@pytest.mark.parametrize("case,field,value,named", INVALID, ids=[c[0] for c in INVALID])
def test_invalid_spec_rejected_by_the_api_server_naming_the_field(
    kube: Kube, case: str, field: str, value: Any, named: str
) -> None:
    errors = refused(kube, with_change(MINIMAL, field, value))
    assert errors, f"{case}: the API server accepted it"
    assert names_field(errors, named), errors


def test_minimal_is_accepted(kube: Kube) -> None:
    assert refused(kube, MINIMAL) == []


@pytest.mark.parametrize("value", ["v1", "V1"])
def test_static_batching_is_refused_naming_what_to_use(kube: Kube, value: str) -> None:
    errors = refused(kube, with_change(MINIMAL, "spec.serving.triton", {"batchingStrategy": value}))
    assert any(e.startswith("spec.serving.triton.batchingStrategy") and "inflight_fused_batching" in e for e in errors)


@pytest.mark.parametrize(
    "doc", [MINIMAL, *(yaml.safe_load(p.read_text()) for p in EXAMPLES)], ids=["minimal", *(p.name for p in EXAMPLES)]
)
def test_the_api_server_stores_the_models_defaults(kube: Kube, doc: dict[str, Any]) -> None:
    """Created for real and read back: the CRD's defaults are the ones the operator's model fills."""
    kube.apply(in_namespace(kube, doc))
    stored = kube.get(RDD + doc["metadata"]["name"])
    assert stored is not None
    model = ReDrafterDeploymentSpec.from_wire(doc["spec"]).wire()
    assert ReDrafterDeploymentSpec.from_wire(stored["spec"]).wire() == model
    if doc is MINIMAL:
        assert stored["spec"]["speculation"]["interval"] == "30s"
        assert "claimName" not in stored["spec"]["engine"]["cache"]  # left to the operator (api/defaults.py)


@pytest.mark.parametrize("speculation,ok", SPECULATION, ids=[str(c[0]) for c in SPECULATION])
def test_the_policy_rules_are_the_crds(kube: Kube, speculation: dict[str, Any], ok: bool) -> None:
    errors = refused(kube, with_change(MINIMAL, "spec.speculation", speculation))
    assert (errors == []) is ok, errors
    assert all(e.startswith("spec.speculation") for e in errors), errors


def test_an_enabled_inference_pool_needs_an_endpoint_picker(kube: Kube) -> None:
    routing = "spec.routing"
    errors = refused(kube, with_change(MINIMAL, routing, {"inferencePool": {"enabled": True}}))
    assert any(e.startswith("spec.routing.inferencePool") and "endpointPickerRef is required" in e for e in errors), (
        errors
    )
    good = {"enabled": True, "endpointPickerRef": {**PICKER, "failureMode": "FailOpen"}}
    assert refused(kube, with_change(MINIMAL, routing, {"inferencePool": good})) == []
    bad_mode = {"enabled": True, "endpointPickerRef": {**PICKER, "failureMode": "Open"}}
    assert refused(kube, with_change(MINIMAL, routing, {"inferencePool": bad_mode}))
    assert refused(kube, with_change(MINIMAL, routing, {"inferencePool": {"enabled": False}})) == []


def test_grpc_validation_behind_api_keys_is_refused(kube: Kube) -> None:
    keys = {"auth": {"apiKeysSecret": "llm-keys"}}
    errors = refused(kube, with_change(with_change(MINIMAL, "spec.serving", keys), "spec.validation.protocol", "grpc"))
    assert any(e.startswith("spec.validation.protocol") and "must not be grpc" in e for e in errors), errors
    for validation in ({"protocol": "openai"}, {}, None):
        doc = with_change(MINIMAL, "spec.serving", keys)
        if validation is not None:
            doc = with_change(doc, "spec.validation", validation)
        assert refused(kube, doc) == [], validation
    assert refused(kube, with_change(MINIMAL, "spec.validation.protocol", "grpc")) == []


# ------------------------------------------------------------------------------ the upstream InferencePool CRD


@pytest.fixture(scope="module")
def pool_crd(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The upstream InferencePool CRD installed for this module's tests, and removed after them."""
    home = tmp_path_factory.mktemp("pool-crd")
    name = yaml.safe_load(POOL_CRD.read_text())["metadata"]["name"]
    run_kubectl(control_plane.admin_kubeconfig, home, "apply", "--server-side", "-f", str(POOL_CRD), check=True)
    run_kubectl(control_plane.admin_kubeconfig, home, "wait", "--for=condition=Established", f"crd/{name}", check=True)
    yield
    run_kubectl(control_plane.admin_kubeconfig, home, "delete", "crd", name, "--wait=false")


def rendered_pool(name: str = "llama3-8b", pool: str = "base", picker: dict[str, Any] = PICKER) -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "examples" / "llama3-8b.yaml").read_text())
    doc["metadata"].update(name=name, uid="u-1", generation=1, namespace="default")
    doc["spec"]["routing"] = {"inferencePool": {"enabled": True, "endpointPickerRef": picker}}
    return inference_pool(Owner.from_body(doc), pool)


@pytest.mark.usefixtures("pool_crd")
@pytest.mark.parametrize("name", ["llama3-8b", "a" * 63, "m.with.dots"])
@pytest.mark.parametrize("pool", ["redrafter", "base"])
@pytest.mark.parametrize(
    "picker",
    [PICKER, {**PICKER, "failureMode": "FailOpen"}, {"name": "epp", "port": 65535, "failureMode": "FailClose"}],
)
def test_the_rendered_pool_is_accepted_by_the_upstream_crd(
    kube: Kube, name: str, pool: str, picker: dict[str, Any]
) -> None:
    assert refused(kube, rendered_pool(name, pool, picker)) == []


@pytest.mark.usefixtures("pool_crd")
def test_the_upstream_crd_refuses_what_a_broken_renderer_would_write(kube: Kube) -> None:
    """The check above can fail: the v1 schema's own rules refuse these."""
    obj = rendered_pool()
    broken = copy.deepcopy(obj)
    broken["spec"]["selector"] = broken["spec"]["selector"]["matchLabels"]  # a Service-style selector
    assert any(e.startswith("spec.selector") for e in refused(kube, broken))
    no_port = copy.deepcopy(obj)
    del no_port["spec"]["endpointPickerRef"]["port"]  # CEL: port is required for a Service
    assert any("port is required" in e for e in refused(kube, no_port))
    two_ports = copy.deepcopy(obj)
    two_ports["spec"]["targetPorts"].append({"number": 8000})  # v1.0.0: a single port
    assert any(e.startswith("spec.targetPorts") for e in refused(kube, two_ports))
