"""``redrafter-operator cache ls|gc``: the engine cache, on a mounted path or through the API.

``--local DIR`` runs engine_jobs' own ``cache`` command on a path this machine mounts. Without it, the
command works from a workstation: it computes the references (every ReDrafterDeployment's spec and
status in every namespace, and the serving Deployments' engine keys) from the API, puts them in a
ConfigMap, starts a one-pod Job that mounts the cache claim (read-only for ``ls`` and ``gc --dry-run``)
and runs the same code, reads its termination message, and deletes the Job and the ConfigMap.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from typing import Any

from engine_jobs.__main__ import main as engine_jobs_main
from engine_jobs.cache_cmd import decode_message, partials_text, table
from engine_jobs.cache_index import Engine
from engine_jobs.progress import human_bytes

from .api import GROUP, PLURAL, VERSION
from .api.defaults import DEFAULTS
from .controller.apply import ApiError, KubeClient
from .controller.validation import ENV_OPERATOR_IMAGE
from .kubeconfig import load_configuration
from .render import cache_jobs, names
from .render.cache_refs import references_document
from .render.validation import DEFAULT_OPERATOR_IMAGE

POLL_SECONDS = 0.5


def register_cli(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("cache", help="list the engine cache or collect unreferenced engines")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    ls = verbs.add_parser("ls", help="list every engine: facts, size, who references it")
    gc = verbs.add_parser("gc", help="collect unreferenced engines beyond a retention (--dry-run: only show)")
    for q in (ls, gc):
        q.add_argument("--local", metavar="DIR", help="a mounted cache directory (no cluster access)")
        q.add_argument("--references", metavar="FILE", help="with --local: the references JSON")
        q.add_argument("-o", "--output", choices=["table", "json"], default="table")
        q.add_argument("-n", "--namespace", default="default", help="namespace of the cache claim")
        q.add_argument("--claim", default=DEFAULTS.cache_claim, help="the cache PersistentVolumeClaim")
        q.add_argument("--sub-path", default="engines", help="directory of the engines inside the claim")
        q.add_argument(
            "--image",
            default=None,
            help=f"image of the pod (default ${ENV_OPERATOR_IMAGE}, else {DEFAULT_OPERATOR_IMAGE})",
        )
        q.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the pod")
        q.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: in-cluster, else ~/.kube/config)")
        q.add_argument("--context", default=None, help="kubeconfig context")
        q.set_defaults(func=_cmd_cache)
    gc.add_argument("--keep", type=int, metavar="N", help="keep the N most recent unreferenced per model and variant")
    gc.add_argument("--max-age", metavar="DURATION", help="keep unreferenced engines younger than this (30d, 12h)")
    gc.add_argument("--dry-run", action="store_true", help="print what would be removed; remove nothing")


def _local_argv(args: argparse.Namespace) -> list[str]:
    argv = ["cache", args.verb, "--local", args.local]
    if args.references:
        argv += ["--references", args.references]
    if args.verb == "ls":
        return argv + ["-o", args.output]
    if args.keep is not None:
        argv += ["--keep", str(args.keep)]
    if args.max_age:
        argv += ["--max-age", args.max_age]
    if args.dry_run:
        argv.append("--dry-run")
    return argv + ["-o", "json" if args.output == "json" else "text"]


def _cmd_cache(args: argparse.Namespace) -> int:
    if args.local:
        if args.verb == "gc" and not args.references:
            print("error: cache gc --local needs --references FILE (the keys in use)", file=sys.stderr)
            return 2
        return engine_jobs_main(_local_argv(args))
    if args.references:
        print(
            "error: --references is for --local; through the API the references come from the cluster", file=sys.stderr
        )
        return 2
    if args.verb == "gc" and not args.dry_run:
        print(
            "error: through the API, cache gc only runs with --dry-run; the operator runs the collection "
            "(spec.engine.cache.retention)",
            file=sys.stderr,
        )
        return 2
    if args.verb == "gc" and args.keep is None and not args.max_age:
        print("error: a retention needs --keep N and/or --max-age DURATION", file=sys.stderr)
        return 2
    try:
        doc = asyncio.run(run_in_cluster(args))
    except (ApiError, ClusterError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return _print(args, doc)


def _print(args: argparse.Namespace, doc: dict[str, Any]) -> int:
    if args.output == "json":
        print(json.dumps(doc, indent=2))
        return 0
    if args.verb == "ls":
        engines = [Engine.from_json(e) for e in doc.get("engines") or []]
        print(table(engines))
        print(
            f"\n{len(engines)} engine(s), {human_bytes(int(doc.get('totalBytes') or 0))} "
            f"in claim {args.namespace}/{args.claim} {args.sub_path}/"
        )
        if doc.get("partials") or doc.get("partialBytes"):  # absent in the listing of an older image
            print(partials_text(doc.get("partials") or [], int(doc.get("partialBytes") or 0)))
        for field, what in (("truncated", "engines"), ("partialsTruncated", "partial builds")):
            if doc.get(field):
                print(
                    f"({doc[field]} more {what} not shown: the pod's message is limited to 4096 bytes; "
                    "use -o json on a mounted path with --local)"
                )
        return 0
    for item in doc.get("removed") or []:
        print(
            f"would remove {item['key']}  {item['variant']}  {item['model']}  {human_bytes(int(item['bytes']))}"
            + (f"  ({item['note']})" if item.get("note") else "")
        )
    count = int(doc.get("removedCount", len(doc.get("removed") or [])))
    partials = int(doc.get("removedPartials") or 0)
    print(
        f"{count - partials} engine(s) and {partials} abandoned partial build(s), "
        f"{human_bytes(int(doc.get('freedBytes') or 0))} would be freed; {doc.get('kept', 0)} kept"
    )
    return 0


class ClusterError(Exception):
    """The listing pod could not run or report (its reason is shown as is)."""


async def _list_all(client: KubeClient, path: str, selector: str | None = None) -> list[dict[str, Any]]:
    query = [("labelSelector", selector)] if selector else None
    return list((await client.request("GET", path, query=query)).get("items") or [])


async def cluster_references(client: KubeClient) -> str:
    resources = await _list_all(client, f"/apis/{GROUP}/{VERSION}/{PLURAL}")
    deployments = await _list_all(client, "/apis/apps/v1/deployments", names.LABEL_ENGINE_KEY)
    return references_document(resources, deployments)


async def run_in_cluster(args: argparse.Namespace) -> dict[str, Any]:
    config = await load_configuration(args.kubeconfig, args.context)
    client = KubeClient(config)
    ns = args.namespace
    name = names.safe_name("cache", args.verb, args.claim, uuid.uuid4().hex[:6], limit=names.JOB_NAME_MAX)
    image = args.image or os.environ.get(ENV_OPERATOR_IMAGE) or DEFAULT_OPERATOR_IMAGE
    if args.verb == "ls":
        pod_args, read_only = cache_jobs.list_args(), True
    else:
        pod_args = cache_jobs.gc_args(keep=args.keep, max_age=args.max_age, dry_run=True)
        read_only = True  # a dry run reads only
    try:
        document = await cluster_references(client)
        await client.request(
            "POST",
            f"/api/v1/namespaces/{ns}/configmaps",
            cache_jobs.references_config_map(name=name, namespace=ns, claim=args.claim, document=document),
        )
        job = cache_jobs.cache_job(
            name=name,
            namespace=ns,
            claim=args.claim,
            sub_path=args.sub_path,
            references_config_map=name,
            image=image,
            args=pod_args,
            verb="ls" if args.verb == "ls" else "gc-dry-run",  # the operator reports "gc"
            read_only=read_only,
        )
        await client.request("POST", f"/apis/batch/v1/namespaces/{ns}/jobs", job)
        try:
            return await wait_for_message(client, ns, name, args.timeout)
        finally:
            await _delete(client, f"/apis/batch/v1/namespaces/{ns}/jobs/{name}")
            await _delete(client, f"/api/v1/namespaces/{ns}/configmaps/{name}")
    finally:
        await client.close()


async def _delete(client: KubeClient, path: str) -> None:
    try:
        await client.request("DELETE", path, {"propagationPolicy": "Background"})
    except ApiError as exc:
        if exc.status != 404:
            print(f"warning: could not delete {path}: {exc}", file=sys.stderr)


async def wait_for_message(client: KubeClient, ns: str, job: str, timeout: float) -> dict[str, Any]:
    """The decoded termination message of the Job's pod once it terminated."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pods = await _list_all(client, f"/api/v1/namespaces/{ns}/pods", f"job-name={job}")
        for pod in pods:
            for cs in (pod.get("status") or {}).get("containerStatuses") or []:
                done = (cs.get("state") or {}).get("terminated")
                if not done:
                    continue
                message = done.get("message") or ""
                if done.get("exitCode") != 0:
                    raise ClusterError(
                        f"the cache pod {pod['metadata']['name']} exited {done.get('exitCode')}: "
                        f"{message.strip() or done.get('reason', '')}"
                    )
                try:
                    return decode_message(message)
                except ValueError as exc:
                    raise ClusterError(f"the cache pod's message is unreadable ({exc})") from None
        job_obj = await client.request("GET", f"/apis/batch/v1/namespaces/{ns}/jobs/{job}")
        for cond in (job_obj.get("status") or {}).get("conditions") or []:
            if cond.get("type") == "Failed" and cond.get("status") == "True":
                raise ClusterError(f"the cache Job failed: {cond.get('reason')}: {cond.get('message')}")
        await asyncio.sleep(POLL_SECONDS)
    raise ClusterError(
        f"the cache pod of Job {ns}/{job} did not finish within {timeout:.0f}s "
        "(is the claim bound and the image pullable?)"
    )
