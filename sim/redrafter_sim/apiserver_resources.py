"""The emulated API server's resource catalogue: built-in kinds, CRD-installed kinds, discovery documents.

A resource type is what discovery advertises and what the store keys objects by. CRDs installed at
runtime add types (with their schema, printer columns and subresources); built-ins are a fixed table
of exactly the kinds the operator, kopf, kubectl and Helm touch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


@dataclass(frozen=True)
class ScaleSpec:
    """Where a kind keeps its replica counts (CRD ``subresources.scale`` or apps/v1 conventions)."""

    spec_replicas_path: str = ".spec.replicas"
    status_replicas_path: str = ".status.replicas"
    label_selector_path: str | None = ".status.selector"


@dataclass(frozen=True)
class ResourceType:
    """One served (group, version, plural) with everything the server needs to handle it."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    singular: str = ""
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    status_subresource: bool = False
    scale: ScaleSpec | None = None
    schema: dict[str, Any] | None = None  # openAPIV3Schema of a CRD version (None: no pruning/validation)
    printer_columns: tuple[dict[str, Any], ...] = ()
    storage_key: tuple[str, str] = ("", "")  # objects of all versions of one (group, plural) share storage
    crd_name: str | None = None
    generation_tracked: bool = True
    extra: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_version(self) -> str:
        return self.api_version

    def discovery_entries(self) -> list[dict[str, Any]]:
        """APIResource entries for this type and its subresources."""
        main = {
            "name": self.plural,
            "singularName": self.singular or self.kind.lower(),
            "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": list(ALL_VERBS),
        }
        if self.short_names:
            main["shortNames"] = list(self.short_names)
        if self.categories:
            main["categories"] = list(self.categories)
        entries = [main]
        if self.status_subresource:
            entries.append(
                {
                    "name": f"{self.plural}/status",
                    "singularName": "",
                    "namespaced": self.namespaced,
                    "kind": self.kind,
                    "verbs": ["get", "patch", "update"],
                }
            )
        if self.scale is not None:
            entries.append(
                {
                    "name": f"{self.plural}/scale",
                    "singularName": "",
                    "namespaced": self.namespaced,
                    "group": "autoscaling",
                    "version": "v1",
                    "kind": "Scale",
                    "verbs": ["get", "patch", "update"],
                }
            )
        return entries


def _builtin(
    group: str,
    version: str,
    plural: str,
    kind: str,
    namespaced: bool = True,
    *,
    short: tuple[str, ...] = (),
    status: bool = False,
    scale: bool = False,
    storage: tuple[str, str] | None = None,
    categories: tuple[str, ...] = (),
) -> ResourceType:
    return ResourceType(
        group=group,
        version=version,
        plural=plural,
        kind=kind,
        namespaced=namespaced,
        singular=kind.lower(),
        short_names=short,
        status_subresource=status,
        scale=ScaleSpec() if scale else None,
        storage_key=storage or (group, plural),
        categories=categories,
        generation_tracked=(storage or (group, plural)) not in NO_GENERATION,
    )


# Kinds without a spec carry no metadata.generation on a real server.
NO_GENERATION = {
    ("", "namespaces"),
    ("", "endpoints"),
    ("", "configmaps"),
    ("", "secrets"),
    ("", "serviceaccounts"),
    ("", "events"),
    ("coordination.k8s.io", "leases"),
    ("rbac.authorization.k8s.io", "roles"),
    ("rbac.authorization.k8s.io", "rolebindings"),
    ("rbac.authorization.k8s.io", "clusterroles"),
    ("rbac.authorization.k8s.io", "clusterrolebindings"),
}


