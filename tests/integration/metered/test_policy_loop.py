"""The speculation policy end to end: the real control plane, serving metrics over HTTP, the operator in-process.

Every serving pod the nodes hold serves the metering model's counters on its pod IP (:mod:`harness.metered`); a
traffic loop advances the counters of the Ready pods the stable Service selects (a ReDrafter canary in the base
pool included) with the acceptance the test sets per engine. Spec timings are short (interval 1s,
failureLimit/successLimit 2, minDwell/cooldown 3s). Assertions count evaluations, never wall time (the machine is
shared); the times are printed. The test changes acceptance or the metrics' availability between two
evaluations (``between_evaluations``), never while one scrapes.
"""

from __future__ import annotations

import time

import pytest

from harness.lifecycle import INFERENCE_POOL_CRD, NAME, routed
from harness.metered import MeteredCluster, WatchedOperator, policy_doc
from harness.waiting import until
from redrafter_operator.policy import Evaluation
from redrafter_operator.render import names

pytestmark = pytest.mark.timeout(240)


async def serving_with_measurements(cluster: MeteredCluster) -> None:
    await until(lambda: len(cluster.running_jobs()) == 2, what="build Jobs")
    cluster.complete_all()
    await until(lambda: cluster.status().get("phase") == "Serving", what="phase Serving")
    await until(
        lambda: (
            (cluster.status().get("speculation") or {}).get("samples", 0) > 0
            and cluster.condition("SpeculationHealthy")["status"] == "True"
        ),
        what="a successful measurement in status",
    )


async def past_dwell(cluster: MeteredCluster) -> None:
    """Wait until minDwell/cooldown (3s) no longer hold a switch (policy time is epoch seconds)."""

    def ok() -> bool:
        s = (cluster.status().get("policy") or {}).get("speculation") or {}
        last = max(s.get("since") or 0, s.get("last_switch") or 0)
        return bool(last) and time.time() - last > 3.5

    await until(ok, timeout=30, what="minDwell/cooldown elapsed")


def first_switch(evals: list[Evaluation], action: str) -> tuple[int, Evaluation]:
    for i, e in enumerate(evals):
        if e.speculation.action == action:
            return i, e
    raise AssertionError(f"no {action} in {[e.speculation.action for e in evals]}")


def status_writes(cluster: MeteredCluster, mark: int) -> list[str]:
    return [
        r.body for r in cluster.operator_writes(mark) if r.path.endswith("/status") and "redrafterdeployments" in r.path
    ]


# ---------------------------------------------------------------------------------------------------------
async def test_collapse_falls_back_to_base_and_recovery_returns_across_a_restart(
    cluster: MeteredCluster, operator: WatchedOperator
) -> None:
    # with the InferencePool on (the upstream v1 CRD installed): it follows the fallback and the return
    cluster.install_crd(INFERENCE_POOL_CRD)
    try:
        await collapse_and_recovery(cluster, operator)
    finally:
        cluster.remove_crd(INFERENCE_POOL_CRD)


