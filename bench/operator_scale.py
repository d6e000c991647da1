"""How the operator scales: N ReDrafterDeployments from apply to validated and Serving on a real control plane.

    python bench/operator_scale.py                 # N = 100 and 1000
    python bench/operator_scale.py 50 200          # any N
    BENCH_PROFILE=/tmp/prof python bench/operator_scale.py 500
                                                   # cProfile the operator: /tmp/prof-500.prof per N
    BENCH_LOG=/tmp/op.log python bench/operator_scale.py 100   # keep the operator's log

Each N gets a fresh control plane (:mod:`redrafter_sim.controlplane`: etcd, kube-apiserver, the controller manager
and the scheduler, built by ``make controlplane``). The operator runs as its own process
(``redrafter-operator run --all-namespaces``) with a bound token of the Helm chart's ServiceAccount, under the
chart's ClusterRole. One node (:class:`redrafter_sim.node.SimNode`) with the GPUs, pods, CPU and memory of a whole
cluster runs no process: its pods go through kwok's stages (:mod:`redrafter_sim.kwokstages`): a build Job's pod
Running, then Succeeded with the termination message ``engine_jobs build`` writes, a validation Job's pod with the
one a passing ``redrafter-operator evaluate validate`` writes, a serving pod Running and Ready. Kubernetes' own Job,
ReplicaSet and Deployment controllers and its scheduler do the rest. Every resource has distinct build inputs
(2 build Jobs + 1 validation Job each), 10 resources per namespace, each namespace with the two claims the example
names (PersistentVolumes pre-bound to them: the scheduler will not place a Pod whose claim is unbound). Done means
every resource Serving on the ReDrafter engine (status.activeEngine redrafter) with condition Validated=True.

Prints, per N: wall time to done, seconds per resource, operator CPU, the control plane's CPU (its four processes)
and this process's (the node), API requests per resource (all but watches, and writes), writes per idle resync
interval (and which requests they were and which status fields they changed, if any), the operator's peak RSS, and
p50/p99 reconcile latency from the operator's own histogram ``redrafter_operator_reconcile_duration_seconds``
(scraped from its --metrics-port; quantiles interpolated within buckets as Prometheus' histogram_quantile does).
Figures, not assertions.

The operator's requests are counted from kube-apiserver's audit log: a policy that records, at level Metadata, the
requests of the operator's ServiceAccount alone, one event per request at its ResponseComplete stage (a watch's
ResponseStarted is how the bench sees the operator's watch open). ``apiserver_request_total`` cannot tell the
operator's requests from the controllers', the scheduler's and the node's.

Idle is measured once the run has settled: after done, the old (base) pool scales down (Progressing=True
Switching until it did), and the speculation policy records the Service's move to ReDrafter
(status.policy.serving, the autoscaler's settle window) at its first evaluation after the move, up to one
spec.speculation.interval (30 s) later; the bench waits for both (time and writes printed as "settle"),
then one resync interval, then counts writes over IDLE_INTERVALS resync intervals.

With BENCH_PROFILE set, the operator runs under ``python -m cProfile -o <BENCH_PROFILE>-<N>.prof`` (it stops on
SIGTERM, cleanly, so the profile is written); read one with
``python -c "import pstats; pstats.Stats('/tmp/prof-500.prof').sort_stats('tottime').print_stats(30)"``.
Profiling slows the operator down: its figures are not comparable with an unprofiled run.
"""

from __future__ import annotations

import asyncio
import collections
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from engine_jobs.contract import BuildResult
from redrafter_operator.api import API_VERSION, PLURAL
from redrafter_operator.api.crd import crd_yaml
from redrafter_operator.evaluate import outcome as oc
from redrafter_sim.chartrbac import chart_rbac
from redrafter_sim.controlplane import ControlPlane, free_port, write_yaml
from redrafter_sim.demo import kubectl
from redrafter_sim.kubeapi import ApiStatusError, Kind, KubeApi
from redrafter_sim.kwokstages import KwokStages
from redrafter_sim.node import SimNode
from redrafter_sim.nodes import A100
from redrafter_sim.nodevolumes import claim_objects

