"""The operator's lifecycle on the real control plane, as a user sees it through kubectl.

The operator runs in-process (kopf in a task of the test's loop) under the chart's identity, through a proxy that
logs what it sends and injects faults; Kubernetes' own controllers run the Jobs, Deployments and pods on simulated
GPU nodes whose pods run nothing: the tests finish build Jobs explicitly (complete or fail, with a termination
message) and the real Job controller applies backoffLimit and podFailurePolicy (:mod:`harness.lifecycle`).
"""

from __future__ import annotations

import contextlib
import copy
import json
import urllib.error
from collections.abc import Iterator
from typing import Any

import pytest

from harness.lifecycle import (
    BUILT,
    INFERENCE_POOL_API,
    INFERENCE_POOL_CRD,
    NAME,
    Cluster,
    LifecycleOperator,
    example,
    quiesce,
    routed,
    running_operator,
    settle,
    table_rows,
    to_serving,
)
from harness.waiting import until
from redrafter_operator.api import API_VERSION, KIND
from redrafter_operator.controller.plan_types import ServingTargets
from redrafter_operator.render import names
from redrafter_sim.chartrbac import chart_rbac

pytestmark = pytest.mark.timeout(180)

INFERENCE_POOL_CRD_NAME = "inferencepools.inference.networking.k8s.io"


def crd_served(cluster: Cluster) -> bool:
    """Whether the InferencePool CRD exists (Terminating counts: its API may still be served)."""
    try:
        cluster.cp.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{INFERENCE_POOL_CRD_NAME}")
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return False
        raise
    return True


async def without_inference_pool_crd(cluster: Cluster) -> None:
    """The CRD deleted and gone: it is cluster-wide, so an earlier test's (or run's) must not leak into this one."""
    cluster.remove_crd(INFERENCE_POOL_CRD)
    await until(lambda: not crd_served(cluster), what="the InferencePool CRD gone")


@contextlib.asynccontextmanager
async def inference_pool_crd(cluster: Cluster) -> Any:
    """The upstream InferencePool CRD installed for the block, and deleted after it whatever happens."""
    await without_inference_pool_crd(cluster)
    try:
        cluster.install_crd(INFERENCE_POOL_CRD)
        yield
    finally:
        await without_inference_pool_crd(cluster)


@contextlib.contextmanager
def refused(code: int) -> Iterator[list[str]]:
    """Expect the admin request in the block to be refused with ``code``; the list receives the Status body."""
    body: list[str] = []
    with pytest.raises(urllib.error.HTTPError) as info:
        yield body
    assert info.value.code == code
    body.append(info.value.read().decode())


