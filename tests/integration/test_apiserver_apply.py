"""Server-side apply on the emulated API server, against the Kubernetes documentation's examples.

Source: kubernetes.io/docs/reference/using-api/server-side-apply/ (Kubernetes 1.30): "Field management"
(the test-cm ConfigMap and its managedFields), "Conflicts", "Transferring ownership" (the nginx
Deployment handed to a second manager for spec.replicas), "Merge strategy" (associative lists by key)
and "Using server-side apply in a controller" (force). Status bodies after k8s.io/apiserver
fieldmanager/internal/conflict.go.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from test_apiserver import CMS, Api, api  # noqa: F401,I001 (the api fixture, same dir)

APPLY = "application/apply-patch+yaml"
DEPLOYS = "/apis/apps/v1/namespaces/default/deployments"


def cm_config(**data: str) -> str:
    """The docs' ConfigMap (Field management), with the data given."""
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "test-cm", "namespace": "default", "labels": {"test-label": "test"}},
            "data": data,
        }
    )


def nginx(replicas: int | None = 3, **container: Any) -> str:
    """The docs' nginx-deployment.yaml (Transferring ownership)."""
    spec: dict[str, Any] = {
        "selector": {"matchLabels": {"app": "nginx"}},
        "template": {
            "metadata": {"labels": {"app": "nginx"}},
            "spec": {"containers": [{"name": "nginx", "image": "nginx:1.14.2", **container}]},
        },
    }
    if replicas is not None:
        spec["replicas"] = replicas
    return yaml.safe_dump(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "nginx-deployment", "labels": {"app": "nginx"}},
            "spec": spec,
        }
    )


def managers(obj: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(e["manager"], e["operation"]): e["fieldsV1"] for e in obj["metadata"].get("managedFields") or []}


async def test_field_management_records_the_docs_managed_fields(api: Api) -> None:
    status, cm = await api("PATCH", f"{CMS}/test-cm", cm_config(key="some value"), APPLY, fieldManager="kubectl")
    assert status == 201
    entry = cm["metadata"]["managedFields"][0]
    assert {k: entry[k] for k in ("manager", "operation", "apiVersion", "fieldsType")} == {
        "manager": "kubectl",
        "operation": "Apply",
        "apiVersion": "v1",
        "fieldsType": "FieldsV1",
    }
    assert entry["fieldsV1"] == {"f:metadata": {"f:labels": {"f:test-label": {}}}, "f:data": {"f:key": {}}}
    _, got = await api("GET", f"{CMS}/test-cm")
    assert got["metadata"]["managedFields"] == cm["metadata"]["managedFields"], "stored, served on GET"


async def test_a_conflicting_apply_is_refused_with_the_real_status_and_force_takes_the_field(api: Api) -> None:
    await api("PATCH", f"{CMS}/test-cm", cm_config(key="some value"), APPLY, fieldManager="kubectl")
    status, err = await api("PATCH", f"{CMS}/test-cm", cm_config(key="other"), APPLY, fieldManager="other-applier")
    assert status == 409
    assert err["reason"] == "Conflict" and err["code"] == 409
    assert err["message"] == 'Apply failed with 1 conflict: conflict with "kubectl": .data.key'
    assert err["details"]["causes"] == [
        {"reason": "FieldManagerConflict", "message": 'conflict with "kubectl"', "field": ".data.key"}
    ]
    _, cm = await api("GET", f"{CMS}/test-cm")
    assert cm["data"] == {"key": "some value"}, "a refused apply changes nothing"
    # the same value is no conflict: both share the field (and the label)
    status, shared = await api(
        "PATCH", f"{CMS}/test-cm", cm_config(key="some value"), APPLY, fieldManager="other-applier"
    )
    assert status == 200 and set(managers(shared)) == {("kubectl", "Apply"), ("other-applier", "Apply")}
    # force: the field (only it) moves to the forcing manager
    status, forced = await api(
        "PATCH", f"{CMS}/test-cm", cm_config(key="forced"), APPLY, fieldManager="third", force="true"
    )
    assert status == 200 and forced["data"] == {"key": "forced"}
    owners = managers(forced)
    assert owners[("third", "Apply")] == {"f:metadata": {"f:labels": {"f:test-label": {}}}, "f:data": {"f:key": {}}}
    assert owners[("kubectl", "Apply")] == {"f:metadata": {"f:labels": {"f:test-label": {}}}}