ROOT = Path(__file__).resolve().parents[1]
RDD = Kind(API_VERSION, PLURAL)
PER_NAMESPACE = 10
RESYNC_SECONDS = 5.0
IDLE_INTERVALS = 3
SETTLE_SECONDS = 120.0
SYSTEM = "redrafter-system"  # the chart's release namespace, as the README's helm install
CLAIMS = ("engine-cache", "drafters")  # what examples/llama3-8b.yaml mounts
WRITES = ("create", "update", "patch", "delete", "deletecollection")
BUILT = BuildResult(size_bytes=17_179_869_184, built_at="2026-12-01T10:00:00Z").message("OK: engine built")
PASSED = oc.format_termination_message(
    oc.ValidationOutcome(oc.PASSED, "12 requests per engine (chat, code): 12 greedy outputs identical, no errors")
)


def resource(i: int) -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "examples" / "llama3-8b.yaml").read_text())
    doc["metadata"] = {"name": f"svc-{i}", "namespace": f"bench-{i // PER_NAMESPACE}"}
    doc["spec"]["model"]["base"]["revision"] = f"rev-{i}"  # distinct build inputs: no shared engines
    return doc


def termination_message(pod: dict[str, Any]) -> str:
    """What the Job's program writes to /dev/termination-log when it succeeds."""
    component = (pod["metadata"].get("labels") or {}).get("app.kubernetes.io/component")
    return {"engine-build": BUILT, "validation": PASSED}.get(component or "", "")


def namespaces(n: int, node_dir: Path) -> list[dict[str, Any]]:
    """The bench namespaces, each with the claims the example names, bound to PersistentVolumes."""
    out: list[dict[str, Any]] = []
    for k in range(math.ceil(n / PER_NAMESPACE)):
        ns = f"bench-{k}"
        out.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        for claim in CLAIMS:
            out.extend(claim_objects(ns, claim, node_dir / "pv" / f"{ns}_{claim}"))
    return out


def audit_policy(user: str) -> dict[str, Any]:
    """Record ``user``'s requests only, once each (ResponseComplete; a watch also at ResponseStarted)."""
    return {
        "apiVersion": "audit.k8s.io/v1",
        "kind": "Policy",
        "omitStages": ["RequestReceived"],
        "rules": [{"level": "Metadata", "users": [user]}, {"level": "None"}],
    }


class AuditLog:
    """The operator's requests as kube-apiserver's audit log recorded them."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def events(self, since: int = 0) -> list[dict[str, Any]]:
        """Every event from line ``since`` on."""
        if not self.path.exists():
            return []
        lines = self.path.read_text().splitlines()[since:]
        return [json.loads(line) for line in lines if line.strip()]

    def mark(self) -> int:
        return len(self.path.read_text().splitlines()) if self.path.exists() else 0

    def requests(self, since: int = 0) -> list[dict[str, Any]]:
        """Completed requests other than watches."""
        return [e for e in self.events(since) if e.get("stage") == "ResponseComplete" and e.get("verb") != "watch"]

    def watching(self, plural: str) -> bool:
        return any(
            e.get("verb") == "watch" and (e.get("objectRef") or {}).get("resource") == plural for e in self.events()
        )


def writes(requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in requests if r.get("verb") in WRITES]


def request_kind(event: dict[str, Any]) -> str:
    ref = event.get("objectRef") or {}
    sub = f"/{ref['subresource']}" if ref.get("subresource") else ""
    return f"{event.get('verb')} {ref.get('resource')}{sub}"


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (/proc/<pid>/stat, clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def done(obj: dict[str, Any]) -> bool:
    """Serving on the ReDrafter engine, validated."""
    st = obj.get("status") or {}
    return (
        st.get("phase") == "Serving"
        and st.get("activeEngine") == "redrafter"
        and any(c.get("type") == "Validated" and c.get("status") == "True" for c in st.get("conditions") or [])
    )


def at_rest(obj: dict[str, Any]) -> bool:
    """The switch is over (Progressing=False Complete: the old pool scaled down) and the speculation policy
    has evaluated since the Service moved (or keeps no state: mode Never)."""
    st = obj.get("status") or {}
    complete = any(
        c.get("type") == "Progressing" and c.get("status") == "False" and c.get("reason") == "Complete"
        for c in st.get("conditions") or []
    )
    return complete and (not st.get("policy") or st["policy"].get("serving") == st.get("activeEngine"))


def progress(items: list[dict[str, Any]]) -> str:
    """How far the resources are: counts by phase / active engine / validation state."""
    seen = collections.Counter(
        f"{(o.get('status') or {}).get('phase')}/{(o.get('status') or {}).get('activeEngine')}/"
        f"{((o.get('status') or {}).get('validation') or {}).get('state')}"
        for o in items
    )
    return ", ".join(f"{k}: {v}" for k, v in seen.most_common())


def changed_fields(old: Any, new: Any, path: str = "status", depth: int = 3) -> list[str]:
    """Paths (up to ``depth`` levels; list items by their type, as conditions are) whose values differ."""
    if old == new:
        return []
    if depth == 0 or not isinstance(old, dict) or not isinstance(new, dict):
        if isinstance(old, list) and isinstance(new, list) and depth:
            by_type = lambda items: {i.get("type", n): i for n, i in enumerate(items) if isinstance(i, dict)}  # noqa: E731
            return changed_fields(by_type(old), by_type(new), path, depth)
        return [path]
    return [
        p
        for k in sorted({*old, *new}, key=str)
        for p in changed_fields(old.get(k), new.get(k), f"{path}.{k}", depth - 1)
    ]


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus' histogram_quantile over cumulative (upper bound, count) buckets: linear interpolation
    inside the bucket holding the q-th observation (lower bound 0 for the first bucket; the +Inf bucket
    answers with the highest finite bound)."""
    buckets = sorted(buckets)
    if len(buckets) < 2 or not math.isinf(buckets[-1][0]) or buckets[-1][1] == 0:
        return float("nan")
    rank = q * buckets[-1][1]
    for i, (bound, count) in enumerate(buckets):
        if count >= rank:
            if math.isinf(bound):
                return buckets[-2][0]
            lower, below = (0.0, 0.0) if i == 0 else buckets[i - 1]
            return lower + (bound - lower) * ((rank - below) / (count - below) if count > below else 1.0)
    return float("nan")


