"""Seeded fault episodes against the unmodified operator: does it converge, and what did the faults cost?

One episode runs the whole lifecycle on the emulated cluster (apply, both builds, validation, serving on the
ReDrafter engine, a switch to base and back through ``spec.speculation.mode``) while a seeded schedule hits the
control plane: 5xx bursts, 429 with ``Retry-After``, 409 storms on writes, added latency, watch streams cut
(clean or by a reset connection) or answered ``ERROR 410 Expired``, short API outages, an API server restart
that keeps its objects, and ``SIGKILL`` of an operator process (restarted as a kubelet restarts a container).
A third of the episodes run two replicas with leader election, and the kills then prefer the leader.

What an episode reports (:class:`Episode`):

* converged: after the faults stop, the resource reaches the intended state (Serving the ReDrafter engine,
  observedGeneration current, the Service on the ReDrafter pool, both switches in ``status.history``) within
  ``converge_timeout``; ``converge_s`` is how long that took after the last fault;
* duplicate_jobs: build Jobs beyond one per (variant, engine key), validation Jobs beyond one (no build or
  validation fails here, so any extra Job is a duplicate);
* history_errors: switches lost, repeated or out of order in ``status.history``;
* crashes: operator exits other than the injected kills (a leader that lost its Lease exits 1 by design and
  is restarted; that is counted as ``lease_exits``, not as a crash);
* non_leader_writes: successful writes by a replica while the Lease, as its last successful write shows it,
  named another;
* idle_writes: writes by the operator in ``idle_seconds`` once it has settled after convergence (Lease
  renewals excluded). Writes while it settles (until 1.5 s pass without one, and while a replica is within
  its startup allowance: the last status updates of the convergence) are counted as ``settle_writes``.

``bench/chaos.py`` runs many seeds and prints the table; a pytest runs a few.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import socket
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from engine_jobs.contract import BuildResult
from redrafter_operator.api import API_VERSION, GROUP, KIND, PLURAL
from redrafter_operator.api.crd import crd_yaml
from redrafter_operator.render import names, validation

from . import controllers
from .apiserver import ApiServerEmulator
from .operator_process import OperatorProcess
from .server import EmulatorThread, write_kubeconfig

NS = "default"
NAME = "chaos"
LEASE, LEASE_NS = "redrafter-operator", "default"
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "llama3-8b.yaml"
BIN = Path(sys.executable).parent
FAULTS = ("5xx", "429", "409", "latency", "reset", "cut", "expire", "outage", "restart", "kill")
#: what a build Pod and a validation Pod report when they succeed (engine_jobs, evaluate)
BUILT_MESSAGE = BuildResult(size_bytes=17_179_869_184, built_at="2026-12-01T10:00:00Z").message("OK: engine built")
VALIDATED_MESSAGE = "Passed: 12 prompts identical"
STARTUP_SECONDS = 8.0  # a restarted replica has listed everything and reconciled once by then
EXPECTED_HISTORY = [("redrafter", "base"), ("base", "redrafter")]
#: kube-apiserver serves these watches from etcd, not from its watch cache: an etcd compaction expires them
#: (ERROR 410 on the next watch from an older resourceVersion), as it does on a cluster that disables their cache;
#: the other kinds stay cached, and a kube-apiserver restart expires those (its new cache starts at the present).
APISERVER_ARGS = (f"--watch-cache-sizes={PLURAL}.{GROUP}#0,jobs.batch#0",)


@dataclass
class Episode:
    seed: int
    replicas: int
    converged: bool = False
    converge_s: float | None = None
    duplicate_jobs: int = 0
    history_errors: int = 0
    crashes: int = 0
    lease_exits: int = 0
    non_leader_writes: int = 0
    idle_writes: int = 0
    settle_writes: int = 0  # re-applies right after convergence, before the operator went quiet
    faults: Counter[str] = field(default_factory=Counter)
    steps: list[float | None] = field(default_factory=list)  # seconds each lifecycle step took (None: timed out)
    detail: str = ""

    @property
    def clean(self) -> bool:
        return self.converged and not (
            self.duplicate_jobs or self.history_errors or self.crashes or self.non_leader_writes or self.idle_writes
        )


class Replica:
    """One operator replica (:class:`OperatorProcess`), its identity the bearer token's user; restarted after
    every exit, as a kubelet restarts a container."""

    def __init__(self, pod: str, url: str, emulator: ApiServerEmulator, workdir: Path, elect: bool) -> None:
        self.pod = pod
        emulator.add_token(f"token-{pod}", pod)
        kubeconfig = write_kubeconfig(url, workdir / f"kubeconfig-{pod}", token=f"token-{pod}")
        args = (
            [
                "--leader-elect",
                f"--leader-election-namespace={LEASE_NS}",
                f"--leader-election-id={LEASE}",
                "--lease-duration=4s",
                "--renew-deadline=3s",
                "--retry-period=0.5s",
            ]
            if elect
            else ["--standalone"]
        )
        args += ["--resync-seconds=300", "--log-format=json"]
        env = {"POD_NAME": pod, "POD_NAMESPACE": LEASE_NS, "PYTHONUNBUFFERED": "1"}
        self.process = OperatorProcess(kubeconfig, NS, workdir / f"{pod}.log", args, env)
        self.started_at = 0.0
        self.killed = False  # the current process was killed by the schedule
        self.exits: list[tuple[int, bool, str]] = []  # (code, killed by us, last log lines)

    async def start(self) -> None:
        self.killed, self.started_at = False, time.monotonic()
        await self.process.start()

    def kill(self) -> None:
        if self.process.alive():
            self.killed = True
            self.process.kill()

    async def supervise(self, stop: asyncio.Event, rng: random.Random) -> None:
        """The kubelet's part: restart the container whenever it exits (after a short backoff)."""
        while not stop.is_set():
            assert self.process.proc is not None
            code = await self.process.proc.wait()
            self.exits.append((code, self.killed, self.process.log_tail(8)))
            if stop.is_set():
                return
            await asyncio.sleep(rng.uniform(0.2, 1.0))
            await self.start()

    async def stop(self) -> None:
        await self.process.stop(grace=15)


