"""Serving failures on the real control plane: the real scheduler leaves a pod Pending, the real ReplicaSet controller
cannot create one past a ResourceQuota, the real Deployment controller times a rollout out, and the node's kubelet
reports the pull, crash, OOM and config causes; the running operator names the cause in status.serving.failure,
Available/Progressing, Ready/Stalled, the printer columns (through the pinned kubectl) and exactly one Event, and
clears it when the cause goes away."""

from __future__ import annotations

import time
from typing import Any

import pytest

from harness.lifecycle import NAME, Cluster, LifecycleOperator, example, table_rows
from harness.waiting import until
from redrafter_operator.api import KIND
from redrafter_operator.controller.facts import ServingPodFact
from redrafter_operator.render import names
from redrafter_sim import nodes
from redrafter_sim.failures import Fault

pytestmark = pytest.mark.timeout(180)

DEPLOYMENT = names.serving_deployment_name(NAME, "redrafter")
SERVING_PODS = f"{names.LABEL_COMPONENT}=serving,{names.LABEL_VARIANT}=redrafter"
#: the kubelet's causes, as the node reports them
KUBELET_FAULTS = {
    "ErrImagePull": Fault("ErrImagePull"),
    "CrashLoopBackOff": Fault("CrashLoopBackOff", detail="failed to load engine: rank0.engine: unexpected EOF"),
    "OOMKilled": Fault("OOMKilled"),
    "CreateContainerConfigError": Fault("CreateContainerConfigError", detail='secret "hf-token" not found'),
}
CAUSES = ["Unschedulable", *KUBELET_FAULTS, "FailedCreate", "ProgressDeadlineExceeded"]
#: serving pods select nodes with 16 GPUs: GPU Feature Discovery labels none of the test's nodes so
BIG_NODE = {"nvidia.com/gpu.count": "16"}
QUOTA = "no-more-gpus"


def _condition(cluster: Cluster, type_: str) -> dict[str, Any]:
    """The condition, or {} before the operator wrote it (the Jobs exist a moment before the first status)."""
    return next((c for c in cluster.status().get("conditions") or [] if c["type"] == type_), {})


def _failure(cluster: Cluster) -> dict[str, Any]:
    return (cluster.status().get("serving") or {}).get("failure") or {}


def _deployment_condition(cluster: Cluster, type_: str) -> dict[str, Any]:
    dep = cluster.find("apps/v1", "Deployment", DEPLOYMENT) or {}
    return next((c for c in (dep.get("status") or {}).get("conditions") or [] if c["type"] == type_), {})


async def _gpu_quota(cluster: Cluster) -> None:
    """A ResourceQuota that admits no GPU pod from now on (the running build pods already hold theirs), once the
    quota controller has counted it (admission refuses every pod while a quota's status is unknown)."""
    cluster.create(
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": QUOTA},
            "spec": {"hard": {"requests.nvidia.com/gpu": "0"}},
        }
    )
    await until(
        lambda: ((cluster.find("v1", "ResourceQuota", QUOTA) or {}).get("status") or {}).get("hard"),
        what="the quota counted",
    )


async def _reconciles(op: LifecycleOperator, more: int) -> None:
    """Wait for ``more`` successful reconciles from now (the operator resyncs every second)."""
    assert op.controller is not None
    metric = op.controller.metrics.reconciles.labels("ok")
    done = metric._value.get()
    await until(lambda: metric._value.get() >= done + more, what=f"{more} more reconciles")


