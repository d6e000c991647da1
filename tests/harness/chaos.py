"""Seeded fault episodes against the unmodified operator on the real control plane: does it converge, and what
did the faults cost?

The campaign's cluster (:class:`ChaosCluster`): the real control plane (:data:`APISERVER_ARGS`), one simulated
node (a kubelet: it runs the build and validation Jobs' pods with the stand-in TensorRT-LLM toolchain and the
serving pods with real Triton) and a fault proxy (:mod:`redrafter_sim.faultproxy`) between the operator and
kube-apiserver. Each episode runs in a namespace of its own, the operator under the chart's ServiceAccount and
RBAC: apply ``examples/demo-tiny.yaml``, both builds, validation, Serving on ReDrafter, a switch to base and back
through ``spec.speculation.mode``, while a seeded schedule injects

* through the proxy: 5xx bursts, 429 with ``Retry-After``, 409 storms on writes, added latency, watch streams cut
  cleanly or by a reset connection, short outages (503 for everything);
* for real: an etcd compaction followed by cut watches (the CRD's and Jobs' watches are served from etcd here, so
  the operator's reconnects get kube-apiserver's own ``ERROR 410``), a kube-apiserver restart (its new watch cache
  expires every older resourceVersion: ``ERROR 410`` again), an etcd restart, and ``SIGKILL`` of an operator
  process (restarted as a kubelet restarts a container).

A third of the episodes run two replicas with leader election, each with a token of its own so the proxy tells
their requests apart; the kills then prefer the leader. At most one control-plane restart per episode (each takes
seconds of real downtime).

What an episode reports (:class:`Episode`): converged and converge_s (the intended state after the faults stop:
Serving ReDrafter, observedGeneration current, the Service on the ReDrafter pool, both switches in
``status.history``); duplicate_jobs; history_errors; crashes (exits other than the injected kills and the
designed exit of a leader that lost its Lease, counted as lease_exits); non_leader_writes (successful writes by a
replica while the last successful Lease write was another's); idle_writes (writes in ``idle_seconds`` once
settled; Lease renewals excluded) and settle_writes (the last writes of the convergence); expired_watches (the
``ERROR 410`` events kube-apiserver sent the operator).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import signal
import time
import urllib.error
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from redrafter_operator.api import GROUP, PLURAL, VERSION
from redrafter_operator.render import names, validation
from redrafter_sim.controlplane import ControlPlane
from redrafter_sim.faultproxy import FaultProxy
from redrafter_sim.node import SimNode
from redrafter_sim.operator_process import OperatorProcess

from .cluster import ROOT, Kube, new_namespace, start_control_plane
from .operator import chart_identity

NAME = "chaos"
LEASE = "redrafter-operator"
NODE = "chaos-node"
EXAMPLE = ROOT / "examples" / "demo-tiny.yaml"
PROXIED = ("5xx", "429", "409", "latency", "reset", "cut", "outage")
REAL = ("compact", "restart-apiserver", "restart-etcd", "kill")
FAULTS = PROXIED + REAL
RESTARTS = ("restart-apiserver", "restart-etcd")
STARTUP_SECONDS = 8.0  # a restarted replica has listed everything and reconciled once by then
EXPECTED_HISTORY = [("redrafter", "base"), ("base", "redrafter")]
#: kube-apiserver serves these watches from etcd, not from its watch cache: an etcd compaction expires them
#: (ERROR 410 on the next watch from an older resourceVersion), as it does on a cluster that disables their cache;
#: the other kinds stay cached, and a kube-apiserver restart expires those (its new cache starts at the present).
APISERVER_ARGS = (f"--watch-cache-sizes={PLURAL}.{GROUP}#0,jobs.batch#0",)
RDD_PATH = f"/apis/{GROUP}/{VERSION}/namespaces/{{ns}}/{PLURAL}"


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
    policy_writes: int = 0  # idle status writes of only the policy's evaluation (status.policy, lastEvaluated)
    expired_watches: int = 0  # ERROR 410 events kube-apiserver sent the operator
    faults: Counter[str] = field(default_factory=Counter)
    steps: list[float | None] = field(default_factory=list)  # seconds each lifecycle step took (None: timed out)
    detail: str = ""

    @property
    def clean(self) -> bool:
        return self.converged and not (
            self.duplicate_jobs or self.history_errors or self.crashes or self.non_leader_writes or self.idle_writes
        )


class ChaosCluster:
    """The campaign's control plane, node and proxy; ``async with`` starts and stops them."""

    def __init__(self, workdir: Path, cp: ControlPlane | None = None) -> None:
        self.workdir = workdir
        self._own_cp = cp is None
        self.cp: ControlPlane = cp  # type: ignore[assignment]  # set in start() when None
        self.node: SimNode | None = None
        self.proxy: FaultProxy | None = None

    async def start(self) -> ChaosCluster:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self._own_cp:
            self.cp = await asyncio.to_thread(start_control_plane, self.workdir / "controlplane", APISERVER_ARGS)
        kube_proxy = self.cp.write_kubeconfig(self.workdir / "kube-proxy.kubeconfig", user="system:kube-proxy")
        self.node = SimNode(
            self.cp.node_kubeconfig(NODE),
            name=NODE,
            proxy_kubeconfig=kube_proxy,
            node_dir=self.workdir / "node",
            heartbeat_seconds=1.0,
        )
        await self.node.start()
        self.proxy = FaultProxy(self.cp).start()
        return self

    async def close(self) -> None:
        if self.proxy is not None:
            self.proxy.stop()
        if self.node is not None:
            await self.node.stop()
        if self._own_cp and self.cp is not None:
            await asyncio.to_thread(self.cp.stop)

    async def __aenter__(self) -> ChaosCluster:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class Replica:
    """One operator replica (:class:`OperatorProcess`) through the proxy, with a token of its own; restarted
    after every exit, as a kubelet restarts a container. ``args`` follow the campaign's flags (the last of a
    repeated flag wins: other lease timings, a metrics port)."""

    def __init__(
        self,
        pod: str,
        kube: Kube,
        proxy: FaultProxy,
        workdir: Path,
        elect: bool,
        sa: str,
        args: tuple[str, ...] = (),
    ) -> None:
        self.pod = pod
        token_kc = kube.cp.service_account_kubeconfig(workdir / f"token-{pod}.kubeconfig", kube.namespace, sa)
        kubeconfig = proxy.kubeconfig(token_kc, workdir / f"kubeconfig-{pod}", name=pod)
        flags = (
            [
                "--leader-elect",
                f"--leader-election-namespace={kube.namespace}",
                f"--leader-election-id={LEASE}",
                "--lease-duration=4s",
                "--renew-deadline=3s",
                "--retry-period=0.5s",
            ]
            if elect
            else ["--standalone"]
        )
        flags += ["--resync-seconds=300", "--log-format=json", *args]
        env = {"POD_NAME": pod, "POD_NAMESPACE": kube.namespace, "PYTHONUNBUFFERED": "1"}
        self.process = OperatorProcess(kubeconfig, kube.namespace, workdir / f"{pod}.log", flags, env)
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


