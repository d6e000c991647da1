"""The speculation state machine: every transition and edge, with hand-built observations."""

import json

import pytest

from redrafter_operator.api.spec import ReDrafterDeploymentSpec
from redrafter_operator.metrics.window import Aggregate, Windows
from redrafter_operator.policy import Observation, SpeculationState, due, evaluate, initial_state

MIN = 60.0


def make_spec(**speculation) -> ReDrafterDeploymentSpec:
    base = {
        "interval": "30s",
        "cooldown": "10m",
        "minDwell": "2m",
        "minSamples": 50,
        "failureLimit": 3,
        "successLimit": 3,
        "consecutiveErrorLimit": 2,
    }
    base.update(speculation)
    return ReDrafterDeploymentSpec.model_validate(
        {
            "model": {"base": {"source": "hf://org/base"}, "drafter": {"source": "hf://org/drafter"}},
            "speculation": base,
        }
    )


def agg(requests=100, acceptance=0.6, active=2.0, pods=1, failed=0, with_increase=None, steps=True) -> Aggregate:
    draft = 1000.0
    inc = {"requests": float(requests), "draft_tokens": draft, "accepted_draft_tokens": draft * acceptance}
    if steps:
        inc.update(output_tokens=(1 + acceptance * 5) * 300, steps=300.0)
    return Aggregate(
        seconds=30,
        pods_reporting=pods,
        pods_failed=failed,
        pods_with_increase=pods if with_increase is None else with_increase,
        resets=0,
        increases=inc,
        tokens_per_second=0.0,
        load={"active": active * pods},
    )


def obs_on_redrafter(**kw) -> Observation:
    a = agg(**kw)
    return Observation(Windows(0, {"redrafter": a}, {"redrafter": a}))


def obs_on_base(canary: Aggregate | None, base_active=2.0) -> Observation:
    base = agg(acceptance=0.0, active=base_active, pods=3)
    variants = {"base": base} | ({"redrafter": canary} if canary else {})
    pool = Aggregate(
        30,
        3 + (canary.pods_reporting if canary else 0),
        0,
        3,
        0,
        {},
        0.0,
        {"active": base_active * (3 + (canary.pods_reporting if canary else 0))},
    )
    return Observation(Windows(0, variants, {"base": pool}))


def run(spec, state, observations, start=0.0, step=30.0):
    decisions = []
    t = start
    for o in observations:
        t += step
        d, state = evaluate(spec, state, o, t)
        decisions.append(d)
    return decisions, state, t


def test_initial_state_and_json_round_trip():
    s = initial_state(make_spec(), 5.0)
    assert s.engine == "redrafter" and s.since == 5.0
    assert initial_state(make_spec(mode="Never"), 5.0).engine == "base"
    assert SpeculationState.model_validate(json.loads(s.model_dump_json())) == s


def test_healthy_acceptance_stays():
    spec = make_spec()
    ds, s, _ = run(spec, initial_state(spec, 0), [obs_on_redrafter(acceptance=0.6)] * 5)
    assert all(d.action == "Stay" and d.engine == "redrafter" and d.healthy == "True" for d in ds)
    assert ds[-1].measurement.acceptance_rate == pytest.approx(0.6)
    assert ds[-1].measurement.tokens_per_step == pytest.approx(4.0)
    assert s.successes == 5 and s.failures == 0


def test_collapse_switches_after_failure_limit():
    spec = make_spec(minDwell="30s")
    ds, s, t = run(spec, initial_state(spec, 0), [obs_on_redrafter(acceptance=0.1)] * 3)
    assert [d.action for d in ds] == ["Stay", "Stay", "SwitchToBase"]
    assert ds[-1].reason == "LowAcceptance" and "3 consecutive failed" in ds[-1].message
    assert ds[0].healthy == "False"
    assert s.engine == "base" and s.last_switch == t and s.failures == 0 and s.fallback_reason == "LowAcceptance"