async def collapse_and_recovery(cluster: MeteredCluster, operator: WatchedOperator) -> None:
    doc = policy_doc()
    doc["spec"]["routing"] = routed()["spec"]["routing"]
    cluster.apply(doc)
    await serving_with_measurements(cluster)
    st = cluster.status()
    assert st["speculation"]["decision"] == "Stay" and st["speculation"]["acceptanceRate"] == pytest.approx(0.8)
    assert st["policy"]["speculation"]["engine"] == "redrafter"  # the state to resume from is in status
    assert cluster.pool() == "redrafter"
    await past_dwell(cluster)

    # ---- acceptance collapses: failureLimit (2) failed measurements => SwitchToBase => Service on base
    t0 = time.monotonic()
    i0 = await operator.between_evaluations(lambda: cluster.acceptance.update(redrafter=0.1))
    await until(lambda: any(e.speculation.switched for e in operator.after(i0)), what="the policy's switch decision")
    t_decided = time.monotonic()
    evals = operator.after(i0)
    i, switch = first_switch(evals, "SwitchToBase")
    assert switch.speculation.reason == "LowAcceptance"
    assert [e.speculation.measurement.outcome for e in evals[: i + 1]].count("Failed") == 2  # failureLimit
    # + at most one window straddling the collapse (pooled across windows to reach minSamples); inconclusive
    # windows (a starved traffic loop on a loaded machine) do not count
    assert len([e for e in evals[: i + 1] if e.speculation.measurement.outcome != "Inconclusive"]) <= 2 + 1
    await until(lambda: cluster.pool() == "base", what="Service on the base pool")
    t_base = time.monotonic()
    print(
        f"\ncollapse -> decision {t_decided - t0:.1f}s, -> Service on base {t_base - t0:.1f}s "
        f"(readiness/rollout {t_base - t_decided:.1f}s)"
    )
    await until(lambda: cluster.status().get("activeEngine") == "base", what="status.activeEngine base")
    st = cluster.status()
    assert [(h["from"], h["to"]) for h in st["history"]] == [("redrafter", "base")]
    assert st["history"][0]["reason"].startswith("LowAcceptance: 2 consecutive failed measurements")
    cond = cluster.condition("SpeculationHealthy")
    assert cond["status"] == "False"
    await until(
        lambda: (
            cluster.deployment("base")["spec"]["replicas"] == 2
            and cluster.deployment("redrafter")["spec"]["replicas"] == 0
        ),
        what="old pool scaled down",
    )
    canary = cluster.find("apps/v1", "Deployment", names.canary_deployment_name(NAME))
    assert canary and canary["spec"]["replicas"] == 1  # recovery stays observable on base
    # `render --active base --canary` prints the fallback's serving children as the operator applied them
    assert not cluster.differing(
        cluster.rendered(doc, active="base", canary=True), {"Deployment", "Service", "ConfigMap", "InferencePool"}
    )
    await until(lambda: {"SwitchToBase", "Switched"} <= {r for r, _, _ in cluster.events()}, what="switch Events")
    event = next(e for e in cluster.events() if e[0] == "SwitchToBase")
    assert event[1] == "Warning" and "LowAcceptance" in event[2]
    assert operator.controller is not None
    m = operator.controller.metrics
    ns = cluster.ns
    assert m.speculation_switches.labels("base", "LowAcceptance")._value.get() == 1
    assert m.switches.labels(ns, NAME, "redrafter", "base")._value.get() == 1
    assert m.active_engine.labels(ns, NAME, "base")._value.get() == 1 and m.fallback.labels(ns, NAME)._value.get() == 1

    # ---- the canary keeps measuring low acceptance on base: no return; an operator restart resumes the state
    await until(
        lambda: (cluster.status().get("speculation") or {}).get("reason", "").startswith("CanaryLowAcceptance"),
        timeout=30,
        what="canary measurements on base",
    )
    await operator.stop()
    before = cluster.status()["policy"]["speculation"]
    await operator.start()
    i1 = len(operator.evaluations)
    await until(lambda: len(operator.after(i1)) >= 3, what="evaluations after restart")
    assert all(e.speculation.engine == "base" for e in operator.after(i1))
    after = cluster.status()["policy"]["speculation"]
    assert after["last_switch"] == before["last_switch"] and after["fallback_reason"] == "LowAcceptance"
    assert cluster.pool() == "base"

    # ---- recovery: canary acceptance high => successLimit (2) successes => back on ReDrafter
    t2 = time.monotonic()
    i2 = await operator.between_evaluations(lambda: cluster.acceptance.update(redrafter=0.8))
    await until(lambda: any(e.speculation.switched for e in operator.after(i2)), what="the recovery decision")
    evals = operator.after(i2)
    i, back = first_switch(evals, "SwitchToRedrafter")
    assert back.speculation.reason == "CanaryRecovered"
    assert [e.speculation.measurement.outcome for e in evals[: i + 1]].count("Successful") >= 2
    await until(lambda: cluster.pool() == "redrafter", what="Service back on ReDrafter")
    print(f"recovery -> Service on ReDrafter {time.monotonic() - t2:.1f}s")
    await until(lambda: cluster.status().get("activeEngine") == "redrafter", what="status.activeEngine redrafter")
    st = cluster.status()
    assert [(h["from"], h["to"]) for h in st["history"]] == [("redrafter", "base"), ("base", "redrafter")]
    assert st["history"][1]["reason"].startswith("CanaryRecovered")
    await until(
        lambda: cluster.get("apps/v1", "Deployment", names.canary_deployment_name(NAME))["spec"]["replicas"] == 0,
        what="canary scaled down",
    )
    await until(
        lambda: any(r == "SwitchToRedrafter" and t == "Normal" for r, t, _ in cluster.events()), what="recovery Event"
    )

    # ---- the Service never selected a pool without Ready pods, at any sample after serving began
    serving = [s for s in cluster.samples if s[1]]
    first = next(i for i, s in enumerate(serving) if s[2] > 0)
    assert all(n >= 1 for _, _, n in serving[first:]), [s for s in serving[first:] if s[2] < 1][:5]
    assert {p for _, p, _ in serving[first:]} == {"redrafter", "base"}
    # ... and neither did the InferencePool, which followed both switches (once the sampler saw the return)
    await until(lambda: cluster.pool_samples[-1][1] == "redrafter", what="a sample of the pool back on ReDrafter")
    pooled = [s for s in cluster.pool_samples if s[1]]
    first = next(i for i, s in enumerate(pooled) if s[2] > 0)
    assert all(n >= 1 for _, _, n in pooled[first:]), [s for s in pooled[first:] if s[2] < 1][:5]
    moves = [b[1] for a, b in zip(pooled[first:], pooled[first + 1 :]) if a[1] != b[1]]
    assert pooled[first][1] == "redrafter" and moves == ["base", "redrafter"], moves
    await until(lambda: cluster.condition("InferencePoolReady")["status"] == "True", what="the pool observed back")