def reconcile_latency(port: int) -> tuple[float, float, int]:
    """(p50, p99, count) of redrafter_operator_reconcile_duration_seconds from the operator's /metrics."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    buckets: list[tuple[float, float]] = []
    for family in text_string_to_metric_families(text):
        if family.name == "redrafter_operator_reconcile_duration_seconds":
            buckets = [(float(s.labels["le"]), s.value) for s in family.samples if s.name.endswith("_bucket")]
    total = int(max((c for _, c in buckets), default=0))
    return histogram_quantile(0.5, buckets), histogram_quantile(0.99, buckets), total


def control_plane_cpu(cp: ControlPlane) -> float:
    return sum(cpu_seconds(c.proc.pid) for c in cp.components.values() if c.proc is not None)


class Resources:
    """Every ReDrafterDeployment as the admin's watch last saw it."""

    def __init__(self, api: KubeApi) -> None:
        self.items: dict[tuple[str, str], dict[str, Any]] = {}
        self.task = asyncio.create_task(self._watch(api), name="bench/watch")

    async def _watch(self, api: KubeApi) -> None:
        while True:
            try:
                async for event, obj in api.watch(RDD):
                    key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
                    if event == "DELETED":
                        self.items.pop(key, None)
                    else:
                        self.items[key] = obj
            except ApiStatusError as exc:  # 429 while a new CRD's watch cache initializes
                if exc.code != 429:
                    raise
                await asyncio.sleep(1.0)

    def all(self) -> list[dict[str, Any]]:
        return list(self.items.values())


async def operator_kubeconfig(cp: ControlPlane, admin: Path, tmp: Path) -> tuple[Path, str]:
    """The chart's ServiceAccount and RBAC applied, and a kubeconfig with a bound token of it (and its user name)."""
    rbac, account = chart_rbac("redrafter", SYSTEM)
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SYSTEM}}
    await kubectl(admin, tmp, "apply", "--server-side", "-f", "-", stdin=yaml.safe_dump_all([namespace, *rbac]))
    path = await asyncio.to_thread(cp.service_account_kubeconfig, tmp / "operator.kubeconfig", SYSTEM, account)
    return path, f"system:serviceaccount:{SYSTEM}:{account}"


async def run(n: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="redrafter-scale-") as tmp_name:
        tmp = Path(tmp_name)
        _, account = chart_rbac("redrafter", SYSTEM)
        policy = write_yaml(tmp / "audit-policy.yaml", audit_policy(f"system:serviceaccount:{SYSTEM}:{account}"))
        audit = AuditLog(tmp / "audit.log")
        cp = ControlPlane(
            tmp / "controlplane",
            extra_apiserver_args=(
                f"--audit-policy-file={policy}",
                f"--audit-log-path={audit.path}",
                "--audit-log-maxsize=100000",  # MB: never rotated during a run
            ),
        )
        await asyncio.to_thread(cp.start)
        try:
            return await measure(n, cp, audit, tmp)
        finally:
            await asyncio.to_thread(cp.stop)