# ---------------------------------------------------------------------------------------------------------
async def test_apply_to_serving_with_conditions_events_and_printer_columns(
    cluster: Cluster, operator: LifecycleOperator, kubectl: Any
) -> None:
    bare = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bare"}}
    with refused(403) as status:  # the namespace enforces the restricted profile
        cluster.create({**bare, "spec": {"containers": [{"name": "app", "image": "busybox:1.36"}]}})
    assert 'violates PodSecurity "restricted:latest"' in json.loads(status[0])["message"]
    doc = example()  # examples/llama3-8b.yaml, in the test's namespace
    cluster.apply(doc)
    await until(lambda: len(cluster.jobs()) == 2, what="two build Jobs")
    await until(lambda: cluster.status().get("phase") == "Building", what="Building")
    assert {j["metadata"]["labels"][names.LABEL_VARIANT] for j in cluster.jobs()} == {"redrafter", "base"}
    assert cluster.deployment("redrafter") is None  # nothing to serve before the engine exists
    assert cluster.condition("EnginesReady")["reason"] == "Building"

    # ReDrafter engine done => serving starts without waiting for the base engine
    redrafter_job = next(j for j in cluster.running_jobs() if "redrafter" in j)
    cluster.complete_job(redrafter_job, BUILT.message("OK: engine built"))
    await until(lambda: cluster.status().get("phase") == "Serving", what="Serving before base is built")
    assert cluster.condition("EnginesReady")["status"] == "False"
    cluster.complete_all()
    await until(lambda: cluster.condition("EnginesReady")["status"] == "True", what="EnginesReady")
    # spec.validation is on by default and nothing here completes the validation Job: the rollout is not
    # complete until the (ReDrafter, base) pair is validated (metered/test_validation_gate.py plays the Job)
    await until(lambda: cluster.condition("Progressing")["reason"] == "Validating", what="Progressing Validating")
    # the build Pod's termination message (size, build time) may reach the watch after its Job's Complete
    await until(
        lambda: all("sizeBytes" in cluster.status()["engines"][v] for v in ("redrafter", "base")),
        what="both engines' sizes from their build Pods",
    )

    kubectl("wait", f"rdd/{NAME}", "--for=jsonpath={.status.phase}=Serving", "--timeout=20s", check=True)
    kubectl("wait", f"rdd/{NAME}", "--for=condition=Available", "--timeout=20s", check=True)
    st = cluster.status()
    assert st["activeEngine"] == "redrafter" and st["observedGeneration"] == 1
    assert st["serving"]["readyReplicas"] == 1 and st["serving"]["replicas"] == 1
    conditions = {c["type"]: c for c in st["conditions"]}
    lifecycle = {
        "SpecValid": "True",
        "EnginesReady": "True",
        "Available": "True",
        "Progressing": "True",
        "SpeculationHealthy": "Unknown",
    }
    assert {t: conditions[t]["status"] for t in lifecycle} == lifecycle  # (other components may add more)
    assert all(conditions[t]["observedGeneration"] == 1 and conditions[t]["lastTransitionTime"] for t in lifecycle)
    for variant in ("redrafter", "base"):
        assert st["engines"][variant]["state"] == "Ready" and st["engines"][variant]["attempts"] == 1
        assert (st["engines"][variant]["sizeBytes"], st["engines"][variant]["builtAt"]) == (
            BUILT.size_bytes,
            BUILT.built_at,
        )
    svc = cluster.get("v1", "Service", NAME)
    assert svc["spec"]["selector"][names.LABEL_TRAFFIC] == "redrafter"
    assert svc["metadata"]["ownerReferences"][0]["kind"] == KIND
    # spec.validation is on by default: the base engine stays at one replica until the (ReDrafter, base)
    # pair is validated (nothing runs the validation Job here, so it is still pending)
    await until(lambda: cluster.deployment("base")["spec"]["replicas"] == 1, what="base kept up for validation")
    assert conditions.get("Validated", {}).get("status") != "True"
    await until(
        lambda: {"BuildStarted", "EngineReady", "PhaseBuilding", "PhaseServing"} <= {r for r, _, _ in cluster.events()},
        what="transition Events",
    )
    # the scale subresource's selector picks the active pods (the ReplicaSet's pod may still be deleting a
    # predecessor: count the ones not being deleted)
    pods = cluster.list("v1", "Pod", st["serving"]["selector"])
    assert len([p for p in pods if not p["metadata"].get("deletionTimestamp")]) == 1

    (row,) = table_rows(kubectl("get", "rdd", check=True).stdout)
    assert list(row)[:5] == ["NAME", "PHASE", "ENGINE", "DRAFTER", "READY"]
    assert row["DRAFTER"] == ""  # a drafter from a source: nothing trains
    assert [row[c] for c in ("NAME", "PHASE", "ENGINE", "READY")] == [NAME, "Serving", "redrafter", "1"]

    # re-applying the same spec, and idling through several resync intervals => zero writes
    await settle(cluster)
    mark = cluster.mark()
    cluster.apply(doc)
    await quiesce(cluster, operator)
    assert cluster.operator_writes(mark) == []
    assert operator.controller is not None and operator.controller.metrics.reconciles.labels("ok")._value.get() > 3


