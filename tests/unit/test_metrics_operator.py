"""OperatorMetrics: the per-resource series the dashboard and the alert rules read."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from redrafter_operator.controller.metrics import OperatorMetrics, build_outcomes


def series(m: OperatorMetrics) -> dict[tuple[str, tuple], float]:
    out = {}
    for fam in text_string_to_metric_families(m.render().decode()):
        for s in fam.samples:
            if s.name.startswith("redrafter_operator_") and "namespace" in s.labels:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def of(m: OperatorMetrics, metric: str, **labels: str) -> dict[tuple, float]:
    return {
        k: v for (n, k), v in series(m).items() if n == metric and all(dict(k).get(a) == b for a, b in labels.items())
    }


STATUS = {
    "phase": "Serving",
    "activeEngine": "base",
    "engines": {"redrafter": {"key": "r", "state": "Failed"}, "base": {"key": "b", "state": "Ready"}},
    "serving": {"replicas": 3, "readyReplicas": 2},
    "validation": {"state": "Running"},
}


def test_observe_resource_exports_one_series_per_fact():
    m = OperatorMetrics()
    m.observe_resource("ml", "a", {"speculation": {"mode": "Auto", "minAcceptanceRate": 0.4}}, STATUS)
    assert of(m, "redrafter_operator_active_engine", name="a") == {
        (("engine", "base"), ("name", "a"), ("namespace", "ml")): 1.0
    }
    assert list(of(m, "redrafter_operator_speculation_fallback").values()) == [1.0]
    assert {dict(k)["variant"]: dict(k)["state"] for k in of(m, "redrafter_operator_engine_state")} == {
        "redrafter": "Failed",
        "base": "Ready",
    }
    assert [dict(k)["state"] for k in of(m, "redrafter_operator_validation_state")] == ["Running"]
    assert list(of(m, "redrafter_operator_serving_replicas", engine="base").values()) == [3.0]
    assert list(of(m, "redrafter_operator_serving_ready_replicas", engine="base").values()) == [2.0]
    assert list(of(m, "redrafter_operator_min_acceptance_rate").values()) == [0.4]
    assert [dict(k)["phase"] for k in of(m, "redrafter_operator_resource_phase")] == ["Serving"]


def test_state_changes_replace_the_previous_series():
    m = OperatorMetrics()
    m.observe_resource("ml", "a", {}, STATUS)
    promoted = {
        **STATUS,
        "activeEngine": "redrafter",
        "validation": {"state": "Passed"},
        "engines": {"redrafter": {"key": "r2", "state": "Ready"}, "base": {"key": "b", "state": "Ready"}},
    }
    m.observe_resource("ml", "a", {}, promoted)
    assert [dict(k)["engine"] for k in of(m, "redrafter_operator_active_engine")] == ["redrafter"]
    assert list(of(m, "redrafter_operator_speculation_fallback").values()) == [0.0]
    assert [dict(k)["state"] for k in of(m, "redrafter_operator_validation_state")] == ["Passed"]
    assert {dict(k)["state"] for k in of(m, "redrafter_operator_engine_state")} == {"Ready"}
    assert [dict(k)["engine"] for k in of(m, "redrafter_operator_serving_replicas")] == ["redrafter"]
    assert list(of(m, "redrafter_operator_min_acceptance_rate").values()) == [0.35]  # the API's default


def test_base_by_choice_is_no_fallback_and_unknowns_export_nothing():
    m = OperatorMetrics()
    m.observe_resource("ml", "never", {"speculation": {"mode": "Never"}}, {"phase": "Serving", "activeEngine": "base"})
    assert list(of(m, "redrafter_operator_speculation_fallback").values()) == [0.0]
    m.observe_resource("ml", "new", {}, {"phase": "Pending"})
    assert of(m, "redrafter_operator_active_engine", name="new") == {}
    assert of(m, "redrafter_operator_engine_state", name="new") == {}
    assert of(m, "redrafter_operator_validation_state", name="new") == {}


def test_forget_resource_drops_every_series_of_it():
    m = OperatorMetrics()
    m.observe_resource("ml", "a", {}, STATUS)
    m.observe_resource("ml", "b", {}, STATUS)
    m.switches.labels("ml", "a", "redrafter", "base").inc()
    m.forget_resource("ml", "a")
    left = {dict(k)["name"] for (n, k) in series(m) if not n.startswith("redrafter_operator_engine_switches")}
    assert left == {"b"}  # a counter's history stays: increase() over the past must still see the switch


# ---- counted from status transitions -------------------------------------------------------------
def status(active: str | None = None, **engines: dict[str, Any]) -> dict[str, Any]:
    return {"activeEngine": active, "engines": engines}


def test_build_outcomes_follow_the_engine_states() -> None:
    building = status(redrafter={"state": "Building", "job": "j0", "attempts": 1}, base={"state": "Pending"})
    assert build_outcomes(status(), building) == []  # a start is counted where the Job is created
    retried = status(redrafter={"state": "Building", "job": "j1", "attempts": 2}, base={"state": "Cached"})
    assert build_outcomes(building, retried) == [("redrafter", "failed"), ("base", "cached")]
    ready = status(redrafter={"state": "Ready", "job": "j1", "attempts": 2}, base={"state": "Cached"})
    assert build_outcomes(retried, ready) == [("redrafter", "succeeded")]
    assert build_outcomes(ready, ready) == []  # the same status again counts nothing
    failed = status(redrafter={"state": "Failed", "job": "j1", "attempts": 2})
    assert build_outcomes(retried, failed) == [("redrafter", "failed")]
    assert build_outcomes(failed, {**failed, "phase": "Failed"}) == []


def test_switches_are_counted_from_the_active_engine() -> None:
    m = OperatorMetrics()
    m.on_transition("ns", "llm", status("redrafter"), status("base"))
    m.on_transition("ns", "llm", status("base"), status("base"))
    m.on_transition("ns", "llm", status(None), status("redrafter"))  # the first serving engine is no switch
    text = m.render().decode()
    assert (
        'redrafter_operator_engine_switches_total{from_engine="redrafter",name="llm",namespace="ns",to_engine="base"} 1.0'
        in text
    )
    assert 'to_engine="redrafter"' not in text
