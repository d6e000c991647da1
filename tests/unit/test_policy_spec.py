"""The policy's spec fields: rules enforced alike by the model and by the CRD (CEL)."""

import pytest

from redrafter_operator.api import spec_errors
from redrafter_operator.api.crd import crd
from redrafter_operator.api.schema_check import validate_resource

BASE = {"model": {"base": {"source": "hf://o/b"}, "drafter": {"source": "hf://o/d"}}}


def resource(speculation: dict) -> dict:
    return {
        "apiVersion": "redrafter.dev/v1alpha1",
        "kind": "ReDrafterDeployment",
        "metadata": {"name": "t", "namespace": "default"},
        "spec": {**BASE, "speculation": speculation},
    }


@pytest.mark.parametrize(
    "speculation,ok",
    [
        ({"minAcceptanceRate": 0.95}, True),  # + default hysteresis 0.05 = 1.0
        ({"minAcceptanceRate": 0.96}, False),
        ({"minAcceptanceRate": 0.5, "acceptanceHysteresis": 0.6}, False),
        ({"costModel": {"tokenCost": 0.01, "drafterOverhead": 0.2, "verifiedTokensPerRequest": 9}}, True),
        ({"costModel": {"tokenCost": 0}}, False),
    ],
)
def test_model_and_crd_agree(speculation, ok):
    model = spec_errors({**BASE, "speculation": speculation})
    server = validate_resource(crd(), resource(speculation))
    assert (model == []) is ok and (server == []) is ok, (model, server)
    if not ok:
        assert all("spec.speculation" in e for e in model + server), (model, server)