class World:
    """One episode's view of its namespace, read as the admin straight from kube-apiserver (never through the
    proxy); a read that fails while kube-apiserver restarts answers None."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.ns = kube.namespace

    def get(self, path: str) -> Any | None:
        try:
            return self.kube.get(path)
        except (urllib.error.URLError, OSError):
            return None

    def rdd(self) -> dict[str, Any]:
        return self.get(f"{RDD_PATH}/{NAME}".format(ns=self.ns)) or {}

    def lease_holder(self) -> str:
        lease = self.get(f"/apis/coordination.k8s.io/v1/namespaces/{self.ns}/leases/{LEASE}") or {}
        return str((lease.get("spec") or {}).get("holderIdentity") or "")

    def serving(self, engine: str) -> bool:
        st = self.rdd().get("status") or {}
        return st.get("phase") == "Serving" and st.get("activeEngine") == engine

    def intended(self) -> bool:
        body = self.rdd()
        status = body.get("status") or {}
        svc = self.get(f"/api/v1/namespaces/{self.ns}/services/{names.service_name(NAME)}")
        history = [(h.get("from"), h.get("to")) for h in status.get("history") or []]
        return bool(
            status.get("phase") == "Serving"
            and status.get("activeEngine") == "redrafter"
            and status.get("observedGeneration") == body.get("metadata", {}).get("generation")
            and svc is not None
            and (svc["spec"].get("selector") or {}).get(names.LABEL_TRAFFIC) == "redrafter"
            and history[-len(EXPECTED_HISTORY) :] == EXPECTED_HISTORY
        )

    def set_mode(self, mode: str) -> None:
        patch = json.dumps({"spec": {"speculation": {"mode": mode}}})
        self.kube.kubectl("patch", f"{PLURAL}.{GROUP}", NAME, "--type=merge", "-p", patch, check=True)

    def jobs(self) -> list[dict[str, Any]]:
        return list((self.get(f"/apis/batch/v1/namespaces/{self.ns}/jobs") or {}).get("items") or [])


async def _until(predicate: Any, timeout: float) -> float | None:
    """Seconds until ``predicate`` (run in a thread: it reads the API) held (None: not within ``timeout``)."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if await asyncio.to_thread(predicate):
            return time.monotonic() - start
        await asyncio.sleep(0.2)
    return time.monotonic() - start if await asyncio.to_thread(predicate) else None


