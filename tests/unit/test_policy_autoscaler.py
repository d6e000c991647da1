"""HPA semantics: ratio, tolerance, missing pods, stabilization windows, max step, bounds, modes."""

import json

import pytest

from redrafter_operator.api.spec import ReDrafterDeploymentSpec
from redrafter_operator.metrics.window import Aggregate
from redrafter_operator.policy import AutoscalerState, recommend


def make_spec(**autoscaling) -> ReDrafterDeploymentSpec:
    base = {"minReplicas": 1, "maxReplicas": 20, "targetQueuePerReplica": 4, "tolerance": 0.1,
            "scaleUpStabilization": "0s", "scaleDownStabilization": "300s", "maxStep": 10}
    base.update(autoscaling)
    return ReDrafterDeploymentSpec.model_validate({
        "model": {"base": {"source": "hf://org/base"}, "drafter": {"source": "hf://org/drafter"}},
        "autoscaling": base,
    })


def load(per_pod: float, pods: int, failed: int = 0, waiting: float = 0.0) -> Aggregate:
    return Aggregate(30, pods, failed, pods, 0, {}, 0.0, {"active": per_pod * pods, "waiting": waiting})


def step(spec, state, current, agg, now):
    return recommend(spec, state, current, agg, now)


def test_desired_is_ceil_of_current_times_ratio():
    d, _ = step(make_spec(), AutoscalerState(), 3, load(10, 3), 0)
    assert d.recommendation == 8 and d.replicas == 8 and d.reason == "ScaleUp"  # ceil(3 * 10/4) = 8
    assert d.metric == 10


def test_waiting_requests_count():
    d, _ = step(make_spec(), AutoscalerState(), 2, load(4, 2, waiting=8), 0)
    assert d.replicas == 4  # (8 + 8) / 2 = 8 per replica -> ceil(2 * 2)


@pytest.mark.parametrize("per_pod,expected", [(4.4, 4), (3.6, 4), (4.41, 5)])
def test_tolerance(per_pod, expected):
    d, _ = step(make_spec(scaleDownStabilization="0s"), AutoscalerState(), 4, load(per_pod, 4), 0)
    assert d.replicas == expected
    if expected == 4:
        assert d.reason == "WithinTolerance"


def test_scale_down_stabilization_uses_max_in_window():
    spec = make_spec(scaleDownStabilization="300s")
    s = AutoscalerState()
    d, s = step(spec, s, 8, load(4, 8), 0)  # at target: recommends 8
    assert d.replicas == 8
    for t in range(30, 300, 30):  # load drops: raw recommendation 2, window still holds 8
        d, s = step(spec, s, 8, load(1, 8), t)
        assert d.replicas == 8 and d.recommendation == 2 and d.reason == "Stabilized"
    d, s = step(spec, s, 8, load(1, 8), 301)
    assert d.replicas == 2 and d.reason == "ScaleDown"


def test_brief_dip_does_not_scale_down():
    spec = make_spec(scaleDownStabilization="120s")
    s = AutoscalerState()
    seq = [4, 4, 1, 4, 4, 1, 4]
    for i, x in enumerate(seq):
        d, s = step(spec, s, 5, load(x, 5), i * 30)
        assert d.replicas == 5


def test_scale_up_stabilization_uses_min_in_window():
    spec = make_spec(scaleUpStabilization="60s", scaleDownStabilization="0s")
    s = AutoscalerState()
    d, s = step(spec, s, 2, load(4, 2), 0)
    d, s = step(spec, s, 2, load(16, 2), 30)  # spike: raw 8, but 2 in window
    assert d.replicas == 2 and d.recommendation == 8
    d, s = step(spec, s, 2, load(16, 2), 61)  # 0s entry expired, window has [8, 8]
    assert d.replicas == 8


def test_max_step_and_bounds():
    d, _ = step(make_spec(maxStep=2), AutoscalerState(), 3, load(40, 3), 0)
    assert d.replicas == 5 and d.reason == "Limited"
    d, _ = step(make_spec(maxReplicas=6), AutoscalerState(), 3, load(40, 3), 0)
    assert d.replicas == 6
    d, _ = step(make_spec(minReplicas=3, scaleDownStabilization="0s"), AutoscalerState(), 5, load(0, 5), 0)
    assert d.replicas == 3


def test_missing_pods_are_conservative():
    spec = make_spec(scaleDownStabilization="0s")
    # scale up: 2 reporting at 8, 2 missing assumed 0 -> mean 4 -> within tolerance, no change
    d, _ = step(spec, AutoscalerState(), 4, load(8, 2, failed=2), 0)
    assert d.replicas == 4 and d.reason == "MissingPodsConservative"
    # scale up still needed: 2 at 16, 2 missing -> mean 8 -> ceil(4 * 2) = 8 (not 16)
    d, _ = step(spec, AutoscalerState(), 4, load(16, 2, failed=2), 0)
    assert d.replicas == 8
    # scale down: 2 at 0, 2 missing assumed at target -> mean 2 -> ceil(4 * 0.5) = 2 (not 1)
    d, _ = step(spec, AutoscalerState(), 4, load(0, 2, failed=2), 0)
    assert d.replicas == 2


def test_no_metrics_no_change_and_minimum_enforced():
    spec = make_spec(minReplicas=2)
    d, _ = step(spec, AutoscalerState(), 3, None, 0)
    assert d.replicas == 3 and d.reason == "NoMetrics"
    d, _ = step(spec, AutoscalerState(), 0, None, 0)
    assert d.replicas == 2 and d.reason == "BelowMinimum"
    d, _ = step(make_spec(minReplicas=0), AutoscalerState(), 0, None, 0)
    assert d.replicas == 0 and d.reason == "ScaledToZero"


@pytest.mark.parametrize("mode", ["External", "Disabled"])
def test_external_and_disabled_never_write(mode):
    s = AutoscalerState(recommendations=[(0.0, 3)])
    d, s2 = step(make_spec(mode=mode), s, 3, load(100, 3), 10)
    assert d.replicas is None and not d.changed(3) and s2 == s


def test_history_is_pruned_and_json():
    spec = make_spec(scaleUpStabilization="60s", scaleDownStabilization="120s")
    s = AutoscalerState()
    for t in range(0, 3600, 30):
        _, s = step(spec, s, 4, load(4, 4), t)
    assert len(s.recommendations) <= 5
    assert AutoscalerState.model_validate(json.loads(s.model_dump_json())) == s