def test_failures_must_be_consecutive():
    spec = make_spec(minDwell="30s")
    seq = (
        [obs_on_redrafter(acceptance=0.1)] * 2
        + [obs_on_redrafter(acceptance=0.6)]
        + [obs_on_redrafter(acceptance=0.1)] * 2
    )
    ds, s, _ = run(spec, initial_state(spec, 0), seq)
    assert all(d.action == "Stay" for d in ds) and s.failures == 2


@pytest.mark.parametrize(
    "observation,reason",
    [
        (obs_on_redrafter(requests=2, acceptance=0.0), "TooFewSamples"),  # 10 windows pool only 20
        (Observation(Windows(0, {}, {})), "NoData"),
        (obs_on_redrafter(acceptance=0.0, with_increase=0), "NoData"),
        (Observation(Windows(0, {"redrafter": agg(pods=0, failed=2)}, {})), "NoData"),
    ],
)
def test_inconclusive_is_never_a_failure_and_keeps_counts(observation, reason):
    spec = make_spec(minDwell="30s")
    ds, s, _ = run(spec, initial_state(spec, 0), [obs_on_redrafter(acceptance=0.1)] * 2 + [observation] * 10)
    assert all(d.action == "Stay" for d in ds) and s.engine == "redrafter"
    assert ds[-1].measurement.outcome == "Inconclusive" and ds[-1].reason == reason
    assert s.failures == 2  # an inconclusive window neither adds nor clears
    d, s = evaluate(spec, s, obs_on_redrafter(acceptance=0.1), 1000)
    assert d.action == "SwitchToBase"


def test_small_windows_are_pooled_until_min_samples_and_consumed():
    """A lone canary finishes few requests per interval: windows are pooled, each counted once."""
    spec = make_spec(minSamples=50, cooldown="1h")
    s = SpeculationState(engine="base", since=0, last_switch=0, fallback_reason="LowAcceptance")
    ds, s, _ = run(spec, s, [obs_on_base(agg(requests=20, acceptance=0.7))] * 9)
    assert [d.measurement.outcome[0] for d in ds] == list("IISIISIIS")
    assert ds[0].reason == "TooFewSamples" and ds[2].measurement.windows == 3 and ds[2].measurement.samples == 60
    assert s.recent == [] and s.successes == 3
    _, s, _ = run(spec, s, [obs_on_base(agg(requests=2, acceptance=0.7))] * 30, start=300)
    assert len(s.recent) == 10  # bounded; 20 requests in 10 windows stay inconclusive


def test_recent_windows_are_dropped_on_switch():
    spec = make_spec(minDwell="30s")
    _, s, _ = run(spec, initial_state(spec, 0), [obs_on_redrafter(acceptance=0.1)] * 3)
    assert s.engine == "base" and s.recent == []


def test_no_draft_tokens_is_inconclusive():
    spec = make_spec()
    a = Aggregate(30, 1, 0, 1, 0, {"requests": 100.0, "draft_tokens": 0.0}, 0.0, {"active": 1})
    d, _ = evaluate(spec, initial_state(spec, 0), Observation(Windows(0, {"redrafter": a}, {"redrafter": a})), 30)
    assert d.measurement.outcome == "Inconclusive" and d.reason == "NoDraftTokens"


def test_metric_errors_never_switch_and_turn_health_unknown_at_limit():
    spec = make_spec(consecutiveErrorLimit=2)
    s = initial_state(spec, 0)
    d, s = evaluate(spec, s, obs_on_redrafter(acceptance=0.6), 30)
    assert d.healthy == "True"
    d, s = evaluate(spec, s, Observation.failed("connection refused"), 60)
    assert d.measurement.outcome == "Error" and d.healthy == "True" and d.reason == "MetricsUnavailable"
    ds, s, _ = run(spec, s, [Observation.failed("boom")] * 20, start=60)
    assert all(x.action == "Stay" for x in ds) and ds[-1].healthy == "Unknown" and s.errors == 21
    d, s = evaluate(spec, s, obs_on_redrafter(acceptance=0.6), 10_000)
    assert s.errors == 0 and d.healthy == "True"


