"""The emulated API server's access reviews: RBAC's matching rules, from hand-built Roles and bindings."""

from __future__ import annotations

from typing import Any

from redrafter_sim.apiserver_authz import invalid, review, user_groups

SA = "system:serviceaccount:ops:op"


def rules(*triples: tuple[str, str, str], names: list[str] | None = None) -> list[dict[str, Any]]:
    out = [{"apiGroups": [g], "resources": [r], "verbs": [v]} for g, r, v in triples]
    if names:
        for rule in out:
            rule["resourceNames"] = names
    return out


def binding(
    kind: str, name: str, role_kind: str, subjects: list[dict[str, str]], ns: str | None = None
) -> dict[str, Any]:
    meta = {"name": name, **({"namespace": ns} if ns else {})}
    return {"kind": kind, "metadata": meta, "roleRef": {"kind": role_kind, "name": name}, "subjects": subjects}


def ask(spec_attrs: dict[str, str], user: str = SA, groups: list[str] | None = None, **objs: Any) -> bool:
    spec = {
        "user": user,
        "groups": groups if groups is not None else user_groups(user),
        "resourceAttributes": spec_attrs,
    }
    found = review(
        spec,
        roles=objs.get("roles", []),
        cluster_roles=objs.get("cluster_roles", []),
        role_bindings=objs.get("role_bindings", []),
        cluster_role_bindings=objs.get("cluster_role_bindings", []),
    )
    return bool(found["allowed"])


def test_a_role_binding_grants_in_its_namespace_only_and_never_for_all_namespaces() -> None:
    role = {"metadata": {"name": "r", "namespace": "a"}, "rules": rules(("batch", "jobs", "create"))}
    bound = binding("RoleBinding", "r", "Role", [{"kind": "ServiceAccount", "name": "op", "namespace": "ops"}], "a")
    objs = {"roles": [role], "role_bindings": [bound]}
    assert ask({"group": "batch", "resource": "jobs", "verb": "create", "namespace": "a"}, **objs)
    assert not ask({"group": "batch", "resource": "jobs", "verb": "create", "namespace": "b"}, **objs)
    assert not ask({"group": "batch", "resource": "jobs", "verb": "create"}, **objs)  # every namespace
    assert not ask({"group": "batch", "resource": "jobs", "verb": "delete", "namespace": "a"}, **objs)
    assert not ask({"group": "batch", "resource": "jobs", "verb": "create", "namespace": "a"}, user="other", **objs)


def test_cluster_role_binding_subresources_wildcards_names_groups_and_aggregation() -> None:
    status = {"metadata": {"name": "s"}, "rules": rules(("x.dev", "*/status", "patch"))}
    named = {"metadata": {"name": "n"}, "rules": rules(("", "configmaps", "get"), names=["one"])}
    agg = {"metadata": {"name": "agg"}, "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"to": "agg"}}]}}
    part = {"metadata": {"name": "part", "labels": {"to": "agg"}}, "rules": rules(("*", "leases", "*"))}
    crbs = [
        binding("ClusterRoleBinding", "s", "ClusterRole", [{"kind": "Group", "name": "system:serviceaccounts"}]),
        binding("ClusterRoleBinding", "n", "ClusterRole", [{"kind": "User", "name": SA}]),
        binding(
            "ClusterRoleBinding", "agg", "ClusterRole", [{"kind": "ServiceAccount", "name": "op", "namespace": "ops"}]
        ),
    ]
    objs = {"cluster_roles": [status, named, agg, part], "cluster_role_bindings": crbs}
    assert ask({"group": "x.dev", "resource": "things", "subresource": "status", "verb": "patch"}, **objs)
    assert not ask({"group": "x.dev", "resource": "things", "verb": "patch"}, **objs)
    assert ask({"group": "", "resource": "configmaps", "verb": "get", "name": "one", "namespace": "a"}, **objs)
    assert not ask({"group": "", "resource": "configmaps", "verb": "get", "name": "two", "namespace": "a"}, **objs)
    assert ask({"group": "coordination.k8s.io", "resource": "leases", "verb": "update", "namespace": "z"}, **objs)
    assert not ask(
        {"group": "x.dev", "resource": "things", "subresource": "status", "verb": "patch"}, groups=[], **objs
    )
    assert ask({"group": "", "resource": "secrets", "verb": "get"}, user="root", groups=["system:masters"])


def test_a_review_must_name_a_subject_and_one_kind_of_attributes() -> None:
    assert invalid({"resourceAttributes": {}}, self_review=False) is not None
    assert invalid({"resourceAttributes": {}}, self_review=True) is None
    assert invalid({"user": "u", "resourceAttributes": {}, "nonResourceAttributes": {}}, self_review=False) is not None
