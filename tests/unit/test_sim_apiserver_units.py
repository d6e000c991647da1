"""Pure pieces of the emulated API server: selectors, JSONPath, patches, CRD schema handling, protobuf."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from redrafter_sim import apiserver_protobuf as pb
from redrafter_sim.apiserver_patch import PatchError, PatchTestFailed, json_patch, merge_patch, strategic_merge_patch
from redrafter_sim.apiserver_resources import types_from_crd
from redrafter_sim.apiserver_schema import apply_defaults, prune, validate
from redrafter_sim.apiserver_selectors import jsonpath, parse_field_selector, parse_label_selector
from redrafter_sim.apiserver_table import human_age, wants_table


def obj(labels: dict[str, str], name: str = "n", namespace: str = "ns") -> dict:
    return {"metadata": {"name": name, "namespace": namespace, "labels": labels}, "status": {"phase": "Running"}}


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        ("a=b", {"a": "b"}, True),
        ("a==b", {"a": "c"}, False),
        ("a!=b", {}, True),
        ("a in (b, c)", {"a": "c"}, True),
        ("a notin (b,c)", {"a": "c"}, False),
        ("a notin (b,c)", {}, True),
        ("a", {"a": ""}, True),
        ("!a", {"a": "x"}, False),
        ("x.io/k=v,a in (b),!c", {"x.io/k": "v", "a": "b"}, True),
        ("", {}, True),
    ],
)
def test_label_selector(selector: str, labels: dict[str, str], expected: bool) -> None:
    assert parse_label_selector(selector)(obj(labels)) is expected


@pytest.mark.parametrize("bad", ["a in b", "a=(b", "=b", "a b"])
def test_label_selector_rejects_garbage(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_label_selector(bad)


def test_field_selector() -> None:
    assert parse_field_selector("metadata.name=n,metadata.namespace=ns")(obj({}))
    assert not parse_field_selector("metadata.name!=n")(obj({}))
    assert parse_field_selector("status.phase=Running")(obj({}))
    assert parse_field_selector("spec.nodeName=")(obj({}))
    with pytest.raises(ValueError):
        parse_field_selector("metadata.name")


def test_jsonpath_subset() -> None:
    doc = {
        "status": {
            "conditions": [{"type": "A", "status": "False"}, {"type": "Ready", "status": "True"}],
            "list": [1, 2],
        }
    }
    assert jsonpath(doc, '.status.conditions[?(@.type=="Ready")].status') == ["True"]
    assert jsonpath(doc, "{.status.list[1]}") == [2]
    assert jsonpath(doc, ".status.list[*]") == [1, 2]
    assert jsonpath(doc, ".status.missing.deeper") == []


def test_merge_patch_rfc7386() -> None:
    assert merge_patch({"a": {"b": 1, "c": 2}, "l": [1]}, {"a": {"b": None, "d": 3}, "l": [2]}) == {
        "a": {"c": 2, "d": 3},
        "l": [2],
    }


def test_strategic_merge_patch_directives() -> None:
    current = {
        "spec": {
            "containers": [
                {"name": "a", "image": "1", "env": [{"name": "X", "value": "1"}]},
                {"name": "b", "image": "1"},
            ],
            "tolerations": [{"key": "t"}],
        },
        "metadata": {"finalizers": ["f1"]},
    }
    patch = {
        "spec": {
            "containers": [
                {"name": "a", "env": [{"name": "Y", "value": "2"}]},
                {"name": "b", "$patch": "delete"},
                {"name": "c", "image": "3"},
            ],
            "tolerations": [{"key": "u"}],
        },
        "metadata": {"finalizers": ["f2"], "$deleteFromPrimitiveList/finalizers": ["f1"]},
    }
    out = strategic_merge_patch(current, patch)
    assert out["spec"]["containers"] == [
        {"name": "a", "image": "1", "env": [{"name": "X", "value": "1"}, {"name": "Y", "value": "2"}]},
        {"name": "c", "image": "3"},
    ]
    assert out["spec"]["tolerations"] == [{"key": "u"}]
    assert out["metadata"]["finalizers"] == ["f2"]


def test_json_patch_ops_and_failures() -> None:
    doc = {"a": [1, 2], "b": {"c": 1}}
    out = json_patch(
        doc,
        [
            {"op": "add", "path": "/a/1", "value": 9},
            {"op": "move", "from": "/b/c", "path": "/d"},
            {"op": "copy", "from": "/d", "path": "/e"},
            {"op": "remove", "path": "/a/0"},
            {"op": "test", "path": "/e", "value": 1},
        ],
    )
    assert out == {"a": [9, 2], "b": {}, "d": 1, "e": 1} and doc == {"a": [1, 2], "b": {"c": 1}}
    with pytest.raises(PatchTestFailed):
        json_patch(doc, [{"op": "test", "path": "/a", "value": []}])
    with pytest.raises(PatchTestFailed):
        json_patch(doc, [{"op": "test", "path": "/missing", "value": 1}])
    with pytest.raises(PatchError):
        json_patch(doc, [{"op": "replace", "path": "/zzz", "value": 1}])
    with pytest.raises(PatchError):
        json_patch(doc, {"op": "add"})


SCHEMA = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "required": ["n"],
            "x-kubernetes-validations": [{"rule": "self.n < self.limit", "message": "n below limit"}],
            "properties": {
                "n": {"type": "integer", "minimum": 0, "exclusiveMaximum": True, "maximum": 10},
                "limit": {"type": "integer", "default": 5},
                "mode": {"type": "string", "enum": ["A", "B"], "nullable": True},
                "port": {"x-kubernetes-int-or-string": True, "anyOf": [{"type": "integer"}, {"type": "string"}]},
                "items": {
                    "type": "array",
                    "items": {"type": "object", "properties": {"k": {"type": "string", "default": "d"}}},
                },
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        },
    },
}


def test_prune_and_defaults() -> None:
    raw = {
        "apiVersion": "x/v1",
        "kind": "K",
        "metadata": {"name": "a", "anything": 1},
        "spec": {"n": 1, "junk": 2, "items": [{"k": "x", "z": 1}, {}], "labels": {"a": "b"}},
        "top": 1,
    }
    out = apply_defaults(prune(raw, SCHEMA, root=True), SCHEMA)
    assert out == {
        "apiVersion": "x/v1",
        "kind": "K",
        "metadata": {"name": "a", "anything": 1},
        "spec": {"n": 1, "limit": 5, "items": [{"k": "x"}, {"k": "d"}], "labels": {"a": "b"}},
    }


@pytest.mark.parametrize(
    ("spec", "field", "reason"),
    [
        ({}, "spec.n", "FieldValueRequired"),
        ({"n": 10}, "spec.n", "FieldValueInvalid"),
        ({"n": -1}, "spec.n", "FieldValueInvalid"),
        ({"n": 1, "mode": "C"}, "spec.mode", "FieldValueNotSupported"),
        ({"n": 1, "port": 1.5}, "spec.port", "FieldValueTypeInvalid"),
        ({"n": 1, "labels": {"a": 1}}, "spec.labels.a", "FieldValueTypeInvalid"),
    ],
)
def test_structural_validation_names_the_field(spec: dict, field: str, reason: str) -> None:
    causes = validate({"metadata": {}, "spec": spec}, SCHEMA)
    assert [(c.field, c.reason) for c in causes][:1] == [(field, reason)]


def test_structural_validation_accepts_valid_and_nullable() -> None:
    assert validate({"spec": {"n": 9, "mode": None, "port": "http"}}, SCHEMA) == []


def test_types_from_crd_and_errors() -> None:
    crd = {
        "metadata": {"name": "ws.e.com"},
        "spec": {
            "group": "e.com",
            "scope": "Cluster",
            "names": {"plural": "ws", "kind": "W"},
            "versions": [
                {"name": "v1", "served": True, "subresources": {"status": {}}},
                {"name": "v0", "served": False},
            ],
        },
    }
    (t,) = types_from_crd(crd)
    assert (t.api_version, t.namespaced, t.status_subresource, t.scale) == ("e.com/v1", False, True, None)
    with pytest.raises(ValueError):
        types_from_crd(
            {
                "spec": {
                    "group": "g",
                    "names": {"plural": "p", "kind": "K"},
                    "scope": "Galaxy",
                    "versions": [{"name": "v1"}],
                }
            }
        )


def _field(number: int, payload: bytes) -> bytes:
    return bytes([number << 3 | 2, len(payload)]) + payload


def test_protobuf_secret_envelope() -> None:
    meta = _field(1, b"s") + _field(11, _field(1, b"k") + _field(2, b"v"))
    secret = _field(1, meta) + _field(2, _field(1, b"token") + _field(2, b"\x00\x01")) + _field(3, b"Opaque")
    body = pb.MAGIC + _field(1, _field(1, b"v1") + _field(2, b"Secret")) + _field(2, secret)
    assert pb.decode(body) == {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "s", "labels": {"k": "v"}},
        "data": {"token": base64.b64encode(b"\x00\x01").decode()},
        "type": "Opaque",
    }
    with pytest.raises(ValueError):
        pb.decode(pb.MAGIC + _field(1, _field(1, b"apps/v1") + _field(2, b"Deployment")))


def test_table_helpers() -> None:
    assert wants_table("application/json;as=Table;v=v1;g=meta.k8s.io,application/json")
    assert not wants_table("application/json")
    import datetime

    now = datetime.datetime(2025, 1, 2, tzinfo=datetime.UTC)
    assert human_age("2025-01-01T23:59:30Z", now) == "30s"
    assert human_age("2025-01-01T23:00:00Z", now) == "60m"
    assert human_age("2024-12-30T00:00:00Z", now) == "3d"


def test_field_sets_round_trip_through_fields_v1_with_members_and_keys() -> None:
    """fieldsV1 as the API server writes it: f:/k:/v: elements, "." for a member that has children."""
    from redrafter_sim.apiserver_apply import field_set, from_fields_v1, path_string, to_fields_v1

    obj = {
        "metadata": {"labels": {"a": "1"}, "finalizers": ["x/y"]},
        "spec": {
            "ports": [{"port": 80, "targetPort": 8000}],
            "selector": {"app": "s"},
            "containers": [{"name": "c", "args": ["--x"], "resources": {}}],
        },
    }
    paths = field_set(obj)
    tree = to_fields_v1(paths)
    assert tree == {
        "f:metadata": {"f:labels": {"f:a": {}}, "f:finalizers": {'v:"x/y"': {}}},
        "f:spec": {
            "f:ports": {'k:{"port":80,"protocol":"TCP"}': {".": {}, "f:port": {}, "f:targetPort": {}}},
            "f:selector": {"f:app": {}},
            "f:containers": {'k:{"name":"c"}': {".": {}, "f:name": {}, "f:args": {}, "f:resources": {}}},
        },
    }
    assert from_fields_v1(tree) == paths
    assert (
        path_string(("f:spec", "f:ports", 'k:{"port":80,"protocol":"TCP"}', "f:targetPort"))
        == '.spec.ports[port=80,protocol="TCP"].targetPort'
    )
    assert path_string(("f:metadata", "f:finalizers", 'v:"x/y"')) == '.metadata.finalizers[="x/y"]'


def test_a_controller_pass_skips_a_deployment_deleted_while_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Deployment deleted between the pass's list and its sync (kubectl delete, garbage collection)."""
    from redrafter_sim import controllers
    from redrafter_sim.apiserver import ApiServerEmulator

    emu = ApiServerEmulator()
    emu.create_object(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "d", "namespace": "default"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"a": "b"}},
                "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}},
            },
        }
    )
    sync = controllers.sync_deployment_pods

    def deleted_first(emu: Any, name: str, namespace: str, **kw: Any) -> Any:
        emu.delete_object("apps/v1", "Deployment", name, namespace)
        return sync(emu, name, namespace, **kw)

    monkeypatch.setattr(controllers, "sync_deployment_pods", deleted_first)
    controllers.reconcile_once(emu, "default")
    assert emu.list_objects("apps/v1", "Deployment", "default") == []
