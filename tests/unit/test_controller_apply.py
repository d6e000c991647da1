"""Server-side apply of children, merge patches, retries, the work queue, and the facts read from child objects."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Mapping

import pytest
import yaml

from redrafter_operator.api.status import ReDrafterDeploymentStatus
from redrafter_operator.controller.apply import APPLY_PATCH, JSON_PATCH, ApiError, Applier, ChildState, merge_patch
from redrafter_operator.controller.facts import DeploymentFact, JobFact, ObjectFact, PodFact
from redrafter_operator.controller.fingerprints import FIELD_MANAGER, manifest_hash
from redrafter_operator.controller.process import instance
from redrafter_operator.controller.workqueue import WorkQueue
from redrafter_sim.apiserver import ApiError as EmulatorError
from redrafter_sim.apiserver import ApiServerEmulator

ROOT = Path(__file__).resolve().parents[2]


class EmulatorClient:
    """The applier's client answered by an in-process emulated API server (its real apply semantics:
    managedFields, removal of unapplied fields, conflicts), recording each request."""

    def __init__(self) -> None:
        self.emu = ApiServerEmulator()
        self.calls: list[tuple[str, str, str]] = []

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        query: list[tuple[str, str]] | None = None,
        **_: Any,
    ) -> dict[str, Any]:
        self.calls.append((method, path, content_type))
        params = {"fieldManager": FIELD_MANAGER, **dict(query or [])}  # as KubeClient.request sends on writes
        parts = path.strip("/").split("/")  # api/v1/namespaces/ns/services[/name], apis/apps/v1/...
        version = parts[1] if parts[0] == "api" else f"{parts[1]}/{parts[2]}"
        ns, plural, *name = parts[parts.index("namespaces") + 1 :]
        try:
            if method == "POST":
                return self.emu.create_object(body, field_manager=params.get("fieldManager"))
            kind = self.emu.resource_type(version, plural).kind
            if method == "PATCH" and content_type in (APPLY_PATCH, JSON_PATCH):
                return self.emu.patch_object(
                    version,
                    kind,
                    name[0],
                    ns,
                    body,
                    patch_type="apply" if content_type == APPLY_PATCH else "json",
                    field_manager=params.get("fieldManager"),
                    force=params.get("force") == "true",
                )
        except EmulatorError as exc:
            raise ApiError(exc.code, exc.reason, exc.message, method, path) from None
        raise AssertionError(f"unexpected {method} {path} {content_type}")

    def watch_view(self, m: Mapping[str, Any]) -> ChildState | None:
        """What an up-to-date watch shows of a child (the controller reads it from its kopf indexes)."""
        obj = self.emu.find_object(m["apiVersion"], m["kind"], m["metadata"]["name"], m["metadata"]["namespace"])
        if obj is None:
            return None
        fact = ObjectFact.from_body(obj)
        return ChildState(fact.resource_version, fact.owned_fields, fact.owned_content)


def service(selector: str = "redrafter", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "s", "namespace": "ns", "labels": {"a": "b"}},
        "spec": {"selector": {"pool": selector}, "ports": [{"name": "http", "port": 8000}], **spec},
    }


def stored(client: EmulatorClient) -> dict[str, Any]:
    return client.emu.get_object("v1", "Service", "s", "ns")


async def test_ensure_applies_server_side_then_writes_nothing_while_in_sync() -> None:
    client = EmulatorClient()
    applier = Applier(client, lambda m: None)  # type: ignore[arg-type]  # a watch that has not caught up
    assert await applier.ensure(service()) is True
    assert client.calls == [("PATCH", "/api/v1/namespaces/ns/services/s", APPLY_PATCH)]
    obj = stored(client)
    assert [(e["manager"], e["operation"]) for e in obj["metadata"]["managedFields"]] == [(FIELD_MANAGER, "Apply")]
    assert await applier.ensure(service()) is False, "the watch has not echoed the apply yet: no second write"
    applier = Applier(client, client.watch_view)  # type: ignore[arg-type]
    assert await applier.ensure(service()) is False, "a restarted operator sees its fields hold the manifest"
    assert stored(client)["metadata"]["resourceVersion"] == obj["metadata"]["resourceVersion"]
    # status or another manager's fields change: the operator's owned fields do not, nothing to do
    client.emu.patch_object(
        "v1", "Service", "s", "ns", {"metadata": {"labels": {"team": "x"}}}, field_manager="kubectl-label"
    )
    assert await applier.ensure(service()) is False
    assert len(client.calls) == 1


async def test_a_restarted_operator_applies_only_what_differs_from_its_fields() -> None:
    """After a restart nothing is in memory: the watched child's fields owned by the operator's manager
    decide. Equal to the manifest: no apply; a changed manifest, a field another manager took, or a child
    the operator never applied: one apply."""
    client = EmulatorClient()
    await Applier(client, client.watch_view).ensure(deployment())  # type: ignore[arg-type]
    await Applier(client, client.watch_view).ensure(service(sessionAffinity="ClientIP"))  # type: ignore[arg-type]
    client.emu.patch_object(  # other managers' fields and status are not the operator's
        "apps/v1", "Deployment", "d", "ns", {"metadata": {"annotations": {"rev": "1"}}}, field_manager="kcm"
    )
    client.emu.patch_object(
        "apps/v1", "Deployment", "d", "ns", {"status": {"observedGeneration": 1}}, subresource="status"
    )
    client.calls.clear()
    restarted = Applier(client, client.watch_view)  # type: ignore[arg-type]
    assert await restarted.ensure(deployment()) is False
    assert await restarted.ensure(service(sessionAffinity="ClientIP")) is False
    assert client.calls == []
    assert await restarted.ensure(service()) is True, "a field the manifest no longer sets must be removed"
    assert "sessionAffinity" not in stored(client)["spec"]
    client.emu.patch_object(
        "apps/v1",
        "Deployment",
        "d",
        "ns",
        {"spec": {"template": {"spec": {"containers": [{"name": "triton", "image": "evil"}]}}}},
        patch_type="strategic",
        field_manager="kubectl-edit",
    )
    again = Applier(client, client.watch_view)  # type: ignore[arg-type]
    assert await again.ensure(deployment()) is True, "a field another manager took is drift"
    assert await again.ensure(deployment("triton:2")) is True
    fresh = Applier(client, client.watch_view)  # type: ignore[arg-type]
    assert await fresh.ensure(deployment("triton:2")) is False
    client.emu.create_object(service() | {"metadata": {"name": "t", "namespace": "ns"}}, field_manager="kubectl")
    other = service() | {"metadata": {"name": "t", "namespace": "ns", "labels": {"a": "b"}}}
    assert await fresh.ensure(other) is True, "a child the operator's manager owns nothing of"


async def test_a_field_removed_from_the_manifest_disappears_from_the_child() -> None:
    client = EmulatorClient()
    applier = Applier(client, client.watch_view)  # type: ignore[arg-type]
    await applier.ensure(service(sessionAffinity="ClientIP"))
    assert stored(client)["spec"]["sessionAffinity"] == "ClientIP"
    assert await applier.ensure(service()) is True
    assert "sessionAffinity" not in stored(client)["spec"]


async def test_a_hand_edit_of_an_owned_field_is_reverted_and_other_fields_are_kept() -> None:
    client = EmulatorClient()
    applier = Applier(client, client.watch_view)  # type: ignore[arg-type]
    await applier.ensure(service())
    client.emu.patch_object(
        "v1", "Service", "s", "ns", {"spec": {"selector": {"pool": "hijacked"}}}, field_manager="kubectl-patch"
    )
    assert await applier.ensure(service()) is True, "drift of an owned field is seen from managedFields"
    assert stored(client)["spec"]["selector"] == {"pool": "redrafter"}
    assert await applier.ensure(service()) is False


async def test_the_watch_view_from_before_an_apply_is_not_taken_for_drift() -> None:
    client = EmulatorClient()
    view: dict[str, Any] = {"of": client.watch_view}
    applier = Applier(client, lambda m: view["of"](m))  # type: ignore[arg-type]
    await applier.ensure(service())
    client.emu.patch_object(
        "v1", "Service", "s", "ns", {"spec": {"selector": {"pool": "hijacked"}}}, field_manager="kubectl-patch"
    )
    drifted = client.watch_view(service())
    assert await applier.ensure(service()) is True
    view["of"] = lambda m: drifted  # the repair's watch event has not arrived yet
    assert await applier.ensure(service()) is False
    view["of"] = lambda m: ChildState("999", drifted.owned_fields if drifted else "")  # a later edit: drift again
    assert await applier.ensure(service()) is True


def deployment(image: str = "triton:1") -> dict[str, Any]:
    labels = {"app": "d"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d", "namespace": "ns"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "triton", "image": image}]}},
        },
    }


def carried(applier: Applier, seen: dict[str, Any]) -> str:
    fact = DeploymentFact.from_body(seen)
    state = ChildState(fact.resource_version, fact.owned_fields, fact.owned_content)
    return applier.carried("Deployment", "ns", "d", fact.generation, state)


async def test_which_manifest_a_deployment_carries_follows_the_apply_its_echo_and_drift() -> None:
    """What tells GitOps health that a Deployment runs this step's template (the rollout check)."""
    client = EmulatorClient()
    applier = Applier(client, client.watch_view)  # type: ignore[arg-type]
    await applier.ensure(deployment())
    v1 = client.emu.get_object("apps/v1", "Deployment", "d", "ns")
    assert carried(applier, v1) == manifest_hash(deployment())
    await applier.ensure(deployment("triton:2"))  # a new template: generation 2
    assert carried(applier, v1) == "", "the watch still shows generation 1: not the new manifest"
    v2 = client.emu.get_object("apps/v1", "Deployment", "d", "ns")
    assert v2["metadata"]["generation"] == 2 and carried(applier, v2) == manifest_hash(deployment("triton:2"))
    client.emu.patch_object(
        "apps/v1", "Deployment", "d", "ns", {"status": {"observedGeneration": 2}}, subresource="status"
    )
    status_only = client.emu.get_object("apps/v1", "Deployment", "d", "ns")
    assert carried(applier, status_only) == manifest_hash(deployment("triton:2")), "status is not drift"
    client.emu.patch_object(
        "apps/v1",
        "Deployment",
        "d",
        "ns",
        {"spec": {"template": {"spec": {"containers": [{"name": "triton", "image": "evil"}]}}}},
        patch_type="strategic",
        field_manager="kubectl-edit",
    )
    edited = client.emu.get_object("apps/v1", "Deployment", "d", "ns")
    assert carried(applier, edited) == "", "a hand edit of the template: not the operator's manifest"
    restarted = Applier(client, client.watch_view)  # type: ignore[arg-type]
    assert carried(restarted, v2) == manifest_hash(deployment("triton:2")), "a restarted operator reads its fields"
    assert carried(restarted, edited) != manifest_hash(deployment("triton:2"))


