"""Serving failures in status: each cause, as the scheduler/kubelet/Deployment controller write it
(redrafter_sim.failures), read into facts and turned by the pure planner into status.serving.failure,
Available/Progressing, the GitOps conditions and one Event per cause."""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import pytest

from redrafter_operator.api.status import ReDrafterDeploymentStatus
from redrafter_operator.controller.facts import DeploymentFact, Observed, ServingPodFact
from redrafter_operator.controller.planner import plan
from redrafter_operator.render import names
from redrafter_sim.failures import Fault, pod_status, progress_deadline_exceeded, replica_failure

sys.path.insert(0, str(Path(__file__).parent))
from test_controller_planner import LATER, NOW, RENDER, body, cond, job, keys, res_of  # noqa: E402

NAME = "llama3-8b"
IMAGE = "nvcr.io/nvidia/tritonserver:25.09-trtllm-python-py3"


def pod(
    name: str = f"{NAME}-redrafter-7d9f4c8b-x2k4q", variant: str = "redrafter", role: str = "primary"
) -> dict[str, Any]:
    labels = {**names.common_labels(NAME, "serving"), names.LABEL_VARIANT: variant, names.LABEL_ROLE: role}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": "0b6e3c1a-5d2f-4f7e-9a53-2f0c8d1e7b44",
            "labels": labels,
        },
        "spec": {"containers": [{"name": "triton", "image": IMAGE}]},
    }


def failing(fault: Fault, **kw: Any) -> dict[str, Any]:
    p = pod(**kw)
    p["status"] = pod_status(p, fault)
    return p


def deployment(
    variant: str = "redrafter",
    key: str = "",
    *,
    replicas: int = 1,
    ready: int = 0,
    conditions: list[dict[str, Any]] | None = None,
) -> DeploymentFact:
    return DeploymentFact.from_body(
        {
            "metadata": {
                "name": names.serving_deployment_name(NAME, variant),
                "generation": 1,
                "labels": {names.LABEL_VARIANT: variant, names.LABEL_ENGINE_KEY: key},
            },
            "spec": {"replicas": replicas},
            "status": {
                "observedGeneration": 1,
                "replicas": replicas,
                "updatedReplicas": replicas,
                "readyReplicas": ready,
                "conditions": conditions or [],
            },
        }
    )


# -- the facts: what each shape says -----------------------------------------------------------------
@pytest.mark.parametrize(
    "fault,reason,needle",
    [
        (Fault("Unschedulable"), "Unschedulable", "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."),
        (Fault("ErrImagePull"), "ErrImagePull", f'failed to pull and unpack image "{IMAGE}"'),
        (Fault("ImagePullBackOff"), "ImagePullBackOff", f'Back-off pulling image "{IMAGE}"'),
        (
            Fault("CrashLoopBackOff", detail="failed to load engine: rank0.engine is truncated"),
            "CrashLoopBackOff",
            "exited with code 1 (failed to load engine: rank0.engine is truncated), restarted 3 times; back-off 40s "
            f"restarting failed container=triton pod={NAME}-redrafter-7d9f4c8b-x2k4q_default(",
        ),
        (Fault("OOMKilled"), "OOMKilled", "OOMKilled, exit code 137"),
        (
            Fault("CreateContainerConfigError", detail='secret "hf-token" not found'),
            "CreateContainerConfigError",
            'secret "hf-token" not found',
        ),
    ],
)
def test_each_pod_cause_is_read_with_its_message(fault: Fault, reason: str, needle: str) -> None:
    fact = ServingPodFact.from_body(failing(fault))
    assert (fact.reason, fact.ready, fact.variant, fact.owner) == (reason, False, "redrafter", NAME)
    assert needle in fact.message


def test_pods_on_their_normal_way_up_are_not_failures() -> None:
    creating = pod()
    creating["status"] = {
        "phase": "Pending",
        "containerStatuses": [
            {"name": "triton", "ready": False, "restartCount": 0, "state": {"waiting": {"reason": "ContainerCreating"}}}
        ],
    }
    ready_after_oom = pod()  # recovered: Ready now, an OOM kill in its past is history
    ready_after_oom["status"] = {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True"}],
        "containerStatuses": [
            {
                "name": "triton",
                "ready": True,
                "restartCount": 1,
                "state": {"running": {}},
                "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137}},
            }
        ],
    }
    pending = pod()
    pending["status"] = {
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}],
    }
    assert [ServingPodFact.from_body(p).reason for p in (creating, ready_after_oom, pending, pod())] == ["", "", "", ""]


