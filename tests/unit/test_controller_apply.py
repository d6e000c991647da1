"""create-or-patch, merge patches, retries, the work queue, and the facts read from child objects."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from redrafter_operator.controller.apply import ApiError, Applier, merge_patch
from redrafter_operator.controller.facts import (
    ANNOTATION_APPLIED_HASH,
    DeploymentFact,
    JobFact,
    PodFact,
    manifest_hash,
)
from redrafter_operator.controller.workqueue import WorkQueue


class FakeClient:
    """Records requests; answers from a dict store like the API server (409 on an existing name)."""

    def __init__(self) -> None:
        self.store: dict[str, dict[str, Any]] = {}
        self.calls: list[tuple[str, str]] = []

    async def request(self, method: str, path: str, body: Any = None, **_: Any) -> dict[str, Any]:
        self.calls.append((method, path))
        if method == "POST":
            key = f"{path}/{body['metadata']['name']}"
            if key in self.store:
                raise ApiError(409, "AlreadyExists", "exists", method, path)
            self.store[key] = body
            return body
        if method == "GET":
            if path not in self.store:
                raise ApiError(404, "NotFound", "missing", method, path)
            return self.store[path]
        if method == "PATCH":
            self.store[path] = {**self.store[path], **body}
            return self.store[path]
        raise AssertionError(method)


def service(selector: str = "redrafter") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "namespace": "ns", "labels": {"a": "b"}},
            "spec": {"selector": {"pool": selector}}}


async def test_ensure_creates_then_skips_then_patches_on_change() -> None:
    client = FakeClient()
    observed: dict[str, str | None] = {"hash": None}
    applier = Applier(client, lambda m: observed["hash"])  # type: ignore[arg-type]
    assert await applier.ensure(service()) is True
    assert client.calls == [("POST", "/api/v1/namespaces/ns/services")]
    stored = client.store["/api/v1/namespaces/ns/services/s"]
    assert stored["metadata"]["annotations"][ANNOTATION_APPLIED_HASH] == manifest_hash(service())
    # before the watch echoes the object, the applier remembers what it wrote
    assert await applier.ensure(service()) is False
    # once observed with the same hash: nothing either
    observed["hash"] = manifest_hash(service())
    assert await applier.ensure(service()) is False
    assert len(client.calls) == 1
    # a changed manifest of an observed object: PATCH straight away
    assert await applier.ensure(service("base")) is True
    assert [c[0] for c in client.calls[1:]] == ["PATCH"]
    # an object this process has not seen (e.g. created by a previous run before the watch caught up):
    # POST conflicts, GET shows another hash, PATCH
    fresh = Applier(client, lambda m: None)  # type: ignore[arg-type]
    assert await fresh.ensure(service("x")) is True
    assert [c[0] for c in client.calls[2:]] == ["POST", "GET", "PATCH"]


async def test_create_only_never_patches_an_existing_job() -> None:
    client = FakeClient()
    applier = Applier(client, lambda m: None)  # type: ignore[arg-type]
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": "ns"}, "spec": {}}
    client.store["/apis/batch/v1/namespaces/ns/jobs/j"] = job
    assert await applier.create(job) is False
    assert client.calls == [("POST", "/apis/batch/v1/namespaces/ns/jobs")]


def test_manifest_hash_ignores_its_own_annotation_and_status() -> None:
    a = service()
    b = service()
    b["metadata"]["annotations"] = {ANNOTATION_APPLIED_HASH: "x"}
    b["status"] = {"loadBalancer": {}}
    assert manifest_hash(a) == manifest_hash(b)
    assert manifest_hash(a) != manifest_hash(service("base"))


@pytest.mark.parametrize("old,new,patch", [
    ({"a": 1}, {"a": 1}, None),
    ({"a": 1, "b": 2}, {"a": 1}, {"b": None}),
    ({"a": {"x": 1, "y": 2}}, {"a": {"x": 1, "y": 3}}, {"a": {"y": 3}}),
    ({"c": [1, 2]}, {"c": [1]}, {"c": [1]}),
    ({}, {"n": {"m": 1}}, {"n": {"m": 1}}),
])
def test_merge_patch(old: Any, new: Any, patch: Any) -> None:
    assert merge_patch(old, new) == patch


def test_job_facts_from_conditions() -> None:
    body = {"metadata": {"name": "j", "namespace": "ns",
                         "labels": {"redrafter.dev/deployment": "d", "redrafter.dev/variant": "base",
                                    "redrafter.dev/engine-key": "k"},
                         "annotations": {"redrafter.dev/attempt": "2", "redrafter.dev/artifact": "engines/k"}},
            "spec": {"template": {"spec": {"volumes": [{"name": "cache", "persistentVolumeClaim": {"claimName": "c"}}]}}},
            "status": {"conditions": [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded", "message": "m"}]}}
    fact = JobFact.from_body(body)
    assert (fact.state, fact.reason, fact.attempt, fact.claim, fact.artifact) == ("Failed", "DeadlineExceeded", 2, "c", "engines/k")
    body["status"] = {"conditions": [{"type": "Complete", "status": "True"}], "succeeded": 1}
    assert JobFact.from_body(body).state == "Succeeded"
    body["status"] = {"active": 1}
    assert JobFact.from_body(body).state == "Running"


def test_pod_fact_prefers_the_failed_container_message() -> None:
    pod = {"metadata": {"labels": {"batch.kubernetes.io/job-name": "j"}}, "status": {"phase": "Failed", "containerStatuses": [
        {"state": {"terminated": {"exitCode": 3, "message": "FetchError: 401\n"}}}]}}
    assert PodFact.from_body(pod) == PodFact(job="j", phase="Failed", message="FetchError: 401")


def test_deployment_rollout_complete_only_when_all_new_replicas_ready() -> None:
    def dep(**status: int) -> DeploymentFact:
        return DeploymentFact.from_body({"metadata": {"name": "d", "generation": 2}, "spec": {"replicas": 2},
                                         "status": {"observedGeneration": 2, **status}})
    assert dep(replicas=2, updatedReplicas=2, readyReplicas=2).rolled_out
    assert not dep(replicas=3, updatedReplicas=2, readyReplicas=2).rolled_out  # an old pod still there
    assert not dep(replicas=2, updatedReplicas=1, readyReplicas=2).rolled_out
    assert not DeploymentFact.from_body({"metadata": {"generation": 3}, "spec": {"replicas": 1},
                                         "status": {"observedGeneration": 2, "replicas": 1, "updatedReplicas": 1,
                                                    "readyReplicas": 1}}).rolled_out


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


async def test_evaluator_slot_runs_per_resource_and_targets_enqueue() -> None:
    """The policy seam: an evaluator is called per resource on its interval and may set serving targets."""
    from redrafter_operator.controller.plan_types import ServingTargets
    from redrafter_operator.controller.reconciler import Controller
    from redrafter_operator.controller.resource_io import interval_of
    from redrafter_operator.controller.renderers import default_renderers

    class Client(FakeClient):
        async def close(self) -> None:
            pass

    calls: list[str] = []

    class Evaluator:
        def interval(self, body: Any) -> float:
            return interval_of(body)

        async def evaluate(self, controller: Controller, body: Any) -> None:
            calls.append(body["metadata"]["name"])
            controller.set_targets("ns", body["metadata"]["name"],
                                   ServingTargets(active="base", replicas={"base": 1, "redrafter": 0}))

    controller = Controller(client=Client(), renderers=default_renderers())  # type: ignore[arg-type]
    controller.add_evaluator(Evaluator())
    controller.bodies[("ns", "a")] = {"metadata": {"name": "a"}, "spec": {"speculation": {"interval": "30s"}}}
    controller.bodies[("ns", "b")] = {"metadata": {"name": "b"}, "spec": {"speculation": {"interval": "1s"}}}
    ticker = asyncio.create_task(controller._ticker())
    try:
        await asyncio.sleep(3.3)
    finally:
        ticker.cancel()
        await asyncio.gather(ticker, return_exceptions=True)
    assert calls.count("a") == 1 and calls.count("b") >= 2  # each on its own interval
    assert controller.targets[("ns", "a")].active == "base" and len(controller.queue) == 2  # enqueued once each
