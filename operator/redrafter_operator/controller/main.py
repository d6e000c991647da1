"""`redrafter-operator run`: start the operator (kopf) with its workers, metrics and liveness endpoints.

Namespaced (``--namespace``, repeatable) or cluster-wide (``--all-namespaces``); standalone, or with
``--leader-elect`` so several replicas run with exactly one active: every replica runs kopf's watches
(warm caches, no writes), only the holder of a ``coordination.k8s.io`` Lease runs the reconcile
workers and monitors (see leader.py). A leader that loses the Lease stops them and exits non-zero,
as client-go based controllers do; Kubernetes restarts it as a standby.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import logging
import os
import socket
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import kopf
from aiohttp import web

from ..api.types import parse_duration
from ..kubeconfig import load_configuration
from ..render import names
from .apply import ApiError, KubeClient
from .clock import Clock, SystemClock
from .handlers import register
from .leader import ElectionConfig, LeaderElector, default_identity
from .metrics import OperatorMetrics
from .plan_types import Renderers
from .reconciler import Controller, ControllerSettings
from .renderers import default_renderers
from .retention import RetentionMonitor
from .speculation import SpeculationMonitor
from .training import TrainingMonitor

log = logging.getLogger("redrafter_operator.controller")

SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


class LeadershipLost(RuntimeError):
    """The leader could not renew its Lease in time: its loops are stopped and the process must end."""


@dataclass
class RunOptions:
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
    clock: Clock | None = None,
) -> None:
    """Run until cancelled or ``stop_flag`` is set. Tests run it as a task; ``run`` via asyncio.run.

    ``clock``: the controller's timers, monitors and policy (a test's fake clock; the Lease keeps real time)."""
    metrics = metrics or OperatorMetrics()
    configuration = await load_configuration(opts.kubeconfig, opts.context)
    registry = kopf.OperatorRegistry()

    async def make_controller() -> Controller:
        # elected: the reconciler's writes are fenced by the Lease (LeaderElector.may_write; the elector
        # below exists before kopf calls this)
        client = KubeClient(
            configuration, on_request=metrics.on_request, may_write=elector.may_write if elector is not None else None
        )
        controller = Controller(
            client=client,
            renderers=renderers or default_renderers(),
            metrics=metrics,
            settings=ControllerSettings(workers=opts.workers, resync_seconds=opts.resync_seconds),
            clock=clock or SystemClock(),
        )
        controller.add_monitor(SpeculationMonitor(metrics=metrics))
        controller.add_monitor(RetentionMonitor(metrics))
        controller.add_monitor(TrainingMonitor())
        if on_controller:
            on_controller(controller)
        return controller

    @kopf.on.login(registry=registry)
    async def login(**_: Any) -> kopf.ConnectionInfo:
        """kopf uses the same credentials as the reconciler's client (one kubeconfig, one truth)."""
        token: Any = configuration.get_api_key_with_prefix("BearerToken")
        if inspect.isawaitable(token):  # kubernetes-asyncio >= 33.3 (token refresh)
            token = await token
        scheme, credential = str(token or "").partition(" ")[::2]
        return kopf.ConnectionInfo(
            server=str(configuration.host),
            ca_path=configuration.ssl_ca_cert,
            insecure=not configuration.verify_ssl,
            scheme=scheme if credential else None,
            token=(credential or scheme) or None,
            certificate_path=configuration.cert_file,
            private_key_path=configuration.key_file,
            username=configuration.username or None,
            password=configuration.password or None,
        )

    election = opts.election
    elector: LeaderElector | None = None
    lease_client: KubeClient | None = None
    created: asyncio.Future[Controller] = asyncio.get_running_loop().create_future()
    kopf_stop = asyncio.Event()  # ours, so losing the lease can stop kopf too
    helpers: list[asyncio.Task[None]] = []  # the election and the stop_flag relay
    lost = False

    async def start(controller: Controller) -> None:
        """Standalone: the loops start with kopf. Elected: only once this replica holds the Lease.

        The election task starts here, inside kopf's startup, so it and the loops it starts inherit kopf's
        context (the Event poster's settings and queue), as the standalone loops do.
        """
        if not created.done():
            created.set_result(controller)
        if election is None:
            metrics.leader.set(1)
            await controller.start()
        else:
            helpers.append(asyncio.create_task(elect(), name="redrafter-leader-election"))

    async def started_leading() -> None:
        await created.result().start()
        log.info("leading: reconcile workers and monitors started")

    async def stopped_leading() -> None:
        """Stop the writer (workers) and the monitors first, then kopf; the process then exits non-zero."""
        nonlocal lost
        lost = True
        controller = created.result()
        await controller.stop()
        log.error(
            "leader election lost (lease %s/%s): reconcile loops stopped, exiting",
            election.namespace if election else "",
            election.name if election else "",
        )
        kopf_stop.set()

    async def elect() -> None:
        assert elector is not None
        try:
            await elector.run()
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug here must not leave a leader running without renewals
            log.exception("leader election failed")
            await stopped_leading()

    async def relay_stop() -> None:
        assert stop_flag is not None
        await stop_flag.wait()
        kopf_stop.set()

    if election is not None:
        lease_client = KubeClient(configuration, on_request=metrics.on_request, backoff=())  # the elector retries
        elector = LeaderElector(
            lease_client,
            election,
            on_started_leading=started_leading,
            on_stopped_leading=stopped_leading,
            on_leader=lambda on: metrics.leader.set(int(on)),
        )

    async def step_down() -> None:
        """A graceful stop of a leader: loops first, then the Lease, so a standby takes over at once."""
        for task in helpers:
            task.cancel()
        await asyncio.gather(*helpers, return_exceptions=True)
        if created.done():
            await created.result().stop()  # idempotent; nothing may write once the lease is released
        metrics.leader.set(0)
        if elector is not None and not lost and elector.is_leader():
            try:
                async with asyncio.timeout(elector.cfg.renew_deadline):
                    await elector.release()
            except TimeoutError:
                log.warning("could not release the lease in time; a standby takes over when it expires")

    @kopf.on.cleanup(registry=registry)
    async def release_lease(**_: Any) -> None:
        """kopf's shutdown (SIGTERM, stop flag) waits for tasks started in its handlers: step down now."""
        await step_down()

    watch_nodes = opts.gpu_node_check and await may_list_nodes(configuration)
    register(registry, make_controller, configure=_configure_posting, start=start, watch_nodes=watch_nodes)
    runner = await _metrics_server(metrics, opts.metrics_host, opts.metrics_port) if opts.metrics_port else None
    if stop_flag is not None:
        helpers.append(asyncio.create_task(relay_stop()))
    try:
        await kopf.operator(
            registry=registry,
            standalone=True,  # kopf peering would pause only kopf's own streams; the Lease gates our loops
            clusterwide=opts.all_namespaces,
            namespaces=opts.namespaces,
            liveness_endpoint=opts.liveness,
            ready_flag=ready_flag,
            stop_flag=kopf_stop,
            memo=kopf.Memo(),
        )
    finally:
        await step_down()  # again, for a cancelled run that skipped kopf's cleanup
        if lease_client is not None:
            await lease_client.close()
        if runner:
            await runner.cleanup()
    if lost:
        raise LeadershipLost(f"lost the leader lease {election.namespace}/{election.name}" if election else "")