async def test_conflicts_with_an_update_manager_name_its_api_version(api: Api) -> None:
    """`kubectl create` (an Update) owns what it set; the docs' message: conflict with "..." using v1."""
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "test-cm"}, "data": {"key": "a", "b": "c"}}
    status, _ = await api("POST", CMS, cm, fieldManager="kubectl-client-side-apply")
    assert status == 201
    status, err = await api("PATCH", f"{CMS}/test-cm", cm_config(key="x", b="y"), APPLY, fieldManager="ssa")
    assert status == 409
    assert err["message"] == (
        'Apply failed with 2 conflicts: conflicts with "kubectl-client-side-apply" using v1:\n- .data.b\n- .data.key'
    )


async def test_removing_a_field_from_the_applied_configuration_removes_it(api: Api) -> None:
    await api("PATCH", f"{CMS}/test-cm", cm_config(key="v", gone="x"), APPLY, fieldManager="kubectl")
    await api(
        "PATCH",
        f"{CMS}/test-cm",
        {"data": {"theirs": "t"}},
        "application/merge-patch+json",
        fieldManager="kubectl-patch",
    )
    status, cm = await api("PATCH", f"{CMS}/test-cm", cm_config(key="v"), APPLY, fieldManager="kubectl")
    assert status == 200 and cm["data"] == {"key": "v", "theirs": "t"}, "another manager's field stays"
    assert managers(cm)[("kubectl-patch", "Update")] == {"f:data": {"f:theirs": {}}}


async def test_transferring_ownership_of_replicas_keeps_the_field(api: Api) -> None:
    status, dep = await api("PATCH", f"{DEPLOYS}/nginx-deployment", nginx(3), APPLY, fieldManager="kubectl")
    assert status == 201 and dep["spec"]["replicas"] == 3
    replicas_only = yaml.safe_dump(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "nginx-deployment"},
            "spec": {"replicas": 3},
        }
    )
    status, dep = await api(
        "PATCH", f"{DEPLOYS}/nginx-deployment", replicas_only, APPLY, fieldManager="handover-to-hpa"
    )
    assert status == 200, "the same value is shared, not a conflict"
    status, dep = await api("PATCH", f"{DEPLOYS}/nginx-deployment", nginx(None), APPLY, fieldManager="kubectl")
    assert status == 200 and dep["spec"]["replicas"] == 3, "still owned by handover-to-hpa: kept"
    owners = managers(dep)
    assert owners[("handover-to-hpa", "Apply")] == {"f:spec": {"f:replicas": {}}}
    assert "f:replicas" not in owners[("kubectl", "Apply")]["f:spec"]
    status, dep = await api(
        "PATCH", f"{DEPLOYS}/nginx-deployment", replicas_only.replace("3", "5"), APPLY, fieldManager="handover-to-hpa"
    )
    assert status == 200 and dep["spec"]["replicas"] == 5, "the new owner changes it without conflicts"