async def test_a_deleted_child_is_applied_again_at_once() -> None:
    client = EmulatorClient()
    applier = Applier(client, client.watch_view)  # type: ignore[arg-type]
    await applier.ensure(service())
    client.emu.delete_object("v1", "Service", "s", "ns")
    applier.deleted(service())  # what the controller does on the DELETED event
    assert await applier.ensure(service()) is True
    assert stored(client)["spec"]["selector"] == {"pool": "redrafter"}


async def test_children_written_by_an_earlier_version_are_adopted_whole() -> None:
    """Before server-side apply the operator created and merge-patched children as the client library's
    User-Agent ("OpenAPI-Generator"): its first apply takes those fields over, so it removes what it no
    longer sets, and leaves other managers' fields alone."""
    client = EmulatorClient()
    old = service(sessionAffinity="ClientIP")
    old["spec"]["ports"].append({"name": "legacy", "port": 9000})
    client.emu.create_object(old, field_manager="OpenAPI-Generator")
    client.emu.patch_object(
        "v1", "Service", "s", "ns", {"metadata": {"annotations": {"team": "x"}}}, field_manager="kubectl-annotate"
    )
    applier = Applier(client, client.watch_view)  # type: ignore[arg-type]
    assert await applier.ensure(service()) is True
    assert [c[2] for c in client.calls] == [APPLY_PATCH, JSON_PATCH, APPLY_PATCH], "apply, hand over, apply"
    obj = stored(client)
    assert [p["name"] for p in obj["spec"]["ports"]] == ["http"] and "sessionAffinity" not in obj["spec"]
    assert obj["metadata"]["annotations"] == {"team": "x"}
    assert {e["manager"] for e in obj["metadata"]["managedFields"]} == {FIELD_MANAGER, "kubectl-annotate"}
    assert await applier.ensure(service()) is False


