"""Convergence of the operator's children on the real control plane, and its cost at rest.

Children are server-side applied and repaired from their own watch events (a deleted child is back at once, a
hand edit reverted, a field removed from the resource removed from the child); at rest, with the cluster
idle, the operator sends nothing but its watches. The real Job, Deployment and garbage-collector controllers
run the children; the nodes' pods are held and given their verdicts by the test (:mod:`harness.lifecycle`).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from harness.lifecycle import (
    BUILT,
    NAME,
    Cluster,
    LifecycleOperator,
    count_calls,
    example,
    quiesce,
    settle,
    to_serving,
)
from harness.waiting import until
from redrafter_operator.api import API_VERSION, KIND
from redrafter_operator.api import engine_key as api_engine_key
from redrafter_operator.api.spec import ReDrafterDeploymentSpec
from redrafter_operator.controller import engines
from redrafter_operator.render import cache_refs, names
from redrafter_sim import nodes

pytestmark = pytest.mark.timeout(120)


async def test_two_resources_sharing_a_cache_build_once(cluster: Cluster, operator: LifecycleOperator) -> None:
    """One build per engine, not per resource: a second resource waits on the first's Jobs, a third arriving
    later finds the engines cached, and deleting the resource that owns the Jobs rebuilds nothing."""
    # three resources serve side by side, each a pod per variant and a surge pod while it rolls out: more than
    # one 8-GPU node of the examples' product holds at once
    await cluster.add_node("gpu-a100-1", nodes.A100, 8)
    cluster.apply(example("svc-a"))
    cluster.apply(example("svc-b"))
    await until(lambda: len(cluster.jobs()) >= 2, what="Jobs")
    await quiesce(cluster, operator, "svc-a", "svc-b")
    assert len(cluster.jobs()) == 2, cluster.job_names()  # one per engine, not per resource
    owners = {o["name"] for j in cluster.jobs() for o in j["metadata"].get("ownerReferences") or []}
    cluster.complete_all()
    for name in ("svc-a", "svc-b"):
        await until(lambda: cluster.status(name).get("phase") == "Serving", what=f"{name} Serving")
        await until(
            lambda: all(e["state"] in ("Ready", "Cached") for e in cluster.status(name)["engines"].values()),
            what=f"{name} engines",
        )
    # a third resource arriving after the builds reuses the cache too
    cluster.apply(example("svc-c"))
    await until(lambda: cluster.status("svc-c").get("phase") == "Serving", what="svc-c Serving")
    assert len(cluster.jobs()) == 2
    assert {e["state"] for e in cluster.status("svc-c")["engines"].values()} == {"Cached"}
    assert {e["sizeBytes"] for e in cluster.status("svc-c")["engines"].values()} == {BUILT.size_bytes}
    # deleting the resource that owns the Jobs does not rebuild for the others (status keeps the facts)
    (owner,) = owners  # whichever of a and b the operator reconciled first
    others = sorted({"svc-a", "svc-b", "svc-c"} - {owner})
    cluster.kubectl("delete", "rdd", owner, "--wait=false", check=True)
    await until(lambda: cluster.find(API_VERSION, KIND, owner) is None, what=f"{owner} gone")
    assert operator.controller is not None
    await until(lambda: (cluster.ns, owner) not in operator.controller.bodies, what=f"{owner}'s deletion watched")
    # the garbage collector deletes the owner's Jobs in the background: wait for it, so the operator sees them gone
    await until(lambda: cluster.jobs() == [], what=f"{owner}'s Jobs garbage-collected")
    await quiesce(cluster, operator, *others)
    assert cluster.jobs() == []  # the Jobs went with their owner; nothing rebuilds for the others
    for name in others:
        assert cluster.status(name)["phase"] == "Serving"


def rolled_out(cluster: Cluster) -> bool:
    """Every Deployment's rollout done: its pods all of the current template, available, and no old pod left
    terminating (the real Deployment controller takes a few steps, and each moves the operator's status)."""
    for dep in cluster.list("apps/v1", "Deployment"):
        spec, st = dep["spec"], dep.get("status") or {}
        want = spec.get("replicas", 1)
        if st.get("observedGeneration", 0) < dep["metadata"]["generation"]:
            return False
        if not (st.get("replicas", 0) == st.get("updatedReplicas", 0) == st.get("availableReplicas", 0) == want):
            return False
        if len(cluster.list("v1", "Pod", names.selector_string(spec["selector"]["matchLabels"]))) != want:
            return False
    return True


async def at_rest(cluster: Cluster) -> None:
    """The rollouts done, then no write from the operator for a second."""
    await until(lambda: rolled_out(cluster), what="the rollouts done")
    await settle(cluster)


async def idle_after_settling(cluster: Cluster, op: LifecycleOperator) -> None:
    """Children in sync again: once the cluster is at rest, a reconcile writes nothing."""
    await at_rest(cluster)
    mark = cluster.mark()
    await quiesce(cluster, op)
    assert cluster.operator_writes(mark) == [], "in sync again: idle"


async def test_children_converge_deleted_edited_and_removed_fields(cluster: Cluster) -> None:
    """Server-side apply with drift repair, measured as a user sees it through kubectl. The resync interval
    is 300 s: every repair below is driven by the child's own watch event."""
    for node in cluster.nodes:  # the real scheduler places the serving pods only where the selector matches
        cluster.kubectl("label", "node", node, "pool=gpu-a", check=True)
    op = cluster.operator()
    await op.start()
    try:
        cluster.apply(example(serving__nodeSelector={"pool": "gpu-a"}, validation__enabled=False))
        await to_serving(cluster)
        dep_name = names.serving_deployment_name(NAME, "redrafter")

        def selector() -> dict[str, str]:
            return (cluster.deployment("redrafter") or {}).get("spec", {}).get("template", {}).get("spec", {}).get(
                "nodeSelector"
            ) or {}

        assert selector()["pool"] == "gpu-a"
        owners = {e["manager"]: e["operation"] for e in cluster.deployment("redrafter")["metadata"]["managedFields"]}
        assert owners[names.MANAGED_BY] == "Apply"
        await at_rest(cluster)

        # 1. deleted: back within 5 s (a new object: another uid)
        uid = cluster.deployment("redrafter")["metadata"]["uid"]
        started = time.monotonic()
        cluster.kubectl("delete", "deployment", dep_name, "--wait=false", check=True)
        await until(
            lambda: (cluster.deployment("redrafter") or {}).get("metadata", {}).get("uid") not in (None, uid),
            timeout=10,
            what="the deleted Deployment back",
        )
        back_after = time.monotonic() - started
        print(f"deleted Deployment back after {back_after:.2f} s")
        assert back_after < 5.0
        assert selector()["pool"] == "gpu-a"
        await at_rest(cluster)

        # 2. a hand edit of a field the operator owns: reverted by the reconcile the edit's event starts
        assert op.controller is not None
        reconciles = op.controller.metrics.reconciles.labels("ok")
        applier = op.controller.applier
        ensure = applier.ensure
        done_at_revert: list[float] = []  # reconciles completed when the reverting apply was sent

        async def recording(manifest: dict[str, Any]) -> bool:
            sent = await ensure(manifest)
            if sent and manifest["kind"] == "Deployment" and manifest["metadata"]["name"] == dep_name:
                done_at_revert.append(reconciles._value.get())
            return sent

        applier.ensure = recording  # type: ignore[method-assign]
        before = reconciles._value.get()
        cluster.kubectl(
            "patch",
            "deployment",
            dep_name,
            "--type=merge",
            "-p",
            json.dumps({"spec": {"template": {"spec": {"nodeSelector": {"pool": "hijacked"}}}}}),
            check=True,
        )
        edited = time.monotonic()
        await until(lambda: selector().get("pool") == "gpu-a", timeout=10, what="the hand edit reverted")
        applier.ensure = ensure  # type: ignore[method-assign]
        # at most one reconcile may have been running already when the edit arrived; the next one reverted it
        # (the serving Pods' events start more reconciles afterwards: they are not counted). Where that running
        # reconcile's apply was already on its way, it landed after the edit and reverted it: no apply was sent
        # through the recorder, and no reconcile completed in between.
        completed = (done_at_revert[0] if done_at_revert else reconciles._value.get()) - before
        print(f"hand edit reverted after {time.monotonic() - edited:.2f} s, {completed:.0f} reconcile(s) before it")
        assert completed <= 1 if done_at_revert else completed <= 2
        await at_rest(cluster)

        # 3. spec.serving.nodeSelector removed from the resource: gone from the Deployment
        cluster.apply(example(validation__enabled=False))
        await until(lambda: "pool" not in selector(), timeout=10, what="the removed nodeSelector gone")
        await idle_after_settling(cluster, op)
    finally:
        await op.stop()


async def test_network_policies_converge_like_every_child(cluster: Cluster) -> None:
    """NetworkPolicies are server-side applied too: a deleted one is back at once, a hand edit of a field the
    operator owns is reverted, driven by their own watch events (the resync interval is 300 s)."""
    op = cluster.operator()
    await op.start()
    try:
        cluster.apply(example(serving__networkPolicy={"enabled": True}, validation__enabled=False))
        await to_serving(cluster)
        np_name = names.safe_name(NAME, "serving")

        def policy() -> dict[str, Any]:
            return cluster.find("networking.k8s.io/v1", "NetworkPolicy", np_name) or {}

        wanted = policy()["spec"]
        assert {e["manager"]: e["operation"] for e in policy()["metadata"]["managedFields"]}[
            names.MANAGED_BY
        ] == "Apply"
        await at_rest(cluster)

        uid = policy()["metadata"]["uid"]
        started = time.monotonic()
        cluster.kubectl("delete", "networkpolicy", np_name, "--wait=false", check=True)
        await until(
            lambda: policy().get("metadata", {}).get("uid") not in (None, uid),
            timeout=10,
            what="the deleted NetworkPolicy back",
        )
        print(f"deleted NetworkPolicy back after {time.monotonic() - started:.2f} s")
        assert time.monotonic() - started < 5.0 and policy()["spec"] == wanted
        await at_rest(cluster)

        cluster.kubectl(
            "patch",
            "networkpolicy",
            np_name,
            "--type=merge",
            "-p",
            json.dumps({"spec": {"ingress": [{}]}}),
            check=True,
        )  # allow everything: a hole, reverted
        await until(lambda: policy().get("spec") == wanted, timeout=10, what="the hand edit reverted")
        await idle_after_settling(cluster, op)
    finally:
        await op.stop()


async def test_validated_resources_at_rest_cost_only_watches_over_five_minutes(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Several resources built, validated (the validation Job's pod leaves the verdict a passing `evaluate
    validate` writes) and serving ReDrafter. At rest, five minutes on the operator's clock (a fake one: no
    waiting) with a resync every 30 s and the policy evaluating each resource every second cost no request
    but the watches: no status or child write, no Job GET, no Pod LIST."""
    from redrafter_operator.evaluate import outcome as oc
    from redrafter_sim.clock import FakeClock

    passed = oc.format_termination_message(
        oc.ValidationOutcome(oc.PASSED, "12 requests per engine (chat): 12 greedy outputs identical, no errors")
    )
    names_ = [f"idle-{i}" for i in range(3)]
    clock = FakeClock(epoch=time.time())
    op = cluster.operator(resync=30.0, clock=clock)
    await op.start()
    ctl = op.controller
    assert ctl is not None
    stop = asyncio.Event()

    async def background() -> None:  # every build and validation Job's pod succeeds; time moves
        while not stop.is_set():
            for component, message in (("engine-build", BUILT.message("OK: engine built")), ("validation", passed)):
                for job in await asyncio.to_thread(cluster.jobs, component):
                    if job["metadata"]["name"] not in cluster.pods.verdicts:
                        cluster.complete_job(job["metadata"]["name"], message)
            await clock.advance(1.0)
            await asyncio.sleep(0.02)

    helper = asyncio.create_task(background())
    try:
        for name in names_:
            cluster.create(example(name, speculation__interval="1s"))

        def validated(name: str) -> bool:
            st = cluster.status(name)
            conds = {c["type"]: c for c in st.get("conditions") or []}
            return (
                st.get("phase") == "Serving"
                and st.get("activeEngine") == "redrafter"
                and conds.get("Validated", {}).get("status") == "True"
                and conds.get("Progressing", {}).get("reason") == "Complete"  # base scaled down
                and (st.get("policy") or {}).get("serving") == "redrafter"
            )

        await until(lambda: all(validated(n) for n in names_), timeout=90, what="validated, serving ReDrafter")
        stop.set()
        await helper
        await until(ctl.idle, what="the operator at rest")
        await at_rest(cluster)  # the base Deployments' pods gone too
        mark = cluster.mark()
        reconciles = ctl.metrics.reconciles.labels("ok")._value.get()
        runs = sum(
            s.value
            for m in ctl.metrics.speculation_evaluations.collect()
            for s in m.samples
            if s.name.endswith("_total")
        )
        parses = count_calls(monkeypatch, ReDrafterDeploymentSpec, "model_validate")
        keys = [count_calls(monkeypatch, m, "engine_key") for m in (api_engine_key, engines, cache_refs)]
        for _ in range(300):  # five minutes: 10 resyncs of each resource, 300 policy evaluations of each
            await clock.advance(1.0)
            await until(ctl.idle, what="the operator at rest")
        # work done once: an unchanged spec is parsed and keyed once, not per reconcile or monitor run
        assert (parses(), [k() for k in keys]) == (0, [0, 0, 0])
        retention = ctl.metrics.monitor_runs.labels("RetentionMonitor")._value.get()
        assert retention >= 5  # every minute, over every resource
        requests = cluster.operator_requests(mark)
        assert [(r.method, r.path) for r in requests if not r.watch] == [], "at rest: only watches"
        assert any(r.method == "PATCH" and r.path.endswith("/status") for r in cluster.operator_requests()), (
            "the log sees the operator's writes"
        )
        assert ctl.metrics.reconciles.labels("ok")._value.get() - reconciles >= 10 * len(names_)
        assert sum(
            s.value
            for m in ctl.metrics.speculation_evaluations.collect()
            for s in m.samples
            if s.name.endswith("_total")
        ) - runs >= 250 * len(names_)
    finally:
        stop.set()
        await helper
        await op.stop()


async def test_events_name_this_operator_and_its_pod(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator's Events say who reported them (component and pod), in core/v1 and events.k8s.io/v1 alike."""
    monkeypatch.setenv("POD_NAME", "redrafter-operator-7d9f-abcde")  # the chart's downward API
    op = cluster.operator()
    await op.start()
    try:
        cluster.apply(example())
        await until(lambda: any(r == "BuildStarted" for r, _, _ in cluster.events()), what="an Event")
    finally:
        await op.stop()
    ours = [e for e in cluster.list("v1", "Event") if e["involvedObject"].get("kind") == KIND]
    assert ours and {(e["reportingComponent"], e["reportingInstance"], e["source"]["component"]) for e in ours} == {
        ("redrafter-operator", "redrafter-operator-7d9f-abcde", "redrafter-operator")
    }
    assert all(e["metadata"]["name"].startswith("redrafter-operator-") for e in ours)
    listed = json.loads(
        cluster.kubectl("get", "events.v1.events.k8s.io", "-n", cluster.ns, "-o", "json", check=True).stdout
    )
    assert {e["reportingController"] for e in listed["items"] if e["regarding"].get("kind") == KIND} == {
        "redrafter-operator"
    }


async def test_deletion_is_never_blocked_and_children_are_collected(
    cluster: Cluster, operator: LifecycleOperator
) -> None:
    """No finalizer: `kubectl delete` returns at once, and the garbage collector removes the children."""
    cluster.apply(example())
    await to_serving(cluster)
    assert not cluster.rdd()["metadata"].get("finalizers")
    cluster.kubectl("delete", "rdd", NAME, "--timeout=20s", check=True)
    assert cluster.find(API_VERSION, KIND, NAME) is None
    # the garbage collector deletes the dependents in the background, in no set order
    await until(
        lambda: cluster.deployment("redrafter") is None and cluster.deployment("base") is None,
        what="Deployments garbage-collected",
    )
    await until(lambda: cluster.find("v1", "Service", NAME) is None, what="the Service garbage-collected")
    await until(lambda: cluster.jobs() == [], what="the build Jobs garbage-collected")
    assert operator.controller is not None
    await until(lambda: (cluster.ns, NAME) not in operator.controller.bodies, what="the operator forgot the resource")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_run_command_serves_metrics_and_liveness(cluster: Cluster) -> None:
    """`redrafter-operator run` as a process: JSON logs, /metrics, kopf's liveness probe, clean SIGTERM."""
    metrics_port, health_port = _free_port(), _free_port()
    exe = Path(sys.executable).parent / "redrafter-operator"
    proc = subprocess.Popen(
        [
            str(exe),
            "run",
            "--kubeconfig",
            str(cluster.operator_kubeconfig),
            "--namespace",
            cluster.ns,
            "--standalone",
            f"--liveness=http://127.0.0.1:{health_port}/healthz",
            f"--metrics-port={metrics_port}",
            "--log-format=json",
            "--log-level=INFO",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ},
    )
    try:
        cluster.apply(example())  # examples/llama3-8b.yaml, in the test's namespace
        await until(
            lambda: len(cluster.jobs()) == 2 and cluster.status().get("phase") == "Building",
            what="the process to start the builds",
        )

        def get(url: str) -> tuple[int, str]:
            with urllib.request.urlopen(url, timeout=5) as resp:
                return resp.status, resp.read().decode()

        status, text = await asyncio.to_thread(get, f"http://127.0.0.1:{metrics_port}/metrics")
        assert status == 200
        assert 'redrafter_operator_engine_builds_total{result="started",variant="redrafter"} 1.0' in text
        phase = f'redrafter_operator_resource_phase{{name="{NAME}",namespace="{cluster.ns}",phase="Building"}} 1.0'
        assert phase in text
        assert 'redrafter_operator_reconciles_total{result="ok"}' in text
        status, _ = await asyncio.to_thread(get, f"http://127.0.0.1:{health_port}/healthz")
        assert status == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = await asyncio.to_thread(proc.communicate, timeout=30)
    assert proc.returncode == 0, out[-2000:]
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert any("BuildStarted" in (rec.get("message") or "") for rec in lines), out[-2000:]


async def test_a_same_named_service_it_cannot_merge_with_stalls_it_with_the_reason_until_it_is_gone(
    cluster: Cluster, operator: LifecycleOperator
) -> None:
    """A Service left under the resource's name by an earlier hand deployment, with a port named like one of the
    operator's but numbered otherwise: server-side apply merges ports by number, so the result would have two
    ports of one name, and the API server refuses it. The other children still apply; the status stalls with
    the API server's reason and a Warning Event says it; once the old Service is deleted, the operator creates
    its own and the resource serves."""
    old = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": NAME},
        "spec": {"selector": {"app": "hand-made"}, "ports": [{"name": "grpc", "port": 1234}]},
    }
    cluster.create(old)
    cluster.apply(example())
    await until(lambda: len(cluster.running_jobs()) == 2, what="build Jobs")
    cluster.complete_all()

    def stalled() -> dict[str, Any] | None:
        cond = {c["type"]: c for c in cluster.status().get("conditions") or []}.get("Stalled")
        return cond if cond and cond["status"] == "True" and cond["reason"] == "ApplyRefused" else None

    stall = await until(stalled, what="Stalled with ApplyRefused")
    assert f"Service {NAME}: 422 Invalid" in stall["message"] and "grpc" in stall["message"], stall
    ready = {c["type"]: c for c in cluster.status()["conditions"]}["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "ApplyRefused")
    # everything else applied: both variants' Deployments and their own Services
    await until(lambda: cluster.deployment("redrafter") and cluster.deployment("base"), what="the Deployments")
    for variant in ("redrafter", "base"):
        assert cluster.find("v1", "Service", names.service_name(NAME, variant)) is not None
    await until(
        lambda: any(r == "ReconcileError" and f"Service {NAME}" in m for r, t, m in cluster.events() if t == "Warning"),
        what="the Warning Event",
    )

    cluster.cp.request("DELETE", cluster.path("v1", "Service", NAME))
    await until(
        lambda: any(
            o.get("kind") == KIND
            for o in (cluster.find("v1", "Service", NAME) or {}).get("metadata", {}).get("ownerReferences") or []
        ),
        timeout=90,  # the next retry of the reconcile's backoff
        what="the operator's own Service",
    )
    await until(lambda: cluster.status().get("phase") == "Serving" and stalled() is None, what="Serving, not stalled")
