"""``redrafter-operator check``: preflight the cluster, and resources from a file or the cluster.

Exit 0 when nothing failed (warnings allowed), 1 when a check failed, 2 when the checks could not run
(unreadable file or kubeconfig, unreachable API server): always one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any

import yaml
from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio import config as k8s_config

from ..api import KIND
from ..kubeconfig import load_configuration
from . import report
from .checks import CheckResult, run_checks
from .facts import ClusterUnreachable, Resource, read_facts, read_resources

DEFAULT_NAMESPACE = "default"


def register_cli(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("check", help="preflight: is the cluster ready to build and serve a ReDrafterDeployment")
    p.add_argument(
        "name", nargs="?", metavar="RDD-NAME", help="check this resource of the cluster (default: all in -n)"
    )
    p.add_argument("-f", "--file", help="check the ReDrafterDeployment(s) of this YAML file (- for stdin)")
    p.add_argument(
        "-n", "--namespace", help=f"namespace of the resources (default: the file's, else {DEFAULT_NAMESPACE})"
    )
    p.add_argument("-o", "--output", choices=["text", "json"], default="text")
    p.add_argument("--operator-namespace", help="where the operator runs (default: look in every namespace)")
    p.add_argument(
        "--operator-health",
        metavar="URL",
        help="the operator runs outside the cluster (`redrafter-operator run --liveness URL` on a machine): check "
        "that its liveness URL answers instead of looking for its Deployment",
    )
    p.add_argument(
        "--cluster-only",
        action="store_true",
        help="check the cluster and the operator, no ReDrafterDeployment (what the chart's `helm test` runs)",
    )
    p.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: in-cluster, else ~/.kube/config)")
    p.add_argument("--context", default=None, help="kubeconfig context")
    p.set_defaults(func=_cmd_check)


class _Unusable(Exception):
    """The input or the configuration keeps the checks from running."""


def _from_file(path: str, namespace: str | None) -> list[Resource]:
    try:
        with open(path, encoding="utf-8") if path != "-" else sys.stdin as fh:
            docs = [d for d in yaml.safe_load_all(fh) if d]
    except OSError as exc:
        raise _Unusable(f"cannot read {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise _Unusable(f"{path} is not YAML: {str(exc).splitlines()[0]}") from None
    out = []
    for doc in docs:
        if not isinstance(doc, dict) or doc.get("kind") != KIND:
            continue
        meta: dict[str, Any] = doc.get("metadata") or {}
        spec = doc.get("spec")
        out.append(
            Resource(
                name=str(meta.get("name") or "?"),
                namespace=namespace or str(meta.get("namespace") or DEFAULT_NAMESPACE),
                spec=spec if isinstance(spec, dict) else {},
            )
        )
    if not out:
        raise _Unusable(f"{path} contains no {KIND}")
    return out


async def _configuration(kubeconfig: str | None, context: str | None) -> k8s_client.Configuration:
    """The operator's rule (:func:`..kubeconfig.load_configuration`), its failures as one line."""
    try:
        return await load_configuration(kubeconfig, context)
    except (k8s_config.ConfigException, OSError, ValueError, yaml.YAMLError) as exc:
        first = (str(exc).strip() or type(exc).__name__).splitlines()[0]
        where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
        raise _Unusable(f"cannot load the kubeconfig {where} (and not running in a cluster): {first}") from None


async def run(args: argparse.Namespace) -> list[CheckResult]:
    resources = _from_file(args.file, args.namespace) if args.file else None
    cfg = await _configuration(args.kubeconfig, args.context)
    api = k8s_client.ApiClient(configuration=cfg)
    try:
        missing: tuple[tuple[str, str], ...] = ()
        looked_in = None
        if args.cluster_only:
            resources = []
        if resources is None:
            looked_in = None if args.name else (args.namespace or DEFAULT_NAMESPACE)
            resources, missing = await read_resources(api, args.namespace or DEFAULT_NAMESPACE, args.name)
        facts = await read_facts(
            api,
            resources,
            operator_namespace=args.operator_namespace,
            missing_resources=missing,
            operator_health=args.operator_health,
        )
    finally:
        await api.close()
    return run_checks(facts, resources, looked_in=looked_in)


def _cmd_check(args: argparse.Namespace) -> int:
    if args.file and args.name:
        print("error: give -f FILE or RDD-NAME, not both", file=sys.stderr)
        return 2
    if args.operator_health and not args.operator_health.startswith(("http://", "https://")):
        print(f"error: --operator-health {args.operator_health}: give an http(s):// URL", file=sys.stderr)
        return 2
    if args.cluster_only and (args.file or args.name):
        print("error: --cluster-only checks no ReDrafterDeployment: drop -f FILE / RDD-NAME", file=sys.stderr)
        return 2
    try:
        results = asyncio.run(run(args))
    except (_Unusable, ClusterUnreachable) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(report.as_json(results) if args.output == "json" else report.text(results))
    return 0 if report.passed(results) else 1
