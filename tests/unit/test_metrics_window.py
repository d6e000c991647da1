"""Windowed rates: increases, counter resets, pod restarts, new pods, dead pods, JSON state."""

import json

import pytest

from redrafter_operator.metrics import PodError, PodSample, Reading, WindowState, advance


def sample(pod="p1", t=0.0, ident="u1/0", variant="redrafter", pool="redrafter", started=None, load=None, **c):
    counters = {"requests": 0, "output_tokens": 0, "draft_tokens": 0, "accepted_draft_tokens": 0, "steps": 0}
    counters.update(c)
    return PodSample(pod, ident, variant, pool, t, counters, load or {"active": 2, "waiting": 1, "max": 8}, started)


def test_first_reading_is_baseline_only():
    w, st = advance(None, Reading(100.0, (sample(requests=500, draft_tokens=1000, accepted_draft_tokens=600),)))
    agg = w.variants["redrafter"]
    assert agg.missing and agg.samples == 0 and agg.acceptance_rate is None
    assert agg.pods_reporting == 1 and agg.load["active"] == 2  # load gauges are usable immediately
    assert st.pods["p1"].c["requests"] == 500 and st.t == 100.0


def test_increase_between_snapshots_gives_rates():
    _, st = advance(
        None,
        Reading(
            0.0, (sample(t=0, requests=10, output_tokens=100, steps=40, draft_tokens=200, accepted_draft_tokens=100),)
        ),
    )
    w, _ = advance(
        st,
        Reading(
            30.0,
            (sample(t=30, requests=70, output_tokens=1000, steps=340, draft_tokens=1700, accepted_draft_tokens=1000),),
        ),
    )
    agg = w.variants["redrafter"]
    assert agg.samples == 60
    assert agg.acceptance_rate == pytest.approx(900 / 1500)
    assert agg.tokens_per_step == pytest.approx(900 / 300)
    assert agg.tokens_per_second == pytest.approx(900 / 30)
    assert agg.seconds == 30 and not agg.missing and agg.resets == 0


def test_counter_reset_counts_the_new_value_like_prometheus_rate():
    _, st = advance(None, Reading(0.0, (sample(t=0, requests=1000, draft_tokens=5000, accepted_draft_tokens=4000),)))
    w, _ = advance(st, Reading(30.0, (sample(t=30, requests=40, draft_tokens=100, accepted_draft_tokens=10),)))
    agg = w.variants["redrafter"]
    assert agg.resets == 1
    assert agg.samples == 40  # never negative
    assert agg.acceptance_rate == pytest.approx(0.1)


def test_restarted_pod_identity_is_a_reset_even_if_value_grew():
    _, st = advance(
        None, Reading(0.0, (sample(t=0, ident="u1/0", requests=10, draft_tokens=10, accepted_draft_tokens=5),))
    )
    w, _ = advance(
        st, Reading(30.0, (sample(t=30, ident="u1/1", requests=60, draft_tokens=100, accepted_draft_tokens=20),))
    )
    agg = w.variants["redrafter"]
    assert agg.resets == 1 and agg.samples == 60 and agg.acceptance_rate == pytest.approx(0.2)


def test_new_pod_started_in_window_counts_whole_value_old_unknown_pod_is_baseline():
    _, st = advance(None, Reading(0.0, (sample("a", t=0, requests=10),)))
    w, st2 = advance(
        st,
        Reading(
            30.0,
            (
                sample("a", t=30, requests=20),
                sample("b", t=30, ident="ub/0", started=10.0, requests=7),  # scaled up during the window
                sample("c", t=30, ident="uc/0", started=-500.0, requests=900),  # existed before: baseline
            ),
        ),
    )
    agg = w.variants["redrafter"]
    assert agg.samples == 10 + 7
    assert agg.pods_reporting == 3 and agg.pods_with_increase == 2
    assert set(st2.pods) == {"a", "b", "c"}


def test_dead_pod_is_missing_not_zero_and_keeps_its_mark():
    _, st = advance(None, Reading(0.0, (sample("a", t=0, requests=10, draft_tokens=100, accepted_draft_tokens=50),)))
    dead = PodError("a", "redrafter", "redrafter", "timed out")
    w, st2 = advance(st, Reading(30.0, errors=(dead,)))
    agg = w.variants["redrafter"]
    assert agg.missing and agg.pods_failed == 1 and agg.pods_reporting == 0
    assert agg.acceptance_rate is None and agg.active_per_pod is None
    assert st2.pods["a"].t == 0  # last good mark kept
    w3, _ = advance(st2, Reading(60.0, (sample("a", t=60, requests=70, draft_tokens=400, accepted_draft_tokens=200),)))
    agg3 = w3.variants["redrafter"]
    assert agg3.samples == 60 and agg3.acceptance_rate == pytest.approx(0.5)
    assert agg3.tokens_per_second == 0.0  # no output tokens counted, spread over 60 s span


def test_pools_and_variants_are_grouped_separately():
    _, st = advance(
        None,
        Reading(
            0.0,
            (
                sample("base-1", t=0, ident="b1", variant="base", pool="base"),
                sample("canary", t=0, ident="c1", variant="redrafter", pool="base"),
            ),
        ),
    )
    w, _ = advance(
        st,
        Reading(
            30.0,
            (
                sample("base-1", t=30, ident="b1", variant="base", pool="base", requests=100, load={"active": 6}),
                sample(
                    "canary",
                    t=30,
                    ident="c1",
                    variant="redrafter",
                    pool="base",
                    requests=30,
                    draft_tokens=100,
                    accepted_draft_tokens=70,
                    load={"active": 4},
                ),
            ),
        ),
    )
    assert w.variants["redrafter"].samples == 30 and w.variants["base"].samples == 100
    assert w.pools["base"].samples == 130 and w.pools["base"].active_per_pod == 5
    assert "redrafter" not in w.pools


def test_queue_metrics():
    _, st = advance(None, Reading(0.0, (sample(t=0, requests=0, queue_us=0),)))
    w, _ = advance(st, Reading(10.0, (sample(t=10, requests=4, queue_us=2_000_000),)))
    agg = w.variants["redrafter"]
    assert agg.queue_seconds_per_request == pytest.approx(0.5)
    assert agg.queue_per_pod == 3  # active 2 + waiting 1


def test_state_is_small_json_and_round_trips():
    _, st = advance(None, Reading(5.0, (sample("a", t=5, requests=3), sample("b", t=5, ident="x", requests=4))))
    text = st.model_dump_json()
    assert len(text) < 600
    again = WindowState.model_validate(json.loads(text))
    assert again == st


def test_pod_that_left_is_forgotten():
    _, st = advance(None, Reading(0.0, (sample("a", t=0), sample("b", t=0, ident="ub"))))
    w, st2 = advance(st, Reading(30.0, (sample("a", t=30, requests=5),)))
    assert set(st2.pods) == {"a"} and w.variants["redrafter"].pods_failed == 0
    assert w.variants["redrafter"].samples == 5
