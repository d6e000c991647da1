"""The policy's spec fields: the rules the model enforces (the CRD's CEL enforces the same ones on the real API
server: tests/integration/test_crd_validation.py runs these cases there)."""

from typing import Any

import pytest

from harness.specs import MINIMAL, SPECULATION
from redrafter_operator.api import spec_errors


@pytest.mark.parametrize("speculation,ok", SPECULATION, ids=[str(c[0]) for c in SPECULATION])
def test_the_model_enforces_the_policy_rules(speculation: dict[str, Any], ok: bool) -> None:
    errors = spec_errors({**MINIMAL["spec"], "speculation": speculation})
    assert (errors == []) is ok, errors
    assert all(e.startswith("spec.speculation") for e in errors), errors
