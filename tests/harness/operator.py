"""The operator as the tests run it: in-process (kopf in a task of the test's loop), under the identity the Helm
chart gives it — its ServiceAccount bound to the chart's own ClusterRole or, with ``watchNamespaces``, Roles — so a
verb the chart does not grant fails the test as it would fail on a cluster."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

from redrafter_operator.controller.main import RunOptions, run_operator
from redrafter_operator.controller.reconciler import Controller

from .cluster import ROOT, Kube
from .waiting import until

CHART = ROOT / "charts" / "redrafter-operator"
RBAC_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}


def chart_objects(release: str, namespace: str, values: dict[str, Any]) -> list[dict[str, Any]]:
    """The chart rendered by Helm's own engine (helm-python-sdk), its test hooks left out."""
    with helm.Chart.load(CHART) as chart:
        rendered = chart.render(values, name=release, namespace=namespace, is_install=True, is_upgrade=False)
    out = []
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            hook = ((doc or {}).get("metadata", {}).get("annotations") or {}).get("helm.sh/hook")
            if doc and hook != "test":
                out.append(doc)
    return out


def chart_identity(kube: Kube, watch_namespaces: list[str] | None = None, values: dict[str, Any] | None = None) -> Path:
    """Apply the chart's ServiceAccount and RBAC (release ``rdo-<namespace>`` in the test's namespace) and return
    a kubeconfig holding a bound token of that ServiceAccount."""
    release = f"rdo-{kube.namespace}"
    vals = {**(values or {}), "watchNamespaces": watch_namespaces or []}
    rbac = [o for o in chart_objects(release, kube.namespace, vals) if o["kind"] in RBAC_KINDS]
    for obj in rbac:
        if obj["kind"] in ("ServiceAccount", "RoleBinding", "Role") and not obj["metadata"].get("namespace"):
            obj["metadata"]["namespace"] = kube.namespace
    kube.apply(*rbac)
    (sa,) = [o["metadata"]["name"] for o in rbac if o["kind"] == "ServiceAccount"]
    return kube.cp.service_account_kubeconfig(kube.home / "operator.kubeconfig", kube.namespace, sa)


class InProcessOperator:
    """Start and stop ``run_operator`` as a task; ``controller`` is the live one (None while stopped)."""

    def __init__(
        self,
        kubeconfig: Path,
        namespaces: list[str],
        resync: float = 300.0,
        clock: Any = None,
        on_controller: Callable[[Controller], None] | None = None,
        **options: Any,
    ) -> None:
        self.opts = RunOptions(namespaces=namespaces, kubeconfig=str(kubeconfig), resync_seconds=resync, **options)
        self.clock = clock
        self.on_controller = on_controller
        self.task: asyncio.Task[None] | None = None
        self.controller: Controller | None = None

    def _keep(self, c: Controller) -> None:
        if self.on_controller is not None:
            self.on_controller(c)
        self.controller = c

    async def start(self) -> None:
        self.task = asyncio.create_task(run_operator(self.opts, on_controller=self._keep, clock=self.clock))
        await until(
            lambda: self.controller is not None or self.task is None or self.task.done(), what="operator start-up"
        )
        if self.task.done():
            self.task.result()  # raises what stopped it

    async def stop(self) -> None:
        if self.task is None:
            return
        self.task.cancel()
        try:
            async with asyncio.timeout(15):
                await self.task
        except (asyncio.CancelledError, TimeoutError):
            pass
        self.task, self.controller = None, None