async def measure(n: int, cp: ControlPlane, audit: AuditLog, tmp: Path) -> dict[str, Any]:
    admin = cp.admin_kubeconfig
    await kubectl(admin, tmp, "apply", "--server-side", "-f", "-", stdin=crd_yaml())
    await asyncio.to_thread(cp.wait_established, f"{PLURAL}.{API_VERSION.split('/')[0]}")
    operator_config, _ = await operator_kubeconfig(cp, admin, tmp)
    node_dir = tmp / "node"
    await kubectl(admin, tmp, "apply", "--server-side", "-f", "-", stdin=yaml.safe_dump_all(namespaces(n, node_dir)))
    stages = KwokStages(message=termination_message)
    capacity = {"pods": str(8 * n + 100), "cpu": str(8 * n + 100), "memory": f"{64 * n + 1024}Gi"}
    node = SimNode(
        cp.node_kubeconfig("scale-node-0"),
        name="scale-node-0",
        product=A100,
        gpus=4 * n + 16,
        node_dir=node_dir,
        stages=stages,
        allocatable=capacity,
    )
    log = open(os.environ.get("BENCH_LOG") or tmp / "operator.log", "w")  # noqa: SIM115 - closed in finally
    port = free_port()
    argv = [
        str(Path(sys.executable).parent / "redrafter-operator"),
        "run",
        "--kubeconfig",
        str(operator_config),
        "--all-namespaces",
        "--standalone",
        f"--resync-seconds={RESYNC_SECONDS}",
        "--log-level=WARNING",
        f"--metrics-port={port}",
    ]
    if os.environ.get("BENCH_PROFILE"):
        argv = [sys.executable, "-m", "cProfile", "-o", f"{os.environ['BENCH_PROFILE']}-{n}.prof", *argv]
    async with node, KubeApi.from_kubeconfig(admin, timeout=60) as api:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        resources = Resources(api)
        try:
            startup = time.monotonic()
            while not audit.watching(PLURAL):
                if proc.poll() is not None or time.monotonic() - startup > 120:
                    raise RuntimeError(f"the operator did not start; see {log.name}")
                await asyncio.sleep(0.2)  # startup (imports, discovery, initial lists) is not part of the figure
            await asyncio.sleep(1.0)
            mark = audit.mark()
            cpu0, cp0, own0 = cpu_seconds(proc.pid), control_plane_cpu(cp), os.times()
            start = time.monotonic()
            gate = asyncio.Semaphore(8)

            async def apply(i: int) -> None:
                async with gate:
                    await api.create(RDD, resource(i))

            await asyncio.gather(*(apply(i) for i in range(n)))
            deadline = start + max(300.0, n * 3.0)
            shown = start
            while True:
                items = resources.all()
                finished = sum(1 for o in items if done(o))
                if finished == n:
                    break
                if resources.task.done():
                    resources.task.result()  # the watch failed: say why
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(
                        f"only {finished}/{n} validated and Serving on redrafter ({progress(items)}); see {log.name}"
                    )
                if time.monotonic() - shown > 15:
                    shown = time.monotonic()
                    print(
                        f"      {shown - start:.0f} s: {finished}/{n} done ({progress(items)})",
                        file=sys.stderr,
                        flush=True,
                    )
                await asyncio.sleep(0.5)
            wall = time.monotonic() - start
            cpu = cpu_seconds(proc.pid) - cpu0
            cp_cpu = control_plane_cpu(cp) - cp0
            own1 = os.times()
            bench_cpu = own1.user + own1.system - own0.user - own0.system  # the node (and this bench's watch)
            requests = audit.requests(mark)
            total, written = len(requests), len(writes(requests))
            jobs = len(await api.list(Kind("batch/v1", "jobs")))
            # settle: after the Service moved to ReDrafter the base pool scales down (Progressing=True Switching
            # until then), and the speculation policy records the move (status.policy.serving, the autoscaler's
            # settle window) at its first evaluation after it, up to spec.speculation.interval later; those
            # writes are counted apart. Then let in-flight echoes settle, and count writes over several resync
            # intervals.
            mark = audit.mark()
            settle_start = time.monotonic()
            while not all(at_rest(o) for o in resources.all()):
                if time.monotonic() - settle_start > SETTLE_SECONDS:
                    raise RuntimeError(f"not at rest {SETTLE_SECONDS} s after done")
                await asyncio.sleep(0.5)
            settle = time.monotonic() - settle_start
            settle_writes = len(writes(audit.requests(mark)))
            await asyncio.sleep(RESYNC_SECONDS)
            mark = audit.mark()
            before = {o["metadata"]["name"]: o.get("status") or {} for o in resources.all()}
            await asyncio.sleep(RESYNC_SECONDS * IDLE_INTERVALS)
            idle = writes(audit.requests(mark))
            changed: collections.Counter[str] = collections.Counter()
            for o in resources.all():
                changed.update(changed_fields(before.get(o["metadata"]["name"]) or {}, o.get("status") or {}))
            idle_kinds = collections.Counter(request_kind(r) for r in idle)
            rss = peak_rss_mb(proc.pid)
            p50, p99, reconciles = await asyncio.to_thread(reconcile_latency, port)
        finally:
            resources.task.cancel()
            await asyncio.gather(resources.task, return_exceptions=True)
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(proc.wait, 30)
            except subprocess.TimeoutExpired:
                proc.kill()
            log.close()
    return {
        "n": n,
        "wall_s": wall,
        "cpu_s": cpu,
        "cp_cpu_s": cp_cpu,
        "bench_cpu_s": bench_cpu,
        "req_per_res": total / n,
        "writes_per_res": written / n,
        "jobs": jobs,
        "settle_s": settle,
        "settle_writes_per_res": settle_writes / n,
        "idle_writes_per_interval": len(idle) / IDLE_INTERVALS,
        "peak_rss_mb": rss,
        "idle_kinds": dict(idle_kinds),
        "idle_changed": dict(changed),
        "p50_ms": p50 * 1000,
        "p99_ms": p99 * 1000,
        "reconciles": reconciles,
        "node_errors": node.errors,
        "by_verb": dict(collections.Counter(str(r.get("verb")) for r in requests).most_common()),
    }


