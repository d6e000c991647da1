"""The emulated API server behaves like a real one for raw HTTP, kubectl, kubernetes-asyncio and kopf."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from redrafter_sim.server import EmulatorHandle

REPO = Path(__file__).resolve().parents[2]

WIDGET_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.example.com"},
    "spec": {
        "group": "example.com",
        "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wd"]},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {
                    "status": {},
                    "scale": {"specReplicasPath": ".spec.size", "statusReplicasPath": ".status.size"},
                },
                "additionalPrinterColumns": [
                    {"name": "Size", "type": "integer", "jsonPath": ".spec.size"},
                    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                    {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
                ],
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "required": ["size"],
                                "x-kubernetes-validations": [
                                    {
                                        "rule": "!has(self.tag) || self.size > 1",
                                        "message": "a tagged widget needs size > 1",
                                        "fieldPath": ".tag",
                                    },
                                    {
                                        "rule": "!has(oldSelf.tag) || self.tag == oldSelf.tag",
                                        "message": "tag is immutable",
                                    },
                                ],
                                "properties": {
                                    "size": {"type": "integer", "minimum": 1, "maximum": 10},
                                    "color": {"type": "string", "enum": ["red", "blue"], "default": "blue"},
                                    "tag": {"type": "string", "pattern": "^[a-z]+$"},
                                    "options": {
                                        "type": "object",
                                        "default": {},
                                        "properties": {"retries": {"type": "integer", "default": 3}},
                                    },
                                    "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                                },
                            },
                            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                        },
                    }
                },
            }
        ],
    },
}

WIDGETS = "/apis/example.com/v1/namespaces/default/widgets"
CMS = "/api/v1/namespaces/default/configmaps"


def widget(name: str, size: int = 2, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "example.com/v1",
        "kind": "Widget",
        "metadata": {"name": name},
        "spec": {"size": size, **spec},
    }


def configmap(name: str, labels: dict[str, str] | None = None, **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "labels": labels or {}, **meta},
        "data": {"k": "v"},
    }


class Api:
    """A tiny raw-HTTP client: status code and decoded JSON body of each call."""

    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session, self.url = session, url

    async def __call__(
        self, method: str, path: str, body: Any = None, ctype: str = "application/json", **params: str
    ) -> tuple[int, Any]:
        data = None if body is None else (body if isinstance(body, str) else json.dumps(body))
        async with self.session.request(
            method, self.url + path, data=data, params=params or None, headers={"Content-Type": ctype}
        ) as resp:
            text = await resp.text()
            return resp.status, (json.loads(text) if text.startswith(("{", "[")) else text)


@pytest.fixture
async def api(apiserver: EmulatorHandle) -> Any:
    async with aiohttp.ClientSession() as session:
        yield Api(session, apiserver.url)


async def install_widgets(api: Api) -> None:
    status, body = await api("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", WIDGET_CRD)
    assert status == 201, body


# ---------------------------------------------------------------------------- discovery


async def test_discovery_core_groups_and_namespaces(api: Api) -> None:
    status, doc = await api("GET", "/api")
    assert status == 200 and doc["versions"] == ["v1"]
    _, core = await api("GET", "/api/v1")
    assert core["groupVersion"] == "v1"
    core_names = {r["name"] for r in core["resources"]}
    assert {
        "pods",
        "pods/status",
        "services",
        "configmaps",
        "secrets",
        "endpoints",
        "events",
        "serviceaccounts",
        "namespaces",
    } <= core_names
    _, groups = await api("GET", "/apis")
    group_names = {g["name"] for g in groups["groups"]}
    assert {
        "apps",
        "batch",
        "coordination.k8s.io",
        "events.k8s.io",
        "rbac.authorization.k8s.io",
        "apiextensions.k8s.io",
    } <= group_names
    _, apps = await api("GET", "/apis/apps/v1")
    assert {"deployments", "deployments/status", "deployments/scale"} <= {r["name"] for r in apps["resources"]}
    status, nss = await api("GET", "/api/v1/namespaces")
    assert status == 200 and nss["kind"] == "NamespaceList" and nss["apiVersion"] == "v1"
    assert "default" in {n["metadata"]["name"] for n in nss["items"]}
    status, missing = await api("GET", "/apis/nope.example.com/v1")
    assert status == 404 and missing["kind"] == "Status" and missing["reason"] == "NotFound"


async def test_installed_crd_becomes_discoverable_and_established(api: Api) -> None:
    status, _ = await api("GET", WIDGETS)
    assert status == 404
    await install_widgets(api)
    _, doc = await api("GET", "/apis/example.com/v1")
    names = {r["name"]: r for r in doc["resources"]}
    assert names["widgets"]["kind"] == "Widget" and names["widgets"]["shortNames"] == ["wd"]
    assert "widgets/status" in names and "widgets/scale" in names
    _, crd = await api("GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.com")
    established = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert established == {"NamesAccepted": "True", "Established": "True"}
    status, lst = await api("GET", WIDGETS)
    assert status == 200 and lst["kind"] == "WidgetList" and lst["items"] == []
    status, _ = await api("DELETE", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.com")
    assert status == 200
    status, _ = await api("GET", WIDGETS)
    assert status == 404


# ---------------------------------------------------------------------------- metadata and errors


async def test_writes_set_uid_resource_version_timestamp_generation(api: Api) -> None:
    _, a = await api("POST", CMS, configmap("a"))
    _, b = await api("POST", CMS, configmap("b"))
    meta = a["metadata"]
    assert meta["uid"] and meta["creationTimestamp"].endswith("Z") and "generation" not in meta
    assert meta["namespace"] == "default"
    assert int(b["metadata"]["resourceVersion"]) > int(meta["resourceVersion"])
    _, lst = await api("GET", CMS)
    assert lst["kind"] == "ConfigMapList" and lst["apiVersion"] == "v1"
    assert int(lst["metadata"]["resourceVersion"]) >= int(b["metadata"]["resourceVersion"])
    assert all(i["kind"] == "ConfigMap" and i["apiVersion"] == "v1" for i in lst["items"])
    _, gen = await api("POST", CMS, {"metadata": {"generateName": "gen-"}, "data": {}})
    assert gen["metadata"]["name"].startswith("gen-") and len(gen["metadata"]["name"]) == 9


async def test_generation_counts_spec_changes_only(api: Api) -> None:
    await install_widgets(api)
    _, w = await api("POST", WIDGETS, widget("w1"))
    assert w["metadata"]["generation"] == 1
    _, w = await api("PATCH", f"{WIDGETS}/w1", {"metadata": {"labels": {"x": "y"}}}, "application/merge-patch+json")
    assert w["metadata"]["generation"] == 1
    _, w = await api("PATCH", f"{WIDGETS}/w1/status", {"status": {"phase": "Ready"}}, "application/merge-patch+json")
    assert w["metadata"]["generation"] == 1 and w["status"]["phase"] == "Ready"
    _, w = await api("PATCH", f"{WIDGETS}/w1", {"spec": {"size": 3}}, "application/merge-patch+json")
    assert w["metadata"]["generation"] == 2
    rv = w["metadata"]["resourceVersion"]
    _, same = await api("PATCH", f"{WIDGETS}/w1", {"spec": {"size": 3}}, "application/merge-patch+json")
    assert same["metadata"]["resourceVersion"] == rv, "a no-op patch must not bump resourceVersion"


async def test_error_bodies_are_standard_statuses(api: Api) -> None:
    status, body = await api("GET", f"{CMS}/missing")
    assert (status, body["reason"], body["kind"]) == (404, "NotFound", "Status")
    assert body["message"] == 'configmaps "missing" not found' and body["details"]["name"] == "missing"
    await api("POST", CMS, configmap("dup"))
    status, body = await api("POST", CMS, configmap("dup"))
    assert (status, body["reason"]) == (409, "AlreadyExists")
    status, body = await api("POST", CMS, configmap("Bad_Name"))
    assert (status, body["reason"]) == (422, "Invalid") and "metadata.name" in body["message"]
    status, body = await api("PATCH", f"{CMS}/dup", {"data": {}}, "application/vnd.kubernetes.protobuf")
    assert status == 415
    status, body = await api("GET", CMS, labelSelector="a in (b")
    assert (status, body["reason"]) == (400, "BadRequest")


async def test_stale_resource_version_conflicts_on_put_and_patch(api: Api) -> None:
    _, cm = await api("POST", CMS, configmap("c"))
    stale = cm["metadata"]["resourceVersion"]
    cm["data"] = {"k": "new"}
    status, fresh = await api("PUT", f"{CMS}/c", cm)
    assert status == 200 and fresh["data"] == {"k": "new"}
    status, body = await api("PUT", f"{CMS}/c", cm)
    assert (status, body["reason"]) == (409, "Conflict") and "has been modified" in body["message"]
    status, body = await api(
        "PATCH",
        f"{CMS}/c",
        {"metadata": {"resourceVersion": stale}, "data": {"k": "x"}},
        "application/merge-patch+json",
    )
    assert (status, body["reason"]) == (409, "Conflict")
    status, ok = await api(
        "PATCH",
        f"{CMS}/c",
        {"metadata": {"resourceVersion": fresh["metadata"]["resourceVersion"]}, "data": {"k": "x"}},
        "application/merge-patch+json",
    )
    assert status == 200 and ok["data"] == {"k": "x"}


async def test_json_patch_test_failure_is_422_and_success_applies(api: Api) -> None:
    await api("POST", CMS, configmap("j", finalizers=["a/b"]))
    failing = [
        {"op": "test", "path": "/metadata/finalizers", "value": ["other"]},
        {"op": "remove", "path": "/metadata/finalizers/0"},
    ]
    status, body = await api("PATCH", f"{CMS}/j", failing, "application/json-patch+json")
    assert (status, body["reason"]) == (422, "Invalid")
    passing = [
        {"op": "test", "path": "/metadata/finalizers", "value": ["a/b"]},
        {"op": "add", "path": "/metadata/finalizers/-", "value": "c/d"},
        {"op": "replace", "path": "/data/k", "value": "w"},
    ]
    status, body = await api("PATCH", f"{CMS}/j", passing, "application/json-patch+json")
    assert status == 200 and body["metadata"]["finalizers"] == ["a/b", "c/d"] and body["data"]["k"] == "w"


async def test_status_subresource_isolation(api: Api) -> None:
    await install_widgets(api)
    body = widget("s1")
    body["status"] = {"phase": "Forged"}
    _, w = await api("POST", WIDGETS, body)
    assert "status" not in w, "status on create is dropped when the status subresource is enabled"
    _, w = await api(
        "PATCH",
        f"{WIDGETS}/s1/status",
        {"spec": {"size": 9}, "status": {"phase": "Ready"}},
        "application/merge-patch+json",
    )
    assert w["spec"]["size"] == 2 and w["status"]["phase"] == "Ready"
    _, w = await api(
        "PATCH", f"{WIDGETS}/s1", {"spec": {"size": 4}, "status": {"phase": "Hacked"}}, "application/merge-patch+json"
    )
    assert w["spec"]["size"] == 4 and w["status"]["phase"] == "Ready"
    w["status"] = {"phase": "ViaPut"}
    _, put = await api("PUT", f"{WIDGETS}/s1/status", w)
    assert put["status"]["phase"] == "ViaPut"


async def test_scale_subresource(api: Api) -> None:
    await install_widgets(api)
    await api("POST", WIDGETS, widget("sc", 2))
    _, scale = await api("GET", f"{WIDGETS}/sc/scale")
    assert scale["kind"] == "Scale" and scale["spec"]["replicas"] == 2
    _, scale = await api("PATCH", f"{WIDGETS}/sc/scale", {"spec": {"replicas": 5}}, "application/merge-patch+json")
    assert scale["spec"]["replicas"] == 5
    _, w = await api("GET", f"{WIDGETS}/sc")
    assert w["spec"]["size"] == 5 and w["metadata"]["generation"] == 2


# ---------------------------------------------------------------------------- selectors and watches


async def test_label_and_field_selectors_on_list(api: Api) -> None:
    for name, labels in (("l1", {"app": "a", "tier": "x"}), ("l2", {"app": "b"}), ("l3", {"app": "c", "tier": "y"})):
        await api("POST", CMS, configmap(name, labels))
    await api("POST", "/api/v1/namespaces/other/configmaps", configmap("l4", {"app": "a"}))

    async def names(path: str = "/api/v1/configmaps", **params: str) -> set[str]:
        status, lst = await api("GET", path, **params)
        assert status == 200, lst
        return {i["metadata"]["name"] for i in lst["items"]}

    assert await names(labelSelector="app=a") == {"l1", "l4"}
    assert await names(CMS, labelSelector="app==a") == {"l1"}
    assert await names(CMS, labelSelector="app!=a") == {"l2", "l3"}
    assert await names(CMS, labelSelector="app in (a,c)") == {"l1", "l3"}
    assert await names(CMS, labelSelector="app notin (a, c)") == {"l2"}
    assert await names(CMS, labelSelector="tier") == {"l1", "l3"}
    assert await names(CMS, labelSelector="!tier") == {"l2"}
    assert await names(CMS, labelSelector="app in (a,c),tier=y") == {"l3"}
    assert await names(fieldSelector="metadata.name=l2") == {"l2"}
    assert await names(fieldSelector="metadata.namespace=other") == {"l4"}
    assert await names(CMS, fieldSelector="metadata.name!=l2") == {"l1", "l3"}


async def _read_events(resp: aiohttp.ClientResponse, count: int, timeout: float = 5) -> list[dict[str, Any]]:
    events = []
    async with asyncio.timeout(timeout):
        while len(events) < count:
            line = await resp.content.readline()
            if not line:
                break
            events.append(json.loads(line))
    return events


async def test_watch_resumes_from_resource_version_and_respects_selectors(api: Api, apiserver: EmulatorHandle) -> None:
    _, first = await api("POST", CMS, configmap("w1", {"app": "a"}))
    mark = first["metadata"]["resourceVersion"]
    await api("POST", CMS, configmap("w2", {"app": "a"}))
    await api("POST", CMS, configmap("w3", {"app": "other"}))
    params = {"watch": "true", "resourceVersion": mark, "labelSelector": "app=a"}
    async with api.session.get(api.url + CMS, params=params) as resp:
        assert resp.status == 200
        replay = await _read_events(resp, 1)
        assert [(e["type"], e["object"]["metadata"]["name"]) for e in replay] == [("ADDED", "w2")]
        await api("PATCH", f"{CMS}/w1", {"data": {"k": "2"}}, "application/merge-patch+json")
        await api("PATCH", f"{CMS}/w3", {"metadata": {"labels": {"app": "a"}}}, "application/merge-patch+json")
        await api("PATCH", f"{CMS}/w2", {"metadata": {"labels": {"app": "gone"}}}, "application/merge-patch+json")
        await api("DELETE", f"{CMS}/w1")
        live = await _read_events(resp, 4)
        assert [(e["type"], e["object"]["metadata"]["name"]) for e in live] == [
            ("MODIFIED", "w1"),
            ("ADDED", "w3"),
            ("DELETED", "w2"),
            ("DELETED", "w1"),
        ]
        assert all(e["object"]["kind"] == "ConfigMap" for e in live)
        assert apiserver.emulator.drop_watches() == 1
        assert await resp.content.readline() == b""
    params = {"watch": "true", "fieldSelector": "metadata.name=w3"}
    async with api.session.get(api.url + CMS, params=params) as resp:
        initial = await _read_events(resp, 1)
        assert [(e["type"], e["object"]["metadata"]["name"]) for e in initial] == [("ADDED", "w3")]


async def test_watch_from_expired_resource_version_gets_410(apiserver: EmulatorHandle, api: Api) -> None:
    apiserver.emulator._history = type(apiserver.emulator._history)(maxlen=2)
    for n in range(4):
        await api("POST", CMS, configmap(f"e{n}"))
    async with api.session.get(api.url + CMS, params={"watch": "true", "resourceVersion": "2"}) as resp:
        events = await _read_events(resp, 1)
    assert events[0]["type"] == "ERROR" and events[0]["object"]["code"] == 410


async def test_watch_timeout_seconds_ends_stream(api: Api) -> None:
    async with api.session.get(api.url + CMS, params={"watch": "1", "timeoutSeconds": "1"}) as resp:
        assert await resp.content.read() == b""


# ---------------------------------------------------------------------------- lifecycle


async def test_finalizers_block_deletion_until_removed(api: Api) -> None:
    await api("POST", CMS, configmap("f", finalizers=["example.com/keep"]))
    status, body = await api("DELETE", f"{CMS}/f")
    assert status == 200 and body["metadata"]["deletionTimestamp"]
    status, _ = await api("GET", f"{CMS}/f")
    assert status == 200
    await api("PATCH", f"{CMS}/f", {"metadata": {"finalizers": None}}, "application/merge-patch+json")
    status, _ = await api("GET", f"{CMS}/f")
    assert status == 404


async def test_owner_reference_cascading_delete(api: Api) -> None:
    _, owner = await api("POST", CMS, configmap("owner"))
    _, other = await api("POST", CMS, configmap("other-owner"))

    def ref(obj: dict[str, Any]) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"],
            "controller": True,
        }

    await api("POST", CMS, configmap("child", ownerReferences=[ref(owner)]))
    await api(
        "POST", CMS, configmap("grandchild", ownerReferences=[{**ref(owner), "name": "child", "uid": "placeholder"}])
    )
    _, child = await api("GET", f"{CMS}/child")
    await api(
        "PATCH", f"{CMS}/grandchild", {"metadata": {"ownerReferences": [ref(child)]}}, "application/merge-patch+json"
    )
    await api("POST", CMS, configmap("shared", ownerReferences=[ref(owner), {**ref(other), "controller": False}]))
    await api("DELETE", f"{CMS}/owner")
    _, lst = await api("GET", CMS)
    assert {i["metadata"]["name"] for i in lst["items"]} == {"other-owner", "shared"}
    await api("POST", CMS, configmap("kept", ownerReferences=[ref(other)]))
    await api("DELETE", f"{CMS}/other-owner", {"propagationPolicy": "Orphan"})
    _, kept = await api("GET", f"{CMS}/kept")
    assert kept["metadata"].get("ownerReferences") == []


async def test_server_side_apply_creates_then_merges(api: Api) -> None:
    body = yaml.safe_dump({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}, "data": {"a": "1"}})
    status, created = await api("PATCH", f"{CMS}/ssa", body, "application/apply-patch+yaml", fieldManager="t")
    assert status == 201 and created["data"] == {"a": "1"}
    body = yaml.safe_dump({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}, "data": {"b": "2"}})
    status, merged = await api("PATCH", f"{CMS}/ssa", body, "application/apply-patch+yaml", fieldManager="other")
    assert status == 200 and merged["data"] == {"a": "1", "b": "2"}, "another manager's fields merge in"
    assert merged["metadata"]["uid"] == created["metadata"]["uid"]
    await api("PATCH", f"{CMS}/ssa", {"data": {"m": "3"}}, "application/merge-patch+json")
    body = yaml.safe_dump({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}, "data": {"c": "4"}})
    status, reapplied = await api("PATCH", f"{CMS}/ssa", body, "application/apply-patch+yaml", fieldManager="t")
    assert reapplied["data"] == {"b": "2", "m": "3", "c": "4"}, "a manager's dropped fields are removed"


async def test_strategic_merge_patch_merges_containers_by_name(api: Api) -> None:
    deploy = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"a": "b"}},
            "template": {
                "metadata": {"labels": {"a": "b"}},
                "spec": {
                    "containers": [
                        {"name": "main", "image": "img:1", "ports": [{"containerPort": 8000}]},
                        {"name": "side", "image": "side:1"},
                    ]
                },
            },
        },
    }
    await api("POST", "/apis/apps/v1/namespaces/default/deployments", deploy)
    patch = {
        "spec": {
            "template": {
                "spec": {
                    "$setElementOrder/containers": [{"name": "main"}, {"name": "side"}],
                    "containers": [{"name": "main", "image": "img:2"}],
                }
            }
        }
    }
    status, d = await api(
        "PATCH", "/apis/apps/v1/namespaces/default/deployments/d", patch, "application/strategic-merge-patch+json"
    )
    containers = d["spec"]["template"]["spec"]["containers"]
    assert status == 200 and [(c["name"], c["image"]) for c in containers] == [("main", "img:2"), ("side", "side:1")]
    assert containers[0]["ports"] == [{"containerPort": 8000}]
    assert d["metadata"]["generation"] == 2


async def test_crd_defaulting_pruning_and_validation(api: Api) -> None:
    await install_widgets(api)
    status, w = await api("POST", WIDGETS, {**widget("v1", 2, bogus=1, free={"any": {"thing": 1}}), "junk": True})
    assert status == 201, w
    assert w["spec"]["color"] == "blue" and w["spec"]["options"] == {"retries": 3}
    assert "bogus" not in w["spec"] and "junk" not in w and w["spec"]["free"] == {"any": {"thing": 1}}
    cases = [
        ({"color": "red"}, "spec.size: Required value"),
        ({"size": 11}, "spec.size: Invalid value: 11"),
        ({"size": 0}, "greater than or equal to 1"),
        ({"size": 2, "color": "green"}, 'spec.color: Unsupported value: \'green\': supported values: "red", "blue"'),
        ({"size": 2, "tag": "UP"}, "spec.tag: Invalid value: 'UP'"),
        ({"size": "two"}, "spec.size: Invalid value: 'two'"),
    ]
    for spec, expected in cases:
        status, body = await api("POST", WIDGETS, {**widget("bad"), "spec": spec})
        assert (status, body["reason"]) == (422, "Invalid"), body
        assert expected in body["message"], body["message"]
        assert body["details"]["causes"][0]["field"].startswith("spec.")
    status, body = await api("PATCH", f"{WIDGETS}/v1", {"spec": {"size": 99}}, "application/merge-patch+json")
    assert status == 422 and "spec.size" in body["message"]


async def test_core_events_are_visible_as_events_k8s_io(api: Api) -> None:
    event = {
        "metadata": {"name": "e1"},
        "involvedObject": {"kind": "ConfigMap", "name": "x"},
        "reason": "Built",
        "message": "engine built",
        "type": "Normal",
    }
    await api("POST", "/api/v1/namespaces/default/events", event)
    _, lst = await api("GET", "/apis/events.k8s.io/v1/namespaces/default/events")
    (item,) = lst["items"]
    assert item["apiVersion"] == "events.k8s.io/v1" and item["note"] == "engine built"
    assert item["regarding"]["name"] == "x" and item["reason"] == "Built"


async def test_table_format_carries_printer_columns(api: Api) -> None:
    await install_widgets(api)
    await api("POST", WIDGETS, widget("t1", 3))
    await api(
        "PATCH",
        f"{WIDGETS}/t1/status",
        {"status": {"phase": "Serving", "conditions": [{"type": "Ready", "status": "True"}]}},
        "application/merge-patch+json",
    )
    accept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
    async with api.session.get(api.url + WIDGETS, headers={"Accept": accept}) as resp:
        tab = await resp.json()
    assert tab["kind"] == "Table"
    assert [c["name"] for c in tab["columnDefinitions"]] == ["Name", "Size", "Phase", "Ready"]
    assert tab["rows"][0]["cells"] == ["t1", 3, "Serving", "True"]


# ---------------------------------------------------------------------------- request log and faults


async def test_request_log_and_fault_injection(api: Api, apiserver: EmulatorHandle) -> None:
    emu = apiserver.emulator
    mark = len(emu.request_log)
    emu.inject("PATCH", r"/configmaps/flaky$", 409, times=1)
    emu.inject("*", r"/configmaps/flaky$", 500, times=2)
    await api("POST", CMS, configmap("flaky"))
    statuses = []
    for _ in range(4):
        status, body = await api("PATCH", f"{CMS}/flaky", {"data": {"k": "z"}}, "application/merge-patch+json")
        statuses.append((status, body["reason"] if isinstance(body, dict) and status >= 400 else None))
    assert statuses == [(409, "Conflict"), (500, "InternalError"), (500, "InternalError"), (200, None)]
    log = emu.request_log[mark:]
    assert [r.kind for r in log] == ["write"] * 5
    assert log[0].method == "POST" and log[1].content_type == "application/merge-patch+json"
    assert log[1].status == 409 and log[-1].status == 200 and log[0].user_agent.startswith("Python")
    await api("GET", CMS, labelSelector="a=b")
    assert emu.request_log[-1].kind == "read" and emu.request_log[-1].query == {"labelSelector": "a=b"}
    assert len(emu.writes(mark)) == 5
    assert [r.status for r in emu.requests(mark, method="patch", path=r"/flaky$")] == [409, 500, 500, 200]
    assert emu.requests(mark, kind="write", user_agent="kopf/") == []
    emu.inject("GET", r"/configmaps$", 503, times=5)
    emu.clear_faults()
    assert (await api("GET", CMS))[0] == 200


def test_direct_object_access_is_consistent_with_http(apiserver: EmulatorHandle) -> None:
    emu = apiserver.emulator
    created = emu.create_object(
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "j", "namespace": "ns1"},
            "spec": {"template": {"spec": {"containers": []}}},
        }
    )
    assert created["metadata"]["uid"]
    emu.patch_object("batch/v1", "Job", "j", "ns1", {"status": {"succeeded": 1}}, subresource="status")
    assert emu.get_object("batch/v1", "Job", "j", "ns1")["status"] == {"succeeded": 1}
    assert emu.find_object("v1", "Namespace", "ns1") is not None, "namespaces are created on first use"
    assert [o["metadata"]["name"] for o in emu.list_objects("batch/v1", "Job")] == ["j"]
    emu.delete_object("batch/v1", "Job", "j", "ns1")
    assert emu.find_object("batch/v1", "Job", "j", "ns1") is None


# ---------------------------------------------------------------------------- kubectl


def test_kubectl_lifecycle_of_a_custom_resource(kubectl: Any, tmp_path: Path) -> None:
    crd_file = tmp_path / "crd.yaml"
    crd_file.write_text(yaml.safe_dump(WIDGET_CRD))
    out = kubectl("apply", "-f", str(crd_file), check=True)
    assert "created" in out.stdout
    kubectl("wait", "--for=condition=Established", "crd/widgets.example.com", "--timeout=10s", check=True)
    cr = tmp_path / "w.yaml"
    cr.write_text(yaml.safe_dump(widget("kw", 4)))
    assert "widget.example.com/kw created" in kubectl("apply", "-f", str(cr), check=True).stdout
    assert "unchanged" in kubectl("apply", "-f", str(cr), check=True).stdout
    got = json.loads(kubectl("get", "wd", "kw", "-o", "json", check=True).stdout)
    assert got["spec"] == {"size": 4, "color": "blue", "options": {"retries": 3}}
    kubectl(
        "patch",
        "widget",
        "kw",
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": {"phase": "Serving", "conditions": [{"type": "Ready", "status": "True"}]}}),
        check=True,
    )
    table = kubectl("get", "widgets", check=True).stdout.splitlines()
    assert table[0].split() == ["NAME", "SIZE", "PHASE", "READY"]
    assert table[1].split() == ["kw", "4", "Serving", "True"]
    kubectl("wait", "--for=condition=Ready", "widget/kw", "--timeout=10s", check=True)
    kubectl("wait", "--for=jsonpath={.status.phase}=Serving", "widget/kw", "--timeout=10s", check=True)
    kubectl("scale", "widget/kw", "--replicas=6", check=True)
    assert json.loads(kubectl("get", "wd", "kw", "-o", "json").stdout)["spec"]["size"] == 6
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(widget("bad", 0)))
    result = kubectl("apply", "-f", str(bad))
    assert result.returncode != 0 and "spec.size" in result.stderr
    deleted = kubectl("delete", "widget", "kw", "--timeout=10s", check=True)
    assert "deleted" in deleted.stdout
    assert "NotFound" in kubectl("get", "widget", "kw").stderr


def test_kubectl_builtin_apply_patch_and_label_selection(kubectl: Any, tmp_path: Path) -> None:
    manifest = tmp_path / "cm.yaml"
    docs = [configmap("one", {"tier": "a"}), configmap("two", {"tier": "b"})]
    manifest.write_text(yaml.safe_dump_all(docs))
    kubectl("apply", "-f", str(manifest), check=True)
    names = kubectl("get", "cm", "-l", "tier in (a)", "-o", "name", check=True).stdout.split()
    assert names == ["configmap/one"]
    docs[0]["data"] = {"k": "changed"}
    manifest.write_text(yaml.safe_dump_all(docs))
    out = kubectl("apply", "-f", str(manifest), check=True).stdout
    assert "configmap/one configured" in out and "configmap/two unchanged" in out
    got = json.loads(kubectl("get", "cm", "one", "-o", "json", check=True).stdout)
    assert got["data"] == {"k": "changed"}
    assert "namespace/default" in kubectl("get", "namespaces", "-o", "name", check=True).stdout


@pytest.mark.skipif(
    not (REPO / "crds" / "redrafter.dev_redrafterdeployments.yaml").exists(),
    reason="the ReDrafterDeployment CRD has not been generated yet",
)
def test_kubectl_applies_the_real_crd_and_examples(kubectl: Any) -> None:
    kubectl("apply", "-f", str(REPO / "crds" / "redrafter.dev_redrafterdeployments.yaml"), check=True)
    kubectl(
        "wait", "--for=condition=Established", "crd/redrafterdeployments.redrafter.dev", "--timeout=10s", check=True
    )
    examples = sorted((REPO / "examples").glob("*.yaml"))
    names = []
    for example in examples:
        kubectl("apply", "-f", str(example), check=True)
        names += [d["metadata"]["name"] for d in yaml.safe_load_all(example.read_text()) if d]
    lines = kubectl("get", "rdd", "-A", check=True).stdout.splitlines()
    assert lines[0].split()[:3] == ["NAMESPACE", "NAME", "PHASE"]
    assert sorted(line.split()[1] for line in lines[1:]) == sorted(names)
    for name in names:  # defaults from the CRD schema were applied and nothing was rejected
        obj = json.loads(kubectl("get", "rdd", name, "-o", "json", check=True).stdout)
        assert obj["metadata"]["generation"] == 1 and obj["spec"]


# ---------------------------------------------------------------------------- kubernetes-asyncio


async def test_kubernetes_asyncio_client_crud_and_watch(apiserver: EmulatorHandle, kubeconfig: Path) -> None:
    from kubernetes_asyncio import client, config, watch

    cfg = client.Configuration()
    await config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    async with client.ApiClient(cfg) as api_client:
        core = client.CoreV1Api(api_client)
        nss = await core.list_namespace()
        assert "default" in {n.metadata.name for n in nss.items}
        created = await core.create_namespaced_config_map(
            "default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="ka", labels={"x": "1"}), data={"a": "1"})
        )
        assert created.metadata.uid and created.metadata.resource_version
        patched = await core.patch_namespaced_config_map("ka", "default", {"data": {"b": "2"}})
        assert patched.data == {"a": "1", "b": "2"}
        with pytest.raises(client.ApiException) as err:
            await core.read_namespaced_config_map("nope", "default")
        assert err.value.status == 404 and json.loads(err.value.body)["reason"] == "NotFound"
        apps = client.AppsV1Api(api_client)
        await apps.create_namespaced_deployment(
            "default",
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "dep"},
                "spec": {
                    "replicas": 1,
                    "selector": {"matchLabels": {"a": "b"}},
                    "template": {
                        "metadata": {"labels": {"a": "b"}},
                        "spec": {"containers": [{"name": "c", "image": "i"}]},
                    },
                },
            },
        )
        scale = await apps.patch_namespaced_deployment_scale("dep", "default", {"spec": {"replicas": 3}})
        assert scale.spec.replicas == 3
        listing = await core.list_namespaced_config_map("default", label_selector="x=1")
        w = watch.Watch()
        seen: list[tuple[str, str]] = []

        async def later_delete() -> None:
            await asyncio.sleep(0.2)
            await core.delete_namespaced_config_map("ka", "default")

        deleter = asyncio.create_task(later_delete())
        async with asyncio.timeout(10):
            async for event in w.stream(
                core.list_namespaced_config_map,
                "default",
                resource_version=listing.metadata.resource_version,
                timeout_seconds=5,
            ):
                seen.append((event["type"], event["object"].metadata.name))
                if event["type"] == "DELETED":
                    w.stop()
        await deleter
        assert seen == [("DELETED", "ka")]


# ---------------------------------------------------------------------------- kopf


async def test_kopf_operator_finalizer_status_and_deletion(apiserver: EmulatorHandle, api: Api) -> None:
    import kopf

    await install_widgets(api)
    registry = kopf.OperatorRegistry()
    handled: list[str] = []

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=apiserver.url, insecure=True)

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.watching.server_timeout = 10
        settings.persistence.finalizer = "example.com/test-finalizer"
        settings.posting.enabled = True

    @kopf.on.create("example.com", "v1", "widgets", id="created", registry=registry)
    def created(spec: dict[str, Any], name: str, body: Any, **_: Any) -> dict[str, Any]:
        handled.append(f"create:{name}")
        kopf.info(body, reason="Created", message=f"size {spec['size']}")
        return {"observedSize": spec["size"]}

    @kopf.on.delete("example.com", "v1", "widgets", id="deleted", registry=registry)
    def deleted(name: str, **_: Any) -> None:
        handled.append(f"delete:{name}")

    stop = asyncio.Event()
    task = asyncio.create_task(kopf.operator(registry=registry, standalone=True, clusterwide=True, stop_flag=stop))
    try:
        await api("POST", WIDGETS, widget("k1", 5))

        async def until(predicate: Any, timeout: float = 20) -> Any:
            async with asyncio.timeout(timeout):
                while True:
                    _, obj = await api("GET", f"{WIDGETS}/k1")
                    if predicate(obj):
                        return obj
                    await asyncio.sleep(0.1)

        obj = await until(lambda o: (o.get("status") or {}).get("created", {}).get("observedSize") == 5)
        assert "example.com/test-finalizer" in obj["metadata"]["finalizers"]
        assert handled == ["create:k1"]
        _, events = await api("GET", "/api/v1/namespaces/default/events")
        assert any(e["reason"] == "Created" and e["message"] == "size 5" for e in events["items"])
        await api("DELETE", f"{WIDGETS}/k1")
        async with asyncio.timeout(20):
            while (await api("GET", f"{WIDGETS}/k1"))[0] != 404:
                await asyncio.sleep(0.1)
        assert handled == ["create:k1", "delete:k1"]
    finally:
        stop.set()
        try:
            async with asyncio.timeout(10):
                await task
        except (TimeoutError, asyncio.CancelledError):
            task.cancel()


# ---------------------------------------------------------------------------- simulated built-in controllers


def _job(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": {"app": "builder"}},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "build", "image": "builder:1"}]},
            },
        },
    }


def test_job_controller_helpers_complete_and_fail(apiserver: EmulatorHandle, kubectl: Any) -> None:
    from redrafter_sim import controllers

    emu = apiserver.emulator
    emu.create_object(_job("ok"))
    emu.create_object(_job("bad"))
    controllers.start_job(emu, "ok", "default")
    assert emu.get_object("batch/v1", "Job", "ok", "default")["status"]["active"] == 1
    controllers.complete_job(emu, "ok", "default", message='{"engine": "ready"}')
    kubectl("wait", "--for=condition=Complete", "job/ok", "--timeout=10s", check=True)
    (pod,) = emu.list_objects("v1", "Pod", "default", label_selector="batch.kubernetes.io/job-name=ok")
    assert pod["metadata"]["labels"]["job-name"] == "ok" and pod["status"]["phase"] == "Succeeded"
    assert pod["status"]["containerStatuses"][0]["state"]["terminated"] == {
        **pod["status"]["containerStatuses"][0]["state"]["terminated"],
        "exitCode": 0,
        "message": '{"engine": "ready"}',
    }
    failed = controllers.fail_job(
        emu,
        "bad",
        "default",
        reason="BackoffLimitExceeded",
        message="gave up",
        exit_code=3,
        termination_message="trtllm-build: out of memory",
    )
    assert failed["status"]["failed"] == 1
    assert {c["type"]: (c["status"], c["reason"], c["message"]) for c in failed["status"]["conditions"]}["Failed"] == (
        "True",
        "BackoffLimitExceeded",
        "gave up",
    )
    kubectl("wait", "--for=condition=Failed", "job/bad", "--timeout=10s", check=True)
    pods = json.loads(kubectl("get", "pods", "-l", "job-name=bad", "-o", "json", check=True).stdout)["items"]
    terminated = pods[0]["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["exitCode"], terminated["message"]) == (3, "trtllm-build: out of memory")
    emu.delete_object("batch/v1", "Job", "bad", "default")
    assert emu.list_objects("v1", "Pod", "default", label_selector="job-name=bad") == []


def test_job_pod_failure_policy_is_validated_and_fail_job_applied(
    apiserver: EmulatorHandle, kubectl: Any, tmp_path: Path
) -> None:
    from redrafter_sim import controllers

    policy = {
        "rules": [{"action": "FailJob", "onExitCodes": {"containerName": "build", "operator": "In", "values": [2, 6]}}]
    }
    bad = _job("restarts")
    bad["spec"]["podFailurePolicy"] = policy
    bad["spec"]["template"]["spec"]["restartPolicy"] = "OnFailure"
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(bad))
    result = kubectl("apply", "-f", str(path))
    assert result.returncode != 0
    assert (
        'spec.template.spec.restartPolicy: Invalid value: "OnFailure": only "Never" is supported when '
        "podFailurePolicy is specified" in result.stderr
    )
    emu = apiserver.emulator
    job = _job("strict")
    job["spec"]["backoffLimit"] = 3
    job["spec"]["podFailurePolicy"] = policy
    emu.create_object(job)
    failed = controllers.fail_job(emu, "strict", "default", exit_code=6, termination_message="SOURCE_UNAVAILABLE: x")
    cond = next(c for c in failed["status"]["conditions"] if c["type"] == "Failed")
    assert cond["reason"] == "PodFailurePolicy"
    assert cond["message"].startswith("Container build for pod default/strict-") and cond["message"].endswith(
        "failed with exit code 6 matching FailJob rule at index 0"
    )


def test_deployment_pods_and_service_endpoints(apiserver: EmulatorHandle, kubectl: Any) -> None:
    from redrafter_sim import controllers

    emu = apiserver.emulator
    template = {
        "metadata": {"labels": {"app": "srv", "variant": "redrafter"}},
        "spec": {
            "containers": [{"name": "triton", "image": "triton:1", "ports": [{"name": "http", "containerPort": 8000}]}]
        },
    }
    emu.create_object(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "srv", "namespace": "default"},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "srv"}}, "template": template},
        }
    )
    emu.create_object(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "srv", "namespace": "default"},
            "spec": {"selector": {"app": "srv"}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]},
        }
    )
    pods = controllers.sync_deployment_pods(emu, "srv", "default", max_ready=1)
    assert len(pods) == 2 and sum(controllers.is_pod_ready(p) for p in pods) == 1
    assert all(p["metadata"]["labels"]["variant"] == "redrafter" and p["status"]["podIP"] for p in pods)
    ep = controllers.sync_endpoints(emu, "srv", "default")
    assert len(ep["subsets"][0]["addresses"]) == 1 and len(ep["subsets"][0]["notReadyAddresses"]) == 1
    assert ep["subsets"][0]["ports"][0]["port"] == 8000
    controllers.reconcile_once(emu)
    deploy = emu.get_object("apps/v1", "Deployment", "srv", "default")
    assert deploy["status"]["readyReplicas"] == 2 and deploy["status"]["observedGeneration"] == 1
    kubectl("wait", "--for=condition=Available", "deployment/srv", "--timeout=10s", check=True)
    assert len(controllers.ready_endpoint_ips(emu, "srv", "default")) == 2
    mark = emu.resource_version
    controllers.reconcile_once(emu)
    assert emu.resource_version == mark, "a second pass over a converged cluster writes nothing"
    new_container = {"name": "triton", "image": "triton:2", "ports": [{"name": "http", "containerPort": 8000}]}
    emu.patch_object(
        "apps/v1",
        "Deployment",
        "srv",
        "default",
        {"spec": {"replicas": 3, "template": {"spec": {"containers": [new_container]}}}},
        patch_type="strategic",
    )
    old_names = {p["metadata"]["name"] for p in pods}
    controllers.reconcile_once(emu)
    new_pods = emu.list_objects("v1", "Pod", "default", label_selector="app=srv")
    assert len(new_pods) == 3 and not old_names & {p["metadata"]["name"] for p in new_pods}
    assert {p["spec"]["containers"][0]["image"] for p in new_pods} == {"triton:2"}
    assert len(controllers.ready_endpoint_ips(emu, "srv", "default")) == 3
    assert emu.get_object("apps/v1", "Deployment", "srv", "default")["status"]["observedGeneration"] == 2
    kubectl("delete", "deployment", "srv", check=True)
    assert emu.list_objects("v1", "Pod", "default", label_selector="app=srv") == []


async def test_run_controllers_loop_stops(apiserver: EmulatorHandle) -> None:
    from redrafter_sim import controllers

    emu = apiserver.emulator
    emu.create_object(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "loop", "namespace": "default"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": "loop"}},
                "template": {
                    "metadata": {"labels": {"app": "loop"}},
                    "spec": {"containers": [{"name": "c", "image": "i"}]},
                },
            },
        }
    )
    stop = asyncio.Event()
    task = asyncio.create_task(controllers.run_controllers(emu, stop, interval=0.05))
    async with asyncio.timeout(5):
        while (emu.get_object("apps/v1", "Deployment", "loop", "default").get("status") or {}).get(
            "readyReplicas"
        ) != 1:
            await asyncio.sleep(0.05)
    stop.set()
    await asyncio.wait_for(task, 2)


# ---------------------------------------------------------------------------- Helm and protobuf clients


def test_kubectl_create_sends_protobuf_and_works(kubectl: Any, apiserver: EmulatorHandle) -> None:
    kubectl("create", "configmap", "imperative", "--from-literal=a=b", check=True)
    kubectl("create", "secret", "generic", "creds", "--from-literal=token=s3cr3t", check=True)
    assert apiserver.emulator.get_object("v1", "ConfigMap", "imperative", "default")["data"] == {"a": "b"}
    secret = apiserver.emulator.get_object("v1", "Secret", "creds", "default")
    assert secret["data"] == {"token": "czNjcjN0"} and secret["type"] == "Opaque"
    assert any(r.content_type == "application/vnd.kubernetes.protobuf" for r in apiserver.emulator.request_log)


def _mini_chart(root: Path) -> Path:
    chart = root / "mini"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: mini\nversion: 0.1.0\n")
    (chart / "values.yaml").write_text("greeting: hello\n")
    (chart / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-cm\n"
        "data:\n  greeting: {{ .Values.greeting }}\n"
    )
    return chart


def test_helm_install_upgrade_uninstall(apiserver: EmulatorHandle, kubeconfig: Path, tmp_path: Path) -> None:
    helm_python = pytest.importorskip("helm_python")
    emu = apiserver.emulator
    cfg = helm_python.Config(kubeconfig_path=str(kubeconfig), namespace="default")
    charts = [_mini_chart(tmp_path)]
    real = REPO / "charts" / "redrafter-operator"
    if (real / "Chart.yaml").exists():
        charts.append(real)
    for n, chart in enumerate(charts):
        release = f"r{n}"
        values = {"greeting": "hi"} if chart.name == "mini" else None
        assert cfg.install(str(chart), release, values, namespace="default", timeout=30)["status"] == "deployed"
        assert [r["name"] for r in cfg.list()] == [release]
        if chart.name == "mini":
            assert emu.get_object("v1", "ConfigMap", f"{release}-cm", "default")["data"] == {"greeting": "hi"}
            upgraded = cfg.upgrade(str(chart), release, {"greeting": "yo"}, namespace="default", timeout=30)
            assert upgraded["revision"] == 2
            assert emu.get_object("v1", "ConfigMap", f"{release}-cm", "default")["data"] == {"greeting": "yo"}
        cfg.uninstall(release, timeout=30)
        assert cfg.list() == []
        # what the cluster had before (its namespaces and nodes) and the CRDs Helm keeps stay
        leftovers = [
            o for o in emu.iter_objects() if o["kind"] not in ("Namespace", "Node", "CustomResourceDefinition")
        ]
        assert leftovers == [], "uninstall removes every release object (Helm keeps CRDs)"
    assert not emu.internal_errors


async def test_kopf_survives_injected_errors_and_dropped_watches(apiserver: EmulatorHandle, api: Api) -> None:
    import kopf

    await install_widgets(api)
    emu = apiserver.emulator
    registry = kopf.OperatorRegistry()
    seen: list[tuple[str, int]] = []

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=apiserver.url, insecure=True)

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.networking.error_backoffs = [0.1, 0.2, 0.3]
        settings.watching.reconnect_backoff = 0.1

    @kopf.on.create("example.com", "v1", "widgets", id="seen", registry=registry)
    @kopf.on.update("example.com", "v1", "widgets", id="seen", field="spec.size", registry=registry)
    def observe(spec: dict[str, Any], name: str, **_: Any) -> None:
        seen.append((name, spec["size"]))

    emu.inject("PATCH", r"/widgets/f1$", 500, times=2)
    stop = asyncio.Event()
    task = asyncio.create_task(kopf.operator(registry=registry, standalone=True, clusterwide=True, stop_flag=stop))
    try:
        await api("POST", WIDGETS, widget("f1", 1))

        async def until(predicate: Any, timeout: float = 20) -> None:
            async with asyncio.timeout(timeout):
                while not predicate():
                    await asyncio.sleep(0.05)

        await until(lambda: ("f1", 1) in seen and any(r.method == "PATCH" and r.status == 200 for r in emu.request_log))
        failed = [r for r in emu.request_log if r.method == "PATCH" and r.status == 500]
        assert len(failed) == 2, "both injected faults were hit and kopf retried past them"
        annotations = emu.get_object("example.com/v1", "Widget", "f1", "default")["metadata"]["annotations"]
        assert "kopf.zalando.org/last-handled-configuration" in annotations
        await until(lambda: any(r.kind == "watch" and r.path.endswith("/widgets") for r in emu.request_log))
        watches_before = sum(1 for r in emu.request_log if r.kind == "watch" and "widgets" in r.path)
        assert emu.drop_watches() >= 1
        await until(
            lambda: sum(1 for r in emu.request_log if r.kind == "watch" and "widgets" in r.path) > watches_before
        )
        await api("PATCH", f"{WIDGETS}/f1", {"spec": {"size": 7}}, "application/merge-patch+json")
        await until(lambda: ("f1", 7) in seen)
        assert emu.drop_watches(abort=True) >= 1
        await api("PATCH", f"{WIDGETS}/f1", {"spec": {"size": 8}}, "application/merge-patch+json")
        await until(lambda: ("f1", 8) in seen)
    finally:
        stop.set()
        try:
            async with asyncio.timeout(10):
                await task
        except (TimeoutError, asyncio.CancelledError):
            task.cancel()


def test_standalone_server_cli_serves_kubectl(tmp_path: Path) -> None:
    import subprocess
    import sys
    import time

    kubectl_bin = Path(sys.executable).parent / "kubectl"
    kubeconfig = tmp_path / "kubeconfig"
    crd = tmp_path / "crd.yaml"
    crd.write_text(yaml.safe_dump(WIDGET_CRD))
    proc = subprocess.Popen(
        [sys.executable, "-m", "redrafter_sim.server", "--kubeconfig", str(kubeconfig), "--load", str(crd)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while not kubeconfig.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert kubeconfig.exists(), "the server wrote no kubeconfig"
        result = subprocess.run(
            [
                str(kubectl_bin),
                "--kubeconfig",
                str(kubeconfig),
                "--cache-dir",
                str(tmp_path / "c"),
                "get",
                "crd",
                "-o",
                "name",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert result.stdout.split() == ["customresourcedefinition.apiextensions.k8s.io/widgets.example.com"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
