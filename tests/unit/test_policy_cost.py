"""Cost model: calibration to published figures, monotonicity, crossover, spec overrides."""

import math

import pytest

from redrafter_operator.api.spec import ReDrafterDeploymentSpec
from redrafter_operator.policy import CostParams, crossover, speedup, throughput, tokens_per_step


def spec(**kw):
    return ReDrafterDeploymentSpec.model_validate(
        {"model": {"base": {"source": "hf://o/b"}, "drafter": {"source": "hf://o/d"}}, **kw}
    )


def test_defaults_reproduce_published_low_batch_speedup():
    p = CostParams.from_spec(spec())
    assert p.verified_tokens == 26 and p.draft_len == 5
    assert speedup(1, 3.5, p) == pytest.approx(2.7, abs=0.01)  # Apple/NVIDIA: up to 2.7x, 3.5 tokens/step


def test_speedup_shrinks_with_batch_and_crosses_one_at_crossover():
    p = CostParams()
    values = [speedup(b, 3.5, p) for b in (1, 2, 4, 8, 16, 32, 64)]
    assert values == sorted(values, reverse=True)
    b = crossover(3.5, p)
    assert 10 < b < 16
    assert speedup(b, 3.5, p) == pytest.approx(1.0, abs=1e-9)
    assert crossover(2.75, p) < b  # lower acceptance, earlier crossover


def test_crossover_edges():
    p = CostParams()
    assert crossover(1.05, p) == 0.0  # cannot beat the drafter's overhead
    assert crossover(30, p) == math.inf  # accepts more than it verifies: never slower


def test_idle_replica_is_judged_at_batch_one_and_throughput_is_zero_at_zero():
    p = CostParams()
    assert speedup(0, 3.5, p) == speedup(1, 3.5, p)
    assert throughput("base", 0, 3.5, p) == 0 and throughput("redrafter", 0, 3.5, p) == 0


def test_tokens_per_step_from_acceptance_is_clamped():
    assert tokens_per_step(0.5, 5) == 3.5
    assert tokens_per_step(1.7, 5) == 6 and tokens_per_step(-1, 5) == 1


def test_every_parameter_is_overridable_in_the_spec():
    s = spec(
        redrafter={"numBeams": 4, "draftLenPerBeam": 3},
        speculation={"costModel": {"tokenCost": 0.01, "drafterOverhead": 0.2, "verifiedTokensPerRequest": 9}},
    )
    p = CostParams.from_spec(s)
    assert p == CostParams(token_cost=0.01, drafter_overhead=0.2, verified_tokens=9, draft_len=3)
    assert CostParams.from_spec(spec(redrafter={"numBeams": 4, "draftLenPerBeam": 3})).verified_tokens == 13