async def _inject(
    cl: ChaosCluster,
    world: World,
    replicas: list[Replica],
    rng: random.Random,
    stop: asyncio.Event,
    ep: Episode,
    kinds: tuple[str, ...],
) -> None:
    """The seeded fault schedule: one fault of ``kinds`` every 0.3 to 1.2 s until ``stop``."""
    proxy = cl.proxy
    assert proxy is not None
    restarted = False
    while kinds and not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), rng.uniform(0.3, 1.2))
        if stop.is_set():
            return
        kind = rng.choice(kinds)
        if kind in RESTARTS and restarted:
            kind = "cut"  # one real restart per episode: each costs seconds of downtime
        ep.faults[kind] += 1
        if kind == "5xx":
            proxy.inject(rng.choice([500, 503, 504]), times=rng.randint(1, 6))
        elif kind == "429":
            proxy.inject(429, times=rng.randint(1, 6), retry_after=1)
        elif kind == "409":
            proxy.inject(409, times=rng.randint(2, 8), methods=("PATCH", "PUT", "POST"))
        elif kind == "latency":
            proxy.inject(0, times=rng.randint(5, 30), delay=rng.uniform(0.05, 0.5))
        elif kind == "reset":
            proxy.cut_watches(reset=True)
        elif kind == "cut":
            proxy.cut_watches()
        elif kind == "outage":
            fault = proxy.inject(503, times=10**9, path=r"^/", message="apiserver unavailable", retry_after=1)
            await asyncio.sleep(rng.uniform(0.3, 2.0))
            fault.remaining = 0
        elif kind == "compact":
            await asyncio.to_thread(cl.cp.compact)
            proxy.cut_watches()  # the reconnects ask etcd for compacted revisions: kube-apiserver answers 410
        elif kind in RESTARTS:
            restarted = True
            await asyncio.to_thread(cl.cp.restart, "kube-apiserver" if kind == "restart-apiserver" else "etcd")
        elif kind == "kill":
            holder = await asyncio.to_thread(world.lease_holder)
            leader = [r for r in replicas if r.pod == holder]
            target = leader[0] if leader and rng.random() < 0.7 else rng.choice(replicas)
            target.kill()


def policy_only(path: str, body: str) -> bool:
    """A status write of nothing but the speculation policy's periodic evaluation: its window and
    recommendations (``status.policy``) and ``status.speculation.lastEvaluated``. The policy writes these every
    ``spec.speculation.interval`` while serving pods report metrics, traffic or not."""
    try:
        status = (json.loads(body) or {}).get("status") or {}
    except ValueError:
        return False  # cut at the recorded length: counted as an idle write
    return (
        path.endswith("/status")
        and set(status) <= {"policy", "speculation"}
        and set(status.get("speculation") or {}) <= {"lastEvaluated"}
    )


def non_leader_writes(proxy: FaultProxy, pods: set[str], since: int) -> int:
    """Successful writes by a replica while the last successful Lease write was another's."""
    holder, count = "", 0
    for r in proxy.requests(since):
        if r.who not in pods or not (r.write and r.ok):
            continue
        if "/leases/" in r.path or r.path.endswith("/leases"):
            holder = r.who
        elif holder and r.who != holder:
            count += 1
    return count