def test_min_dwell_holds_then_switches_when_it_opens():
    spec = make_spec(minDwell="5m")
    ds, s, t = run(spec, initial_state(spec, 0), [obs_on_redrafter(acceptance=0.1)] * 10)
    assert [d.action for d in ds[:9]] == ["Stay", "Stay"] + ["Hold"] * 7
    assert ds[2].reason == "MinDwell" and "wanted base" in ds[2].message
    assert ds[9].action == "SwitchToBase" and t == 300


def test_cooldown_between_switches():
    spec = make_spec(minDwell="30s", cooldown="10m", successLimit=2)
    s = SpeculationState(engine="base", since=0, last_switch=0, fallback_reason="LowAcceptance")
    good = obs_on_base(agg(acceptance=0.7, active=2))
    ds, s, _ = run(spec, s, [good] * 19)
    assert ds[1].action == "Hold" and ds[1].reason == "Cooldown"
    assert all(d.action == "Hold" for d in ds[1:]) and s.engine == "base"
    d, s = evaluate(spec, s, good, 600)
    assert d.action == "SwitchToRedrafter" and d.reason == "CanaryRecovered" and s.engine == "redrafter"


def test_recovery_needs_hysteresis_above_min_acceptance():
    spec = make_spec(minDwell="30s", cooldown="30s", successLimit=2, minAcceptanceRate=0.35, acceptanceHysteresis=0.1)
    s = SpeculationState(engine="base", since=0, last_switch=0, fallback_reason="LowAcceptance")
    ds, s, _ = run(spec, s, [obs_on_base(agg(acceptance=0.40))] * 5)
    assert all(d.action == "Stay" for d in ds) and ds[0].reason == "CanaryLowAcceptance" and ds[0].healthy == "False"
    ds, s, _ = run(spec, s, [obs_on_base(agg(acceptance=0.50))] * 2, start=200)
    assert ds[-1].action == "SwitchToRedrafter"


def test_on_base_without_canary_data_is_inconclusive():
    spec = make_spec()
    s = SpeculationState(engine="base", since=0, last_switch=0, fallback_reason="LowAcceptance")
    d, _ = evaluate(spec, s, obs_on_base(None), 30)
    assert d.measurement.outcome == "Inconclusive" and d.healthy == "False"


def test_load_aware_fallback_and_return_with_margin():
    spec = make_spec(minDwell="30s", cooldown="30s", margin=0.05)
    # acceptance fine (tokens/step 4) but batch 40 per replica: ReDrafter predicted slower
    ds, s, _ = run(spec, initial_state(spec, 0), [obs_on_redrafter(acceptance=0.6, active=40)] * 3)
    assert ds[-1].action == "SwitchToBase" and ds[-1].reason == "NoSpeedupAtLoad"
    assert ds[-1].measurement.predicted_speedup < 0.95
    assert 10 < ds[-1].measurement.crossover < 30
    # still loaded: canary fine, but no speedup -> stay on base
    ds, s, t = run(spec, s, [obs_on_base(agg(acceptance=0.6, active=40), base_active=40)] * 4, start=90)
    assert all(d.action == "Stay" for d in ds) and ds[0].reason == "NoSpeedupAtLoad"
    # load drops: the smoothed batch follows within a few intervals, then successLimit successes
    ds, s, _ = run(spec, s, [obs_on_base(agg(acceptance=0.6, active=2), base_active=2)] * 6, start=t)
    assert [d.action for d in ds if d.switched] == ["SwitchToRedrafter"]


def test_margin_band_holds_both_ways():
    """A speedup inside [1-margin, 1+margin] neither leaves ReDrafter nor returns to it."""
    spec = make_spec(minDwell="30s", cooldown="30s", margin=0.2)
    from redrafter_operator.policy import CostParams, speedup

    p = CostParams.from_spec(spec)
    batch = next(b for b in range(1, 100) if speedup(b, 4.0, p) < 1.0)  # just past the crossover
    assert 0.8 < speedup(batch, 4.0, p) < 1.2
    ds, s, _ = run(spec, initial_state(spec, 0), [obs_on_redrafter(acceptance=0.6, active=batch)] * 6)
    assert all(d.action == "Stay" for d in ds)
    s = SpeculationState(engine="base", since=0, last_switch=0, fallback_reason="NoSpeedupAtLoad")
    ds, s, _ = run(spec, s, [obs_on_base(agg(acceptance=0.6, active=batch), base_active=batch)] * 6)
    assert all(d.action == "Stay" for d in ds) and s.engine == "base"