class Episodes:
    """The emulated cluster of one episode: API server (restartable on its port), built-in controllers, and a
    Job runner that completes build and validation Jobs as their pods would."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.emu = ApiServerEmulator()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.thread = EmulatorThread(self.emu, self.port)
        self.url = self.thread.start().url
        self.seen_jobs: dict[str, float] = {}
        self.tick_errors: list[str] = []

    def restart_apiserver(self) -> None:
        """Stop serving (every connection drops), then serve the same objects again on the same port."""
        self.thread.stop()
        self.thread = EmulatorThread(self.emu, self.port)
        self.thread.start()

    def close(self) -> None:
        self.thread.stop()

    def tick(self, delay: float) -> None:
        controllers.reconcile_once(self.emu, NS)
        now = time.monotonic()
        for job in self.emu.list_objects("batch/v1", "Job", NS):
            name = job["metadata"]["name"]
            status = job.get("status") or {}
            if any(c.get("status") == "True" for c in status.get("conditions") or []):
                continue
            first = self.seen_jobs.setdefault(name, now)
            if now - first >= delay:
                component = (job["metadata"].get("labels") or {}).get(names.LABEL_COMPONENT)
                message = BUILT_MESSAGE if component == "engine-build" else VALIDATED_MESSAGE
                controllers.complete_job(self.emu, name, NS, message=message)

    def rdd(self) -> dict[str, Any]:
        return self.emu.find_object(API_VERSION, KIND, NAME, NS) or {}


def intended(cl: Episodes) -> bool:
    body = cl.rdd()
    status = body.get("status") or {}
    svc = cl.emu.find_object("v1", "Service", names.service_name(NAME), NS)
    history = [(h.get("from"), h.get("to")) for h in status.get("history") or []]
    return bool(
        status.get("phase") == "Serving"
        and status.get("activeEngine") == "redrafter"
        and status.get("observedGeneration") == body["metadata"].get("generation")
        and svc is not None
        and svc["spec"]["selector"].get(names.LABEL_TRAFFIC) == "redrafter"
        and history[-len(EXPECTED_HISTORY) :] == EXPECTED_HISTORY
    )


def _set_mode(cl: Episodes, mode: str) -> None:
    cl.emu.patch_object(API_VERSION, KIND, NAME, NS, {"spec": {"speculation": {"mode": mode}}})


async def _until(predicate: Any, timeout: float) -> float | None:
    """Seconds until ``predicate`` held (None: not within ``timeout``)."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if predicate():
            return time.monotonic() - start
        await asyncio.sleep(0.05)
    return time.monotonic() - start if predicate() else None