def count_duplicates(jobs: list[dict[str, Any]]) -> int:
    builds: Counter[tuple[str, str]] = Counter()
    validations = 0
    for job in jobs:
        labels = job["metadata"].get("labels") or {}
        if labels.get(names.LABEL_COMPONENT) == "engine-build":
            builds[(labels.get(names.LABEL_VARIANT, ""), labels.get(names.LABEL_ENGINE_KEY, ""))] += 1
        elif labels.get(names.LABEL_COMPONENT) == validation.COMPONENT:
            validations += 1
    return sum(n - 1 for n in builds.values()) + max(0, validations - 1)


def _prepare(cl: ChaosCluster, workdir: Path, replicas: int) -> tuple[Kube, str]:
    """The episode's namespace: the chart's identity (with ``replicas``: the Lease Role comes with more than
    one), the node's claims."""
    assert cl.node is not None
    kube = new_namespace(cl.cp, workdir / "kube")
    chart_identity(
        kube, [kube.namespace], {"replicas": replicas}
    )  # the chart's ServiceAccount and RBAC; each replica asks a token of its own
    sa_name = next(
        o["metadata"]["name"]
        for o in (kube.get(f"/api/v1/namespaces/{kube.namespace}/serviceaccounts") or {}).get("items", [])
        if o["metadata"]["name"] != "default"
    )
    for claim in ("engine-cache", "models"):
        pv, pvc = cl.node.claim_objects(kube.namespace, claim)
        cl.cp.request("POST", "/api/v1/persistentvolumes", pv)
        cl.cp.request("POST", f"/api/v1/namespaces/{kube.namespace}/persistentvolumeclaims", pvc)
    return kube, sa_name


def _create_resource(kube: Kube, validate: bool) -> None:
    body = yaml.safe_load(EXAMPLE.read_text())
    body["metadata"] = {"name": NAME, "namespace": kube.namespace}
    # a short validation: the same checks, fewer tokens (real Triton on a shared 2-core machine)
    body["spec"]["validation"] = {"enabled": validate, "maxTokens": 4, "longMaxTokens": 8, "singleRequests": 1}
    kube.cp.request("POST", RDD_PATH.format(ns=kube.namespace), body)


def _cleanup(cl: ChaosCluster, kube: Kube) -> None:
    """Delete the namespace and the claims' volumes; wait (bounded) until the node runs none of its pods."""
    with contextlib.suppress(urllib.error.URLError, OSError):
        cl.cp.request("DELETE", f"/api/v1/namespaces/{kube.namespace}")
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        with contextlib.suppress(urllib.error.URLError, OSError):
            if not (cl.cp.request("GET", f"/api/v1/namespaces/{kube.namespace}/pods") or {}).get("items"):
                break
        time.sleep(0.5)
    assert cl.node is not None
    for claim in ("engine-cache", "models"):
        pv = cl.node.claim_objects(kube.namespace, claim)[0]["metadata"]["name"]
        with contextlib.suppress(urllib.error.URLError, OSError):
            cl.cp.request("DELETE", f"/api/v1/persistentvolumes/{pv}")


