"""policy.loop.step: the controller's entry point, from a Reading to decisions and persisted state."""

import json

from redrafter_operator.api.spec import ReDrafterDeploymentSpec
from redrafter_operator.metrics import PodSample, Reading
from redrafter_operator.policy import PolicyState, step


def spec(**kw):
    return ReDrafterDeploymentSpec.model_validate(
        {
            "model": {"base": {"source": "hf://o/b"}, "drafter": {"source": "hf://o/d"}},
            "speculation": {"minDwell": "30s", "minSamples": 10},
            **kw,
        }
    )


def reading(t, n, acceptance, active=2.0, pods=2, variant="redrafter", pool="redrafter"):
    """Cumulative counters after n intervals of 30 requests per pod."""
    out = []
    for i in range(pods):
        c = {
            "requests": 30.0 * n,
            "draft_tokens": 500.0 * n,
            "accepted_draft_tokens": 500.0 * n * acceptance,
            "output_tokens": 100.0 * n * (1 + 5 * acceptance),
            "steps": 100.0 * n,
        }
        out.append(PodSample(f"{variant}-{i}", f"u{i}/0", variant, pool, t, c, {"active": active, "waiting": 0.0}))
    return Reading(t, tuple(out))


def roundtrip(state: PolicyState) -> PolicyState:
    return PolicyState.model_validate(json.loads(state.model_dump_json()))


def test_first_step_is_baseline_then_measures_and_scales():
    s = spec(autoscaling={"targetQueuePerReplica": 1, "minReplicas": 1, "maxReplicas": 8})
    ev, st = step(s, None, reading(0, 1, 0.6), 0, current_replicas=2)
    assert ev.speculation.measurement.outcome == "Inconclusive" and ev.speculation.reason == "NoData"
    assert ev.scale.replicas == 4  # load gauges are instantaneous: usable from the first reading
    ev, st = step(s, roundtrip(st), reading(30, 2, 0.6), 30, current_replicas=4)
    assert ev.speculation.measurement.outcome == "Successful"
    assert ev.speculation.measurement.acceptance_rate == 0.6 and ev.windows.variants["redrafter"].samples == 60


def test_collapse_switches_and_autoscaler_waits_for_the_new_pool():
    s = spec(autoscaling={"targetQueuePerReplica": 2})  # 2 in flight per pod: within tolerance
    st, t = None, 0.0
    actions = []
    for n in range(1, 6):
        ev, st = step(s, st and roundtrip(st), reading(t, n, 0.6 if n < 3 else 0.05), t, current_replicas=2)
        actions.append(ev.speculation.action)
        t += 30
    assert actions[-1] == "SwitchToBase" and st.speculation.engine == "base"
    assert ev.scale.reason == "NoMetrics" and ev.scale.replicas == 2  # new pool not measured yet


def test_source_failure_keeps_marks_and_is_an_error():
    s = spec()
    _, st = step(s, None, reading(0, 1, 0.6), 0, current_replicas=1)
    ev, st2 = step(s, st, None, 30, current_replicas=1, error="Prometheus: connection refused")
    assert ev.speculation.measurement.outcome == "Error" and "connection refused" in ev.speculation.message
    assert ev.windows is None and st2.window == st.window and st2.speculation.errors == 1
    assert ev.scale.reason == "NoMetrics"


def test_external_autoscaling_never_writes_replicas():
    ev, _ = step(spec(autoscaling={"mode": "External"}), None, reading(0, 1, 0.6, active=50), 0, current_replicas=1)
    assert ev.scale.replicas is None