async def _inject(
    cl: Episodes,
    replicas: list[Replica],
    rng: random.Random,
    stop: asyncio.Event,
    ep: Episode,
    kinds: tuple[str, ...],
) -> None:
    """The seeded fault schedule: one fault of ``kinds`` every 0.3 to 1.2 s until ``stop``."""
    while kinds and not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), rng.uniform(0.3, 1.2))
        if stop.is_set():
            return
        kind = rng.choice(kinds)
        ep.faults[kind] += 1
        emu = cl.emu
        if kind == "5xx":
            emu.inject("*", r"^/api", rng.choice([500, 502, 503]), times=rng.randint(1, 6))
        elif kind == "429":
            emu.inject("*", r"^/api", 429, times=rng.randint(1, 6), message="too many requests", retry_after=1)
        elif kind == "409":
            for method in ("PATCH", "POST"):
                emu.inject(method, r"^/api", 409, times=rng.randint(2, 8), message="the object has been modified")
        elif kind == "latency":
            emu.inject("*", r"^/api", 0, times=rng.randint(5, 30), delay=rng.uniform(0.05, 0.5))
        elif kind == "reset":
            emu.drop_watches(abort=True)
        elif kind == "cut":
            emu.drop_watches()
        elif kind == "expire":
            emu.expire_watches()
        elif kind == "outage":
            fault = emu.inject("*", r"^/", 503, times=10**9, message="apiserver unavailable", retry_after=1)
            await asyncio.sleep(rng.uniform(0.3, 2.0))
            fault.remaining = 0
        elif kind == "restart":
            await asyncio.to_thread(cl.restart_apiserver)
        elif kind == "kill":
            holder = (
                (emu.find_object("coordination.k8s.io/v1", "Lease", LEASE, LEASE_NS) or {}).get("spec") or {}
            ).get("holderIdentity")
            leader = [r for r in replicas if r.pod == holder]
            target = leader[0] if leader and rng.random() < 0.7 else rng.choice(replicas)
            target.kill()


def non_leader_writes(emu: ApiServerEmulator, pods: set[str]) -> int:
    """Successful writes by a replica while the last successful Lease write was another's."""
    holder, count = "", 0
    for r in emu.request_log:
        if r.user not in pods or r.kind != "write" or not (200 <= (r.status or 0) < 300):
            continue
        if "/leases/" in r.path or r.path.endswith("/leases"):
            holder = r.user
        elif holder and r.user != holder:
            count += 1
    return count


def count_duplicates(emu: ApiServerEmulator) -> int:
    builds: Counter[tuple[str, str]] = Counter()
    validations = 0
    for job in emu.list_objects("batch/v1", "Job", NS):
        labels = job["metadata"].get("labels") or {}
        if labels.get(names.LABEL_COMPONENT) == "engine-build":
            builds[(labels.get(names.LABEL_VARIANT, ""), labels.get(names.LABEL_ENGINE_KEY, ""))] += 1
        elif labels.get(names.LABEL_COMPONENT) == validation.COMPONENT:
            validations += 1
    return sum(n - 1 for n in builds.values()) + max(0, validations - 1)


