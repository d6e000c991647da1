"""How the operator scales: N ReDrafterDeployments from apply to validated and Serving on the emulated API server.

    python bench/operator_scale.py                 # N = 100, 500 and 1000
    python bench/operator_scale.py 50 200          # any N
    BENCH_PROFILE=/tmp/prof python bench/operator_scale.py 500
                                                   # cProfile the operator: /tmp/prof-500.prof per N
    BENCH_LOG=/tmp/op.log python bench/operator_scale.py 100   # keep the operator's log

The operator runs as its own process (`redrafter-operator run --all-namespaces`), so its peak RSS is its
own; the emulator and the stand-in built-in controllers run in this process, writing straight into the
store (not counted as API requests): build Jobs finish at once, validation Jobs finish at once with the
termination message a passing `redrafter-operator evaluate validate` writes, Deployments become Ready.
Every resource has distinct build inputs (2 build Jobs + 1 validation Job each), 10 resources per
namespace. Done means every resource Serving on the ReDrafter engine (status.activeEngine redrafter)
with condition Validated=True.

Prints, per N: wall time to done, seconds per resource, operator CPU, this process's CPU (emulator and
stand-ins), API requests per resource (all, writes), writes per idle resync interval (and which requests
they were and which status fields they changed, if any), the operator's peak RSS, and p50/p99 reconcile
latency from the operator's own histogram
``redrafter_operator_reconcile_duration_seconds`` (scraped from its --metrics-port; quantiles
interpolated within buckets as Prometheus' histogram_quantile does). Figures, not assertions.

Idle is measured once the run has settled: after done, the old (base) pool scales down (Progressing=True
Switching until it did), and the speculation policy records the Service's move to ReDrafter
(status.policy.serving, the autoscaler's settle window) at its first evaluation after the move, up to one
spec.speculation.interval (30 s) later; the bench waits for both (time and writes printed as "settle"),
then one resync interval, then counts writes over IDLE_INTERVALS resync intervals.

With BENCH_PROFILE set, the operator runs under ``python -m cProfile -o <BENCH_PROFILE>-<N>.prof``
(it stops on SIGTERM, cleanly, so the profile is written), and this process's emulator and stand-in
threads are profiled into ``<BENCH_PROFILE>-<N>-emulator.prof`` / ``-standins.prof``; read one with
``python -c "import pstats; pstats.Stats('/tmp/prof-500.prof').sort_stats('tottime').print_stats(30)"``.
Profiling slows the operator down: its figures are not comparable with an unprofiled run.
"""

from __future__ import annotations

import collections
import cProfile
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from redrafter_operator.api import API_VERSION, KIND
from redrafter_operator.evaluate import outcome as oc
from redrafter_sim import controllers
from redrafter_sim.server import EmulatorThread, write_kubeconfig

ROOT = Path(__file__).resolve().parents[1]
PER_NAMESPACE = 10
RESYNC_SECONDS = 5.0
IDLE_INTERVALS = 3
SETTLE_SECONDS = 120.0


def resource(i: int) -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "examples" / "llama3-8b.yaml").read_text())
    doc["metadata"] = {"name": f"svc-{i}", "namespace": f"bench-{i // PER_NAMESPACE}"}
    doc["spec"]["model"]["base"]["revision"] = f"rev-{i}"  # distinct build inputs: no shared engines
    return doc