async def may_list_nodes(configuration: Any) -> bool:
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


def _instance() -> str:
    """This replica's name: its pod (POD_NAME, from the chart's downward API), else the host name."""
    return os.environ.get("POD_NAME") or socket.gethostname()


def _configure_posting(settings: kopf.OperatorSettings) -> None:
    """Events name this operator and the replica that posted them, not kopf's defaults ("kopf", "dev").

    kopf 1.45 PostingSettings (kopf/_cogs/configs/configuration.py) puts these in every Event it posts:
    reportingComponent, reportingInstance, source.component and the generateName prefix.
    """
    settings.posting.reporting_component = (
        names.MANAGED_BY
    )  # core/v1 reportingComponent = events/v1 reportingController
    settings.posting.reporting_instance = _instance()
    settings.posting.event_name_prefix = f"{names.MANAGED_BY}-"


def _duration(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return parse_duration(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration such as 15s, 500ms or 1m") from None


def _lease_namespace(explicit: str | None) -> str | None:
    """--leader-election-namespace, else this pod's namespace (downward API or the service account)."""
    if explicit:
        return explicit
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    try:
        with open(SERVICE_ACCOUNT_NAMESPACE, encoding="utf-8") as fh:
            return fh.read().strip() or None
    except OSError:
        return None


def _env_list(name: str) -> list[str]:
    return [s.strip() for s in os.environ.get(name, "").split(",") if s.strip()]


def register_cli(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("run", help="run the operator (kopf) against the current cluster")
    scope = p.add_mutually_exclusive_group()
    scope.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=None,
        help="watch this namespace (repeatable; globs allowed). Env REDRAFTER_NAMESPACES (comma-separated)",
    )
    scope.add_argument(
        "-A",
        "--all-namespaces",
        action="store_true",
        default=None,
        help="watch every namespace (env REDRAFTER_ALL_NAMESPACES=1)",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--standalone", action="store_true", help="no leader election: exactly one replica must run (the default)"
    )
    mode.add_argument(
        "--leader-elect",
        action="store_true",
        default=os.environ.get("REDRAFTER_LEADER_ELECT", "").lower() in ("1", "true"),
        help="elect one active replica through a coordination.k8s.io/v1 Lease; the others keep "
        "their caches warm and write nothing (env REDRAFTER_LEADER_ELECT=1)",
    )
    mode.add_argument("--peering", help=argparse.SUPPRESS)  # replaced by --leader-elect: a clear error
    elect = p.add_argument_group("leader election (with --leader-elect; client-go's semantics and defaults)")
    elect.add_argument(
        "--leader-election-namespace",
        default=os.environ.get("REDRAFTER_LEADER_ELECTION_NAMESPACE") or None,
        help="namespace of the Lease (default: this pod's, from POD_NAMESPACE or the service "
        "account; env REDRAFTER_LEADER_ELECTION_NAMESPACE)",
    )
    elect.add_argument(
        "--leader-election-id",
        default=os.environ.get("REDRAFTER_LEADER_ELECTION_ID") or "redrafter-operator",
        help="name of the Lease (env REDRAFTER_LEADER_ELECTION_ID; default redrafter-operator)",
    )
    elect.add_argument(
        "--lease-duration",
        type=_duration,
        default=os.environ.get("REDRAFTER_LEASE_DURATION") or "15s",
        help="a standby takes over this long after the leader's last renewal it saw; whole seconds "
        "(env REDRAFTER_LEASE_DURATION; default 15s)",
    )
    elect.add_argument(
        "--renew-deadline",
        type=_duration,
        default=os.environ.get("REDRAFTER_RENEW_DEADLINE") or "10s",
        help="a leader that cannot renew for this long stops its loops and exits; less than the lease "
        "duration (env REDRAFTER_RENEW_DEADLINE; default 10s)",
    )
    elect.add_argument(
        "--retry-period",
        type=_duration,
        default=os.environ.get("REDRAFTER_RETRY_PERIOD") or "2s",
        help="time between attempts to acquire or renew (env REDRAFTER_RETRY_PERIOD; default 2s)",
    )
    p.add_argument(
        "--liveness",
        default=os.environ.get("REDRAFTER_LIVENESS") or None,
        help="kopf liveness endpoint, e.g. http://0.0.0.0:8080/healthz",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=int(os.environ.get("REDRAFTER_METRICS_PORT", "0")) or None,
        help="serve the operator's /metrics on this port (0: off)",
    )
    p.add_argument(
        "--kubeconfig",
        default=os.environ.get("KUBECONFIG") or None,
        help="kubeconfig file (default: in-cluster service account, else ~/.kube/config)",
    )
    p.add_argument("--context", default=None, help="kubeconfig context")
    p.add_argument(
        "--workers",
        type=int,
        default=int(os.environ.get("REDRAFTER_WORKERS", "4")),
        help="concurrent reconciles (one resource is never reconciled twice at once)",
    )
    p.add_argument(
        "--resync-seconds",
        type=float,
        default=float(os.environ.get("REDRAFTER_RESYNC_SECONDS", "300")),
        help="re-check every resource this often (catches missed events; writes nothing when in sync)",
    )
    p.add_argument(
        "--log-level",
        default=os.environ.get("REDRAFTER_LOG_LEVEL", "INFO"),
        choices=["DEBUG", "INFO", "WARNING", "ERROR", "debug", "info", "warning", "error"],
    )
    p.add_argument(
        "--log-format", default=os.environ.get("REDRAFTER_LOG_FORMAT", "plain"), choices=["plain", "full", "json"]
    )
    p.add_argument(
        "--gpu-node-check",
        action=argparse.BooleanOptionalAction,
        default=os.environ.get("REDRAFTER_GPU_NODE_CHECK", "true").lower() not in ("0", "false", "no"),
        help="watch Nodes and create a GPU Job only when some node could run it (product, GPU count, taints); "
        "turn off where GPU nodes scale from zero, so the Jobs' Pending pods can trigger the autoscaler "
        "(env REDRAFTER_GPU_NODE_CHECK; default on)",
    )
    p.set_defaults(func=_cmd_run)


def _cmd_run(args: argparse.Namespace) -> int:
    namespaces = args.namespace if args.namespace is not None else _env_list("REDRAFTER_NAMESPACES")
    all_ns = bool(args.all_namespaces) or (
        not namespaces and os.environ.get("REDRAFTER_ALL_NAMESPACES", "") in ("1", "true")
    )
    if not namespaces and not all_ns:
        namespaces = [os.environ.get("POD_NAMESPACE") or "default"]
    if args.peering is not None:
        return _usage_error(
            "--peering (kopf peering) was replaced by --leader-elect: replicas elect one active "
            "operator through a coordination.k8s.io/v1 Lease (see `redrafter-operator run --help`)"
        )
    election = None
    if args.leader_elect and not args.standalone:
        namespace = _lease_namespace(args.leader_election_namespace)
        if not namespace:
            return _usage_error(
                "--leader-elect needs --leader-election-namespace outside a pod "
                "(no POD_NAMESPACE and no service account namespace)"
            )
        try:
            election = ElectionConfig(
                namespace=namespace,
                name=args.leader_election_id,
                identity=default_identity(),
                lease_duration=args.lease_duration,
                renew_deadline=args.renew_deadline,
                retry_period=args.retry_period,
            )
        except ValueError as exc:
            return _usage_error(str(exc))
    level = args.log_level.upper()
    kopf.configure(
        debug=level == "DEBUG",
        quiet=level in ("WARNING", "ERROR"),
        log_format={"plain": kopf.LogFormat.PLAIN, "full": kopf.LogFormat.FULL, "json": kopf.LogFormat.JSON}[
            args.log_format
        ],
    )
    logging.getLogger().setLevel(level)
    if level != "DEBUG":
        # kopf logs every handler call at INFO; ours only enqueue work, the reconciler logs what happens
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    opts = RunOptions(
        namespaces=namespaces,
        all_namespaces=all_ns,
        election=election,
        liveness=args.liveness,
        metrics_port=args.metrics_port,
        kubeconfig=args.kubeconfig,
        context=args.context,
        workers=args.workers,
        resync_seconds=args.resync_seconds,
        log_level=level,
        log_format=args.log_format,
        gpu_node_check=args.gpu_node_check,
    )
    if threading.current_thread() is threading.main_thread():
        try:
            asyncio.run(run_operator(opts))
        except KeyboardInterrupt:
            return 0
        except LeadershipLost:
            return 1  # Kubernetes restarts the container, which then starts as a standby
    return 0


def _usage_error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2
