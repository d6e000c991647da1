"""The operator as the tests run it: in-process (kopf in a task of the test's loop), under the identity the Helm
chart gives it — its ServiceAccount bound to the chart's own ClusterRole or, with ``watchNamespaces``, Roles — so a
verb the chart does not grant fails the test as it would fail on a cluster."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from redrafter_operator.controller.main import RunOptions, run_operator
from redrafter_operator.controller.reconciler import Controller
from redrafter_sim.chartrbac import chart_rbac

from .cluster import Kube
from .waiting import until


def chart_identity(kube: Kube, watch_namespaces: list[str] | None = None, values: dict[str, Any] | None = None) -> Path:
    """Apply the chart's ServiceAccount and RBAC (release ``rdo-<namespace>`` in the test's namespace) and return
    a kubeconfig holding a bound token of that ServiceAccount."""
    rbac, account = chart_rbac(f"rdo-{kube.namespace}", kube.namespace, watch_namespaces, values)
    kube.apply(*rbac)
    return kube.cp.service_account_kubeconfig(kube.home / "operator.kubeconfig", kube.namespace, account)


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