def test_persisted_state_stays_small():
    s = spec()
    st, t = None, 0.0
    for n in range(1, 200):
        _, st = step(s, st, reading(t, n, 0.6 if (n // 7) % 2 else 0.1, pods=8), t, current_replicas=8)
        t += 30
    assert len(st.model_dump_json()) < 6000


def test_plan_maps_decisions_to_serving_targets():
    s = spec(autoscaling={"targetQueuePerReplica": 1, "maxReplicas": 8}, serving={"rollout": {"keepStandby": True}})
    ev, st = step(s, None, reading(0, 1, 0.6), 0, current_replicas=2)
    plan = ev.plan(s, current_replicas=2)
    assert (plan.active, plan.replicas, plan.canary) == ("redrafter", {"redrafter": 4, "base": 1}, 0)
    t = 0.0
    for n in range(2, 6):  # collapse -> base, with the canary (4 pods, 1 in flight each: no rescale)
        t += 30
        ev, st = step(s, st, reading(t, n, 0.05, active=1.0, pods=4), t, current_replicas=4)
    assert ev.speculation.engine == "base"
    plan = ev.plan(s, current_replicas=4)
    assert (plan.active, plan.replicas, plan.canary) == ("base", {"base": 4, "redrafter": 1}, 1)


def test_plan_without_operator_autoscaling_uses_spec_replicas():
    s = spec(autoscaling={"mode": "External"}, serving={"replicas": 3})
    ev, _ = step(s, None, reading(0, 1, 0.6), 0, current_replicas=5)
    assert ev.plan(s, current_replicas=5).replicas == {"redrafter": 3, "base": 0}
    pinned = spec(speculation={"mode": "Never"})
    ev, _ = step(pinned, None, reading(0, 1, 0.6), 0, current_replicas=1)
    assert ev.plan(pinned, 1).canary == 0 and ev.plan(pinned, 1).active == "base"


def test_the_policy_starts_from_the_replicas_it_asked_for_not_a_lagging_deployment():
    """After a switch the new pool's Deployment still has its standby size for a reconcile or two; an
    evaluation then must keep the size the switch asked for (no 3 -> 1 -> 3 dip)."""
    s = spec(autoscaling={"targetQueuePerReplica": 1, "maxReplicas": 8})
    st, t = None, 0.0
    for n in range(1, 6):  # 3 pods, 1 in flight each: 3 replicas; then acceptance collapses
        ev, st = step(
            s, st and roundtrip(st), reading(t, n, 0.6 if n < 3 else 0.05, active=1.0, pods=3), t, current_replicas=3
        )
        t += 30
    assert ev.speculation.action == "SwitchToBase" and ev.plan(s, 3).replicas["base"] == 3
    # the base Deployment still shows its standby size (0) and base reports no load yet
    ev, st = step(s, roundtrip(st), reading(t, 6, 0.05, active=1.0, pods=3), t, current_replicas=0)
    assert ev.current_replicas == 3 and ev.scale.replicas == 3 and ev.plan(s, 0).replicas["base"] == 3
    # without Operator autoscaling nothing is remembered: the observed replicas are the current ones
    ext = spec(autoscaling={"mode": "External"}, serving={"replicas": 2})
    ev, st = step(ext, None, reading(0, 1, 0.6), 0, current_replicas=2)
    assert st.replicas is None
    ev, _ = step(ext, st, reading(30, 2, 0.6), 30, current_replicas=5)
    assert ev.current_replicas == 5


def test_the_autoscaler_sizes_the_pool_that_takes_the_traffic():
    """While validation holds the Service on base, the policy's engine (ReDrafter) has no traffic: sizing
    from its empty pool would scale down and flap; the serving pool's load decides."""
    s = spec(autoscaling={"targetQueuePerReplica": 1, "maxReplicas": 8})
    on_base = reading(0, 1, 0.6, active=2.0, pods=2, variant="base", pool="base")
    ev, st = step(s, None, on_base, 0, current_replicas=2, serving="base")
    assert ev.speculation.engine == "redrafter" and ev.scale.replicas == 4  # 2 in flight per pod, target 1
    ev, _ = step(s, None, on_base, 0, current_replicas=2)  # measured on the chosen engine's pool: nothing there
    assert ev.scale.reason == "NoMetrics" and ev.scale.replicas == 2


def test_no_scaling_on_the_first_evaluation_after_the_service_moved():
    """Right after the Service moves to the other pool its pods' in-flight gauges still read ~0."""
    s = spec(autoscaling={"targetQueuePerReplica": 1, "maxReplicas": 8})
    busy_base = reading(0, 1, 0.6, active=2.0, pods=3, variant="base", pool="base")
    ev, st = step(s, None, busy_base, 0, current_replicas=3, serving="base")
    assert ev.scale.replicas == 6
    idle_redrafter = reading(30, 2, 0.6, active=0.0, pods=3)
    ev, st = step(s, roundtrip(st), idle_redrafter, 30, current_replicas=6, serving="redrafter")
    assert ev.scale.reason == "NoMetrics" and ev.scale.replicas == 6  # just moved: kept
    ev, st = step(
        s, roundtrip(st), reading(60, 3, 0.6, active=0.0, pods=3), 60, current_replicas=6, serving="redrafter"
    )
    assert ev.scale.reason != "NoMetrics"  # measured from the next evaluation on


def test_the_pool_that_took_the_traffic_is_not_scaled_down_after_the_switch():
    """After the Service moved, the new pool's gauges read ~0 for several evaluations: no 3 -> 1 -> 3 dip.
    The hold lasts the scale-down window from the move; a real drop in load scales down after it."""
    s = spec(autoscaling={"targetQueuePerReplica": 1, "maxReplicas": 8, "scaleDownStabilization": "120s"})
    busy_base = reading(0, 1, 0.6, active=1.0, pods=3, variant="base", pool="base")
    ev, st = step(s, None, busy_base, 0, current_replicas=3, serving="base")
    assert ev.scale.replicas == 3
    t, n = 30, 2
    ev, st = step(s, roundtrip(st), reading(t, n, 0.6, active=0.0, pods=3), t, current_replicas=3, serving="redrafter")
    while t < 30 + 120 - 30:  # the moved evaluation, then near-zero load for the rest of the window
        t, n = t + 30, n + 1
        ev, st = step(
            s, roundtrip(st), reading(t, n, 0.6, active=0.1, pods=3), t, current_replicas=3, serving="redrafter"
        )
        assert ev.scale.replicas == 3 and ev.scale.reason == "SwitchSettling", (t, ev.scale)
    t, n = 30 + 120, n + 1
    ev, st = step(s, roundtrip(st), reading(t, n, 0.6, active=0.1, pods=3), t, current_replicas=3, serving="redrafter")
    assert ev.scale.replicas == 1  # the load really is low: ceil(3 ready x 0.1) after the window


def test_plan_runs_no_canary_after_a_load_fallback_and_a_restart_resumes_it_from_status():
    from redrafter_operator.api.status import ReDrafterDeploymentStatus
    from redrafter_operator.policy import canary_from_status

    S = ReDrafterDeploymentStatus.from_wire

    s = spec(autoscaling={"mode": "Disabled"})
    st, t = None, 0.0
    for n in range(1, 6):  # acceptance fine, 40 in flight per pod: ReDrafter predicted slower
        ev, st = step(s, st and roundtrip(st), reading(t, n, 0.6, active=40.0, pods=2), t, current_replicas=2)
        t += 30
    assert ev.speculation.engine == "base" and st.speculation.fallback_reason == "NoSpeedupAtLoad"
    assert ev.plan(s, 2).canary == 0
    status = {"activeEngine": "base", "policy": json.loads(st.model_dump_json(exclude_none=True))}
    assert canary_from_status(s, S(status)) == 0  # a restarted operator does not start a canary to drop it
    low = st.speculation.model_copy(update={"fallback_reason": "LowAcceptance"})
    assert canary_from_status(s, S({**status, "policy": {**status["policy"], "speculation": low.model_dump()}})) == 1
    assert canary_from_status(s, S({"activeEngine": "base"})) == 1  # no policy state yet: the spec's canary
    assert canary_from_status(s, S({"activeEngine": "redrafter", "policy": status["policy"]})) == 0
