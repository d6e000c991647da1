"""The operator's identity as the Helm chart gives it: the chart rendered by Helm's own engine (helm-python-sdk),
its ServiceAccount and RBAC objects. The demo and the tests apply them and run the operator with a bound token of
that ServiceAccount, so a verb the chart does not grant fails here as it fails on a cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

CHART = Path(__file__).resolve().parents[2] / "charts" / "redrafter-operator"
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")


def chart_objects(release: str, namespace: str, values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The chart's objects for this release, its ``helm test`` hooks left out."""
    with helm.Chart.load(CHART) as chart:
        rendered = chart.render(values or {}, name=release, namespace=namespace, is_install=True, is_upgrade=False)
    out: list[dict[str, Any]] = []
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            hook = ((doc or {}).get("metadata", {}).get("annotations") or {}).get("helm.sh/hook")
            if doc and hook != "test":
                out.append(doc)
    return out


def chart_rbac(
    release: str, namespace: str, watch_namespaces: list[str] | None = None, values: dict[str, Any] | None = None
) -> tuple[list[dict[str, Any]], str]:
    """The chart's ServiceAccount and RBAC objects (each namespaced one with its namespace set), and the
    ServiceAccount's name."""
    vals = {**(values or {}), "watchNamespaces": watch_namespaces or []}
    rbac = [o for o in chart_objects(release, namespace, vals) if o["kind"] in RBAC_KINDS]
    for obj in rbac:
        if obj["kind"] in ("ServiceAccount", "Role", "RoleBinding"):
            obj["metadata"].setdefault("namespace", namespace)
    (account,) = [o["metadata"]["name"] for o in rbac if o["kind"] == "ServiceAccount"]
    return rbac, account