async def test_associative_lists_merge_by_key_and_fields_v1_names_the_keys(api: Api) -> None:
    config = nginx(2, ports=[{"containerPort": 80}], env=[{"name": "A", "value": "1"}, {"name": "B", "value": "2"}])
    _, dep = await api("PATCH", f"{DEPLOYS}/nginx-deployment", config, APPLY, fieldManager="op")
    container = managers(dep)[("op", "Apply")]["f:spec"]["f:template"]["f:spec"]["f:containers"]['k:{"name":"nginx"}']
    assert container["."] == {} and container["f:image"] == {} and container["f:name"] == {}
    assert container["f:ports"] == {'k:{"containerPort":80,"protocol":"TCP"}': {".": {}, "f:containerPort": {}}}
    assert set(container["f:env"]) == {'k:{"name":"A"}', 'k:{"name":"B"}'}
    # a second manager adds a sidecar and an env var: merged by key, not replacing the list
    sidecar = yaml.safe_dump(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "nginx-deployment"},
            "spec": {
                "template": {
                    "spec": {
                        "containers": [
                            {"name": "nginx", "env": [{"name": "C", "value": "3"}]},
                            {"name": "sidecar", "image": "busybox"},
                        ]
                    }
                }
            },
        }
    )
    status, dep = await api("PATCH", f"{DEPLOYS}/nginx-deployment", sidecar, APPLY, fieldManager="mesh")
    assert status == 200
    containers = dep["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["nginx", "sidecar"]
    assert [e["name"] for e in containers[0]["env"]] == ["A", "B", "C"]
    # op drops env B: removed; C (mesh's) stays
    config = nginx(2, ports=[{"containerPort": 80}], env=[{"name": "A", "value": "1"}])
    _, dep = await api("PATCH", f"{DEPLOYS}/nginx-deployment", config, APPLY, fieldManager="op")
    assert [e["name"] for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]] == ["A", "C"]


async def test_updates_record_their_manager_and_take_the_fields_they_change(api: Api) -> None:
    await api(
        "PATCH",
        f"{DEPLOYS}/nginx-deployment",
        nginx(2, env=[{"name": "A", "value": "1"}]),
        APPLY,
        fieldManager="redrafter-operator",
    )
    patch = {
        "spec": {"template": {"spec": {"nodeSelector": {"pool": "spot"}}}},
        "metadata": {"labels": {"app": "nginx"}},
    }
    status, dep = await api(
        "PATCH",
        f"{DEPLOYS}/nginx-deployment",
        patch,
        "application/strategic-merge-patch+json",
        fieldManager="kubectl-patch",
    )
    assert status == 200
    owners = managers(dep)
    assert owners[("kubectl-patch", "Update")] == {
        "f:spec": {"f:template": {"f:spec": {"f:nodeSelector": {"f:pool": {}}}}}
    }, "only what changed"
    entry = next(e for e in dep["metadata"]["managedFields"] if e["manager"] == "kubectl-patch")
    assert entry["operation"] == "Update" and entry["apiVersion"] == "apps/v1" and entry["time"]
    # the image edited by hand: the applier loses it, and a forced re-apply takes it back
    image = [{"op": "replace", "path": "/spec/template/spec/containers/0/image", "value": "nginx:edited"}]
    _, dep = await api(
        "PATCH", f"{DEPLOYS}/nginx-deployment", image, "application/json-patch+json", fieldManager="kubectl-edit"
    )
    assert (
        "f:image"
        not in managers(dep)[("redrafter-operator", "Apply")]["f:spec"]["f:template"]["f:spec"]["f:containers"][
            'k:{"name":"nginx"}'
        ]
    )
    status, err = await api(
        "PATCH",
        f"{DEPLOYS}/nginx-deployment",
        nginx(2, env=[{"name": "A", "value": "1"}]),
        APPLY,
        fieldManager="redrafter-operator",
    )
    assert status == 409 and '"kubectl-edit" using apps/v1' in err["message"]
    assert err["details"]["causes"][0]["field"] == '.spec.template.spec.containers[name="nginx"].image'
    status, dep = await api(
        "PATCH",
        f"{DEPLOYS}/nginx-deployment",
        nginx(2, env=[{"name": "A", "value": "1"}]),
        APPLY,
        fieldManager="redrafter-operator",
        force="true",
    )
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == "nginx:1.14.2"
    assert ("kubectl-edit", "Update") not in managers(dep), "an entry that owns nothing is dropped"
    # no fieldManager: the User-Agent's prefix (k8s.io/apiserver prefixFromUserAgent)
    async with api.session.post(
        api.url + CMS,
        data=json.dumps({"metadata": {"name": "ua"}, "data": {"a": "b"}}),
        headers={"Content-Type": "application/json", "User-Agent": "kopf/1.45.2"},
    ) as resp:
        created = await resp.json()
    assert [e["manager"] for e in created["metadata"]["managedFields"]] == ["kopf"]