async def test_invalid_spec_is_reported_not_raised(cluster: Cluster, operator: LifecycleOperator) -> None:
    # accepted by the CRD schema, rejected by the operator's cross-field validation
    cluster.apply(example(metrics={"source": "Prometheus"}))
    await until(lambda: cluster.status().get("phase") == "Failed", what="Failed")
    cond = cluster.condition("SpecValid")
    assert cond["status"] == "False" and cond["reason"] == "InvalidSpec"
    assert cond["message"] == "spec.metrics: prometheusUrl is required when source is Prometheus"
    assert cluster.jobs() == []
    await until(lambda: ("InvalidSpec", "Warning", cond["message"]) in cluster.events(), what="InvalidSpec Event")
    # fixing the spec recovers
    cluster.apply(example(metrics={"source": "Pods"}))
    await until(lambda: len(cluster.jobs()) == 2, what="Jobs after the fix")
    await until(lambda: cluster.condition("SpecValid")["status"] == "True", what="SpecValid again")
    await until(lambda: any(r == "SpecValid" for r, _, _ in cluster.events()), what="SpecValid Event")


async def test_a_gpu_no_node_offers_waits_pending_until_such_a_node_registers(cluster: Cluster) -> None:
    # no resync to speak of: only the Node watch can wake the resource when the node comes
    async with running_operator(cluster, resync=300.0) as op:
        cluster.apply(example(engine__build__gpuProduct="NVIDIA-B200", parallelism__tensor=2))
        await until(lambda: cluster.status().get("engines"), what="first status")
        cond = await until(
            lambda: next((c for c in cluster.status().get("conditions", []) if c["type"] == "Schedulable"), None),
            what="Schedulable",
        )
        missing = (
            "no node offers 2× NVIDIA-B200; nodes: 1× NVIDIA-A100-SXM4-80GB (8 each), 1× NVIDIA-H100-80GB-HBM3 (8 each)"
        )
        assert (cond["status"], cond["reason"]) == ("False", "NoMatchingGPUNodes")
        assert cond["message"] == f"redrafter engine, base engine: {missing}"
        assert cluster.status()["phase"] == "Pending"
        assert cluster.jobs() == [] and cluster.list("v1", "Pod") == []
        await until(lambda: any(r == "NoMatchingGPUNodes" for r, _, _ in cluster.events()), what="Warning Event")
        # a node change that changes nothing placement reads (the nodes' own heartbeats meanwhile, and an
        # annotation here) wakes nothing; one Warning only
        await quiesce(cluster, op)
        cluster.patch("v1", "Node", "gpu-a100-0", {"metadata": {"annotations": {"beat": "1"}}})
        await quiesce(cluster, op)
        assert [(r, t) for r, t, _ in cluster.events() if r == "NoMatchingGPUNodes"] == [
            ("NoMatchingGPUNodes", "Warning")
        ]
        assert cluster.jobs() == []

        await cluster.add_node("b200-0", "NVIDIA-B200", 8)
        await until(lambda: len(cluster.jobs()) == 2, what="build Jobs once a B200 node registered")
        assert all(
            j["spec"]["template"]["spec"]["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-B200"
            for j in cluster.jobs()
        )
        await until(lambda: cluster.condition("Schedulable")["status"] == "True", what="Schedulable True")
        assert cluster.condition("Schedulable")["message"].endswith("1 node(s) offer 2× NVIDIA-B200: b200-0")
        await until(lambda: cluster.status().get("phase") == "Building", what="phase Building")
        await until(lambda: any(r == "GPUNodesFound" for r, _, _ in cluster.events()), what="Normal Event")


async def test_an_operator_that_may_not_list_nodes_runs_without_the_gpu_node_check(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    # the chart with gpuNodeCheck: false grants no ClusterRole on nodes: take the binding away, as the admin
    rbac, account = chart_rbac(f"rdo-{cluster.ns}", cluster.ns, [cluster.ns])
    (binding,) = [o for o in rbac if o["kind"] == "ClusterRoleBinding" and o["metadata"]["name"].endswith("-nodes")]
    cluster.delete("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", binding["metadata"]["name"])
    user = f"system:serviceaccount:{cluster.ns}:{account}"
    await until(
        lambda: cluster.kubectl("auth", "can-i", "list", "nodes", f"--as={user}").stdout.strip() == "no",
        what="the operator's identity may not list nodes",
    )
    async with running_operator(cluster, resync=300.0) as op:
        assert op.controller is not None and "rdd_nodes" not in op.controller.indexes
        assert (
            f'GPU node check off: this operator may not list nodes (403: nodes is forbidden: User "{user}" cannot '
            'list resource "nodes"' in caplog.text
        )
        cluster.apply(example(engine__build__gpuProduct="NVIDIA-B200"))
        await until(lambda: len(cluster.jobs()) == 2, what="build Jobs, unchecked")
        assert "Schedulable" not in {c["type"] for c in cluster.status().get("conditions", [])}


async def test_restart_at_each_stage_resumes_without_duplicate_jobs(cluster: Cluster) -> None:
    op = cluster.operator()
    await op.start()
    try:
        # validation off: nothing here plays the validation Job, and a rollout waiting on it is not Complete
        cluster.create(example(validation__enabled=False))
        await until(lambda: len(cluster.jobs()) == 2 and cluster.status().get("phase") == "Building", what="Jobs")
        jobs = cluster.job_names()
        # 1. killed while building: restart => same Jobs, nothing recreated
        await op.stop()
        await op.start()
        await quiesce(cluster, op)
        assert cluster.job_names() == jobs
        # 2. killed; Jobs finish while it is down => resumes to Serving
        await op.stop()
        cluster.complete_all()
        await until(lambda: cluster.running_jobs() == [], what="the Job controller finished both Jobs")
        await op.start()
        await until(lambda: cluster.status().get("phase") == "Serving", what="Serving after restart")
        # 3. killed while serving; restarted => nothing changes, same Jobs: the new process compares each
        # child it serves with the fields its field manager owns there, and sends nothing (once the speculation
        # policy evaluated: its first evaluation writes status, and a process stopped before it leaves it to the next)
        await until(lambda: cluster.status().get("speculation"), what="the policy's first evaluation")
        await settle(cluster)
        await op.stop()
        versions = cluster.versions()  # every object of the kinds the operator writes
        mark = cluster.mark()
        await op.start()
        await quiesce(cluster, op)
        assert cluster.operator_writes(mark) == []
        assert cluster.versions() == versions
        mark = cluster.mark()
        await quiesce(cluster, op)
        assert cluster.operator_writes(mark) == []
        assert cluster.job_names() == jobs
        # 4. killed in the middle of a spec change (new build started) => continues it
        patched = cluster.patch(API_VERSION, KIND, NAME, {"spec": {"redrafter": {"numBeams": 4}}})
        assert patched["metadata"]["generation"] == 2
        await until(lambda: len(cluster.jobs()) == 3, what="the new redrafter Job")
        await op.stop()
        await op.start()
        await quiesce(cluster, op)
        assert len(cluster.jobs()) == 3
        cluster.complete_all()
        await until(
            lambda: (
                cluster.status().get("observedGeneration") == 2
                and cluster.condition("Progressing")["reason"] == "Complete"
            ),
            what="new engine served",
        )
    finally:
        await op.stop()


async def test_conflicts_server_errors_and_dropped_watches_still_converge(cluster: Cluster) -> None:
    cluster.inject(
        409,
        methods=["PATCH"],
        path=r"/redrafterdeployments/.*/status$",
        times=3,
        message="the object has been modified",
    )
    cluster.inject(500, methods=["POST"], path=r"/jobs$", times=2)
    cluster.inject(503, methods=["PATCH"], path=r"/deployments/[^/]+$", times=2)  # (applied: server-side apply)
    cluster.inject(500, methods=["PATCH"], path=r"/services/", times=1)
    async with running_operator(cluster) as op:
        assert op.controller is not None
        # (validation off: nothing here runs its Job, and the pair built at once would serve base until validated)
        cluster.create(example(autoscaling__mode="Disabled", validation__enabled=False))
        await until(lambda: len(cluster.jobs()) == 2, what="Jobs despite 500s")
        assert cluster.cut_watches(reset=True) > 0
        cluster.complete_all()
        await until(lambda: cluster.status().get("phase") == "Serving", what="Serving despite faults")
        cluster.cut_watches()
        # a spec change after the watches were dropped is still seen
        cluster.patch(API_VERSION, KIND, NAME, {"spec": {"serving": {"replicas": 2}}})
        await until(
            lambda: (cluster.deployment("redrafter") or {}).get("spec", {}).get("replicas") == 2,
            what="scale after reconnect",
        )
        await until(lambda: cluster.status()["serving"]["readyReplicas"] == 2, what="2 Ready")
        assert len(cluster.jobs()) == 2
        # every fault was served to the operator, and it retried past each
        injected = [(r.method, r.status) for r in cluster.operator_requests() if r.injected]
        assert sorted(injected) == sorted(
            [("PATCH", 409)] * 3 + [("POST", 500)] * 2 + [("PATCH", 503)] * 2 + [("PATCH", 500)]
        )


async def building_redrafter_after_base(cluster: Cluster, retries: int, **spec: Any) -> str:
    """Apply the example with ``retries``; complete the base build; the running ReDrafter build Job's name."""
    cluster.apply(example(engine__build__retries=retries, **spec))
    await until(lambda: len(cluster.running_jobs()) == 2, what="Jobs")
    base_job = next(j for j in cluster.running_jobs() if "-base-" in j)
    cluster.complete_job(base_job, BUILT.message("OK: engine built"))
    await until(lambda: len(cluster.running_jobs()) == 1, what="the base Job Complete")
    return next(j for j in cluster.running_jobs() if "redrafter" in j)


def failure_reason(cluster: Cluster, job: str) -> str | None:
    """The reason the Job controller gave the Job's Failed condition (None while it has not failed)."""
    conditions = (cluster.get("batch/v1", "Job", job).get("status") or {}).get("conditions") or []
    return next((c["reason"] for c in conditions if c["type"] == "Failed" and c["status"] == "True"), None)


async def test_failed_job_reason_bounded_retries_then_retry_annotation(
    cluster: Cluster, operator: LifecycleOperator
) -> None:
    # one pod per Job (backoffLimit 0): the operator's retries are under test, not the Job controller's pod
    # retries (whose 10 s back-off would only slow the test down)
    first = await building_redrafter_after_base(cluster, retries=1, engine__build__backoffLimit=0)
    cluster.fail_job(first, exit_code=3, message="BuildError: trtllm-build exited 1: CUDA out of memory")
    await until(lambda: failure_reason(cluster, first), what="the first Job Failed")
    assert failure_reason(cluster, first) == "BackoffLimitExceeded"
    await until(lambda: cluster.running_jobs() not in ([], [first]), what="retry Job")
    (retry,) = cluster.running_jobs()
    assert retry == first + "-1"  # same name with the attempt suffix
    await until(lambda: cluster.condition("EnginesReady")["reason"] == "BuildRetrying", what="BuildRetrying")
    message = cluster.status()["engines"]["redrafter"]["message"]
    assert "BackoffLimitExceeded" in message and "CUDA out of memory" in message
    cluster.fail_job(retry, message="FetchError: hf://meta-llama/Meta-Llama-3-8B-Instruct: 401 Unauthorized")
    await until(lambda: cluster.status().get("phase") == "Failed", what="Failed")
    assert failure_reason(cluster, retry) == "BackoffLimitExceeded"  # the Job controller's verdict, as reported
    st = cluster.status()
    engine = st["engines"]["redrafter"]
    assert engine["state"] == "Failed" and engine["attempts"] == 2 and engine["job"] == retry
    assert "BackoffLimitExceeded" in engine["message"] and "401 Unauthorized" in engine["message"]
    assert "CUDA out of memory" not in engine["message"]  # the last attempt's, not the first's
    cond = cluster.condition("EnginesReady")
    assert cond["status"] == "False" and cond["reason"] == "BuildFailed" and "401 Unauthorized" in cond["message"]
    assert cluster.condition("Available")["reason"] == "EngineFailed"
    await until(
        lambda: (
            sum(1 for r, t, m in cluster.events() if r == "BuildFailed" and t == "Warning") == 2
            and any(r == "RetriesExhausted" for r, _, _ in cluster.events())
        ),
        what="failure Events",
    )
    assert any("401 Unauthorized" in m for r, _, m in cluster.events() if r == "BuildFailed")
    # no rebuild loop
    await settle(cluster)
    mark = cluster.mark()
    await quiesce(cluster, operator)
    assert cluster.operator_writes(mark) == [] and len(cluster.jobs()) == 3
    # the user retries with the annotation (any new value)
    cluster.kubectl("annotate", f"rdd/{NAME}", f"{names.ANNOTATION_RETRY_BUILD}=try-2", check=True)
    await until(lambda: len(cluster.running_jobs()) == 1, what="Job after the retry annotation")
    assert cluster.running_jobs()[0] == first + "-2"
    cluster.complete_all()
    await until(lambda: cluster.status().get("phase") == "Serving", what="Serving after retry")
    assert cluster.status()["engines"]["redrafter"]["state"] == "Ready"


async def test_bad_input_build_ends_after_one_job_and_status_says_how_to_retry(
    cluster: Cluster, operator: LifecycleOperator
) -> None:
    first = await building_redrafter_after_base(cluster, retries=2)
    # the Job controller applies the rendered podFailurePolicy: exit code 2 is FailJob (though backoffLimit is 1)
    cluster.fail_job(first, exit_code=2, message="BAD_INPUT: drafter config.json lacks exit_dim")
    await until(lambda: failure_reason(cluster, first), what="the Job Failed")
    assert failure_reason(cluster, first) == "PodFailurePolicy"
    await until(lambda: cluster.status().get("phase") == "Failed", what="Failed")
    engine = cluster.status()["engines"]["redrafter"]
    assert engine["state"] == "Failed" and engine["attempts"] == 1 and engine["exitCode"] == 2
    assert engine["message"].startswith("exit code 2 (BAD_INPUT) cannot succeed on retry")
    assert f"kubectl annotate rdd {NAME} {names.ANNOTATION_RETRY_BUILD}=<new value> --overwrite" in engine["message"]
    assert "drafter config.json lacks exit_dim" in engine["message"]
    await until(
        lambda: any(r == "BuildNotRetried" and "exit code 2 (BAD_INPUT)" in m for r, _, m in cluster.events()),
        what="BuildNotRetried Event",
    )
    assert not any(r == "RetriesExhausted" for r, _, _ in cluster.events())
    # one Job, one pod, and no retry however long we wait
    await settle(cluster)
    mark = cluster.mark()
    await quiesce(cluster, operator)
    assert cluster.operator_writes(mark) == []
    redrafter_jobs = [j for j in cluster.jobs() if "-redrafter-" in j["metadata"]["name"]]
    assert [j["metadata"]["name"] for j in redrafter_jobs] == [first]
    assert len(cluster.list("v1", "Pod", f"job-name={first}")) == 1


async def test_build_input_change_rolls_to_new_engine_without_gap_and_serving_change_never_rebuilds(
    cluster: Cluster, operator: LifecycleOperator
) -> None:
    # replicas from the spec, not the autoscaler; validation off (tests/integration/metered/test_validation_gate.py
    # covers an engine change under validation: there the promoted engine serves until the new one passes)
    doc = example(autoscaling__mode="Disabled", validation__enabled=False)
    cluster.apply(doc)
    await to_serving(cluster)
    old_key = cluster.status()["engines"]["redrafter"]["key"]
    base_key = cluster.status()["engines"]["base"]["key"]
    await until(lambda: cluster.samples and cluster.samples[-1][2] >= 1, what="the Service on a Ready pod")
    served_from = len(cluster.samples)

    changed = copy.deepcopy(doc)
    changed["spec"]["redrafter"]["numBeams"] = 4
    cluster.apply(changed)
    await until(lambda: len(cluster.jobs()) == 3, what="one new Job (redrafter only: base inputs unchanged)")
    await until(lambda: cluster.status().get("observedGeneration") == 2, what="generation 2 observed")
    st = cluster.status()
    assert st["engines"]["redrafter"]["state"] == "Building" and st["engines"]["base"]["key"] == base_key
    assert st["phase"] == "Serving"  # still serving the previous engine meanwhile
    assert cluster.deployment("redrafter")["metadata"]["labels"][names.LABEL_ENGINE_KEY] == old_key
    cluster.complete_all()
    new_key = st["engines"]["redrafter"]["key"]
    await until(
        lambda: cluster.deployment("redrafter")["metadata"]["labels"][names.LABEL_ENGINE_KEY] == new_key,
        what="Deployment on the new engine",
    )
    await until(lambda: cluster.condition("Progressing")["reason"] == "Complete", what="rollout complete")
    assert cluster.status()["phase"] == "Serving"
    gaps = [s for s in cluster.samples[served_from:] if s[2] == 0]
    assert gaps == [], "the Service lost its Ready pods during the engine change"

    # serving-only change: Triton parameter + replicas => Deployments patched, no Job
    jobs = cluster.job_names()
    serving_change = copy.deepcopy(changed)
    serving_change["spec"]["serving"]["triton"] = {"maxQueueDelayMicroseconds": 500}
    serving_change["spec"]["serving"]["replicas"] = 2
    cluster.apply(serving_change)
    await until(lambda: cluster.deployment("redrafter")["spec"]["replicas"] == 2, what="replicas patched")
    await until(lambda: cluster.status()["serving"]["readyReplicas"] == 2, what="2 Ready")
    assert cluster.job_names() == jobs
    assert cluster.status()["observedGeneration"] == 3


async def test_policy_seam_switches_blue_green_without_gap(cluster: Cluster) -> None:
    async with running_operator(cluster, resync=1.0, policy=False) as operator:
        cluster.create(example(validation__enabled=False))  # the seam itself, no gate in between
        await to_serving(cluster)
        await until(lambda: cluster.condition("EnginesReady")["status"] == "True", what="both engines")
        await until(lambda: cluster.samples and cluster.samples[-1][2] >= 1, what="the Service on a Ready pod")
        start = len(cluster.samples)
        assert operator.controller is not None
        operator.controller.set_targets(
            cluster.ns, NAME, ServingTargets(active="base", replicas={"base": 2, "redrafter": 0})
        )
        await until(lambda: cluster.status().get("activeEngine") == "base", what="Service on base")
        await until(lambda: cluster.deployment("redrafter")["spec"]["replicas"] == 0, what="redrafter scaled down")
        await until(lambda: cluster.condition("Progressing")["reason"] == "Complete", what="switch complete")
        await until(lambda: cluster.samples[-1][1] == "base", what="a sample of the Service on base")
        samples = cluster.samples[start:]
        assert [s for s in samples if s[2] == 0] == [], "the Service lost its Ready pods during the switch"
        # the Service moved only after base was up (first base-pool sample already has 2 Ready pods)
        first_base = next(s for s in samples if s[1] == "base")
        assert first_base[2] == 2
        await until(
            lambda: ("Switched", "Normal", "Service now selects the base engine (was redrafter)") in cluster.events(),
            what="Switched Event",
        )


async def test_inference_pool_follows_every_switch_blue_green(cluster: Cluster) -> None:
    """The upstream v1 CRD installed: the pool is created with the Service, follows it to base and back, never
    selects a pool without Ready pods, and is deleted when the feature is turned off."""
    async with (
        inference_pool_crd(cluster),
        running_operator(cluster, resync=1.0, policy=False) as operator,  # switches through the policy's seam
    ):
        doc = routed(validation__enabled=False, autoscaling__mode="Disabled")
        cluster.apply(doc)
        await to_serving(cluster)
        await until(lambda: cluster.condition("InferencePoolReady")["status"] == "True", what="pool Ready")
        for target, other in (("base", "redrafter"), ("redrafter", "base")):
            await until(
                lambda: cluster.pool_samples and cluster.pool_samples[-1][1] == other and cluster.pool_samples[-1][2],
                what=f"a sample of the pool on {other}, Ready",
            )
            start = len(cluster.pool_samples)
            assert operator.controller is not None
            operator.controller.set_targets(
                cluster.ns, NAME, ServingTargets(active=target, replicas={target: 2, other: 0})
            )
            await until(lambda: cluster.status().get("activeEngine") == target, what=f"Service on {target}")
            await until(lambda: cluster.deployment(other)["spec"]["replicas"] == 0, what=f"{other} scaled down")
            await until(lambda: cluster.condition("Progressing")["reason"] == "Complete", what="switch complete")
            await until(lambda: cluster.condition("InferencePoolReady")["status"] == "True", what="pool Ready")
            await until(lambda: cluster.pool_samples[-1][1] == target, what="a sample of the pool on the target")
            samples = cluster.pool_samples[start:]
            assert [s for s in samples if s[2] == 0] == [], f"the InferencePool selected no Ready pod: {samples}"
            assert samples[0][1] == other and samples[-1][1] == target  # it moved, within this switch
            # it moved only once the target was up (its first sample on the target already has 2 Ready pods)
            assert next(s for s in samples if s[1] == target)[2] == 2
            pool = cluster.get(INFERENCE_POOL_API, "InferencePool", NAME)
            svc = cluster.get("v1", "Service", NAME)
            assert pool["spec"]["selector"]["matchLabels"] == svc["spec"]["selector"]
            assert pool["spec"]["targetPorts"] == [{"number": 9000}]
            assert pool["metadata"]["ownerReferences"][0]["uid"] == cluster.rdd()["metadata"]["uid"]
        assert cluster.condition("InferencePoolReady")["reason"] == "Selecting"

        # a deleted pool is seen (the watch-fed index) and recreated
        deleted_uid = cluster.get(INFERENCE_POOL_API, "InferencePool", NAME)["metadata"]["uid"]
        cluster.delete(INFERENCE_POOL_API, "InferencePool", NAME)
        await until(
            lambda: (
                (cluster.find(INFERENCE_POOL_API, "InferencePool", NAME) or {}).get("metadata", {}).get("uid")
                not in (None, deleted_uid)
            ),
            what="pool recreated",
        )

        off = copy.deepcopy(doc)
        off["spec"]["routing"]["inferencePool"]["enabled"] = False
        cluster.apply(off)
        await until(
            lambda: cluster.find(INFERENCE_POOL_API, "InferencePool", NAME) is None,
            what="pool deleted once turned off",
        )
        await until(
            lambda: all(c["type"] != "InferencePoolReady" for c in cluster.status().get("conditions", [])),
            what="condition removed",
        )


async def test_inference_pool_without_its_crd_is_a_clear_status_error_until_the_crd_is_installed(
    cluster: Cluster,
) -> None:
    # the CRD is cluster-wide: make sure no earlier test left it before the operator discovers the API
    await without_inference_pool_crd(cluster)
    try:
        async with running_operator(cluster, resync=1.0):
            cluster.apply(routed(validation__enabled=False))
            await to_serving(cluster)  # the Service serves regardless
            await until(
                lambda: cluster.condition("InferencePoolReady")["reason"] == "CRDNotInstalled", what="CRD missing"
            )
            cond = cluster.condition("InferencePoolReady")
            assert cond["status"] == "False" and INFERENCE_POOL_CRD_NAME in cond["message"]
            await until(
                lambda: [e for e in cluster.events() if e[0] == "InferencePoolCRDMissing"], what="Warning Event"
            )
            assert [e[1] for e in cluster.events() if e[0] == "InferencePoolCRDMissing"] == ["Warning"]
            # once installed, the next reconcile creates the pool and kopf starts watching it
            cluster.install_crd(INFERENCE_POOL_CRD)
            await until(
                lambda: cluster.condition("InferencePoolReady")["status"] == "True", what="pool Ready after install"
            )
            assert cluster.find(INFERENCE_POOL_API, "InferencePool", NAME) is not None
    finally:
        await without_inference_pool_crd(cluster)
