"""The operator process: kopf, the controller, its monitors, leader election and the /metrics server, wired.

Namespaced or cluster-wide; standalone, or elected so several replicas run with exactly one active: every
replica runs kopf's watches (warm caches, no writes), only the holder of a ``coordination.k8s.io`` Lease
runs the reconcile workers and monitors (see leader.py). A leader that loses the Lease stops them and the
process ends non-zero (:class:`LeadershipLost`), as client-go based controllers do; Kubernetes restarts it
as a standby. The `run` subcommand's flags are main.py's.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import kopf
from aiohttp import web
from kubernetes_asyncio.client import Configuration

from ..kubeconfig import load_configuration
from ..render import names
from .apply import ApiError, KubeClient
from .clock import Clock, SystemClock
from .handlers import register
from .leader import ElectionConfig, LeaderElector
from .metrics import OperatorMetrics
from .plan_types import Renderers
from .reconciler import Controller, ControllerSettings
from .renderers import default_renderers
from .retention import RetentionMonitor
from .speculation import SpeculationMonitor
from .training import TrainingMonitor

log = logging.getLogger("redrafter_operator.controller")


class LeadershipLost(RuntimeError):
    """The leader could not renew its Lease in time: its loops are stopped and the process must end."""


@dataclass
class RunOptions:
    """What one operator process watches and serves (the `run` flags, parsed)."""

    namespaces: list[str] = field(default_factory=list)
    all_namespaces: bool = False
    election: ElectionConfig | None = None  # None: standalone (exactly one replica must run)
    liveness: str | None = None  # e.g. http://0.0.0.0:8080/healthz
    metrics_port: int | None = None  # None: no /metrics server
    metrics_host: str = "0.0.0.0"
    kubeconfig: str | None = None
    context: str | None = None
    workers: int = 4
    resync_seconds: float = 300.0
    log_level: str = "INFO"
    log_format: str = "plain"
    gpu_node_check: bool = True  # watch Nodes; create a GPU Job only when some node could run it


@dataclass
class Hooks:
    """What a caller other than the command line brings (tests, the development package's demo)."""

    ready_flag: asyncio.Event | None = None
    stop_flag: asyncio.Event | None = None
    on_controller: Callable[[Controller], None] | None = None
    renderers: Renderers | None = None
    clock: Clock | None = None  # the controller's timers, monitors and policy; the Lease keeps real time


async def run_operator(
    opts: RunOptions,
    *,
    ready_flag: asyncio.Event | None = None,
    stop_flag: asyncio.Event | None = None,
    on_controller: Callable[[Controller], None] | None = None,
    metrics: OperatorMetrics | None = None,
    renderers: Renderers | None = None,
    clock: Clock | None = None,
) -> None:
    """Run until cancelled or ``stop_flag`` is set. Tests run it as a task; ``run`` via asyncio.run.

    ``clock``: the controller's timers, monitors and policy (a test's fake clock; the Lease keeps real time)."""
    configuration = await load_configuration(opts.kubeconfig, opts.context)
    hooks = Hooks(ready_flag, stop_flag, on_controller, renderers, clock)
    await OperatorProcess(opts, configuration, metrics or OperatorMetrics(), hooks).run()


class OperatorProcess:
    """One run: kopf's registry, the controller kopf's startup creates, and (elected) the Lease's elector.

    Standalone, the loops start with kopf. Elected, they start only once this replica holds the Lease, and
    stop (then kopf, then the process) when it loses it; a graceful stop releases the Lease after the loops
    stop, so a standby takes over at once."""

    def __init__(self, opts: RunOptions, configuration: Configuration, metrics: OperatorMetrics, hooks: Hooks):
        self.opts, self.configuration, self.metrics, self.hooks = opts, configuration, metrics, hooks
        self.registry = kopf.OperatorRegistry()
        self.created: asyncio.Future[Controller] = asyncio.get_running_loop().create_future()
        self.kopf_stop = asyncio.Event()  # ours, so losing the lease can stop kopf too
        self.helpers: list[asyncio.Task[None]] = []  # the election and the stop_flag relay
        self.lost = False
        self.elector: LeaderElector | None = None
        self.lease_client: KubeClient | None = None
        if opts.election is not None:
            self.lease_client = KubeClient(configuration, on_request=metrics.on_request, backoff=())  # it retries
            self.elector = LeaderElector(
                self.lease_client,
                opts.election,
                on_started_leading=self.started_leading,
                on_stopped_leading=self.stopped_leading,
                on_leader=self.set_leader,
            )
        kopf.on.login(registry=self.registry)(self.login)
        # kopf's shutdown (SIGTERM, stop flag) waits for tasks started in its handlers: step down in its cleanup
        kopf.on.cleanup(registry=self.registry)(self.release_lease)

    async def run(self) -> None:
        opts = self.opts
        watch_nodes = opts.gpu_node_check and await may_list_nodes(self.configuration)
        register(
            self.registry, self.make_controller, configure=configure_posting, start=self.start, watch_nodes=watch_nodes
        )
        runner = await metrics_server(self.metrics, opts.metrics_host, opts.metrics_port) if opts.metrics_port else None
        if self.hooks.stop_flag is not None:
            self.helpers.append(asyncio.create_task(self.relay_stop(self.hooks.stop_flag)))
        try:
            await kopf.operator(
                registry=self.registry,
                standalone=True,  # kopf peering would pause only kopf's own streams; the Lease gates our loops
                clusterwide=opts.all_namespaces,
                namespaces=opts.namespaces,
                liveness_endpoint=opts.liveness,
                ready_flag=self.hooks.ready_flag,
                stop_flag=self.kopf_stop,
                memo=kopf.Memo(),
            )
        finally:
            await self.step_down()  # again, for a cancelled run that skipped kopf's cleanup
            if self.lease_client is not None:
                await self.lease_client.close()
            if runner:
                await runner.cleanup()
        if self.lost:
            election = opts.election
            raise LeadershipLost(f"lost the leader lease {election.namespace}/{election.name}" if election else "")

    async def make_controller(self) -> Controller:
        """The controller kopf's startup creates; elected, its writes are fenced by the Lease."""
        may_write = self.elector.may_write if self.elector is not None else None
        client = KubeClient(self.configuration, on_request=self.metrics.on_request, may_write=may_write)
        controller = Controller(
            client=client,
            renderers=self.hooks.renderers or default_renderers(),
            metrics=self.metrics,
            settings=ControllerSettings(workers=self.opts.workers, resync_seconds=self.opts.resync_seconds),
            clock=self.hooks.clock or SystemClock(),
        )
        controller.add_monitor(SpeculationMonitor(metrics=self.metrics))
        controller.add_monitor(RetentionMonitor(self.metrics))
        controller.add_monitor(TrainingMonitor())
        if self.hooks.on_controller:
            self.hooks.on_controller(controller)
        return controller

    async def login(self, **_: Any) -> kopf.ConnectionInfo:
        """kopf uses the same credentials as the reconciler's client (one kubeconfig, one truth)."""
        cfg = self.configuration
        token: object = cfg.get_api_key_with_prefix("BearerToken")
        if inspect.isawaitable(token):  # kubernetes-asyncio >= 33.3 (token refresh)
            token = await token
        scheme, _sep, value = (token if isinstance(token, str) else "").partition(" ")
        return kopf.ConnectionInfo(
            server=cfg.host or "",
            ca_path=cfg.ssl_ca_cert,
            insecure=not cfg.verify_ssl,
            scheme=scheme if value else None,
            token=(value or scheme) or None,
            certificate_path=cfg.cert_file,
            private_key_path=cfg.key_file,
            username=cfg.username or None,
            password=cfg.password or None,
        )

    async def start(self, controller: Controller) -> None:
        """Standalone: the loops start with kopf. Elected: only once this replica holds the Lease.

        The election task starts here, inside kopf's startup, so it and the loops it starts inherit kopf's
        context (the Event poster's settings and queue), as the standalone loops do.
        """
        if not self.created.done():
            self.created.set_result(controller)
        if self.elector is None:
            self.metrics.leader.set(1)
            await controller.start()
        else:
            self.helpers.append(asyncio.create_task(self.elect(self.elector), name="redrafter-leader-election"))

    def set_leader(self, leading: bool) -> None:
        self.metrics.leader.set(int(leading))

    async def started_leading(self) -> None:
        await self.created.result().start()
        log.info("leading: reconcile workers and monitors started")

    async def stopped_leading(self) -> None:
        """Stop the writer (workers) and the monitors first, then kopf; the process then exits non-zero."""
        self.lost = True
        await self.created.result().stop()
        election = self.opts.election
        log.error(
            "leader election lost (lease %s/%s): reconcile loops stopped, exiting",
            election.namespace if election else "",
            election.name if election else "",
        )
        self.kopf_stop.set()

    async def elect(self, elector: LeaderElector) -> None:
        try:
            await elector.run()
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug here must not leave a leader running without renewals
            log.exception("leader election failed")
            await self.stopped_leading()

    async def relay_stop(self, stop_flag: asyncio.Event) -> None:
        await stop_flag.wait()
        self.kopf_stop.set()

    async def release_lease(self, **_: Any) -> None:
        """kopf's cleanup (SIGTERM, the stop flag): step down, and raise kopf's stop flag as well. Stopped by a
        signal, kopf 1.45 leaves its own task waiting on that flag pending, and its shutdown then gives such
        leftover tasks 5 s before it cancels them (kopf/_core/reactor/running.py run_tasks): seconds of a
        pod's grace period spent on nothing."""
        self.kopf_stop.set()
        await self.step_down()

    async def step_down(self) -> None:
        """A graceful stop of a leader: loops first, then the Lease, so a standby takes over at once."""
        for task in self.helpers:
            task.cancel()
        await asyncio.gather(*self.helpers, return_exceptions=True)
        if self.created.done():
            await self.created.result().stop()  # idempotent; nothing may write once the lease is released
        self.metrics.leader.set(0)
        elector = self.elector
        if elector is not None and not self.lost and elector.is_leader():
            try:
                async with asyncio.timeout(elector.cfg.renew_deadline):
                    await elector.release()
            except TimeoutError:
                log.warning("could not release the lease in time; a standby takes over when it expires")


async def metrics_server(metrics: OperatorMetrics, host: str, port: int) -> web.AppRunner:
    """The operator's /metrics on ``host:port``."""

    async def handle(_: web.Request) -> web.Response:
        return web.Response(body=metrics.render(), headers={"Content-Type": metrics.content_type})

    app = web.Application()
    app.router.add_get("/metrics", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner


async def may_list_nodes(configuration: Configuration) -> bool:
    """Whether the GPU node check can run: it reads Nodes, cluster-wide. Without that right kopf would wait
    forever for the Node index and nothing would be reconciled, so a 401/403 turns the check off, loudly."""
    client = KubeClient(configuration)
    try:
        await client.request("GET", "/api/v1/nodes", query=[("limit", "1")])
    except ApiError as exc:
        if exc.status in (401, 403):
            log.warning(
                "GPU node check off: this operator may not list nodes (%s: %s); GPU Jobs are created without "
                "checking that a node can run them. Grant list and watch on nodes (the chart does, with "
                "gpuNodeCheck: true) or pass --no-gpu-node-check to silence this",
                exc.status,
                exc.message,
            )
            return False
    finally:
        await client.close()
    return True


def instance() -> str:
    """This replica's name: its pod (POD_NAME, from the chart's downward API), else the host name."""
    return os.environ.get("POD_NAME") or socket.gethostname()


def configure_posting(settings: kopf.OperatorSettings) -> None:
    """Events name this operator and the replica that posted them, not kopf's defaults ("kopf", "dev").

    kopf 1.45 PostingSettings (kopf/_cogs/configs/configuration.py) puts these in every Event it posts:
    reportingComponent, reportingInstance, source.component and the generateName prefix.
    """
    # core/v1 reportingComponent = events/v1 reportingController
    settings.posting.reporting_component = names.MANAGED_BY
    settings.posting.reporting_instance = instance()
    settings.posting.event_name_prefix = f"{names.MANAGED_BY}-"
