"""Operator metrics from status transitions: build outcomes and engine switches, counted once per change."""

from __future__ import annotations

from typing import Any

from redrafter_operator.controller.metrics import OperatorMetrics, build_outcomes


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
