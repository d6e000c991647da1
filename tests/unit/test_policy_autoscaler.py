"""HPA semantics: ratio, tolerance, ready/missing/pending pods, stabilization windows, max step, bounds, modes.

Expected values follow kube-controller-manager's replica calculator (pkg/controller/podautoscaler/
replica_calculator.go, calcPlainMetricReplicas and groupPods; same logic at release-1.28 and master).
"""

import json

import pytest

from redrafter_operator.api.spec import ReDrafterDeploymentSpec
from redrafter_operator.metrics import PodError, PodSample, PodStatus, Reading
from redrafter_operator.policy import AutoscalerState, PoolLoad, pool_load, recommend
from redrafter_operator.policy.autoscaler import SETTLE_INTERVALS, settled
from redrafter_operator.render.names import LABEL_TRAFFIC, LABEL_VARIANT


def make_spec(**autoscaling) -> ReDrafterDeploymentSpec:
    base = {
        "minReplicas": 1,
        "maxReplicas": 20,
        "targetQueuePerReplica": 4,
        "tolerance": 0.1,
        "scaleUpStabilization": "0s",
        "scaleDownStabilization": "300s",
        "maxStep": 10,
    }
    base.update(autoscaling)
    return ReDrafterDeploymentSpec.model_validate(
        {
            "model": {"base": {"source": "hf://org/base"}, "drafter": {"source": "hf://org/drafter"}},
            "autoscaling": base,
        }
    )


def load(per_pod: float, pods: int, failed: int = 0, waiting: float = 0.0, pending: int = 0) -> PoolLoad:
    """``pods`` ready pods at ``per_pod`` in flight (plus ``waiting`` queued in all), ``failed`` missing."""
    return PoolLoad(per_pod * pods + waiting, pods, failed, pending)


def step(spec, state, current, agg, now):
    return recommend(spec, state, current, agg, now)


def test_desired_is_ceil_of_ready_pods_times_ratio():
    d, _ = step(make_spec(), AutoscalerState(), 3, load(10, 3), 0)
    assert d.recommendation == 8 and d.replicas == 8 and d.reason == "ScaleUp"  # ceil(3 ready * 10/4) = 8
    assert d.metric == 10


def test_desired_multiplies_the_ready_pods_not_the_spec_replicas():
    # spec says 4, only 2 pods exist and report 8 each: ceil(2 * 8/4) = 4 (x spec replicas would say 8)
    d, _ = step(make_spec(), AutoscalerState(), 4, load(8, 2), 0)
    assert d.recommendation == 4 and d.replicas == 4 and d.reason == "NoChange"


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


def test_pending_pods_count_as_idle_on_a_scale_up():
    # 2 ready at 8, 2 Pending: ratio 2 from the ready pods; with the pending ones at 0: 16/4/4 = 1 -> no change
    d, _ = step(make_spec(), AutoscalerState(), 4, load(8, 2, pending=2), 0)
    assert d.replicas == 4 and d.reason == "UnreadyPodsConservative"
    # still needed with them idle: 2 at 16, 2 pending -> 32/4/4 = 2 -> ceil(2 * 4) = 8
    d, _ = step(make_spec(), AutoscalerState(), 4, load(16, 2, pending=2), 0)
    assert d.replicas == 8 and d.reason == "ScaleUp"


def test_pending_pods_are_left_out_of_a_scale_down_and_starting_pods_count_at_target():
    spec = make_spec(scaleDownStabilization="0s")
    # Pending pods are ignored on a scale-down (groupPods: unready): ceil(2 * 1/4) = 1
    d, _ = step(spec, AutoscalerState(), 4, load(1, 2, pending=2), 0)
    assert d.replicas == 1 and d.reason == "ScaleDown"
    # a running pod without a reading (starting, not Ready yet) is missing: at the target on a scale-down,
    # (2 + 2 * 4) / 4 pods / 4 = 0.625 -> ceil(0.625 * 4) = 3
    d, _ = step(spec, AutoscalerState(), 4, load(1, 2, failed=2), 0)
    assert d.replicas == 3 and d.reason == "ScaleDown"


