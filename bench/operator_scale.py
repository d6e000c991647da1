"""How the operator scales: N ReDrafterDeployments from apply to Serving on the emulated API server.

    python bench/operator_scale.py            # N = 100 and 500
    python bench/operator_scale.py 50 200     # any N

The operator runs as its own process (`redrafter-operator run --all-namespaces`), so its peak RSS is its
own; the emulator and the stand-in built-in controllers (Jobs finish at once, Deployments become Ready)
run in this process, writing straight into the store (not counted as API requests). Every resource has
distinct build inputs (2 Jobs each), 10 resources per namespace. Prints, per N: wall time to all Serving,
API requests per resource (all, writes), writes during idle resync intervals, operator peak RSS.
Figures, not assertions.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from redrafter_operator.api import API_VERSION, KIND
from redrafter_sim import controllers
from redrafter_sim.server import EmulatorThread, write_kubeconfig

ROOT = Path(__file__).resolve().parents[1]
PER_NAMESPACE = 10
RESYNC_SECONDS = 5.0
IDLE_INTERVALS = 3


def resource(i: int) -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "examples" / "llama3-8b.yaml").read_text())
    doc["metadata"] = {"name": f"svc-{i}", "namespace": f"bench-{i // PER_NAMESPACE}"}
    doc["spec"]["model"]["base"]["revision"] = f"rev-{i}"  # distinct build inputs: no shared engines
    return doc


class StandIns(threading.Thread):
    """The Job controller (finish every build at once) and the Deployment controller + kubelet."""

    def __init__(self, emu: Any) -> None:
        super().__init__(daemon=True, name="stand-in-controllers")
        self.emu, self.stop = emu, threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            for job in self.emu.list_objects("batch/v1", "Job", label_selector="app.kubernetes.io/component=engine-build"):
                if not (job.get("status") or {}).get("conditions"):
                    controllers.complete_job(self.emu, job["metadata"]["name"], job["metadata"]["namespace"])
            for dep in self.emu.list_objects("apps/v1", "Deployment"):
                meta, st = dep["metadata"], dep.get("status") or {}
                want = (meta.get("generation"), (dep.get("spec") or {}).get("replicas", 1))
                if (st.get("observedGeneration"), st.get("readyReplicas", 0)) != want:
                    controllers.sync_deployment_pods(self.emu, meta["name"], meta["namespace"])
            self.stop.wait(0.2)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (/proc/<pid>/stat, clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def run(n: int) -> dict[str, float]:
    thread = EmulatorThread()
    handle = thread.start()
    emu = handle.emulator
    emu.create_object(yaml.safe_load((ROOT / "crds" / "redrafter.dev_redrafterdeployments.yaml").read_text()))
    stand_ins = StandIns(emu)
    stand_ins.start()
    with tempfile.TemporaryDirectory() as tmp:
        kubeconfig = write_kubeconfig(handle.url, Path(tmp) / "kubeconfig")
        exe = Path(sys.executable).parent / "redrafter-operator"
        log = open(os.environ.get("BENCH_LOG") or Path(tmp) / "operator.log", "w")
        proc = subprocess.Popen([str(exe), "run", "--kubeconfig", str(kubeconfig), "--all-namespaces", "--standalone",
                                 f"--resync-seconds={RESYNC_SECONDS}", "--log-level=WARNING"],
                                stdout=log, stderr=subprocess.STDOUT)
        try:
            startup = time.monotonic()
            while not any(r.kind == "watch" and "redrafterdeployments" in r.path for r in emu.request_log):
                if proc.poll() is not None or time.monotonic() - startup > 60:
                    raise RuntimeError(f"the operator did not start; see {log.name}")
                time.sleep(0.1)  # operator startup (imports, discovery, initial lists) is not part of the figure
            time.sleep(0.5)
            emu.clear_log()
            cpu0 = cpu_seconds(proc.pid)
            start = time.monotonic()
            for i in range(n):
                emu.create_object(resource(i))
            deadline = start + max(300.0, n * 3.0)
            while True:
                items = emu.list_objects(API_VERSION, KIND)
                serving = sum(1 for o in items if (o.get("status") or {}).get("phase") == "Serving")
                if serving == n:
                    break
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"only {serving}/{n} Serving; see {log.name}")
                time.sleep(0.25)
            wall = time.monotonic() - start
            cpu = cpu_seconds(proc.pid) - cpu0
            requests = emu.request_log
            total = len([r for r in requests if r.kind != "watch"])
            writes = len([r for r in requests if r.is_write])
            jobs = len(emu.list_objects("batch/v1", "Job"))
            # idle: let in-flight echoes settle, then count writes over several resync intervals
            time.sleep(RESYNC_SECONDS)
            mark = len(emu.request_log)
            time.sleep(RESYNC_SECONDS * IDLE_INTERVALS)
            idle = emu.writes(mark)
            idle_writes = len(idle) / IDLE_INTERVALS
            idle_kinds = collections.Counter(f"{r.method} {r.path.split('?')[0].rsplit('/namespaces/', 1)[-1].split('/', 1)[-1].split('/')[0]}"
                                             + ("/status" if r.path.split("?")[0].endswith("/status") else "") for r in idle)
            rss = peak_rss_mb(proc.pid)
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
    return {"n": n, "wall_s": wall, "cpu_s": cpu, "req_per_res": total / n, "writes_per_res": writes / n, "jobs": jobs,
            "idle_writes_per_interval": idle_writes, "peak_rss_mb": rss, "idle_kinds": dict(idle_kinds)}


def main(argv: list[str]) -> int:
    sizes = [int(a) for a in argv] or [100, 500]
    print(f"{'N':>5} {'wall s':>8} {'s/res':>7} {'op CPU s':>8} {'req/res':>8} {'writes/res':>10} {'Jobs':>5} "
          f"{'idle writes/interval':>21} {'peak RSS MB':>12}")
    for n in sizes:
        r = run(n)
        print(f"{r['n']:>5} {r['wall_s']:>8.1f} {r['wall_s'] / n:>7.3f} {r['cpu_s']:>8.1f} {r['req_per_res']:>8.1f} "
              f"{r['writes_per_res']:>10.1f} {r['jobs']:>5} {r['idle_writes_per_interval']:>21.1f} "
              f"{r['peak_rss_mb']:>12.1f}", flush=True)
        if r["idle_kinds"]:
            print(f"      idle writes by request: {r['idle_kinds']}", flush=True)
    print(f"(resync every {RESYNC_SECONDS:.0f} s; idle writes averaged over {IDLE_INTERVALS} intervals; "
          f"requests exclude watch streams; writes include Events; op CPU = operator process, apply to Serving)")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main(sys.argv[1:]))