async def test_create_only_never_patches_an_existing_job() -> None:
    client = EmulatorClient()
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "j", "namespace": "ns"},
        "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}},
    }
    client.emu.create_object(job)
    applier = Applier(client, lambda m: None)  # type: ignore[arg-type]
    assert await applier.create(job) is False
    assert [c[0] for c in client.calls] == ["POST"]
    assert await applier.create(job) is False, "remembered"
    assert len(client.calls) == 1


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

    class Client(EmulatorClient):
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


async def test_every_rendered_child_is_in_sync_after_a_restart() -> None:
    """The operator's real children (Deployments with keyed containers, ports, volumes; Services; ConfigMaps;
    NetworkPolicies), applied once, are recognised from their managed fields by a fresh process."""
    from test_pod_security import children, load  # same dir

    from redrafter_operator.controller.facts import DeploymentFact

    owner = load(ROOT / "examples" / "llama3-8b.yaml", **{"serving.networkPolicy": {"enabled": True}})
    docs = [d for d in children(owner, active="base", canary=True) if d["kind"] != "Job"]
    client = EmulatorClient()

    def view(m: Mapping[str, Any]) -> ChildState | None:
        obj = client.emu.find_object(m["apiVersion"], m["kind"], m["metadata"]["name"], m["metadata"]["namespace"])
        if obj is None:
            return None
        fact = DeploymentFact.from_body(obj) if m["kind"] == "Deployment" else ObjectFact.from_body(obj)
        return ChildState(fact.resource_version, fact.owned_fields, fact.owned_content)

    first = Applier(client, view)  # type: ignore[arg-type]
    for doc in docs:
        assert await first.ensure(doc) is True
    client.calls.clear()
    restarted = Applier(client, view)  # type: ignore[arg-type]
    assert [d["metadata"]["name"] for d in docs if await restarted.ensure(d)] == []
    assert client.calls == []
