"""`redrafter-operator run`: start the operator (kopf) with its workers, metrics and liveness endpoints.

Namespaced (``--namespace``, repeatable) or cluster-wide (``--all-namespaces``); standalone or with
kopf peering (``--peering NAME``) so two replicas run with exactly one active.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import socket
import inspect
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import kopf
from aiohttp import web

from ..render import names
from .apply import KubeClient, load_configuration
from .handlers import Controller, ControllerSettings, register
from .metrics import OperatorMetrics
from .planner import Renderers
from .renderers import default_renderers
from .speculation import SpeculationEvaluator
from .validation import Promotion, ValidationEvaluator

log = logging.getLogger("redrafter_operator.controller")


@dataclass
class RunOptions:
    namespaces: list[str] = field(default_factory=list)
    all_namespaces: bool = False
    peering: str | None = None  # None: standalone
    priority: int = 0
    liveness: str | None = None  # e.g. http://0.0.0.0:8080/healthz
    metrics_port: int | None = None  # None: no /metrics server
    metrics_host: str = "0.0.0.0"
    kubeconfig: str | None = None
    context: str | None = None
    workers: int = 4
    resync_seconds: float = 300.0
    log_level: str = "INFO"
    log_format: str = "plain"


async def _metrics_server(metrics: OperatorMetrics, host: str, port: int) -> web.AppRunner:
    async def handle(_: web.Request) -> web.Response:
        return web.Response(body=metrics.render(), headers={"Content-Type": metrics.content_type})

    app = web.Application()
    app.router.add_get("/metrics", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner


async def run_operator(
    opts: RunOptions,
    *,
    ready_flag: asyncio.Event | None = None,
    stop_flag: asyncio.Event | None = None,
    on_controller: Callable[[Controller], None] | None = None,
    metrics: OperatorMetrics | None = None,
    renderers: Renderers | None = None,
) -> None:
    """Run until cancelled or ``stop_flag`` is set. Tests run it as a task; ``run`` via asyncio.run."""
    metrics = metrics or OperatorMetrics()
    configuration = await load_configuration(opts.kubeconfig, opts.context)
    registry = kopf.OperatorRegistry()

    async def make_controller() -> Controller:
        client = KubeClient(configuration, on_request=metrics.on_request)
        controller = Controller(client=client, renderers=renderers or default_renderers(), metrics=metrics,
                                settings=ControllerSettings(workers=opts.workers, resync_seconds=opts.resync_seconds))
        promotion = Promotion()  # the validation gate applied to the speculation policy's targets
        controller.add_evaluator(SpeculationEvaluator(promotion=promotion))
        controller.add_evaluator(ValidationEvaluator(promotion))
        if on_controller:
            on_controller(controller)
        return controller

    @kopf.on.login(registry=registry)
    async def login(**_: Any) -> kopf.ConnectionInfo:
        """kopf uses the same credentials as the reconciler's client (one kubeconfig, one truth)."""
        token = configuration.get_api_key_with_prefix("BearerToken")
        if inspect.isawaitable(token):  # kubernetes-asyncio >= 33.3 (token refresh)
            token = await token
        scheme, _, value = (token or "").partition(" ")
        return kopf.ConnectionInfo(
            server=configuration.host,
            ca_path=configuration.ssl_ca_cert,
            insecure=not configuration.verify_ssl,
            scheme=scheme if value else None,
            token=(value or scheme) or None,
            certificate_path=configuration.cert_file,
            private_key_path=configuration.key_file,
            username=configuration.username or None,
            password=configuration.password or None,
        )

    register(registry, make_controller, configure=_configure_posting)
    runner = await _metrics_server(metrics, opts.metrics_host, opts.metrics_port) if opts.metrics_port else None
    try:
        await kopf.operator(
            registry=registry,
            standalone=opts.peering is None,
            peering_name=opts.peering,
            priority=opts.priority,
            clusterwide=opts.all_namespaces,
            namespaces=opts.namespaces,
            liveness_endpoint=opts.liveness,
            ready_flag=ready_flag,
            stop_flag=stop_flag,
            memo=kopf.Memo(),
        )
    finally:
        if runner:
            await runner.cleanup()


def _instance() -> str:
    """This replica's name: its pod (POD_NAME, from the chart's downward API), else the host name."""
    return os.environ.get("POD_NAME") or socket.gethostname()


def _configure_posting(settings: kopf.OperatorSettings) -> None:
    """Events name this operator and the replica that posted them, not kopf's defaults ("kopf", "dev").

    kopf 1.45 PostingSettings (kopf/_cogs/configs/configuration.py) puts these in every Event it posts:
    reportingComponent, reportingInstance, source.component and the generateName prefix.
    """
    settings.posting.reporting_component = names.MANAGED_BY  # core/v1 reportingComponent = events/v1 reportingController
    settings.posting.reporting_instance = _instance()
    settings.posting.event_name_prefix = f"{names.MANAGED_BY}-"