def test_load_aware_off_ignores_load():
    spec = make_spec(loadAware=False)
    ds, s, _ = run(spec, initial_state(spec, 0), [obs_on_redrafter(acceptance=0.6, active=200)] * 6)
    assert all(d.action == "Stay" for d in ds)


def test_no_canary_load_fallback_recovers_from_last_acceptance():
    spec = make_spec(minDwell="30s", cooldown="30s", canaryReplicas=0)
    ds, s, t = run(spec, initial_state(spec, 0), [obs_on_redrafter(acceptance=0.6, active=40)] * 3)
    assert s.engine == "base" and s.last_tokens_per_step == pytest.approx(4.0)
    ds, s, _ = run(spec, s, [obs_on_base(None, base_active=2)] * 6, start=t)
    assert "LoadDropped" in [d.reason for d in ds] and [d.action for d in ds if d.switched] == ["SwitchToRedrafter"]


def test_no_canary_acceptance_fallback_is_unobservable():
    spec = make_spec(minDwell="30s", cooldown="30s", canaryReplicas=0)
    s = SpeculationState(engine="base", since=0, last_switch=0, fallback_reason="LowAcceptance")
    ds, s, _ = run(spec, s, [obs_on_base(None, base_active=1)] * 10)
    assert all(d.action == "Stay" and d.reason == "RecoveryUnobservable" for d in ds)


def test_target_not_ready_holds():
    spec = make_spec(minDwell="30s")
    o = obs_on_redrafter(acceptance=0.1)
    o = Observation(o.windows, available=frozenset({"redrafter"}))
    ds, s, _ = run(spec, initial_state(spec, 0), [o] * 4)
    assert ds[-1].action == "Hold" and ds[-1].reason == "TargetNotReady" and s.engine == "redrafter"


@pytest.mark.parametrize("mode,engine", [("Always", "redrafter"), ("Never", "base")])
def test_pinned_modes_switch_at_once_and_stay(mode, engine):
    spec = make_spec(mode=mode, cooldown="1h", minDwell="1h")
    other = "base" if engine == "redrafter" else "redrafter"
    s = SpeculationState(engine=other, since=0, last_switch=0)
    d, s = evaluate(spec, s, obs_on_redrafter(acceptance=0.0 if mode == "Always" else 0.9), 1)
    assert d.switched and d.engine == engine and d.reason == "Pinned"
    ds, s, _ = run(spec, s, [obs_on_redrafter(acceptance=0.0), obs_on_redrafter(acceptance=0.9)] * 5, start=1)
    assert all(x.action == "Stay" and x.engine == engine for x in ds)


def test_flapping_acceptance_switches_at_most_once():
    spec = make_spec(minDwell="2m", cooldown="10m")
    seq = [obs_on_redrafter(acceptance=a) for a in [0.1, 0.6, 0.1, 0.1, 0.6, 0.1, 0.1, 0.6] * 10]
    ds, s, _ = run(spec, initial_state(spec, 0), seq)
    assert sum(d.switched for d in ds) == 0


def test_due_respects_interval():
    spec = make_spec(interval="30s")
    s = initial_state(spec, 0)
    assert due(spec, s, 0)
    _, s = evaluate(spec, s, obs_on_redrafter(), 100)
    assert not due(spec, s, 110) and due(spec, s, 130)


def test_decision_status_fields_are_wire_names():
    spec = make_spec()
    d, _ = evaluate(spec, initial_state(spec, 0), obs_on_redrafter(acceptance=0.6, active=3), 30)
    st = d.status("2026-01-01T00:00:30Z").wire()
    assert st["decision"] == "Stay" and st["acceptanceRate"] == 0.6 and st["samples"] == 100
    assert st["predictedSpeedup"] > 1 and "crossoverConcurrency" in st