async def run_episode(
    seed: int,
    workdir: Path,
    *,
    replicas: int | None = None,
    fault_seconds: float = 12.0,
    step_timeout: float = 90.0,
    converge_timeout: float = 60.0,
    idle_seconds: float = 3.0,
    job_delay: float = 0.5,
    kinds: tuple[str, ...] = FAULTS,
) -> Episode:
    rng = random.Random(seed)
    n = replicas if replicas is not None else (2 if rng.random() < 1 / 3 else 1)
    ep = Episode(seed, n)
    workdir.mkdir(parents=True, exist_ok=True)
    cl = Episodes(workdir)
    done = asyncio.Event()
    tasks: list[asyncio.Task[Any]] = []
    procs = [Replica(f"op-{chr(97 + i)}", cl.url, cl.emu, workdir, elect=n > 1) for i in range(n)]
    try:
        cl.emu.create_object(yaml.safe_load(crd_yaml()))

        async def cluster_loop() -> None:
            while not done.is_set():
                try:
                    await asyncio.to_thread(cl.tick, job_delay)
                except Exception as exc:  # an object gone between list and update: the next tick sees it
                    cl.tick_errors.append(f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(0.05)

        tasks.append(asyncio.create_task(cluster_loop()))
        for p in procs:
            await p.start()
            tasks.append(asyncio.create_task(p.supervise(done, rng)))
        body = yaml.safe_load(EXAMPLE.read_text())
        body["metadata"] = {"name": NAME, "namespace": NS}
        cl.emu.create_object(body)

        faults_stop = asyncio.Event()
        injector = asyncio.create_task(_inject(cl, procs, rng, faults_stop, ep, kinds))
        calm: list[float] = []

        async def stop_faults() -> None:
            await asyncio.sleep(fault_seconds)
            faults_stop.set()
            await injector
            cl.emu.lift_faults()  # what is left of the last faults
            calm.append(time.monotonic())

        stopper = asyncio.create_task(stop_faults())
        tasks.append(stopper)

        def serving(engine: str) -> bool:
            st = cl.rdd().get("status") or {}
            return st.get("phase") == "Serving" and st.get("activeEngine") == engine

        # the lifecycle starts under faults and goes on after them; each step must finish (else the
        # episode did not converge): Serving on ReDrafter, pinned to base, pinned back to ReDrafter
        ep.steps.append(await _until(lambda: serving("redrafter"), step_timeout))
        if ep.steps[-1] is not None:
            _set_mode(cl, "Never")
            ep.steps.append(await _until(lambda: serving("base"), step_timeout))
        if ep.steps[-1] is not None:
            _set_mode(cl, "Always")
        await stopper
        if ep.steps[-1] is not None:
            converged = await _until(lambda: intended(cl), converge_timeout)
            ep.converge_s = None if converged is None else time.monotonic() - calm[0]
        ep.converged = ep.converge_s is not None
        if ep.converged:
            pods = {p.pod for p in procs}

            def writes(since: int) -> list[Any]:
                return [
                    r
                    for r in cl.emu.request_log[since:]
                    if r.user in pods and r.kind == "write" and "/leases/" not in r.path
                ]

            # settle: the last writes of the convergence (status) may still come; then nothing may be written
            mark, quiet_since, settle_until = len(cl.emu.request_log), time.monotonic(), time.monotonic() + 30

            def settling() -> bool:
                now = time.monotonic()
                started = any(now - p.started_at < STARTUP_SECONDS for p in procs)
                return (started or now - quiet_since < 1.5) and now < settle_until

            while settling():
                await asyncio.sleep(0.1)
                if writes(mark):
                    ep.settle_writes += len(writes(mark))
                    mark, quiet_since = len(cl.emu.request_log), time.monotonic()
            await asyncio.sleep(idle_seconds)
            idle = [f"{r.user} {r.method} {r.path} {r.status}" for r in writes(mark)]
            ep.idle_writes = len(idle)
            ep.detail += "".join(f"\nidle write: {w}" for w in idle[:10])
        else:
            st = cl.rdd().get("status") or {}
            ep.detail = (
                f"cluster errors={cl.tick_errors[-3:]} "
                f"steps={ep.steps} phase={st.get('phase')} active={st.get('activeEngine')} "
                f"history={[(h.get('from'), h.get('to')) for h in st.get('history') or []]} "
                + "; ".join(
                    f"{c['type']}={c['status']} {c.get('reason')}: {c.get('message', '')[:160]}"
                    for c in st.get("conditions") or []
                    if c.get("status") != "True" or c["type"] == "Validated"
                )
            )
        history = [(h.get("from"), h.get("to")) for h in (cl.rdd().get("status") or {}).get("history") or []]
        ep.history_errors = 0 if history == EXPECTED_HISTORY else max(1, abs(len(history) - len(EXPECTED_HISTORY)))
        ep.duplicate_jobs = count_duplicates(cl.emu)
        ep.non_leader_writes = non_leader_writes(cl.emu, {p.pod for p in procs}) if n > 1 else 0
    finally:
        done.set()
        for p in procs:
            await p.stop()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        cl.close()
    for p in procs:
        for code, killed, tail in p.exits:
            if killed or code in (-signal.SIGTERM, 0):
                continue
            if code == 1 and "lost the leader lease" in tail:
                ep.lease_exits += 1
            else:
                ep.crashes += 1
                ep.detail += f"\n{p.pod} exited {code}: {tail}"
    return ep