def test_deployment_causes_are_read() -> None:
    quota = deployment(conditions=[replica_failure(f"{NAME}-redrafter-7d9f4c8b-0")])
    assert quota.failure_reason == "FailedCreate" and "exceeded quota: gpu-quota" in quota.failure_message
    late = deployment(conditions=[progress_deadline_exceeded(f"{NAME}-redrafter-7d9f4c8b")])
    assert late.failure_reason == "ProgressDeadlineExceeded"
    assert late.failure_message == f'ReplicaSet "{NAME}-redrafter-7d9f4c8b" has timed out progressing.'
    assert deployment(ready=1).failure_reason == ""


# -- the planner: status, conditions, Events ----------------------------------------------------------
def _observed(doc: dict[str, Any], dep: DeploymentFact, pods: list[dict[str, Any]]) -> Observed:
    return Observed(
        jobs=[job(doc, "redrafter", "Succeeded"), job(doc, "base", "Succeeded")],
        deployments={"redrafter": dep},
        serving_pods=[ServingPodFact.from_body(p) for p in pods],
        service_pool="redrafter",
    )


CASES = {
    "Unschedulable": (Fault("Unschedulable"), None),
    "ErrImagePull": (Fault("ErrImagePull"), None),
    "ImagePullBackOff": (Fault("ImagePullBackOff"), None),
    "CrashLoopBackOff": (Fault("CrashLoopBackOff", detail="failed to load engine"), None),
    "OOMKilled": (Fault("OOMKilled"), None),
    "CreateContainerConfigError": (Fault("CreateContainerConfigError", detail='configmap "extra" not found'), None),
    "FailedCreate": (
        None,
        replica_failure(
            f"{NAME}-redrafter-7d9f4c8b-0", 'violates PodSecurity "restricted:latest": runAsNonRoot != true'
        ),
    ),
    "ProgressDeadlineExceeded": (None, progress_deadline_exceeded(f"{NAME}-redrafter-7d9f4c8b")),
}


@pytest.mark.parametrize("cause", sorted(CASES))
def test_each_cause_shows_in_status_conditions_and_one_event(cause: str) -> None:
    fault, dep_condition = CASES[cause]
    doc = body(validation__enabled=False)
    k = keys(doc)
    pods = [failing(fault)] if fault else []
    observed = _observed(doc, deployment(key=k["redrafter"], conditions=[dep_condition] if dep_condition else []), pods)
    first = plan(res_of(doc), observed, now=NOW, renderers=RENDER)
    st = first.status.wire()
    failure = st["serving"]["failure"]
    assert failure["reason"] == cause and failure["deployment"] == f"{NAME}-redrafter"
    assert failure.get("pod") == (pods[0]["metadata"]["name"] if fault else None)
    assert failure["message"]
    available, progressing = cond(st, "Available"), cond(st, "Progressing")
    assert (
        available["status"] == "False" and available["reason"] == cause and failure["message"] in available["message"]
    )
    assert progressing["reason"] == cause and failure["message"] in progressing["message"]
    assert progressing["status"] == ("False" if cause == "ProgressDeadlineExceeded" else "True")
    assert (cond(st, "Stalled")["status"], cond(st, "Ready")["status"], cond(st, "Reconciling")["status"]) == (
        "True",
        "False",
        "False",
    )
    warnings = [e for e in first.events if e.reason == cause]
    assert len(warnings) == 1 and warnings[0].type == "Warning" and failure["message"] in warnings[0].message
    ReDrafterDeploymentStatus.model_validate(st)
    # the next reconcile with the same cluster state: the same status, no second Event
    again = plan(res_of(doc, st), observed, now=LATER, renderers=RENDER)
    assert again.status.wire() == st and again.events == []