def test_oscillation_is_flapping_and_switches_at_most_once():
    """Half-periods of 4 intervals: the first triggers a switch; during the cooldown (10m) the
    alternation is seen as flapping, which then holds the engine."""
    spec = make_spec(minDwell="2m", cooldown="10m")
    # at batch 10, acceptance 0.30 / 0.45 predict speedups 0.85 / 1.10: the mean is ~1, no clear winner
    seq = [obs_on_redrafter(acceptance=0.6, active=10)] * 10 + [
        obs_on_redrafter(acceptance=a, active=10) for a in ([0.30] * 4 + [0.45] * 4) * 12
    ]
    s = initial_state(spec, 0)
    switches, t = [], 0.0
    for o in seq:
        t += 30
        if s.engine == "base":  # on base the same acceptance reaches the policy through the canary
            o = obs_on_base(o.windows.variants["redrafter"], base_active=10)
        d, s = evaluate(spec, s, o, t)
        switches += [d.action] if d.switched else []
    assert switches == ["SwitchToBase"]
    assert s.flapping and d.reason == "Flapping" and "changes in the last" in d.message


def test_flapping_moves_once_when_the_mean_clearly_favours_the_other_engine():
    from redrafter_operator.policy.speculation import FLAP_MIN

    spec = make_spec(minDwell="30s", cooldown="30s", margin=0.05)
    s = SpeculationState(engine="base", since=0, last_switch=0, outcomes="SFSFSFSF", flapping=True)
    # canary alternates between failing hysteresis (0.38) and great acceptance (0.9): mean speedup >> 1.2
    seq = [obs_on_base(agg(acceptance=a)) for a in [0.38, 0.9] * FLAP_MIN]
    ds, s, _ = run(spec, s, seq)
    assert [d.action for d in ds if d.switched] == ["SwitchToRedrafter"]
    assert next(d for d in ds if d.switched).reason == "FlappingMean"


def test_collapse_and_recovery_is_not_flapping():
    spec = make_spec(minDwell="30s", cooldown="30s")
    seq = [obs_on_redrafter(acceptance=0.6)] * 10 + [obs_on_redrafter(acceptance=0.05)] * 3
    ds, s, t = run(spec, initial_state(spec, 0), seq)
    ds2, s, _ = run(spec, s, [obs_on_base(agg(acceptance=0.6))] * 3, start=t)
    assert ds[-1].action == "SwitchToBase" and ds2[-1].action == "SwitchToRedrafter" and not s.flapping


def test_load_is_smoothed_so_a_one_interval_burst_is_not_a_failure():
    spec = make_spec(minDwell="30s", cooldown="30s")
    s = initial_state(spec, 0)
    ds, s, t = run(spec, s, [obs_on_redrafter(acceptance=0.6, active=3)] * 3)
    d, s = evaluate(spec, s, obs_on_redrafter(acceptance=0.6, active=30), t + 30)  # one burst sample
    assert d.measurement.outcome == "Successful" and 10 < d.measurement.batch < 20 and s.batch == d.measurement.batch
    ds, s, _ = run(spec, s, [obs_on_redrafter(acceptance=0.6, active=30)] * 3, start=t + 30)  # sustained
    assert ds[-1].action == "SwitchToBase" and ds[-1].reason == "NoSpeedupAtLoad"