class StandIns(threading.Thread):
    """The Job controller + kubelet (every build and validation Job succeeds at once; a validation Job's
    pod leaves the verdict a passing ``evaluate validate`` writes) and the Deployment controller."""

    PASSED = oc.format_termination_message(
        oc.ValidationOutcome(oc.PASSED, "12 requests per engine (chat, code): 12 greedy outputs identical, no errors")
    )

    def __init__(self, emu: Any) -> None:
        super().__init__(daemon=True, name="stand-in-controllers")
        self.emu, self.stop = emu, threading.Event()

    def run(self) -> None:
        with profiled("standins"):
            self.loop()

    def changed(self, api_version: str, kind: str, seen: dict[tuple[str, str, str], str]):
        """Objects of a kind whose resourceVersion differs from the one last marked in ``seen``."""
        for (ns, name), rv in self.emu.resource_versions(api_version, kind).items():
            if seen.get((kind, ns, name)) != rv:
                obj = self.emu.find_object(api_version, kind, name, ns)
                if obj is not None:
                    yield obj

    def loop(self) -> None:
        seen: dict[tuple[str, str, str], str] = {}  # (kind, namespace, name) -> resourceVersion last looked at
        while not self.stop.is_set():
            # Look only at objects changed since the last pass (as a controller's informer would): listing
            # and copying every object five times a second would make this harness, not the operator,
            # the cost that grows with N.
            for job in self.changed("batch/v1", "Job", seen):
                meta = job["metadata"]
                seen[("Job", meta["namespace"], meta["name"])] = meta["resourceVersion"]
                component = (meta.get("labels") or {}).get("app.kubernetes.io/component")
                if component in ("engine-build", "validation") and not (job.get("status") or {}).get("conditions"):
                    controllers.complete_job(
                        self.emu,
                        meta["name"],
                        meta["namespace"],
                        message=self.PASSED if component == "validation" else "",
                    )
            for dep in self.changed("apps/v1", "Deployment", seen):
                meta, st = dep["metadata"], dep.get("status") or {}
                want = (meta.get("generation"), (dep.get("spec") or {}).get("replicas", 1))
                if (st.get("observedGeneration"), st.get("readyReplicas", 0)) != want:
                    controllers.sync_deployment_pods(self.emu, meta["name"], meta["namespace"])
                else:  # settled: look again only when it changes
                    seen[("Deployment", meta["namespace"], meta["name"])] = meta["resourceVersion"]
            self.stop.wait(0.2)


PROFILE_N: list[int] = []  # the N being profiled (BENCH_PROFILE)


