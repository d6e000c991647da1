"""SubjectAccessReview and SelfSubjectAccessReview (authorization.k8s.io/v1), answered by RBAC.

The emulated API server authenticates bearer tokens (``ApiServerEmulator.add_token``) but does not
authorize its requests; the reviews, though, answer what the RBAC authorizer of a real cluster would from
the Roles, ClusterRoles and bindings stored in the emulator (kubernetes.io/docs/reference/access-authn-authz/rbac/;
the matching is plugin/pkg/auth/authorizer/rbac and pkg/apis/rbac/v1/evaluation_helpers.go):

- ClusterRoleBindings grant everywhere; RoleBindings only in their namespace, with a Role there or a
  ClusterRole; a request for all namespaces (``namespace: ""``) is granted by ClusterRoleBindings only;
- subjects: ``User`` by name, ``Group`` by membership, ``ServiceAccount`` by
  ``system:serviceaccount:<namespace>:<name>`` (the binding's namespace when the subject names none);
- rules: ``*`` matches any group, resource or verb; ``resource/subresource`` and ``*/subresource``;
  ``resourceNames`` when set; ``nonResourceURLs`` exactly or by a trailing ``*``; an aggregated
  ClusterRole's rules are those of the ClusterRoles its ``aggregationRule`` selects (matchLabels);
- ``system:masters`` is allowed everything (the superuser group, before RBAC).

SelfSubjectAccessReview reviews the requester: a bearer token's user (with ``system:authenticated``, and a
ServiceAccount's groups); a client without a known token is the emulator's administrator, whom it never
refuses anything, so its reviews are allowed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

GROUP = "authorization.k8s.io"
KINDS = {"subjectaccessreviews": "SubjectAccessReview", "selfsubjectaccessreviews": "SelfSubjectAccessReview"}
REVIEWS = tuple(KINDS)
SA_PREFIX = "system:serviceaccount:"
SUPERUSER_GROUP = "system:masters"
ADMIN_REASON = "the emulator's unauthenticated client is its administrator"

Obj = Mapping[str, Any]


def user_groups(user: str) -> list[str]:
    """The groups a token's user authenticates with (a ServiceAccount's, as the token authenticator adds)."""
    groups = ["system:authenticated"]
    if user.startswith(SA_PREFIX):
        namespace = user[len(SA_PREFIX) :].split(":", 1)[0]
        groups += ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"]
    return groups


def _applies(subject: Obj, binding_namespace: str, user: str, groups: Iterable[str]) -> bool:
    kind, name = subject.get("kind"), subject.get("name", "")
    if kind == "User":
        return bool(user) and name == user
    if kind == "Group":
        return name in groups
    if kind == "ServiceAccount":
        namespace = subject.get("namespace") or binding_namespace
        return bool(namespace) and user == f"{SA_PREFIX}{namespace}:{name}"
    return False


def _matches(values: Iterable[str], wanted: str) -> bool:
    values = list(values or [])
    return "*" in values or wanted in values


def _resource_matches(rule: Obj, resource: str, subresource: str) -> bool:
    combined = f"{resource}/{subresource}" if subresource else resource
    for r in rule.get("resources") or []:
        if r in ("*", combined) or (subresource and r == f"*/{subresource}"):
            return True
    return False


def rule_allows(rule: Obj, attrs: Obj, non_resource: bool) -> bool:
    if not _matches(rule.get("verbs") or [], str(attrs.get("verb") or "")):
        return False
    if non_resource:
        path = str(attrs.get("path") or "")
        return any(
            u == "*" or u == path or (u.endswith("*") and path.startswith(u[:-1]))
            for u in rule.get("nonResourceURLs") or []
        )
    if rule.get("nonResourceURLs") and not rule.get("resources"):
        return False
    if not _matches(rule.get("apiGroups") or [], str(attrs.get("group") or "")):
        return False
    if not _resource_matches(rule, str(attrs.get("resource") or ""), str(attrs.get("subresource") or "")):
        return False
    names = rule.get("resourceNames") or []
    return not names or str(attrs.get("name") or "") in names


def _cluster_role_rules(role: Obj, cluster_roles: list[Obj]) -> list[Obj]:
    aggregation = role.get("aggregationRule")
    if not aggregation:
        return list(role.get("rules") or [])
    rules: list[Obj] = []
    for selector in aggregation.get("clusterRoleSelectors") or []:
        wanted = selector.get("matchLabels") or {}
        for other in cluster_roles:
            labels = (other.get("metadata") or {}).get("labels") or {}
            if other is not role and all(labels.get(k) == v for k, v in wanted.items()):
                rules += other.get("rules") or []
    return rules


def review(
    spec: Obj,
    *,
    roles: list[Obj],
    cluster_roles: list[Obj],
    role_bindings: list[Obj],
    cluster_role_bindings: list[Obj],
) -> dict[str, Any]:
    """The ``status`` of an access review of ``spec`` (user, groups, resourceAttributes | nonResourceAttributes)."""
    user, groups = str(spec.get("user") or ""), list(spec.get("groups") or [])
    if SUPERUSER_GROUP in groups:
        return {"allowed": True, "reason": f"{SUPERUSER_GROUP} is allowed everything"}
    non_resource = "nonResourceAttributes" in spec and "resourceAttributes" not in spec
    attrs = (spec.get("nonResourceAttributes") if non_resource else spec.get("resourceAttributes")) or {}
    namespace = "" if non_resource else str(attrs.get("namespace") or "")
    by_name = {(r.get("metadata") or {}).get("name"): r for r in cluster_roles}

    def role_rules(ref: Obj, binding_namespace: str) -> list[Obj]:
        if ref.get("kind") == "ClusterRole":
            role = by_name.get(ref.get("name"))
            return _cluster_role_rules(role, cluster_roles) if role else []
        for r in roles:
            meta = r.get("metadata") or {}
            if meta.get("namespace") == binding_namespace and meta.get("name") == ref.get("name"):
                return list(r.get("rules") or [])
        return []

    candidates = [(b, "") for b in cluster_role_bindings]
    if namespace:
        candidates += [(b, namespace) for b in role_bindings if (b.get("metadata") or {}).get("namespace") == namespace]
    for binding, binding_ns in candidates:
        if not any(_applies(s, binding_ns, user, groups) for s in binding.get("subjects") or []):
            continue
        ref = binding.get("roleRef") or {}
        if any(rule_allows(rule, attrs, non_resource) for rule in role_rules(ref, binding_ns)):
            kind = "RoleBinding" if binding_ns else "ClusterRoleBinding"
            where = f'"{(binding.get("metadata") or {}).get("name")}"' + (
                f' in namespace "{binding_ns}"' if binding_ns else ""
            )
            return {
                "allowed": True,
                "reason": f'RBAC: allowed by {kind} {where} of {ref.get("kind")} "{ref.get("name")}"',
            }
    return {"allowed": False}


def invalid(spec: Obj, self_review: bool) -> str | None:
    """Why the API server would refuse the review as Invalid (422), else None."""
    has_resource, has_non_resource = "resourceAttributes" in spec, "nonResourceAttributes" in spec
    if has_resource == has_non_resource:
        return "spec.resourceAttributes: Invalid value: exactly one of nonResourceAttributes or resourceAttributes must be specified"
    if not self_review and not spec.get("user") and not spec.get("groups"):
        return "spec.user: Invalid value: at least one of user or group must be specified"
    return None
