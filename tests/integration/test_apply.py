"""The operator's server-side apply (``Applier``) against the real kube-apiserver: its managedFields, the removal of
fields an apply no longer sets, other field managers' edits, and the hand-over of fields an earlier operator
version wrote. The Applier talks through the operator's own client (``KubeClient``) with the admin's kubeconfig,
recorded request by request; the watch is a GET of the object turned into what the controller's indexes hold.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.cluster import Kube
from redrafter_operator.controller.apply import (
    APPLY_PATCH,
    JSON_PATCH,
    MERGE_PATCH,
    Applier,
    ChildState,
    KubeClient,
    object_path,
)
from redrafter_operator.controller.facts import DeploymentFact, ObjectFact
from redrafter_operator.controller.fingerprints import FIELD_MANAGER, manifest_hash
from redrafter_operator.controller.preview import planned_children
from redrafter_operator.kubeconfig import load_configuration

ROOT = Path(__file__).resolve().parents[2]
STRATEGIC = "application/strategic-merge-patch+json"

pytestmark = pytest.mark.timeout(300)


class Recorded:
    """The operator's own API client (what the controller gives its Applier), as the admin, recording each
    request as (method, path, content type)."""

    def __init__(self, client: KubeClient, kube: Kube) -> None:
        self.client, self.kube = client, kube
        self.calls: list[tuple[str, str, str]] = []

    async def request(
        self, method: str, path: str, body: Any = None, *, content_type: str = "application/json", **kw: Any
    ) -> dict[str, Any]:
        self.calls.append((method, path, content_type))
        return await self.client.request(method, path, body, content_type=content_type, **kw)

    def watch_view(self, m: Mapping[str, Any]) -> ChildState | None:
        """What an up-to-date watch shows of a child (the controller reads it from its kopf indexes)."""
        obj = self.kube.get(object_path(m))
        if obj is None:
            return None
        fact = ObjectFact.from_body(obj)
        return ChildState(fact.resource_version, fact.owned_fields, fact.owned_content)


@pytest.fixture
async def client(kube: Kube) -> AsyncIterator[Recorded]:
    api = KubeClient(await load_configuration(str(kube.kubeconfig)))
    try:
        yield Recorded(api, kube)
    finally:
        await api.close()


def edit(
    kube: Kube,
    manifest: Mapping[str, Any],
    body: Any,
    manager: str | None = "kubectl-edit",
    content_type: str = MERGE_PATCH,
    subresource: str = "",
) -> dict[str, Any]:
    """Another field manager's PATCH as the admin (``kubectl edit``/``label``/``patch`` send these)."""
    path = object_path(manifest) + (f"/{subresource}" if subresource else "")
    query = f"?{urllib.parse.urlencode({'fieldManager': manager})}" if manager else ""
    return kube.cp.request("PATCH", path + query, body, content_type=content_type)


def create(kube: Kube, manifest: Mapping[str, Any], manager: str) -> dict[str, Any]:
    """A POST as the admin, recorded in managedFields as an Update by ``manager``."""
    path = object_path(manifest, collection=True) + f"?fieldManager={manager}"
    return kube.cp.request("POST", path, dict(manifest))


def service(ns: str, selector: str = "redrafter", name: str = "s", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": ns, "labels": {"a": "b"}},
        "spec": {"selector": {"pool": selector}, "ports": [{"name": "http", "port": 8000}], **spec},
    }


def deployment(ns: str, image: str = "triton:1") -> dict[str, Any]:
    labels = {"app": "d"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d", "namespace": ns},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "triton", "image": image}]}},
        },
    }


def stored(kube: Kube, manifest: Mapping[str, Any] | None = None) -> dict[str, Any]:
    obj = kube.get(object_path(manifest or service(kube.namespace)))
    assert obj is not None
    return obj