async def test_metric_outage_is_inconclusive_and_never_switches(
    cluster: MeteredCluster, operator: WatchedOperator
) -> None:
    cluster.apply(policy_doc())
    await serving_with_measurements(cluster)
    await past_dwell(cluster)

    def outage() -> None:
        cluster.outage = True
        cluster.acceptance["redrafter"] = 0.05  # collapsed, but nobody can see it

    i0 = await operator.between_evaluations(outage)
    await until(lambda: len(operator.after(i0)) >= 6, what="evaluations during the outage")
    evals = operator.after(i0)
    assert not any(e.speculation.switched for e in evals)
    assert all(e.speculation.measurement.outcome == "Inconclusive" for e in evals)
    assert all(e.speculation.reason == "NoData" for e in evals)
    st = cluster.status()
    assert st["activeEngine"] == "redrafter" and cluster.pool() == "redrafter" and not st.get("history")
    assert st["speculation"]["reason"].startswith("NoData")
    assert st["policy"]["speculation"]["failures"] == 0
    assert cluster.condition("SpeculationHealthy")["status"] == "Unknown"
    # an unchanged inconclusive evaluation writes nothing (timestamps alone do not count): once status shows the
    # outage, further evaluations cost no status write
    mark, i1 = cluster.mark(), len(operator.evaluations)
    await until(lambda: len(operator.after(i1)) >= 4, what="more evaluations during the outage")
    assert status_writes(cluster, mark) == []

    # the outage ends with acceptance back up: measurements resume, still no switch (the first window spans
    # the outage, whose collapsed acceptance the cumulative counters carry: one failed measurement at most)
    def recovered() -> None:
        cluster.acceptance["redrafter"] = 0.8
        cluster.outage = False

    i2 = await operator.between_evaluations(recovered)
    await until(lambda: cluster.condition("SpeculationHealthy")["status"] == "True", what="healthy again")
    assert [e.speculation.measurement.outcome for e in operator.after(i2)].count("Failed") <= 1
    assert cluster.pool() == "redrafter" and not cluster.status().get("history")