def main(argv: list[str]) -> int:
    sizes = [int(a) for a in argv] or [100, 1000]
    print(
        f"{'N':>5} {'wall s':>8} {'s/res':>7} {'op CPU s':>8} {'cp CPU s':>8} {'node CPU s':>10} {'req/res':>8} "
        f"{'writes/res':>10} {'Jobs':>5} {'idle writes/interval':>21} {'peak RSS MB':>12} {'reconciles':>10} "
        f"{'p50 ms':>7} {'p99 ms':>7}"
    )
    for n in sizes:
        r = asyncio.run(run(n))
        print(
            f"{r['n']:>5} {r['wall_s']:>8.1f} {r['wall_s'] / n:>7.3f} {r['cpu_s']:>8.1f} {r['cp_cpu_s']:>8.1f} "
            f"{r['bench_cpu_s']:>10.1f} {r['req_per_res']:>8.1f} {r['writes_per_res']:>10.1f} {r['jobs']:>5} "
            f"{r['idle_writes_per_interval']:>21.1f} {r['peak_rss_mb']:>12.1f} {r['reconciles']:>10} "
            f"{r['p50_ms']:>7.1f} {r['p99_ms']:>7.1f}",
            flush=True,
        )
        print(
            f"      settle after done: {r['settle_s']:.1f} s, {r['settle_writes_per_res']:.2f} writes/resource "
            f"(the base pool scaling down, the speculation policy recording the move); load average "
            f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs",
            flush=True,
        )
        print(f"      the operator's requests by verb (apply to done): {r['by_verb']}", flush=True)
        if r["idle_kinds"]:
            print(f"      idle writes by request: {r['idle_kinds']}", flush=True)
            print(f"      status fields they changed (resources): {r['idle_changed']}", flush=True)
    print(
        f"(done = Serving on redrafter, Validated=True; resync every {RESYNC_SECONDS:.0f} s; idle writes averaged "
        f"over {IDLE_INTERVALS} intervals; requests: the operator's, from the audit log, watches excluded, Events "
        f"included; op CPU = operator process, cp CPU = etcd + kube-apiserver + controller manager + scheduler, "
        f"node CPU = this process (the node), apply to done; reconcile latency: the operator's histogram over the "
        f"whole run)"
    )
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main(sys.argv[1:]))
