"""The load-aware rule uses the validation Job's measured crossover instead of the default calibration."""

from __future__ import annotations

import math

import pytest

from redrafter_operator.api.status import ReDrafterDeploymentStatus
from redrafter_operator.controller.speculation import measured_crossover
from redrafter_operator.policy import cost

S = ReDrafterDeploymentStatus.from_wire


@pytest.mark.parametrize("measured", [2.0, 3.5, 13.0, 40.0])
@pytest.mark.parametrize("tps", [2.0, 3.5])
def test_calibrated_model_crosses_over_where_measured(measured, tps):
    p = cost.CostParams()
    q = cost.calibrated(p, measured, tps)
    assert math.isclose(cost.crossover(tps, q), measured, rel_tol=1e-9)
    assert cost.speedup(measured * 0.5, tps, q) > 1 > cost.speedup(measured * 2, tps, q)
    # only the batch-scaling parameter moves
    assert (q.drafter_overhead, q.verified_tokens, q.draft_len) == (p.drafter_overhead, p.verified_tokens, p.draft_len)


@pytest.mark.parametrize("measured,tps", [(None, 3.0), (0.0, 3.0), (math.inf, 3.0), (5.0, 1.0), (5.0, 1000.0)])
def test_unusable_measurements_keep_the_default_model(measured, tps):
    p = cost.CostParams()
    assert cost.calibrated(p, measured, tps) == p


def test_measured_crossover_comes_only_from_a_passed_validation():
    passed = {"validation": {"state": "Passed"}, "speculation": {"crossoverConcurrency": 3.51}}
    assert measured_crossover(S(passed)) == 3.51
    assert measured_crossover(S({**passed, "validation": {"state": "Failed"}})) is None
    assert measured_crossover(S({"validation": {"state": "Passed"}, "speculation": {}})) is None
    assert measured_crossover(S({})) is None


def test_step_judges_load_against_the_measured_crossover():
    """Acceptance 0.6 at 2 active requests per pod pays under the default model (crossover ~13) but not on an
    engine pair whose validation measured a crossover of 1.5 concurrent requests."""
    from redrafter_operator.api.spec import ReDrafterDeploymentSpec
    from redrafter_operator.metrics import PodSample, Reading
    from redrafter_operator.policy import step

    spec = ReDrafterDeploymentSpec.model_validate(
        {
            "model": {"base": {"source": "hf://o/b"}, "drafter": {"source": "hf://o/d"}},
            "speculation": {"minDwell": "30s", "minSamples": 10},
        }
    )

    def reading(t: float, n: int) -> Reading:
        c = {
            "requests": 30.0 * n,
            "draft_tokens": 500.0 * n,
            "accepted_draft_tokens": 300.0 * n,
            "output_tokens": 400.0 * n,
            "steps": 100.0 * n,
        }
        return Reading(t, (PodSample("r-0", "u0/0", "redrafter", "redrafter", t, c, {"active": 2.0, "waiting": 0.0}),))

    outcomes = {}
    for label, measured in (("default", None), ("measured", 1.5)):
        _, st = step(spec, None, reading(0, 1), 0, current_replicas=1, measured_crossover=measured)
        ev, _ = step(spec, st, reading(30, 2), 30, current_replicas=1, measured_crossover=measured)
        outcomes[label] = (ev.speculation.measurement.outcome, ev.speculation.measurement.predicted_speedup)
    assert outcomes["default"][0] == "Successful" and outcomes["default"][1] > 1
    assert outcomes["measured"][0] == "Failed" and outcomes["measured"][1] < 1