def test_flapping_ends_once_the_canary_succeeds_settle_times_in_a_row():
    """A slow load crossing looks like flapping while noise straddles the threshold; once the load has
    clearly moved, FLAP_SETTLE successes in a row, twice any earlier run, end the episode and the engine
    returns (at once: the successLimit is already met). Before, flapping lingered until the 40-outcome
    history had flushed."""
    from redrafter_operator.policy.speculation import FLAP_SETTLE

    spec = make_spec(minDwell="30s", cooldown="30s")
    s = SpeculationState(engine="base", since=0, last_switch=0, outcomes="FFSFFSFSFF", flapping=True)
    good = obs_on_base(agg(acceptance=0.55), base_active=12)  # predicted speedup 1.14: pays, not beyond 1.2
    ds, s, t = run(spec, s, [good] * (FLAP_SETTLE - 1))
    assert all(1.05 < d.measurement.predicted_speedup < 1.2 for d in ds)
    assert not any(d.switched for d in ds) and s.flapping  # still flapping: the mean has not moved it
    ds, s, _ = run(spec, s, [good], start=t)
    assert ds[-1].action == "SwitchToRedrafter" and not s.flapping
    # an oscillation's runs keep their length: 10 successes after runs of 10 are its next half, not a settling
    s = SpeculationState(engine="base", since=0, last_switch=0, outcomes="SSSSSSSSSSFFFFFFFFFF", flapping=True)
    ds, s, t = run(spec, s, [good] * FLAP_SETTLE)
    assert s.flapping and not any(d.switched for d in ds)
    ds, s, _ = run(spec, s, [good] * FLAP_SETTLE, start=t)  # twice the longest run: it settled
    assert not s.flapping and [d.action for d in ds if d.switched] == ["SwitchToRedrafter"]
    # a run of failures does not end flapping: while flapping, the cost model's mean decides a fallback
    s = SpeculationState(engine="redrafter", since=0, last_switch=0, outcomes="SSFSSFSFSS", flapping=True)
    ds, s, _ = run(spec, s, [obs_on_redrafter(acceptance=0.30)] * (FLAP_SETTLE + 2))
    assert s.flapping and not any(d.switched for d in ds)


def test_a_load_caused_fallback_runs_no_canary_and_recovers_from_the_load():
    """The canary would serve at ReDrafter's speed while the load makes ReDrafter the slower engine;
    a load-caused fallback needs no fresh acceptance to return, so none runs (canaryReplicas 1 here)."""
    from redrafter_operator.policy import canary_replicas

    spec = make_spec(minDwell="30s", cooldown="30s")
    assert spec.speculation.canary_replicas == 1
    ds, s, t = run(spec, initial_state(spec, 0), [obs_on_redrafter(acceptance=0.6, active=40)] * 3)
    assert s.engine == "base" and s.fallback_reason == "NoSpeedupAtLoad" and canary_replicas(spec, s) == 0
    ds, s, t = run(spec, s, [obs_on_base(None, base_active=40)] * 3, start=t)  # still loaded: stays
    assert all(d.action == "Stay" and d.reason == "NoSpeedupAtLoad" for d in ds)
    ds, s, _ = run(spec, s, [obs_on_base(None, base_active=2)] * 6, start=t)  # the load falls
    assert "LoadDropped" in [d.reason for d in ds] and [d.action for d in ds if d.switched] == ["SwitchToRedrafter"]
    assert canary_replicas(spec, s) == 0  # on ReDrafter: none


def test_the_canary_runs_when_the_fallback_needs_acceptance_measured():
    from redrafter_operator.policy import canary_replicas

    spec = make_spec(minDwell="30s", cooldown="30s")
    _, s, _ = run(spec, initial_state(spec, 0), [obs_on_redrafter(acceptance=0.05)] * 3)
    assert s.engine == "base" and s.fallback_reason == "LowAcceptance" and canary_replicas(spec, s) == 1
    # a load fallback with load-awareness off cannot happen; without a ReDrafter measurement the load
    # alone cannot judge the return either: the canary runs
    assert canary_replicas(make_spec(loadAware=False), s.model_copy(update={"fallback_reason": "NoSpeedupAtLoad"})) == 1
    assert (
        canary_replicas(spec, s.model_copy(update={"fallback_reason": "NoSpeedupAtLoad", "last_tokens_per_step": None}))
        == 1
    )
    # no speedup at an acceptance below the canary's recovery bar (0.35 + 0.05): the acceptance decides the
    # return, so it must stay measured
    low = s.model_copy(
        update={"fallback_reason": "NoSpeedupAtLoad", "last_acceptance": 0.38, "last_tokens_per_step": 2.9}
    )
    assert canary_replicas(spec, low) == 1
    assert canary_replicas(spec, low.model_copy(update={"last_acceptance": 0.40})) == 0
    assert canary_replicas(make_spec(mode="Never"), s) == 0