def test_deadline_names_the_pod_behind_it_and_a_new_pod_cause_is_a_new_event() -> None:
    doc = body(validation__enabled=False)
    k = keys(doc)
    late = deployment(key=k["redrafter"], conditions=[progress_deadline_exceeded(f"{NAME}-redrafter-7d9f4c8b")])
    p1 = plan(res_of(doc), _observed(doc, late, [failing(Fault("ImagePullBackOff"))]), now=NOW, renderers=RENDER)
    f1 = p1.status.wire()["serving"]["failure"]
    assert f1["reason"] == "ImagePullBackOff" and "ProgressDeadlineExceeded" in f1["message"]
    assert cond(p1.status.wire(), "Progressing")["status"] == "False"  # the Deployment controller gave up
    p2 = plan(
        res_of(doc, p1.status.wire()),
        _observed(doc, late, [failing(Fault("ErrImagePull"))]),
        now=LATER,
        renderers=RENDER,
    )
    assert [e.reason for e in p2.events] == ["ErrImagePull"]


def test_recovery_clears_the_failure_and_the_resource_becomes_ready() -> None:
    doc = body(validation__enabled=False)
    k = keys(doc)
    broken = plan(
        res_of(doc),
        _observed(doc, deployment(key=k["redrafter"]), [failing(Fault("OOMKilled"))]),
        now=NOW,
        renderers=RENDER,
    ).status.wire()
    healthy = _observed(doc, deployment(key=k["redrafter"], ready=1), [])
    st = plan(res_of(doc, broken), healthy, now=LATER, renderers=RENDER).status.wire()
    st = plan(res_of(doc, st), healthy, now=LATER, renderers=RENDER).status.wire()
    assert "failure" not in st["serving"]
    assert cond(st, "Ready")["status"] == "True" and cond(st, "Stalled")["status"] == "False"


def test_a_canary_or_candidate_pod_failing_is_not_the_serving_cause() -> None:
    doc = body(validation__enabled=False)
    k = keys(doc)
    others = [
        failing(Fault("CrashLoopBackOff"), name=f"{NAME}-canary-1", role="canary"),
        failing(Fault("CrashLoopBackOff"), name=f"{NAME}-candidate-1", role=names.ROLE_CANDIDATE),
    ]
    st = plan(
        res_of(doc), _observed(doc, deployment(key=k["redrafter"]), others), now=NOW, renderers=RENDER
    ).status.wire()
    assert "failure" not in st["serving"] and cond(st, "Progressing")["reason"] == "RollingOut"


def test_the_planner_does_not_mutate_the_observed_facts() -> None:
    doc = body(validation__enabled=False)
    k = keys(doc)
    observed = _observed(doc, deployment(key=k["redrafter"]), [failing(Fault("Unschedulable"))])
    before = copy.deepcopy(observed)
    plan(res_of(doc), observed, now=NOW, renderers=RENDER)
    assert observed == before  # the planner does not mutate its inputs


def test_a_crash_loop_between_two_back_offs_is_still_the_crash_loop() -> None:
    # the kubelet runs the container again after the back-off: running, not Ready, the crash in lastState
    restarted = pod()
    restarted["status"] = {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "False"}],
        "containerStatuses": [
            {
                "name": "triton",
                "ready": False,
                "restartCount": 2,
                "state": {"running": {"startedAt": NOW}},
                "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "message": "engine failed to load"}},
            }
        ],
    }
    fact = ServingPodFact.from_body(restarted)
    assert fact.reason == "CrashLoopBackOff"
    assert fact.message == "container triton exited with code 1 (engine failed to load), restarted 2 times"
    clean_exit = copy.deepcopy(restarted)  # a container that exited 0 and restarted is not a crash
    clean_exit["status"]["containerStatuses"][0]["lastState"]["terminated"]["exitCode"] = 0
    assert ServingPodFact.from_body(clean_exit).reason == ""


def test_a_deployment_reason_outside_the_condition_reason_syntax_is_named_replica_failure() -> None:
    odd = replica_failure(f"{NAME}-redrafter-7d9f4c8b-0") | {"reason": "Failed Create!"}
    doc = body(validation__enabled=False)
    st = plan(
        res_of(doc),
        _observed(doc, deployment(key=keys(doc)["redrafter"], conditions=[odd]), []),
        now=NOW,
        renderers=RENDER,
    ).status.wire()
    assert st["serving"]["failure"]["reason"] == "ReplicaFailure"
    ReDrafterDeploymentStatus.model_validate(st)  # the CRD's reason pattern holds