async def test_an_identical_apply_writes_nothing_and_bad_apply_requests_are_refused(api: Api) -> None:
    _, first = await api("PATCH", f"{CMS}/test-cm", cm_config(key="v"), APPLY, fieldManager="m")
    _, again = await api("PATCH", f"{CMS}/test-cm", cm_config(key="v"), APPLY, fieldManager="m")
    assert again["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"], "a no-op apply"
    status, err = await api("PATCH", f"{CMS}/test-cm", cm_config(key="v"), APPLY)
    assert status == 422 and "fieldManager: Required value" in err["message"]
    status, err = await api(
        "PATCH", f"{CMS}/test-cm", {"data": {"a": "b"}}, "application/merge-patch+json", force="true"
    )
    assert status == 422 and "force: Forbidden" in err["message"]
    status, err = await api("PATCH", f"{CMS}/test-cm", yaml.safe_dump({"data": {"z": "9"}}), APPLY, fieldManager="m")
    assert status == 400, "an apply configuration names its apiVersion and kind"
    status, dry = await api("PATCH", f"{CMS}/test-cm", cm_config(key="v", z="9"), APPLY, fieldManager="m", dryRun="All")
    assert status == 200 and dry["data"]["z"] == "9"
    _, stored = await api("GET", f"{CMS}/test-cm")
    assert "z" not in stored["data"], "dry runs persist nothing"


def test_kubectl_server_side_apply_conflict_and_force(kubectl: Any, tmp_path: Path) -> None:
    """The pinned kubectl's --server-side path: create, a conflicting apply refused, --force-conflicts."""
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    first.write_text(cm_config(key="some value"))
    second.write_text(cm_config(key="changed"))
    out = kubectl("apply", "--server-side", "-f", str(first), check=True)
    assert "serverside-applied" in out.stdout
    refused = kubectl("apply", "--server-side", "--field-manager=other", "-f", str(second))
    assert refused.returncode != 0
    assert 'Apply failed with 1 conflict: conflict with "kubectl": .data.key' in refused.stderr
    kubectl("apply", "--server-side", "--field-manager=other", "--force-conflicts", "-f", str(second), check=True)
    got = json.loads(kubectl("get", "configmap", "test-cm", "-o", "json", "--show-managed-fields", check=True).stdout)
    assert got["data"]["key"] == "changed"
    assert {e["manager"] for e in got["metadata"]["managedFields"]} == {"kubectl", "other"}


async def test_a_patch_may_move_ownership_and_defaults_come_back_after_a_removal(api: Api) -> None:
    """managedFields sent in an Update are its starting point (k8s.io/apiserver FieldManager.Update): how
    client-go's csaupgrade hands a client-side manager's fields to an applier."""
    svc = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "s"},
        "spec": {"selector": {"app": "a"}, "ports": [{"port": 80}], "sessionAffinity": "ClientIP"},
    }
    _, created = await api("POST", "/api/v1/namespaces/default/services", svc, fieldManager="old-client")
    (entry,) = created["metadata"]["managedFields"]
    moved = [{**entry, "manager": "applier", "operation": "Apply"}]
    status, patched = await api(
        "PATCH",
        "/api/v1/namespaces/default/services/s",
        [{"op": "replace", "path": "/metadata/managedFields", "value": moved}],
        "application/json-patch+json",
        fieldManager="mover",
    )
    assert status == 200 and [(e["manager"], e["operation"]) for e in patched["metadata"]["managedFields"]] == [
        ("applier", "Apply")
    ]
    config = yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "s"},
            "spec": {"selector": {"app": "a"}, "ports": [{"port": 80}]},
        }
    )
    _, applied = await api("PATCH", "/api/v1/namespaces/default/services/s", config, APPLY, fieldManager="applier")
    assert "sessionAffinity" not in applied["spec"], "the applier owned it and no longer applies it"
    assert applied["spec"]["type"] == "ClusterIP" and applied["spec"]["ports"][0]["protocol"] == "TCP", (
        "defaults it no longer applies are defaulted again"
    )
    assert applied["spec"]["clusterIP"] == created["spec"]["clusterIP"]