def test_no_change_when_the_pods_counted_turn_the_direction_around():
    # ratio 0.8 (scale down); with 2 missing at target: (9.6 + 8) / 5 / 4 = 0.88, but ceil(0.88 * 5) = 5 > 4
    d, _ = step(make_spec(scaleDownStabilization="0s"), AutoscalerState(), 4, load(3.2, 3, failed=2), 0)
    assert d.replicas == 4 and d.reason == "MissingPodsConservative" and d.recommendation == 4


def _pods(ready: int, starting: int = 0, pending: int = 0, pool: str = "redrafter") -> list[PodStatus]:
    phases = ["Ready"] * ready + ["Starting"] * starting + ["Pending"] * pending
    return [PodStatus(f"{pool}-{i}", pool, pool, ph) for i, ph in enumerate(phases)]  # type: ignore[arg-type]


def _reading(per_pod: dict[str, float], t: float = 0.0, errors: tuple[str, ...] = ()) -> Reading:
    samples = tuple(
        PodSample(n, f"{n}/0", "redrafter", "redrafter", t, {}, {"active": v, "waiting": 0.0})
        for n, v in per_pod.items()
    )
    return Reading(t, samples, tuple(PodError(n, "redrafter", "redrafter", "timeout") for n in errors))


def test_pool_load_groups_pods_as_the_hpa_does():
    pods = _pods(ready=3, starting=1, pending=1) + [
        PodStatus("redrafter-gone", "redrafter", "redrafter", "Ignored"),
        PodStatus("canary-0", "redrafter", "base", "Ready"),  # another Deployment in the base pool
    ]
    r = _reading({"redrafter-0": 5, "redrafter-1": 3, "redrafter-gone": 40}, errors=("redrafter-2",))
    got = pool_load(r, "redrafter", pods)
    # ready: the two that answered; missing: the Ready one that did not + the starting one; pending: 1
    assert got == PoolLoad(total=8, ready=2, missing=2, unready=1)
    # without a pod list only the reading is known: the error is the missing pod, the deleted pod counts
    assert pool_load(r, "redrafter") == PoolLoad(total=48, ready=3, missing=1, unready=0)
    # a pod that is not Ready is missing even when the source has a reading for it (Prometheus can)
    loading = _reading({"redrafter-0": 5, "redrafter-1": 3, "redrafter-3": 0}, errors=("redrafter-2",))
    assert pool_load(loading, "redrafter", pods) == PoolLoad(total=8, ready=2, missing=2, unready=1)
    # every pod still starting: nothing to compute a ratio from
    assert pool_load(_reading({}), "redrafter", _pods(ready=0, starting=3)) is None


def test_pod_status_from_pod_objects():
    def pod(phase, ready, deleting=False, traffic=None):
        labels = {LABEL_VARIANT: "base", **({LABEL_TRAFFIC: traffic} if traffic else {})}
        meta = {"name": "p", "labels": labels, **({"deletionTimestamp": "2026-01-01T00:00:00Z"} if deleting else {})}
        conds = [{"type": "Ready", "status": "True" if ready else "False"}]
        return {"metadata": meta, "status": {"phase": phase, "conditions": conds}}

    assert PodStatus.from_pod(pod("Running", True)).phase == "Ready"
    assert PodStatus.from_pod(pod("Running", False)).phase == "Starting"
    assert PodStatus.from_pod(pod("Pending", False)).phase == "Pending"
    assert PodStatus.from_pod(pod("Running", True, deleting=True)).phase == "Ignored"
    assert PodStatus.from_pod(pod("Failed", False)).phase == "Ignored"
    assert PodStatus.from_pod(pod("Running", True, traffic="redrafter")).pool == "redrafter"
    with pytest.raises(ValueError, match="variant"):
        PodStatus.from_pod({"metadata": {"name": "x", "labels": {}}, "status": {}})