def _replica_priority() -> int:
    """A stable per-replica peering priority: kopf pauses *every* peer when priorities tie.

    Derived from the pod name (hostname), so two replicas of one Deployment get different
    priorities and exactly one of them is active; a restarted pod keeps its priority.
    """
    return 1 + int(hashlib.sha256(_instance().encode()).hexdigest()[:6], 16) % 1_000_000


def _env_list(name: str) -> list[str]:
    return [s.strip() for s in os.environ.get(name, "").split(",") if s.strip()]


def register_cli(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run the operator (kopf) against the current cluster")
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", action="append", default=None,
                       help="watch this namespace (repeatable; globs allowed). Env REDRAFTER_NAMESPACES (comma-separated)")
    scope.add_argument("-A", "--all-namespaces", action="store_true", default=None,
                       help="watch every namespace (env REDRAFTER_ALL_NAMESPACES=1)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--standalone", action="store_true", help="no peering: exactly one replica must run (default)")
    mode.add_argument("--peering", default=os.environ.get("REDRAFTER_PEERING") or None,
                      help="kopf peering object name: replicas elect one active operator (env REDRAFTER_PEERING)")
    p.add_argument("--priority", type=int, default=int(os.environ["REDRAFTER_PRIORITY"]) if os.environ.get("REDRAFTER_PRIORITY") else None,
                   help="peering priority: the highest-priority replica is active, the others wait "
                   "(default with --peering: derived from POD_NAME/hostname, so replicas differ)")
    p.add_argument("--liveness", default=os.environ.get("REDRAFTER_LIVENESS") or None,
                   help="kopf liveness endpoint, e.g. http://0.0.0.0:8080/healthz")
    p.add_argument("--metrics-port", type=int, default=int(os.environ.get("REDRAFTER_METRICS_PORT", "0")) or None,
                   help="serve the operator's /metrics on this port (0: off)")
    p.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG") or None,
                   help="kubeconfig file (default: in-cluster service account, else ~/.kube/config)")
    p.add_argument("--context", default=None, help="kubeconfig context")
    p.add_argument("--workers", type=int, default=int(os.environ.get("REDRAFTER_WORKERS", "4")),
                   help="concurrent reconciles (one resource is never reconciled twice at once)")
    p.add_argument("--resync-seconds", type=float, default=float(os.environ.get("REDRAFTER_RESYNC_SECONDS", "300")),
                   help="re-check every resource this often (catches missed events; writes nothing when in sync)")
    p.add_argument("--log-level", default=os.environ.get("REDRAFTER_LOG_LEVEL", "INFO"),
                   choices=["DEBUG", "INFO", "WARNING", "ERROR", "debug", "info", "warning", "error"])
    p.add_argument("--log-format", default=os.environ.get("REDRAFTER_LOG_FORMAT", "plain"),
                   choices=["plain", "full", "json"])
    p.set_defaults(func=_cmd_run)


def _cmd_run(args: argparse.Namespace) -> int:
    namespaces = args.namespace if args.namespace is not None else _env_list("REDRAFTER_NAMESPACES")
    all_ns = bool(args.all_namespaces) or (not namespaces and os.environ.get("REDRAFTER_ALL_NAMESPACES", "") in ("1", "true"))
    if not namespaces and not all_ns:
        namespaces = [os.environ.get("POD_NAMESPACE") or "default"]
    level = args.log_level.upper()
    kopf.configure(debug=level == "DEBUG", quiet=level in ("WARNING", "ERROR"),
                   log_format={"plain": kopf.LogFormat.PLAIN, "full": kopf.LogFormat.FULL, "json": kopf.LogFormat.JSON}[args.log_format])
    logging.getLogger().setLevel(level)
    if level != "DEBUG":
        # kopf logs every handler call at INFO; ours only enqueue work, the reconciler logs what happens
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    priority = args.priority
    if priority is None:
        priority = _replica_priority() if args.peering and not args.standalone else 0
    opts = RunOptions(namespaces=namespaces, all_namespaces=all_ns, peering=None if args.standalone else args.peering,
                      priority=priority, liveness=args.liveness, metrics_port=args.metrics_port,
                      kubeconfig=args.kubeconfig, context=args.context, workers=args.workers,
                      resync_seconds=args.resync_seconds, log_level=level, log_format=args.log_format)
    if threading.current_thread() is threading.main_thread():
        try:
            asyncio.run(run_operator(opts))
        except KeyboardInterrupt:
            return 0
    return 0
