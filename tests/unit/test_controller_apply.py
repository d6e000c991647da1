"""The pure side of applying children: merge patches, manifest hashes, create-only's answer to a 409, the work
queue, the facts read from child objects, the monitors and kopf's registry. The Applier against the real API
server (managedFields, field removal, drift, adoption) is tests/integration/test_apply.py."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml

from redrafter_operator.api.status import ReDrafterDeploymentStatus
from redrafter_operator.controller.apply import ApiError, Applier, merge_patch
from redrafter_operator.controller.facts import DeploymentFact, JobFact, PodFact
from redrafter_operator.controller.fingerprints import manifest_hash
from redrafter_operator.controller.process import instance
from redrafter_operator.controller.workqueue import WorkQueue

ROOT = Path(__file__).resolve().parents[2]


def service(selector: str = "redrafter") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "s", "namespace": "ns", "labels": {"a": "b"}},
        "spec": {"selector": {"pool": selector}, "ports": [{"name": "http", "port": 8000}]},
    }


async def test_create_only_takes_only_already_exists_for_an_existing_object() -> None:
    """A 409 Conflict on a create (an API server under contention, a proxy) created nothing: it is raised, so the
    reconcile retries and creates nothing after it (a build Job after its ConfigMap)."""

    class Refusing:
        def __init__(self, reason: str) -> None:
            self.reason, self.calls = reason, 0

        async def request(self, method: str, path: str, body: object = None, **_: object) -> None:
            self.calls += 1
            raise ApiError(409, self.reason, "refused", method, path)

    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ns"}, "data": {}}
    conflict = Refusing("Conflict")
    with pytest.raises(ApiError):
        await Applier(conflict, lambda m: None).create(cm)  # type: ignore[arg-type]
    exists = Refusing("AlreadyExists")
    applier = Applier(exists, lambda m: None)  # type: ignore[arg-type]
    assert await applier.create(cm) is False
    assert await applier.create(cm) is False and exists.calls == 1, "remembered"


def test_manifest_hash_ignores_status() -> None:
    a = service()
    b = service()
    b["status"] = {"loadBalancer": {}}
    assert manifest_hash(a) == manifest_hash(b)
    assert manifest_hash(a) != manifest_hash(service("base"))


@pytest.mark.parametrize(
    "old,new,patch",
    [
        ({"a": 1}, {"a": 1}, None),
        ({"a": 1, "b": 2}, {"a": 1}, {"b": None}),
        ({"a": {"x": 1, "y": 2}}, {"a": {"x": 1, "y": 3}}, {"a": {"y": 3}}),
        ({"c": [1, 2]}, {"c": [1]}, {"c": [1]}),
        ({}, {"n": {"m": 1}}, {"n": {"m": 1}}),
    ],
)
def test_merge_patch(old: Any, new: Any, patch: Any) -> None:
    assert merge_patch(old, new) == patch


def test_job_facts_from_conditions() -> None:
    body = {
        "metadata": {
            "name": "j",
            "namespace": "ns",
            "labels": {
                "redrafter.dev/deployment": "d",
                "redrafter.dev/variant": "base",
                "redrafter.dev/engine-key": "k",
            },
            "annotations": {"redrafter.dev/attempt": "2", "redrafter.dev/artifact": "engines/k"},
        },
        "spec": {"template": {"spec": {"volumes": [{"name": "cache", "persistentVolumeClaim": {"claimName": "c"}}]}}},
        "status": {"conditions": [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded", "message": "m"}]},
    }
    fact = JobFact.from_body(body)
    assert (fact.state, fact.reason, fact.attempt, fact.claim, fact.artifact) == (
        "Failed",
        "DeadlineExceeded",
        2,
        "c",
        "engines/k",
    )
    body["status"] = {"conditions": [{"type": "Complete", "status": "True"}], "succeeded": 1}
    assert JobFact.from_body(body).state == "Succeeded"
    body["status"] = {"active": 1}
    assert JobFact.from_body(body).state == "Running"


def test_pod_fact_prefers_the_failed_container_message() -> None:
    pod = {
        "metadata": {"labels": {"batch.kubernetes.io/job-name": "j"}},
        "status": {
            "phase": "Failed",
            "containerStatuses": [{"state": {"terminated": {"exitCode": 3, "message": "FetchError: 401\n"}}}],
        },
    }
    assert PodFact.from_body(pod) == PodFact(job="j", phase="Failed", message="FetchError: 401")


def test_deployment_rollout_complete_only_when_all_new_replicas_ready() -> None:
    def dep(**status: int) -> DeploymentFact:
        return DeploymentFact.from_body(
            {
                "metadata": {"name": "d", "generation": 2},
                "spec": {"replicas": 2},
                "status": {"observedGeneration": 2, **status},
            }
        )

    assert dep(replicas=2, updatedReplicas=2, readyReplicas=2).rolled_out
    assert not dep(replicas=3, updatedReplicas=2, readyReplicas=2).rolled_out  # an old pod still there
    assert not dep(replicas=2, updatedReplicas=1, readyReplicas=2).rolled_out
    assert not DeploymentFact.from_body(
        {
            "metadata": {"generation": 3},
            "spec": {"replicas": 1},
            "status": {"observedGeneration": 2, "replicas": 1, "updatedReplicas": 1, "readyReplicas": 1},
        }
    ).rolled_out


async def test_work_queue_dedups_and_requeues_dirty_keys() -> None:
    q = WorkQueue()
    q.add(("ns", "a"))
    q.add(("ns", "a"))
    q.add(("ns", "b"))
    assert len(q) == 2
    key = await q.get()
    assert key == ("ns", "a")
    q.add(key)  # changed while being processed: processed again afterwards, not concurrently
    assert len(q) == 1
    q.done(key)
    assert len(q) == 2
    q.add_after(("ns", "c"), 0.01)
    await asyncio.sleep(0.05)
    assert len(q) == 3
    q.close()


def test_events_report_the_pod_name_else_the_host_name(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    monkeypatch.setenv("POD_NAME", "op-a")
    assert instance() == "op-a"
    monkeypatch.delenv("POD_NAME")
    assert instance() == socket.gethostname()


async def test_monitor_slots_run_per_resource_on_the_fake_clock_and_reports_enqueue() -> None:
    """A per-resource monitor runs on its own interval (moved by the fake clock, no sleep); a report it hands
    over wakes the resource once, and the same report again wakes nothing."""
    from redrafter_operator.controller.plan_types import ServingTargets
    from redrafter_operator.controller.reconciler import Controller
    from redrafter_operator.controller.renderers import default_renderers
    from redrafter_operator.controller.reports import SpeculationReport
    from redrafter_operator.controller.resource_io import interval_of
    from redrafter_sim.clock import FakeClock

    class Client:
        """No request is expected: the monitors and the queue run without the API server."""

        async def request(self, method: str, path: str, *_: Any, **__: Any) -> None:
            raise AssertionError(f"unexpected {method} {path}")

        async def close(self) -> None:
            pass

    calls: list[str] = []
    targets = ServingTargets(active="base", replicas={"base": 1, "redrafter": 0})

    class Monitor:
        per_resource = True

        def interval(self, host: Any, key: Any) -> float:
            return interval_of(host.spec_of(key))

        def forget(self, key: Any) -> None:
            pass

        async def run(self, host: Any, key: Any) -> None:
            calls.append(key[1])
            host.hand_over(
                key, SpeculationReport(uid="", status=ReDrafterDeploymentStatus(), condition=None, targets=targets)
            )

    clock = FakeClock()
    controller = Controller(client=Client(), renderers=default_renderers(), clock=clock)  # type: ignore[arg-type]
    controller.add_monitor(Monitor())
    spec = yaml.safe_load((ROOT / "examples" / "llama3-8b.yaml").read_text())["spec"]
    controller.bodies[("ns", "a")] = {"metadata": {"name": "a"}, "spec": {**spec, "speculation": {"interval": "30s"}}}
    controller.bodies[("ns", "b")] = {"metadata": {"name": "b"}, "spec": {**spec, "speculation": {"interval": "1s"}}}
    ticker = asyncio.create_task(controller._ticker())
    await asyncio.sleep(0)  # the ticker takes its first sleep on the fake clock
    try:
        for _ in range(4):
            await clock.advance(1.0)
    finally:
        ticker.cancel()
        await asyncio.gather(ticker, return_exceptions=True)
    assert calls.count("a") == 1 and calls.count("b") == 4  # each on its own interval
    assert controller.resources[("ns", "a")].inputs.speculation.targets == targets
    assert len(controller.queue) == 2  # enqueued once each: the same report again changes nothing


def test_the_operator_registers_nothing_that_reads_kopfs_diff_base() -> None:
    """kopf's diff-base essence is never built (handlers.NoEssenceStorage): that holds only while the
    operator registers no change-detecting handlers (create/update/resume/delete/field), daemons or timers."""
    import kopf

    from redrafter_operator.controller.handlers import NoEssenceStorage, register

    registry = kopf.OperatorRegistry()

    async def make() -> Any:
        raise AssertionError("not started here")

    register(registry, make)
    assert registry._changing.get_all_handlers() == [] and registry._spawning.get_all_handlers() == []
    assert len(registry._watching.get_all_handlers()) >= 8 and len(registry._indexing.get_all_handlers()) >= 8
    storage = NoEssenceStorage()
    assert storage.build(body=kopf.Body({"metadata": {"name": "x"}, "spec": {"a": 1}})) is None
    assert storage.fetch(body=kopf.Body({"metadata": {"name": "x"}})) is None
