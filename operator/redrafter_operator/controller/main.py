"""`redrafter-operator run`: the flags (each with its environment variable), parsed into :class:`RunOptions`.

Namespaced (``--namespace``, repeatable) or cluster-wide (``--all-namespaces``); standalone, or with
``--leader-elect`` so several replicas run with exactly one active (process.py wires the run, leader.py
elects). A leader that loses the Lease exits 1, so Kubernetes restarts it as a standby.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import threading

import kopf

from ..api.types import parse_duration
from .leader import ElectionConfig, default_identity
from .process import LeadershipLost, RunOptions, run_operator

__all__ = ["RunOptions", "register_cli", "run_operator"]

SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
#: the Lease's timings: flag, environment variable, default, what it means
DURATION_FLAGS = (
    (
        "--lease-duration",
        "REDRAFTER_LEASE_DURATION",
        "15s",
        "a standby takes over this long after the leader's last renewal it saw; whole seconds",
    ),
    (
        "--renew-deadline",
        "REDRAFTER_RENEW_DEADLINE",
        "10s",
        "a leader that cannot renew for this long stops its loops and exits; less than the lease duration",
    ),
    ("--retry-period", "REDRAFTER_RETRY_PERIOD", "2s", "time between attempts to acquire or renew"),
)
LOG_FORMATS = {"plain": kopf.LogFormat.PLAIN, "full": kopf.LogFormat.FULL, "json": kopf.LogFormat.JSON}


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
    for flag, env, default, help_ in DURATION_FLAGS:
        elect.add_argument(
            flag, type=_duration, default=os.environ.get(env) or default, help=f"{help_} (env {env}; default {default})"
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
        "--metrics-address",
        default=os.environ.get("REDRAFTER_METRICS_ADDRESS") or "0.0.0.0",
        help="the address /metrics listens on (env REDRAFTER_METRICS_ADDRESS; default 0.0.0.0, every address)",
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


class UsageError(ValueError):
    """Flags that cannot run together, or cannot run here: exit 2 with the message."""


def options(args: argparse.Namespace) -> RunOptions:
    """The run's options from its flags and, where a flag is not given, the environment."""
    namespaces = args.namespace if args.namespace is not None else _env_list("REDRAFTER_NAMESPACES")
    all_ns = bool(args.all_namespaces) or (
        not namespaces and os.environ.get("REDRAFTER_ALL_NAMESPACES", "") in ("1", "true")
    )
    if not namespaces and not all_ns:
        namespaces = [os.environ.get("POD_NAMESPACE") or "default"]
    if args.peering is not None:
        raise UsageError(
            "--peering (kopf peering) was replaced by --leader-elect: replicas elect one active "
            "operator through a coordination.k8s.io/v1 Lease (see `redrafter-operator run --help`)"
        )
    return RunOptions(
        namespaces=namespaces,
        all_namespaces=all_ns,
        election=_election(args) if args.leader_elect and not args.standalone else None,
        liveness=args.liveness,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_address,
        kubeconfig=args.kubeconfig,
        context=args.context,
        workers=args.workers,
        resync_seconds=args.resync_seconds,
        log_level=args.log_level.upper(),
        log_format=args.log_format,
        gpu_node_check=args.gpu_node_check,
    )


def _election(args: argparse.Namespace) -> ElectionConfig:
    namespace = _lease_namespace(args.leader_election_namespace)
    if not namespace:
        raise UsageError(
            "--leader-elect needs --leader-election-namespace outside a pod "
            "(no POD_NAMESPACE and no service account namespace)"
        )
    try:
        return ElectionConfig(
            namespace=namespace,
            name=args.leader_election_id,
            identity=default_identity(),
            lease_duration=args.lease_duration,
            renew_deadline=args.renew_deadline,
            retry_period=args.retry_period,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def configure_logging(level: str, log_format: str) -> None:
    kopf.configure(debug=level == "DEBUG", quiet=level in ("WARNING", "ERROR"), log_format=LOG_FORMATS[log_format])
    logging.getLogger().setLevel(level)
    if level != "DEBUG":
        # kopf logs every handler call at INFO; ours only enqueue work, the reconciler logs what happens
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)


def _cmd_run(args: argparse.Namespace) -> int:
    try:
        opts = options(args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    configure_logging(opts.log_level, opts.log_format)
    if threading.current_thread() is threading.main_thread():
        try:
            asyncio.run(run_operator(opts))
        except KeyboardInterrupt:
            return 0
        except LeadershipLost:
            return 1  # Kubernetes restarts the container, which then starts as a standby
    return 0