@pytest.mark.parametrize("cause", CAUSES)
async def test_a_serving_failure_shows_in_status_columns_and_one_event_then_clears(
    cluster: Cluster, operator: LifecycleOperator, kubectl: Any, cause: str
) -> None:
    spec: dict[str, Any] = {"validation__enabled": False}
    if cause == "Unschedulable":
        spec["serving__nodeSelector"] = BIG_NODE
    if cause in KUBELET_FAULTS:
        cluster.set_fault(DEPLOYMENT, KUBELET_FAULTS[cause])
    if cause == "ProgressDeadlineExceeded":
        cluster.set_pods_ready(False)
    cluster.apply(example(**spec))
    await until(lambda: len(cluster.running_jobs()) == 2, what="build Jobs")
    if cause == "FailedCreate":
        await _gpu_quota(cluster)
    cluster.complete_all()
    if cause == "ProgressDeadlineExceeded":
        # the deadline the operator renders is startupTimeoutSeconds + 600 s (at least 630 s): an admin shortens
        # it while the operator's writes to the Deployment fail, and the real Deployment controller times the
        # rollout out; the condition stays timed out after the operator puts its deadline back, until the
        # rollout progresses
        await until(lambda: cluster.list("v1", "Pod", SERVING_PODS), what="a serving pod")
        cluster.inject(503, methods=["PATCH", "PUT"], path=f"/deployments/{DEPLOYMENT}$", times=1000)
        cluster.patch("apps/v1", "Deployment", DEPLOYMENT, {"spec": {"progressDeadlineSeconds": 1}})
        await until(
            lambda: _deployment_condition(cluster, "Progressing").get("reason") == cause,
            what="the Deployment controller's progress deadline",
        )
        cluster.proxy.lift_faults()
        await until(
            lambda: cluster.get("apps/v1", "Deployment", DEPLOYMENT)["spec"]["progressDeadlineSeconds"] > 1,
            what="the operator's deadline back",
        )
    await until(lambda: _failure(cluster).get("reason") == cause, what=f"status.serving.failure {cause}")

    failure = _failure(cluster)
    pods = cluster.list("v1", "Pod", SERVING_PODS)
    if cause in ("FailedCreate", "ProgressDeadlineExceeded"):
        assert "pod" not in failure and failure["deployment"] == DEPLOYMENT
        assert (pods == []) == (cause == "FailedCreate")  # admission rejected every Pod
    else:
        assert failure["pod"] == pods[0]["metadata"]["name"]
    expected = {
        "Unschedulable": "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector.",
        "ErrImagePull": "failed to pull and unpack image",
        "CrashLoopBackOff": "rank0.engine: unexpected EOF",
        "OOMKilled": "exit code 137",
        "CreateContainerConfigError": 'secret "hf-token" not found',
        "FailedCreate": f"is forbidden: exceeded quota: {QUOTA}, requested: requests.nvidia.com/gpu=1",
        "ProgressDeadlineExceeded": "has timed out progressing",
    }
    assert expected[cause] in failure["message"], failure
    for type_ in ("Available", "Progressing", "Ready", "Stalled"):
        c = cluster.condition(type_)
        assert c["reason"] == cause and failure["message"] in c["message"], (type_, c)
    assert cluster.condition("Stalled")["status"] == "True" and cluster.condition("Ready")["status"] == "False"
    progressing = "False" if cause == "ProgressDeadlineExceeded" else "True"
    assert cluster.condition("Progressing")["status"] == progressing

    (row,) = table_rows(kubectl("get", "rdd", NAME, check=True).stdout)
    assert row["REASON"] == cause
    assert failure["message"][:40] in kubectl("get", "rdd", NAME, "-o", "wide", check=True).stdout

    # several resyncs (every 1 s here) and Pod/Deployment status writes later: still one Event
    def events() -> list[tuple[str, str, str]]:
        """The operator's Events of this cause on the resource (the ReplicaSet controller writes its own
        FailedCreate Events on the ReplicaSet)."""
        return [
            (e["reason"], e.get("type", ""), e.get("message", ""))
            for e in cluster.list("v1", "Event")
            if e["reason"] == cause and e["involvedObject"]["kind"] == KIND
        ]

    await until(events, what=f"the {cause} Event")
    await _reconciles(operator, 3)
    events = events()
    assert len(events) == 1 and events[0][1] == "Warning" and failure["message"] in events[0][2], events

    # the cause goes away: the failure clears and the resource is Ready
    if cause == "Unschedulable":
        await cluster.add_node("gpu-a100-16", nodes.A100, 16)  # a node the pods select registers
    elif cause == "FailedCreate":
        cluster.delete("v1", "ResourceQuota", QUOTA)
    elif cause == "ProgressDeadlineExceeded":
        cluster.set_pods_ready(True)
    else:
        cluster.set_fault(DEPLOYMENT, None)
    await until(lambda: _condition(cluster, "Ready").get("status") == "True", what="Ready after recovery")
    kubectl("wait", f"rdd/{NAME}", "--for=condition=Ready", "--timeout=20s", check=True)
    assert _failure(cluster) == {} and cluster.condition("Stalled")["status"] == "False"
    assert cluster.condition("Available")["reason"] == "MinimumReplicasAvailable"


async def test_the_cause_reaches_status_from_the_pod_event_not_a_resync(cluster: Cluster, kubectl: Any) -> None:
    op = cluster.operator(resync=300.0)  # no periodic resync during the test: only watch events drive it
    await op.start()
    try:
        cluster.apply(example(validation__enabled=False))
        await until(lambda: len(cluster.running_jobs()) == 2, what="build Jobs")
        cluster.complete_all()
        await until(lambda: _condition(cluster, "Ready").get("status") == "True", what="Ready")
        cluster.set_fault(DEPLOYMENT, Fault("OOMKilled"))  # the running pod's container is OOM-killed

        def oom_pod() -> bool:
            return any(
                ServingPodFact.from_body(p).reason == "OOMKilled" for p in cluster.list("v1", "Pod", SERVING_PODS)
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