async def run_episode(
    seed: int,
    cl: ChaosCluster,
    workdir: Path,
    *,
    replicas: int | None = None,
    fault_seconds: float = 12.0,
    step_timeout: float = 180.0,
    converge_timeout: float = 90.0,
    idle_seconds: float = 3.0,
    kinds: tuple[str, ...] = FAULTS,
    validate: bool = False,
) -> Episode:
    """One episode in a fresh namespace of ``cl``. ``validate``: run the validation Job before promoting (off by
    default: on the simulated node the validation pod does not finish yet, see docs)."""
    rng = random.Random(seed)
    n = replicas if replicas is not None else (2 if rng.random() < 1 / 3 else 1)
    ep = Episode(seed, n)
    workdir.mkdir(parents=True, exist_ok=True)
    proxy = cl.proxy
    assert proxy is not None
    proxy.lift_faults()
    kube, sa = await asyncio.to_thread(_prepare, cl, workdir, n)
    world = World(kube)
    since, errors_before = proxy.mark(), proxy.watch_errors[410]
    done = asyncio.Event()
    tasks: list[asyncio.Task[Any]] = []
    procs = [Replica(f"op-{chr(97 + i)}", kube, proxy, workdir, elect=n > 1, sa=sa) for i in range(n)]
    try:
        for p in procs:
            await p.start()
            tasks.append(asyncio.create_task(p.supervise(done, rng)))
        await asyncio.to_thread(_create_resource, kube, validate)

        faults_stop = asyncio.Event()
        injector = asyncio.create_task(_inject(cl, world, procs, rng, faults_stop, ep, kinds))
        calm: list[float] = []

        async def stop_faults() -> None:
            await asyncio.sleep(fault_seconds)
            faults_stop.set()
            await injector
            proxy.lift_faults()  # what is left of the last faults
            calm.append(time.monotonic())

        stopper = asyncio.create_task(stop_faults())
        tasks.append(stopper)

        # the lifecycle starts under faults and goes on after them; each step must finish (else the
        # episode did not converge): Serving on ReDrafter, pinned to base, pinned back to ReDrafter
        ep.steps.append(await _until(lambda: world.serving("redrafter"), step_timeout))
        if ep.steps[-1] is not None:
            await asyncio.to_thread(world.set_mode, "Never")
            ep.steps.append(await _until(lambda: world.serving("base"), step_timeout))
        if ep.steps[-1] is not None:
            await asyncio.to_thread(world.set_mode, "Always")
        await stopper
        if ep.steps[-1] is not None:
            converged = await _until(world.intended, converge_timeout)
            ep.converge_s = None if converged is None else time.monotonic() - calm[0]
        ep.converged = ep.converge_s is not None
        pods = {p.pod for p in procs}
        if ep.converged:

            def writes(mark: int) -> list[Any]:
                return [r for r in proxy.requests(mark) if r.who in pods and r.write and "/leases/" not in r.path]

            # settle: the last writes of the convergence (status) may still come; then nothing may be written
            mark, quiet_since, settle_until = proxy.mark(), time.monotonic(), time.monotonic() + 30

            def settling() -> bool:
                now = time.monotonic()
                started = any(now - p.started_at < STARTUP_SECONDS for p in procs)
                return (started or now - quiet_since < 1.5) and now < settle_until

            while settling():
                await asyncio.sleep(0.1)
                if writes(mark):
                    ep.settle_writes += len(writes(mark))
                    mark, quiet_since = proxy.mark(), time.monotonic()
            await asyncio.sleep(idle_seconds)
            idle_all = writes(mark)
            ep.policy_writes = sum(1 for r in idle_all if policy_only(r.path, r.body))
            idle = [
                f"{r.who} {r.method} {r.path} {r.status} {r.body[:600]}"
                for r in idle_all
                if not policy_only(r.path, r.body)
            ]
            ep.idle_writes = len(idle)
            ep.detail += "".join(f"\nidle write: {w}" for w in idle[:10])
        else:
            st = world.rdd().get("status") or {}
            ep.detail = (
                f"steps={ep.steps} phase={st.get('phase')} active={st.get('activeEngine')} "
                f"history={[(h.get('from'), h.get('to')) for h in st.get('history') or []]} "
                + "; ".join(
                    f"{c['type']}={c['status']} {c.get('reason')}: {c.get('message', '')[:160]}"
                    for c in st.get("conditions") or []
                    if c.get("status") != "True" or c["type"] == "Validated"
                )
            )
        history = [(h.get("from"), h.get("to")) for h in (world.rdd().get("status") or {}).get("history") or []]
        ep.history_errors = 0 if history == EXPECTED_HISTORY else max(1, abs(len(history) - len(EXPECTED_HISTORY)))
        ep.duplicate_jobs = count_duplicates(await asyncio.to_thread(world.jobs))
        ep.non_leader_writes = non_leader_writes(proxy, pods, since) if n > 1 else 0
        ep.expired_watches = proxy.watch_errors[410] - errors_before
    finally:
        done.set()
        for p in procs:
            await p.stop()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        proxy.lift_faults()
        await asyncio.to_thread(_cleanup, cl, kube)
    for p in procs:
        for code, killed, tail in p.exits:
            if killed or code in (-signal.SIGTERM, 0):
                continue
            if code == 1 and ("lost the leader lease" in tail or "leader election lost (lease" in tail):
                ep.lease_exits += 1
            else:
                ep.crashes += 1
                ep.detail += f"\n{p.pod} exited {code}: {tail}"
    return ep