class profiled:
    """Profile this thread into <BENCH_PROFILE>-<N>-<what>.prof while inside (nothing without BENCH_PROFILE)."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.prof = cProfile.Profile() if os.environ.get("BENCH_PROFILE") and PROFILE_N else None

    def __enter__(self) -> None:
        if self.prof:
            self.prof.enable()

    def __exit__(self, *exc: object) -> None:
        if self.prof:
            self.prof.disable()
            self.prof.dump_stats(f"{os.environ['BENCH_PROFILE']}-{PROFILE_N[-1]}-{self.what}.prof")


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


def run(n: int) -> dict[str, Any]:
    PROFILE_N.append(n)
    thread = EmulatorThread()
    serve = thread._run

    def run_profiled() -> None:
        with profiled("emulator"):
            serve()

    thread._run = run_profiled  # type: ignore[method-assign]
    handle = thread.start()
    emu = handle.emulator
    emu.create_object(yaml.safe_load((ROOT / "crds" / "redrafter.dev_redrafterdeployments.yaml").read_text()))
    stand_ins = StandIns(emu)
    stand_ins.start()
    with tempfile.TemporaryDirectory() as tmp:
        kubeconfig = write_kubeconfig(handle.url, Path(tmp) / "kubeconfig")
        exe = Path(sys.executable).parent / "redrafter-operator"
        log = open(os.environ.get("BENCH_LOG") or Path(tmp) / "operator.log", "w")
        port = free_port()
        argv = [
            str(exe),
            "run",
            "--kubeconfig",
            str(kubeconfig),
            "--all-namespaces",
            "--standalone",
            f"--resync-seconds={RESYNC_SECONDS}",
            "--log-level=WARNING",
            f"--metrics-port={port}",
        ]
        if os.environ.get("BENCH_PROFILE"):
            argv = [sys.executable, "-m", "cProfile", "-o", f"{os.environ['BENCH_PROFILE']}-{n}.prof", *argv]
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        try:
            startup = time.monotonic()
            while not any(r.kind == "watch" and "redrafterdeployments" in r.path for r in emu.request_log):
                if proc.poll() is not None or time.monotonic() - startup > 60:
                    raise RuntimeError(f"the operator did not start; see {log.name}")
                time.sleep(0.1)  # operator startup (imports, discovery, initial lists) is not part of the figure
            time.sleep(0.5)
            emu.clear_log()
            cpu0, own0 = cpu_seconds(proc.pid), os.times()
            start = time.monotonic()
            for i in range(n):
                emu.create_object(resource(i))
            deadline = start + max(300.0, n * 3.0)
            shown = start
            while True:
                items = emu.list_objects(API_VERSION, KIND)
                finished = sum(1 for o in items if done(o))
                if finished == n:
                    break
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
                time.sleep(0.25)
            wall = time.monotonic() - start
            cpu = cpu_seconds(proc.pid) - cpu0
            own1 = os.times()
            bench_cpu = own1.user + own1.system - own0.user - own0.system  # the emulator and the stand-ins
            requests = emu.request_log
            total = len([r for r in requests if r.kind != "watch"])
            writes = len([r for r in requests if r.is_write])
            jobs = len(emu.list_objects("batch/v1", "Job"))
            # settle: after the Service moved to ReDrafter the base pool scales down (Progressing=True Switching
            # until then), and the speculation policy records the move (status.policy.serving, the autoscaler's
            # settle window) at its first evaluation after it, up to spec.speculation.interval later; those
            # writes are counted apart. Then let in-flight echoes settle, and count writes over several resync
            # intervals.
            mark = len(emu.request_log)
            settle_start = time.monotonic()
            while not all(at_rest(o) for o in emu.list_objects(API_VERSION, KIND)):
                if time.monotonic() - settle_start > SETTLE_SECONDS:
                    raise RuntimeError(f"not at rest {SETTLE_SECONDS} s after done")
                time.sleep(0.5)
            settle = time.monotonic() - settle_start
            settle_writes = len(emu.writes(mark))
            time.sleep(RESYNC_SECONDS)
            mark = len(emu.request_log)
            before = {o["metadata"]["name"]: o.get("status") or {} for o in emu.list_objects(API_VERSION, KIND)}
            time.sleep(RESYNC_SECONDS * IDLE_INTERVALS)
            idle = emu.writes(mark)
            changed: collections.Counter[str] = collections.Counter()
            for o in emu.list_objects(API_VERSION, KIND):
                changed.update(changed_fields(before.get(o["metadata"]["name"]) or {}, o.get("status") or {}))
            idle_writes = len(idle) / IDLE_INTERVALS
            idle_kinds = collections.Counter(
                f"{r.method} {r.path.split('?')[0].rsplit('/namespaces/', 1)[-1].split('/', 1)[-1].split('/')[0]}"
                + ("/status" if r.path.split("?")[0].endswith("/status") else "")
                for r in idle
            )
            rss = peak_rss_mb(proc.pid)
            p50, p99, reconciles = reconcile_latency(port)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
            log.close()
            stand_ins.stop.set()
            stand_ins.join(5)
            thread.stop()
    return {
        "n": n,
        "wall_s": wall,
        "cpu_s": cpu,
        "bench_cpu_s": bench_cpu,
        "req_per_res": total / n,
        "writes_per_res": writes / n,
        "jobs": jobs,
        "settle_s": settle,
        "settle_writes_per_res": settle_writes / n,
        "idle_writes_per_interval": idle_writes,
        "peak_rss_mb": rss,
        "idle_kinds": dict(idle_kinds),
        "idle_changed": dict(changed),
        "p50_ms": p50 * 1000,
        "p99_ms": p99 * 1000,
        "reconciles": reconciles,
    }


def main(argv: list[str]) -> int:
    sizes = [int(a) for a in argv] or [100, 500, 1000]
    print(
        f"{'N':>5} {'wall s':>8} {'s/res':>7} {'op CPU s':>8} {'emu CPU s':>9} {'req/res':>8} {'writes/res':>10} {'Jobs':>5} "
        f"{'idle writes/interval':>21} {'peak RSS MB':>12} {'reconciles':>10} {'p50 ms':>7} {'p99 ms':>7}"
    )
    for n in sizes:
        r = run(n)
        print(
            f"{r['n']:>5} {r['wall_s']:>8.1f} {r['wall_s'] / n:>7.3f} {r['cpu_s']:>8.1f} {r['bench_cpu_s']:>9.1f} {r['req_per_res']:>8.1f} "
            f"{r['writes_per_res']:>10.1f} {r['jobs']:>5} {r['idle_writes_per_interval']:>21.1f} "
            f"{r['peak_rss_mb']:>12.1f} {r['reconciles']:>10} {r['p50_ms']:>7.1f} {r['p99_ms']:>7.1f}",
            flush=True,
        )
        print(
            f"      settle after done: {r['settle_s']:.1f} s, {r['settle_writes_per_res']:.2f} writes/resource "
            f"(the base pool scaling down, the speculation policy recording the move)",
            flush=True,
        )
        if r["idle_kinds"]:
            print(f"      idle writes by request: {r['idle_kinds']}", flush=True)
            print(f"      status fields they changed (resources): {r['idle_changed']}", flush=True)
    print(
        f"(done = Serving on redrafter, Validated=True; resync every {RESYNC_SECONDS:.0f} s; idle writes averaged "
        f"over {IDLE_INTERVALS} intervals; requests exclude watch streams; writes include Events; op CPU = operator "
        f"process, emu CPU = this process (emulator + stand-ins), apply to done; reconcile latency: the operator's histogram over the whole run)"
    )
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main(sys.argv[1:]))