BUILTINS: tuple[ResourceType, ...] = (
    _builtin("", "v1", "namespaces", "Namespace", False, short=("ns",), status=True),
    _builtin("", "v1", "pods", "Pod", short=("po",), status=True, categories=("all",)),
    _builtin("", "v1", "services", "Service", short=("svc",), status=True, categories=("all",)),
    _builtin("", "v1", "endpoints", "Endpoints", short=("ep",)),
    _builtin("", "v1", "configmaps", "ConfigMap", short=("cm",)),
    _builtin("", "v1", "secrets", "Secret"),
    _builtin("", "v1", "serviceaccounts", "ServiceAccount", short=("sa",)),
    _builtin("", "v1", "events", "Event", short=("ev",)),
    _builtin("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", short=("pvc",), status=True),
    _builtin("", "v1", "nodes", "Node", False, short=("no",), status=True),
    _builtin(
        "apps", "v1", "deployments", "Deployment", short=("deploy",), status=True, scale=True, categories=("all",)
    ),
    _builtin("apps", "v1", "replicasets", "ReplicaSet", short=("rs",), status=True, scale=True, categories=("all",)),
    _builtin("apps", "v1", "daemonsets", "DaemonSet", short=("ds",), status=True, categories=("all",)),
    _builtin("apps", "v1", "statefulsets", "StatefulSet", short=("sts",), status=True, scale=True, categories=("all",)),
    _builtin("batch", "v1", "jobs", "Job", status=True, categories=("all",)),
    _builtin("batch", "v1", "cronjobs", "CronJob", short=("cj",), status=True, categories=("all",)),
    _builtin("events.k8s.io", "v1", "events", "Event", short=("ev",), storage=("", "events")),
    _builtin("coordination.k8s.io", "v1", "leases", "Lease"),
    _builtin("rbac.authorization.k8s.io", "v1", "roles", "Role"),
    _builtin("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
    _builtin("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False),
    _builtin("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False),
    _builtin("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", short=("pdb",), status=True),
    _builtin("autoscaling", "v2", "horizontalpodautoscalers", "HorizontalPodAutoscaler", short=("hpa",), status=True),
    _builtin("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", short=("netpol",)),
    _builtin(
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        False,
        short=("crd", "crds"),
        status=True,
    ),
)

CRD_STORAGE_KEY = ("apiextensions.k8s.io", "customresourcedefinitions")


def types_from_crd(crd: dict[str, Any]) -> list[ResourceType]:
    """Every served version of a CustomResourceDefinition as a ResourceType (ValueError if malformed)."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    group, plural, kind = spec.get("group"), names.get("plural"), names.get("kind")
    if not group or not plural or not kind:
        raise ValueError("spec.group, spec.names.plural and spec.names.kind are required")
    scope = spec.get("scope", "Namespaced")
    if scope not in ("Namespaced", "Cluster"):
        raise ValueError(f"spec.scope: Unsupported value: {scope!r}")
    versions = spec.get("versions") or []
    if not versions:
        raise ValueError("spec.versions: Required value")
    result: list[ResourceType] = []
    for ver in versions:
        if not ver.get("served", True):
            continue
        subresources = ver.get("subresources") or {}
        scale_def = subresources.get("scale")
        scale = None
        if scale_def is not None:
            scale = ScaleSpec(
                spec_replicas_path=scale_def.get("specReplicasPath", ".spec.replicas"),
                status_replicas_path=scale_def.get("statusReplicasPath", ".status.replicas"),
                label_selector_path=scale_def.get("labelSelectorPath"),
            )
        schema = (ver.get("schema") or {}).get("openAPIV3Schema")
        result.append(
            ResourceType(
                group=group,
                version=ver["name"],
                plural=plural,
                kind=kind,
                namespaced=scope == "Namespaced",
                singular=names.get("singular") or kind.lower(),
                short_names=tuple(names.get("shortNames") or ()),
                categories=tuple(names.get("categories") or ()),
                status_subresource="status" in subresources,
                scale=scale,
                schema=schema,
                printer_columns=tuple(ver.get("additionalPrinterColumns") or ()),
                storage_key=(group, plural),
                crd_name=(crd.get("metadata") or {}).get("name"),
            )
        )
    return result


def api_versions_doc() -> dict[str, Any]:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}],
    }


def _group_doc(group: str, versions: list[str]) -> dict[str, Any]:
    entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {"name": group, "versions": entries, "preferredVersion": entries[0]}


def api_group_list_doc(types: list[ResourceType]) -> dict[str, Any]:
    groups: dict[str, list[str]] = {}
    for t in types:
        if t.group and t.version not in groups.setdefault(t.group, []):
            groups[t.group].append(t.version)
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [_group_doc(g, vs) for g, vs in groups.items()]}


def api_group_doc(group: str, types: list[ResourceType]) -> dict[str, Any] | None:
    versions: list[str] = []
    for t in types:
        if t.group == group and t.version not in versions:
            versions.append(t.version)
    if not versions:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group_doc(group, versions)}


def resource_list_doc(group: str, version: str, types: list[ResourceType]) -> dict[str, Any] | None:
    matching = [t for t in types if t.group == group and t.version == version]
    if not matching:
        return None
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/{version}" if group else version,
        "resources": [e for t in matching for e in t.discovery_entries()],
    }


def _gv_path(group: str, version: str) -> str:
    return f"api/{version}" if not group else f"apis/{group}/{version}"


def openapi_v3_root(types: list[ResourceType]) -> dict[str, Any]:
    """The /openapi/v3 index: one document per group/version (hash = its content, for client caches)."""
    import hashlib
    import json

    paths: dict[str, Any] = {}
    for gv in sorted({(t.group, t.version) for t in types}):
        doc = openapi_v3_doc(gv[0], gv[1], types)
        digest = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16].upper()
        paths[_gv_path(*gv)] = {"serverRelativeURL": f"/openapi/v3/{_gv_path(*gv)}?hash={digest}"}
    return {"paths": paths}


def openapi_v3_doc(group: str, version: str, types: list[ResourceType]) -> dict[str, Any] | None:
    """A minimal per-group/version OpenAPI v3 document: PATCH operations that accept ``fieldValidation``.

    kubectl reads it to decide that validation happens on the server (so it needs no schemas here);
    CRD kinds include their openAPIV3Schema as a component so ``kubectl explain`` has something to show.
    """
    matching = [t for t in types if t.group == group and t.version == version]
    if not matching:
        return None
    paths: dict[str, Any] = {}
    schemas: dict[str, Any] = {}
    prefix = "/" + _gv_path(group, version)
    for t in matching:
        gvk = {"group": group, "version": version, "kind": t.kind}
        item = (
            f"{prefix}/namespaces/{{namespace}}/{t.plural}/{{name}}"
            if t.namespaced
            else f"{prefix}/{t.plural}/{{name}}"
        )
        paths[item] = {
            "patch": {
                "x-kubernetes-group-version-kind": gvk,
                "x-kubernetes-action": "patch",
                "parameters": [
                    {"name": n, "in": "query", "schema": {"type": "string", "uniqueItems": True}}
                    for n in ("dryRun", "fieldManager", "fieldValidation", "force")
                ],
                "responses": {"200": {"description": "OK"}},
            }
        }
        if t.schema is not None:
            reversed_group = ".".join(reversed(group.split("."))) if group else "io.k8s.api.core"
            schemas[f"{reversed_group}.{version}.{t.kind}"] = {**t.schema, "x-kubernetes-group-version-kind": [gvk]}
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes (emulated)", "version": "v1.33.0"},
        "paths": paths,
        "components": {"schemas": schemas},
    }