def operator_fields(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The fieldsV1 of the operator's Apply entry."""
    (entry,) = [
        e for e in obj["metadata"]["managedFields"] if e["manager"] == FIELD_MANAGER and e["operation"] == "Apply"
    ]
    return entry["fieldsV1"]


async def test_ensure_applies_server_side_then_writes_nothing_while_in_sync(kube: Kube, client: Recorded) -> None:
    ns = kube.namespace
    applier = Applier(client, lambda m: None)  # type: ignore[arg-type]  # a watch that has not caught up
    assert await applier.ensure(service(ns)) is True
    assert client.calls == [("PATCH", f"/api/v1/namespaces/{ns}/services/s", APPLY_PATCH)]
    obj = stored(kube)
    assert [(e["manager"], e["operation"]) for e in obj["metadata"]["managedFields"]] == [(FIELD_MANAGER, "Apply")]
    assert await applier.ensure(service(ns)) is False, "the watch has not echoed the apply yet: no second write"
    applier = Applier(client, client.watch_view)  # type: ignore[arg-type]
    assert await applier.ensure(service(ns)) is False, "a restarted operator sees its fields hold the manifest"
    assert stored(kube)["metadata"]["resourceVersion"] == obj["metadata"]["resourceVersion"]
    # status or another manager's fields change: the operator's owned fields do not, nothing to do
    edit(kube, service(ns), {"metadata": {"labels": {"team": "x"}}}, manager="kubectl-label")
    assert await applier.ensure(service(ns)) is False
    assert len(client.calls) == 1


async def test_a_restarted_operator_applies_only_what_differs_from_its_fields(kube: Kube, client: Recorded) -> None:
    """After a restart nothing is in memory: the watched child's fields owned by the operator's manager
    decide. Equal to the manifest: no apply; a changed manifest, a field another manager took, or a child
    the operator never applied: one apply."""
    ns = kube.namespace
    await Applier(client, client.watch_view).ensure(deployment(ns))  # type: ignore[arg-type]
    await Applier(client, client.watch_view).ensure(service(ns, sessionAffinity="ClientIP"))  # type: ignore[arg-type]
    # other managers' fields and status are not the operator's (the real Deployment controller writes both too)
    edit(kube, deployment(ns), {"metadata": {"annotations": {"rev": "1"}}}, manager="kcm")
    edit(kube, deployment(ns), {"status": {"observedGeneration": 1}}, manager=None, subresource="status")
    client.calls.clear()
    restarted = Applier(client, client.watch_view)  # type: ignore[arg-type]
    assert await restarted.ensure(deployment(ns)) is False
    assert await restarted.ensure(service(ns, sessionAffinity="ClientIP")) is False
    assert client.calls == []
    assert await restarted.ensure(service(ns)) is True, "a field the manifest no longer sets must be removed"
    # the real API server defaults the field again once nobody sets it: its value, not its presence, is removed
    assert stored(kube)["spec"]["sessionAffinity"] == "None"
    assert "f:sessionAffinity" not in operator_fields(stored(kube))["f:spec"]
    edit(
        kube,
        deployment(ns),
        {"spec": {"template": {"spec": {"containers": [{"name": "triton", "image": "evil"}]}}}},
        content_type=STRATEGIC,
    )
    again = Applier(client, client.watch_view)  # type: ignore[arg-type]
    assert await again.ensure(deployment(ns)) is True, "a field another manager took is drift"
    assert await again.ensure(deployment(ns, "triton:2")) is True
    fresh = Applier(client, client.watch_view)  # type: ignore[arg-type]
    assert await fresh.ensure(deployment(ns, "triton:2")) is False
    create(kube, service(ns, name="t"), manager="kubectl")
    assert await fresh.ensure(service(ns, name="t")) is True, "a child the operator's manager owns nothing of"


async def test_a_field_removed_from_the_manifest_disappears_from_the_child(kube: Kube, client: Recorded) -> None:
    ns = kube.namespace
    applier = Applier(client, client.watch_view)  # type: ignore[arg-type]
    await applier.ensure(service(ns, sessionAffinity="ClientIP", publishNotReadyAddresses=True))
    assert stored(kube)["spec"]["sessionAffinity"] == "ClientIP"
    assert stored(kube)["spec"]["publishNotReadyAddresses"] is True
    assert await applier.ensure(service(ns)) is True
    spec = stored(kube)["spec"]
    assert "publishNotReadyAddresses" not in spec, "a field without a default disappears"
    assert spec["sessionAffinity"] == "None", "a defaulted field falls back to the API server's default"
    assert not {"f:sessionAffinity", "f:publishNotReadyAddresses"} & set(operator_fields(stored(kube))["f:spec"])


async def test_a_hand_edit_of_an_owned_field_is_reverted_and_other_fields_are_kept(
    kube: Kube, client: Recorded
) -> None:
    ns = kube.namespace
    applier = Applier(client, client.watch_view)  # type: ignore[arg-type]
    await applier.ensure(service(ns))
    edit(kube, service(ns), {"spec": {"selector": {"pool": "hijacked"}}}, manager="kubectl-patch")
    edit(kube, service(ns), {"metadata": {"labels": {"team": "x"}}}, manager="kubectl-label")
    assert await applier.ensure(service(ns)) is True, "drift of an owned field is seen from managedFields"
    obj = stored(kube)
    assert obj["spec"]["selector"] == {"pool": "redrafter"}
    assert obj["metadata"]["labels"] == {"a": "b", "team": "x"}, "another manager's field is kept"
    assert await applier.ensure(service(ns)) is False


async def test_the_watch_view_from_before_an_apply_is_not_taken_for_drift(kube: Kube, client: Recorded) -> None:
    ns = kube.namespace
    view: dict[str, Any] = {"of": client.watch_view}
    applier = Applier(client, lambda m: view["of"](m))  # type: ignore[arg-type]
    await applier.ensure(service(ns))
    edit(kube, service(ns), {"spec": {"selector": {"pool": "hijacked"}}}, manager="kubectl-patch")
    drifted = client.watch_view(service(ns))
    assert await applier.ensure(service(ns)) is True
    view["of"] = lambda m: drifted  # the repair's watch event has not arrived yet
    assert await applier.ensure(service(ns)) is False
    view["of"] = lambda m: ChildState("999", drifted.owned_fields if drifted else "")  # a later edit: drift again
    assert await applier.ensure(service(ns)) is True


def carried(applier: Applier, ns: str, seen: dict[str, Any]) -> str:
    fact = DeploymentFact.from_body(seen)
    state = ChildState(fact.resource_version, fact.owned_fields, fact.owned_content)
    return applier.carried("Deployment", ns, "d", fact.generation, state)


async def test_which_manifest_a_deployment_carries_follows_the_apply_its_echo_and_drift(
    kube: Kube, client: Recorded
) -> None:
    """What tells GitOps health that a Deployment runs this step's template (the rollout check)."""
    ns = kube.namespace
    applier = Applier(client, client.watch_view)  # type: ignore[arg-type]
    await applier.ensure(deployment(ns))
    v1 = stored(kube, deployment(ns))
    assert carried(applier, ns, v1) == manifest_hash(deployment(ns))
    await applier.ensure(deployment(ns, "triton:2"))  # a new template: generation 2
    assert carried(applier, ns, v1) == "", "the watch still shows generation 1: not the new manifest"
    v2 = stored(kube, deployment(ns))
    assert v2["metadata"]["generation"] == 2 and carried(applier, ns, v2) == manifest_hash(deployment(ns, "triton:2"))
    edit(kube, deployment(ns), {"status": {"observedGeneration": 2}}, manager=None, subresource="status")
    status_only = stored(kube, deployment(ns))
    assert carried(applier, ns, status_only) == manifest_hash(deployment(ns, "triton:2")), "status is not drift"
    edit(
        kube,
        deployment(ns),
        {"spec": {"template": {"spec": {"containers": [{"name": "triton", "image": "evil"}]}}}},
        content_type=STRATEGIC,
    )
    edited = stored(kube, deployment(ns))
    assert carried(applier, ns, edited) == "", "a hand edit of the template: not the operator's manifest"
    restarted = Applier(client, client.watch_view)  # type: ignore[arg-type]
    assert carried(restarted, ns, v2) == manifest_hash(deployment(ns, "triton:2")), "a restart reads its fields"
    assert carried(restarted, ns, edited) != manifest_hash(deployment(ns, "triton:2"))


async def test_a_deleted_child_is_applied_again_at_once(kube: Kube, client: Recorded) -> None:
    ns = kube.namespace
    applier = Applier(client, client.watch_view)  # type: ignore[arg-type]
    await applier.ensure(service(ns))
    kube.cp.request("DELETE", object_path(service(ns)))
    applier.deleted(service(ns))  # what the controller does on the DELETED event
    assert await applier.ensure(service(ns)) is True
    assert stored(kube)["spec"]["selector"] == {"pool": "redrafter"}


async def test_children_written_by_an_earlier_version_are_adopted_whole(kube: Kube, client: Recorded) -> None:
    """Before server-side apply the operator created and merge-patched children as the client library's
    User-Agent ("OpenAPI-Generator"): its first apply takes those fields over, so it removes what it no
    longer sets, and leaves other managers' fields alone."""
    ns = kube.namespace
    old = service(ns, sessionAffinity="ClientIP")
    old["spec"]["ports"].append({"name": "legacy", "port": 9000})
    create(kube, old, manager="OpenAPI-Generator")
    edit(kube, old, {"metadata": {"annotations": {"team": "x"}}}, manager="kubectl-annotate")
    applier = Applier(client, client.watch_view)  # type: ignore[arg-type]
    assert await applier.ensure(service(ns)) is True
    assert [c[2] for c in client.calls] == [APPLY_PATCH, JSON_PATCH, APPLY_PATCH], "apply, hand over, apply"
    obj = stored(kube)
    assert [p["name"] for p in obj["spec"]["ports"]] == ["http"]
    assert obj["spec"]["sessionAffinity"] == "None", "ClientIP is gone: the API server's default is back"
    assert obj["metadata"]["annotations"] == {"team": "x"}
    assert {e["manager"] for e in obj["metadata"]["managedFields"]} == {FIELD_MANAGER, "kubectl-annotate"}
    assert await applier.ensure(service(ns)) is False


async def test_a_hand_over_raced_by_another_writer_is_tried_again(kube: Kube, client: Recorded) -> None:
    """On a real cluster the Deployment controller writes status right after an apply: the take-over's test of
    the resourceVersion the apply answered then fails (422). The apply again answers the current object and
    the take-over succeeds; the reconcile does not fail, and the earlier version's fields go."""
    ns = kube.namespace
    old = service(ns)
    old["spec"]["ports"].append({"name": "legacy", "port": 9000})
    create(kube, old, manager="OpenAPI-Generator")
    raced = {"done": False}
    request = client.request

    async def racing(method: str, path: str, body: Any = None, **kw: Any) -> dict[str, Any]:
        answer = await request(method, path, body, **kw)
        if kw.get("content_type") == APPLY_PATCH and not raced["done"]:
            raced["done"] = True  # another manager writes between the apply's answer and the take-over
            edit(kube, old, {"metadata": {"labels": {"team": "x"}}}, manager="kubectl-label")
        return answer

    client.request = racing  # type: ignore[method-assign]
    applier = Applier(client, client.watch_view)  # type: ignore[arg-type]
    assert await applier.ensure(service(ns)) is True
    assert [c[2] for c in client.calls] == [APPLY_PATCH, JSON_PATCH, APPLY_PATCH, JSON_PATCH, APPLY_PATCH]
    obj = stored(kube)
    assert [p["name"] for p in obj["spec"]["ports"]] == ["http"]
    assert obj["metadata"]["labels"] == {"a": "b", "team": "x"}, "the other manager's write is kept"
    assert "OpenAPI-Generator" not in {e["manager"] for e in obj["metadata"]["managedFields"]}
    assert await applier.ensure(service(ns)) is False


async def test_an_unfinished_hand_over_is_finished_by_a_restarted_operator(kube: Kube, client: Recorded) -> None:
    """An apply whose take-over did not happen (the process stopped in between, or it failed): the operator's
    fields hold the manifest, yet the earlier version's fields are still there. Not in sync: the next process
    applies and takes them over."""
    ns = kube.namespace
    old = service(ns)
    old["spec"]["ports"].append({"name": "legacy", "port": 9000})
    create(kube, old, manager="OpenAPI-Generator")
    path = object_path(service(ns)) + f"?fieldManager={FIELD_MANAGER}&force=true"
    kube.cp.request("PATCH", path, service(ns), content_type=APPLY_PATCH)  # the apply alone
    assert "legacy" in {p["name"] for p in stored(kube)["spec"]["ports"]}
    restarted = Applier(client, client.watch_view)  # type: ignore[arg-type]
    assert await restarted.ensure(service(ns)) is True
    assert [c[2] for c in client.calls] == [APPLY_PATCH, JSON_PATCH, APPLY_PATCH]
    assert [p["name"] for p in stored(kube)["spec"]["ports"]] == ["http"]
    assert await Applier(client, client.watch_view).ensure(service(ns)) is False  # type: ignore[arg-type]


async def test_create_only_never_patches_an_existing_job(kube: Kube, client: Recorded) -> None:
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "j", "namespace": kube.namespace},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "i"}]}}},
    }
    create(kube, job, manager="kubectl-create")
    applier = Applier(client, lambda m: None)  # type: ignore[arg-type]
    assert await applier.create(job) is False
    assert [c[0] for c in client.calls] == ["POST"]
    assert await applier.create(job) is False, "remembered"
    assert len(client.calls) == 1


async def test_every_rendered_child_is_in_sync_after_a_restart(kube: Kube, client: Recorded) -> None:
    """The operator's real children (Deployments with keyed containers, ports, volumes and resources; Services;
    ConfigMaps; NetworkPolicies), applied once, are recognised from their managed fields by a fresh process:
    what the API server defaults, normalises or adds is not taken for drift."""
    body = yaml.safe_load((ROOT / "examples" / "llama3-8b.yaml").read_text())
    body["metadata"]["namespace"] = kube.namespace
    body["spec"].setdefault("serving", {})["networkPolicy"] = {"enabled": True}
    # the owner exists, so the garbage collector keeps children whose ownerReferences name it
    owner = kube.cp.request(
        "POST", f"/apis/redrafter.dev/v1alpha1/namespaces/{kube.namespace}/redrafterdeployments", body
    )
    docs = [d for d in planned_children(owner, active="base", canary=True) if d["kind"] != "Job"]
    assert {d["kind"] for d in docs} == {"Deployment", "Service", "ConfigMap", "NetworkPolicy"}

    def view(m: Mapping[str, Any]) -> ChildState | None:
        obj = kube.get(object_path(m))
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