def test_loading_pods_do_not_overshoot():
    """16 requests in flight, target 4 per replica, new pods need 60 s to load their engine and become
    Ready; evaluations every 5 s for 90 s. The load needs 4 replicas: the autoscaler must never ask for
    more (multiplying a ready-pod ratio by the spec replicas ran 2 -> 4 -> 8 -> 12 -> 16)."""
    spec = make_spec(maxReplicas=16, maxStep=4, scaleDownStabilization="300s")
    created = {"redrafter-0": -600.0, "redrafter-1": -600.0}  # two pods Ready long ago
    state, replicas, seen = AutoscalerState(), 2, []
    for t in range(0, 95, 5):
        names = sorted(created)
        pods = [PodStatus(n, "redrafter", "redrafter", "Ready" if t - created[n] >= 60 else "Starting") for n in names]
        ready = [p.name for p in pods if p.phase == "Ready"]
        r = _reading({n: 16 / len(ready) for n in ready}, t)  # the Service spreads the load over Ready pods
        d, state = recommend(spec, state, replicas, pool_load(r, "redrafter", pods), t)
        state = AutoscalerState.model_validate_json(state.model_dump_json())
        replicas = d.replicas
        seen.append(replicas)
        for i in range(len(created), replicas):  # the Deployment creates the missing pods now
            created[f"redrafter-{i}"] = float(t)
    assert max(seen) == 4, seen
    assert seen[0] == 4 and seen[-1] == 4  # scaled for the load at once, and held while the pods loaded


def test_no_scale_up_while_every_pod_is_starting():
    spec = make_spec()
    d, _ = recommend(spec, AutoscalerState(), 3, pool_load(_reading({}), "redrafter", _pods(0, starting=3)), 0)
    assert d.replicas == 3 and d.reason == "NoMetrics"


def test_the_pool_that_just_took_the_traffic_is_not_scaled_down_within_the_settle_window():
    spec = make_spec(scaleDownStabilization="120s")
    s = settled(spec, 3, 0.0)  # the Service moved to a pool sized 3
    for t in range(5, 120, 5):  # its gauges read ~0 for a while
        d, s = step(spec, s, 3, load(0.1, 3), t)
        assert d.replicas == 3 and d.reason == "SwitchSettling", (t, d)
        s = AutoscalerState.model_validate_json(s.model_dump_json())
    d, s = step(spec, s, 3, load(8, 3), 120)  # scaling up is never held
    assert d.replicas == 6
    spec0 = make_spec(scaleDownStabilization="0s")  # no window asked for: still SETTLE_INTERVALS evaluations
    s = settled(spec0, 3, 0.0)
    interval = 30  # make_spec's speculation interval (default 30s)
    d, s = step(spec0, s, 3, load(0.1, 3), SETTLE_INTERVALS * interval - 1)
    assert d.replicas == 3
    d, s = step(spec0, s, 3, load(0.1, 3), SETTLE_INTERVALS * interval)
    assert d.replicas == 1 and s.settle is None


def test_requests_queued_in_the_front_count_as_waiting():
    """The OpenAI front's queue is load Triton does not see yet; a pod without the front's gauges counts
    only Triton's (missing data for that part, not an error)."""
    samples = (
        PodSample(
            "redrafter-0", "r0/0", "redrafter", "redrafter", 0, {}, {"active": 8, "waiting": 2, "front_queued": 6}
        ),
        PodSample("redrafter-1", "r1/0", "redrafter", "redrafter", 0.0, {}, {"active": 8, "front_in_flight": 8}),
    )
    got = pool_load(Reading(0.0, samples), "redrafter", _pods(ready=2))
    assert got == PoolLoad(total=24, ready=2)
    d, _ = recommend(make_spec(), AutoscalerState(), 2, got, 0)
    assert d.metric == 12 and d.replicas == 6 and d.reason == "ScaleUp"
