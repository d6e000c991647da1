"""Serving failures on the emulated cluster: the simulated scheduler/kubelet/Deployment controller
(redrafter_sim.controllers with redrafter_sim.failures) make the serving Pods fail; the running operator
names the cause in status.serving.failure, Available/Progressing, Ready/Stalled, the printer columns
(through the pinned kubectl) and exactly one Event, and clears it when the cause goes away."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from test_lifecycle import (  # noqa: F401
    NAME,
    Cluster,
    Operator,
    apply,
    cluster,
    example,
    operator,
    table_rows,
    until,
)

from redrafter_operator.controller.facts import ServingPodFact
from redrafter_operator.render import names
from redrafter_sim.failures import Fault

pytestmark = pytest.mark.timeout(120)

DEPLOYMENT = names.serving_deployment_name(NAME, "redrafter")
FAULTS = {
    "Unschedulable": Fault("Unschedulable"),
    "ErrImagePull": Fault("ErrImagePull"),
    "CrashLoopBackOff": Fault("CrashLoopBackOff", detail="failed to load engine: rank0.engine: unexpected EOF"),
    "OOMKilled": Fault("OOMKilled"),
    "CreateContainerConfigError": Fault("CreateContainerConfigError", detail='secret "hf-token" not found'),
    "FailedCreate": Fault("FailedCreate"),
    "ProgressDeadlineExceeded": None,  # Pods that never get Ready (no other cause) past the deadline
}


def _condition(cluster: Cluster, type_: str) -> dict[str, Any]:
    """The condition, or {} before the operator wrote it (the Jobs exist a moment before the first status)."""
    return next((c for c in cluster.status().get("conditions") or [] if c["type"] == type_), {})


def _failure(cluster: Cluster) -> dict[str, Any]:
    return (cluster.status().get("serving") or {}).get("failure") or {}


@pytest.mark.parametrize("cause", list(FAULTS))
async def test_a_serving_failure_shows_in_status_columns_and_one_event_then_clears(
    cluster: Cluster, operator: Operator, kubectl: Any, cause: str
) -> None:
    fault = FAULTS[cause]
    if fault is None:
        cluster.pods_ready, cluster.deadline_seconds = False, 2.0
    else:
        cluster.faults[DEPLOYMENT] = fault
    apply(kubectl, example(validation__enabled=False))
    await until(lambda: len(cluster.running_jobs()) == 2, what="build Jobs")
    cluster.complete_all()
    await until(lambda: _failure(cluster).get("reason") == cause, what=f"status.serving.failure {cause}")
    seen = time.monotonic()

    failure = _failure(cluster)
    pods = cluster.emu.list_objects(
        "v1", "Pod", "default", label_selector=f"{names.LABEL_COMPONENT}=serving,{names.LABEL_VARIANT}=redrafter"
    )
    if cause in ("FailedCreate", "ProgressDeadlineExceeded"):
        assert "pod" not in failure and failure["deployment"] == DEPLOYMENT
        assert (pods == []) == (cause == "FailedCreate")  # admission rejected every Pod
    else:
        assert failure["pod"] == pods[0]["metadata"]["name"]
    expected = {
        "Unschedulable": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
        "ErrImagePull": "failed to pull and unpack image",
        "CrashLoopBackOff": "rank0.engine: unexpected EOF",
        "OOMKilled": "exit code 137",
        "CreateContainerConfigError": 'secret "hf-token" not found',
        "FailedCreate": "is forbidden: exceeded quota",
        "ProgressDeadlineExceeded": "has timed out progressing",
    }
    assert expected[cause] in failure["message"]
    for type_ in ("Available", "Progressing", "Ready", "Stalled"):
        c = cluster.condition(type_)
        assert c["reason"] == cause and failure["message"] in c["message"], (type_, c)
    assert cluster.condition("Stalled")["status"] == "True" and cluster.condition("Ready")["status"] == "False"
    assert cluster.condition("Progressing")["status"] == ("False" if cause == "ProgressDeadlineExceeded" else "True")

    (row,) = table_rows(kubectl("get", "rdd", NAME, check=True).stdout)
    assert row["REASON"] == cause
    assert failure["message"][:40] in kubectl("get", "rdd", NAME, "-o", "wide", check=True).stdout

    # several resyncs (every 1 s here) and Pod/Deployment status writes later: still one Event
    await asyncio.sleep(max(0.0, seen + 3.5 - time.monotonic()))
    events = [e for e in cluster.events() if e[0] == cause]
    assert len(events) == 1 and events[0][1] == "Warning" and failure["message"] in events[0][2]

    # the cause goes away: the failure clears and the resource is Ready
    cluster.faults.clear()
    cluster.pods_ready, cluster.deadline_seconds = True, None
    await until(lambda: _condition(cluster, "Ready").get("status") == "True", what="Ready after recovery")
    kubectl("wait", f"rdd/{NAME}", "--for=condition=Ready", "--timeout=20s", check=True)
    assert _failure(cluster) == {} and cluster.condition("Stalled")["status"] == "False"
    assert cluster.condition("Available")["reason"] == "MinimumReplicasAvailable"


async def test_the_cause_reaches_status_from_the_pod_event_not_a_resync(
    cluster: Cluster, kubeconfig: Any, kubectl: Any
) -> None:
    op = Operator(kubeconfig, resync=300.0)  # no periodic resync during the test: only watch events drive it
    await op.start()
    try:
        apply(kubectl, example(validation__enabled=False))
        await until(lambda: len(cluster.running_jobs()) == 2, what="build Jobs")
        cluster.complete_all()
        await until(lambda: _condition(cluster, "Ready").get("status") == "True", what="Ready")
        cluster.faults[DEPLOYMENT] = Fault("OOMKilled")
        # a new template makes new Pods (the stand-in controller applies faults to the current template's Pods)
        cluster.emu.patch_object(
            "apps/v1",
            "Deployment",
            DEPLOYMENT,
            "default",
            {"spec": {"template": {"metadata": {"annotations": {"test/rollout": "1"}}}}},
        )

        def oom_pod() -> bool:
            return any(
                ServingPodFact.from_body(p).reason == "OOMKilled"
                for p in cluster.emu.list_objects(
                    "v1", "Pod", "default", label_selector=f"{names.LABEL_COMPONENT}=serving"
                )
            )

        await until(oom_pod, what="an OOMKilled pod")
        written = time.monotonic()
        await until(lambda: _failure(cluster).get("reason") == "OOMKilled", timeout=10, what="the cause in status")
        latency = time.monotonic() - written
        print(f"pod status -> resource status: {latency * 1000:.0f} ms")
        assert latency < 5.0  # far below the 300 s resync: the Pod's watch event drove the reconcile
        assert "exit code 137" in _failure(cluster)["message"]
    finally:
        await op.stop()
