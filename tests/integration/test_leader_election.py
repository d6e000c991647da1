"""Leader election against the emulated API server: the Lease as the server keeps it, two electors in one
loop (optimistic concurrency, expiry, stepping down), and two `redrafter-operator run --leader-elect`
processes (the standby writes nothing; SIGKILL and a network partition of the leader hand over safely).

Each operator process has its own kubeconfig token, which the emulator maps to a user name, so every
request in ``emulator.request_log`` is attributed to the process that sent it (kopf's and ours alike).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from test_lifecycle import NAME, NS, Cluster, apply, example, running, until  # noqa: I001 (same dir)

from redrafter_operator.controller.apply import ApiError, KubeClient
from redrafter_operator.controller.leader import ElectionConfig, LeaderElector, LeaseRecord
from redrafter_operator.kubeconfig import load_configuration
from redrafter_operator.render import names
from redrafter_sim.server import EmulatorHandle, write_kubeconfig

LEASE_NS, LEASE = "redrafter-system", "redrafter-operator"
LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NS}/leases"
# Short durations keep the tests quick; the ratios are client-go's (15/10/2 s by default).
# A leader steps down by RetryPeriod + RenewDeadline after its last renewal, 3 s before the lease can expire.
LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD = 8, 4.0, 1.0


# ------------------------------------------------------------------------------------ the Lease itself
def lease_body(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": LEASE, "namespace": LEASE_NS},
        "spec": spec,
    }


@contextlib.asynccontextmanager
async def client_for(kubeconfig: Path) -> AsyncIterator[KubeClient]:
    client = KubeClient(await load_configuration(str(kubeconfig)), backoff=())
    try:
        yield client
    finally:
        await client.close()


async def test_lease_round_trips_micro_times_and_conflicts_like_the_server(
    apiserver: EmulatorHandle, kubeconfig: Path, kubectl: Any
) -> None:
    async with client_for(kubeconfig) as c:
        created = await c.request(
            "POST",
            LEASES,
            lease_body(
                holderIdentity="pod-a",
                leaseDurationSeconds=15,
                acquireTime="2026-12-02T20:00:00.000001+02:00",
                renewTime="2026-12-02T18:00:00.500000Z",
                leaseTransitions=0,
                unknownField="dropped",
            ),
        )
        assert created["spec"] == {
            "holderIdentity": "pod-a",
            "leaseDurationSeconds": 15,
            "leaseTransitions": 0,
            "acquireTime": "2026-12-02T18:00:00.000001Z",  # MicroTime, served in UTC
            "renewTime": "2026-12-02T18:00:00.500000Z",
        }
        # optimistic concurrency: an update based on an older resourceVersion is refused
        first = await c.request(
            "PUT", f"{LEASES}/{LEASE}", {**created, "spec": {**created["spec"], "holderIdentity": "b"}}
        )
        with pytest.raises(ApiError) as stale:
            await c.request(
                "PUT",
                f"{LEASES}/{LEASE}",
                {**created, "spec": {**created["spec"], "holderIdentity": "c"}},
                retry_conflict=False,
            )
        assert stale.value.status == 409 and stale.value.reason == "Conflict"
        assert (await c.request("GET", f"{LEASES}/{LEASE}"))["spec"]["holderIdentity"] == "b"
        assert int(first["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])
        # decoding (400) and validation (422) as kube-apiserver does
        with pytest.raises(ApiError) as bad_time:
            await c.request("PUT", f"{LEASES}/{LEASE}", {**first, "spec": {"renewTime": "2026-12-02T18:00:00Z"}})
        assert bad_time.value.status == 400 and "2006-01-02T15:04:05.000000Z07:00" in bad_time.value.message
        with pytest.raises(ApiError) as bad_duration:
            await c.request("PUT", f"{LEASES}/{LEASE}", {**first, "spec": {"leaseDurationSeconds": 0}})
        assert bad_duration.value.status == 422 and "spec.leaseDurationSeconds" in bad_duration.value.message
        with pytest.raises(ApiError) as bad_type:
            await c.request("POST", LEASES, {**lease_body(leaseTransitions="1"), "metadata": {"name": "x"}})
        assert bad_type.value.status == 400
    table = kubectl("get", "lease", "-n", LEASE_NS, check=True).stdout.split()
    assert table[:3] == ["NAME", "HOLDER", "AGE"] and table[3:5] == [LEASE, "b"]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def _noop() -> None:
    return None


def elector(client: KubeClient, identity: str, clock: Clock) -> LeaderElector:
    cfg = ElectionConfig(
        namespace=LEASE_NS,
        name=LEASE,
        identity=identity,
        lease_duration=LEASE_DURATION,
        renew_deadline=RENEW_DEADLINE,
        retry_period=RETRY_PERIOD,
    )
    return LeaderElector(client, cfg, on_started_leading=_noop, on_stopped_leading=_noop, clock=clock)


async def test_two_electors_one_leader_takeover_only_after_expiry_and_a_stale_leader_loses(
    apiserver: EmulatorHandle, kubeconfig: Path
) -> None:
    emu = apiserver.emulator
    async with client_for(kubeconfig) as ca, client_for(kubeconfig) as cb:
        clock_a, clock_b = Clock(), Clock()
        a, b = elector(ca, "pod-a", clock_a), elector(cb, "pod-b", clock_b)
        assert await a.try_acquire_or_renew() and a.is_leader()
        assert a.may_write() and not b.may_write()
        assert not await b.try_acquire_or_renew()  # held and valid on b's clock
        clock_b.now = LEASE_DURATION - 0.1
        assert not await b.try_acquire_or_renew()
        # a renews: the record changes, so b's expiry clock restarts from this observation
        clock_a.now = RENEW_DEADLINE  # a renewal older than RenewDeadline fences the leader's writes ...
        assert not a.may_write()
        clock_a.now = 1.0
        assert await a.try_acquire_or_renew() and a.may_write()  # ... until the next renewal
        assert not await b.try_acquire_or_renew()
        clock_b.now += LEASE_DURATION - 0.1
        assert not await b.try_acquire_or_renew()
        record = LeaseRecord.from_lease(emu.get_object("coordination.k8s.io/v1", "Lease", LEASE, LEASE_NS))
        assert record.holder == "pod-a" and record.transitions == 0
        # a stops renewing (partitioned, or paused): b takes over once the record is older than the lease
        clock_b.now += 0.2
        mark = len(emu.request_log)
        assert await b.try_acquire_or_renew() and b.is_leader()
        taken = LeaseRecord.from_lease(emu.get_object("coordination.k8s.io/v1", "Lease", LEASE, LEASE_NS))
        assert taken.holder == "pod-b" and taken.transitions == 1 and taken.acquire_time != record.acquire_time
        # a still believes it leads (its clock says its lease is valid): its optimistic renewal carries the old
        # resourceVersion and is refused with 409; it reads the Lease, sees b, and is no longer the leader
        clock_a.now = 2.0
        assert not await a.try_acquire_or_renew() and not a.is_leader() and not a.may_write()
        puts = [(r.method, r.status) for r in emu.request_log[mark:] if r.path.startswith(LEASES)]
        assert ("PUT", 409) in puts
        assert (
            LeaseRecord.from_lease(emu.get_object("coordination.k8s.io/v1", "Lease", LEASE, LEASE_NS)).holder == "pod-b"
        )


async def test_a_fenced_client_sends_no_write(apiserver: EmulatorHandle, kubeconfig: Path) -> None:
    allowed = False
    client = KubeClient(await load_configuration(str(kubeconfig)), may_write=lambda: allowed)
    try:
        mark = len(apiserver.emulator.request_log)
        with pytest.raises(ApiError) as refused:
            await client.request("POST", LEASES, lease_body(holderIdentity="x", leaseDurationSeconds=1))
        assert refused.value.reason == "NotLeader"
        assert (await client.request("GET", LEASES))["items"] == []
        assert apiserver.emulator.writes(mark) == []  # refused before it was sent; reads still go through
        allowed = True
        await client.request("POST", LEASES, lease_body(holderIdentity="x", leaseDurationSeconds=1))
        assert len(apiserver.emulator.writes(mark)) == 1
    finally:
        await client.close()


async def test_concurrent_takeover_of_an_expired_lease_has_one_winner(
    apiserver: EmulatorHandle, kubeconfig: Path
) -> None:
    emu = apiserver.emulator
    emu.create_object(
        lease_body(
            holderIdentity="gone",
            leaseDurationSeconds=LEASE_DURATION,
            renewTime="2026-12-02T18:00:00.000000Z",
            leaseTransitions=4,
        )
    )
    clients = [client_for(kubeconfig) for _ in range(4)]
    async with contextlib.AsyncExitStack() as stack:
        opened = [await stack.enter_async_context(c) for c in clients]
        clocks = [Clock() for _ in opened]
        electors = [elector(c, f"pod-{i}", k) for i, (c, k) in enumerate(zip(opened, clocks))]
        assert not any(await asyncio.gather(*(e.try_acquire_or_renew() for e in electors)))
        for k in clocks:
            k.now = LEASE_DURATION + 1
        won = await asyncio.gather(*(e.try_acquire_or_renew() for e in electors))
    assert sum(won) == 1
    record = LeaseRecord.from_lease(emu.get_object("coordination.k8s.io/v1", "Lease", LEASE, LEASE_NS))
    assert record.holder == f"pod-{won.index(True)}" and record.transitions == 5


async def test_a_leader_that_cannot_renew_stops_within_the_renew_deadline(
    apiserver: EmulatorHandle, kubeconfig: Path
) -> None:
    events: list[tuple[str, float]] = []

    async def started() -> None:
        events.append(("started", time.monotonic()))

    async def stopped() -> None:
        events.append(("stopped", time.monotonic()))

    async with client_for(kubeconfig) as c:
        cfg = ElectionConfig(
            namespace=LEASE_NS,
            name=LEASE,
            identity="pod-a",
            lease_duration=LEASE_DURATION,
            renew_deadline=RENEW_DEADLINE,
            retry_period=RETRY_PERIOD,
        )
        e = LeaderElector(c, cfg, on_started_leading=started, on_stopped_leading=stopped)
        task = asyncio.create_task(e.run())
        await until(lambda: events, timeout=10, what="leading")
        await asyncio.sleep(2 * RETRY_PERIOD)  # a few renewals go through
        renewed = LeaseRecord.from_lease(
            apiserver.emulator.get_object("coordination.k8s.io/v1", "Lease", LEASE, LEASE_NS)
        )
        assert renewed.renew_time != renewed.acquire_time
        apiserver.emulator.inject("*", "/leases", 503, times=10_000, message="etcdserver: request timed out")
        failing_since = time.monotonic()
        async with asyncio.timeout(RETRY_PERIOD + RENEW_DEADLINE + 3):
            await task
    assert [name for name, _ in events] == ["started", "stopped"]
    # stopped by the last successful renewal + RetryPeriod + RenewDeadline, before a standby could take over
    assert events[1][1] - failing_since <= RETRY_PERIOD + RENEW_DEADLINE + 0.5
    assert events[1][1] - failing_since < LEASE_DURATION
    assert not e.leading


# ------------------------------------------------------------------------------ two operator processes
class Proxy:
    """A TCP proxy in front of the emulator for one process; ``partition()`` cuts it off from the server.

    It runs its own event loop in a thread: the test's loop blocks on kubectl and on the cluster stand-ins,
    which must not stall the proxied process's lease renewals."""

    def __init__(self, target: str) -> None:
        host_port = target.split("://", 1)[1]
        self.host, self.port = host_port.rsplit(":", 1)[0], int(host_port.rsplit(":", 1)[1])
        self.cut = False
        self.transports: set[asyncio.BaseTransport] = set()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def start(self) -> str:
        self.thread.start()
        server = asyncio.run_coroutine_threadsafe(asyncio.start_server(self._handle, "127.0.0.1", 0), self.loop).result(
            10
        )
        return f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.cut:
            writer.transport.abort()
            return
        up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        self.transports |= {writer.transport, up_writer.transport}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, asyncio.CancelledError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def _partition(self) -> None:
        self.cut = True
        for transport in self.transports:
            transport.abort()

    def partition(self) -> None:
        self.loop.call_soon_threadsafe(self._partition)

    def close(self) -> None:
        self.partition()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


class Replica:
    """One `redrafter-operator run --leader-elect` process, as the chart runs it, with its own identity."""

    def __init__(self, pod: str, url: str, apiserver: EmulatorHandle, tmp_path: Path) -> None:
        self.pod, self.log = pod, tmp_path / f"{pod}.log"
        apiserver.emulator.add_token(f"token-{pod}", pod)
        kubeconfig = write_kubeconfig(url, tmp_path / f"kubeconfig-{pod}", token=f"token-{pod}")
        exe = Path(sys.executable).parent / "redrafter-operator"
        env = {**os.environ, "POD_NAME": pod, "POD_NAMESPACE": LEASE_NS, "PYTHONUNBUFFERED": "1"}
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.metrics_port = s.getsockname()[1]
        self.proc = subprocess.Popen(
            [
                str(exe),
                "run",
                "--kubeconfig",
                str(kubeconfig),
                "--namespace",
                NS,
                "--leader-elect",
                f"--leader-election-id={LEASE}",
                f"--lease-duration={LEASE_DURATION}s",
                f"--renew-deadline={RENEW_DEADLINE}s",
                f"--retry-period={RETRY_PERIOD}s",
                "--log-format=json",
                "--resync-seconds=2",
                f"--metrics-port={self.metrics_port}",
            ],
            env=env,
            stdout=self.log.open("w"),
            stderr=subprocess.STDOUT,
        )
        self.exited_at: float | None = None  # wall time, comparable with the emulator's request timestamps
        threading.Thread(target=self._wait, daemon=True).start()

    def _wait(self) -> None:
        self.proc.wait()
        self.exited_at = time.time()

    def text(self) -> str:
        return self.log.read_text()

    def metric(self, name: str) -> float:
        """The sum of a metric's samples on the process's /metrics (0 when it has none)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as rsp:
            text = rsp.read().decode()
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(name) and not line.startswith("#") and line[len(name)] in " {"
        )

    def logged_at(self, fragment: str) -> float:
        """When (wall time) the process logged a message containing ``fragment`` (JSON log lines)."""
        for line in self.text().splitlines():
            if line.startswith("{") and fragment in (record := json.loads(line)).get("message", ""):
                return dt.datetime.fromisoformat(record["timestamp"]).timestamp()
        raise AssertionError(f"{self.pod} never logged {fragment!r}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@pytest.fixture
async def cluster(apiserver: EmulatorHandle) -> AsyncIterator[Cluster]:
    async for c in running(apiserver, Cluster):
        yield c


@pytest.fixture
def replicas() -> Iterator[list[Replica]]:
    started: list[Replica] = []
    yield started
    for r in started:
        r.stop()


def lease(cluster: Cluster) -> dict[str, Any] | None:
    return cluster.emu.find_object("coordination.k8s.io/v1", "Lease", LEASE, LEASE_NS)


def holder(cluster: Cluster) -> str:
    found = lease(cluster)
    return ((found or {}).get("spec") or {}).get("holderIdentity") or ""


def by(cluster: Cluster, user: str, since: int = 0, *, writes: bool = False) -> list[Any]:
    records = cluster.emu.writes(since) if writes else cluster.emu.request_log[since:]
    return [r for r in records if r.user == user]


def micro(ts: str) -> float:
    return dt.datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


async def start_pair(
    cluster: Cluster, apiserver: EmulatorHandle, tmp_path: Path, replicas: list[Replica], leader_url: str | None = None
) -> tuple[Replica, Replica]:
    """op-a first (it becomes the leader), then op-b once the Lease names op-a; both with warm watches."""
    a = Replica("op-a", leader_url or apiserver.url, apiserver, tmp_path)
    replicas.append(a)
    await until(lambda: holder(cluster) == "op-a", timeout=60, what=f"op-a to acquire the lease\n{a.text()}")
    b = Replica("op-b", apiserver.url, apiserver, tmp_path)
    replicas.append(b)
    await until(
        lambda: (
            any(r.kind == "watch" and "redrafterdeployments" in r.path for r in by(cluster, "op-b"))
            and any(r.path.startswith(LEASES) for r in by(cluster, "op-b"))
        ),
        timeout=60,
        what=f"op-b to watch and poll the lease\n{b.text()}",
    )
    return a, b


pytestmark = pytest.mark.timeout(240)


@pytest.mark.slow
async def test_standby_writes_nothing_and_takes_over_after_sigkill(
    cluster: Cluster, apiserver: EmulatorHandle, kubectl: Any, tmp_path: Path, replicas: list[Replica]
) -> None:
    mark = len(cluster.emu.request_log)
    a, b = await start_pair(cluster, apiserver, tmp_path, replicas)
    apply(kubectl, example(speculation__interval="2s"))  # the policy evaluates often: its state must carry over
    await until(lambda: len(cluster.jobs()) == 2 and cluster.status().get("phase") == "Building", what="builds")
    cluster.complete_all()
    await until(lambda: cluster.status().get("phase") == "Serving", what="Serving")
    await asyncio.sleep(3 * RETRY_PERIOD + 2)  # evaluators and resyncs (every 2 s) run on the leader meanwhile
    # the standby: watches and lease reads only, not one write; the leader did all the work
    assert by(cluster, "op-b", mark, writes=True) == []
    assert {r.method for r in by(cluster, "op-b", mark)} == {"GET"}
    leader_writes = by(cluster, "op-a", mark, writes=True)
    assert any(r.method == "POST" and r.path.endswith("/jobs") for r in leader_writes)
    assert any(r.path.endswith("/status") for r in leader_writes)
    assert "default/llama3-8b" not in b.text() and "default/llama3-8b" in a.text()
    # ... and ran no reconcile, no policy evaluation (speculation and autoscaler), no validation Job
    assert b.metric("redrafter_operator_leader") == 0 and a.metric("redrafter_operator_leader") == 1
    assert b.metric("redrafter_operator_reconciles_total") == 0 < a.metric("redrafter_operator_reconciles_total")
    assert b.metric("redrafter_operator_speculation_evaluations_total") == 0
    assert a.metric("redrafter_operator_speculation_evaluations_total") > 0
    assert b.metric("redrafter_operator_resources") == 1  # its watches are warm all the same
    policy_before = cluster.status().get("policy")
    jobs_before = cluster.job_names()
    transitions = lease(cluster)["spec"]["leaseTransitions"]

    a.proc.send_signal(signal.SIGKILL)  # no release, no cleanup
    killed_at = time.time()
    a.proc.wait(10)
    last_renew = micro(lease(cluster)["spec"]["renewTime"])
    # a change only a live leader acts on: the serving config (ConfigMap) and a rolled Deployment
    config_before = cluster.emu.get_object("v1", "ConfigMap", names.serving_config_name(NAME, "base"), NS)
    cluster.emu.patch_object(
        "redrafter.dev/v1alpha1",
        "ReDrafterDeployment",
        NAME,
        NS,
        {"spec": {"serving": {"triton": {"kvCacheFreeGpuMemFraction": 0.8}}}},
    )
    await until(lambda: holder(cluster) == "op-b", timeout=LEASE_DURATION + 10, what=f"op-b to take over\n{b.text()}")
    acquired = lease(cluster)["spec"]
    handover = micro(acquired["acquireTime"]) - last_renew
    assert acquired["leaseTransitions"] == transitions + 1
    # the standby takes over one lease duration after the last change it saw; it polls every RetryPeriod
    # jittered up to ×2.2, so it sees the last renewal and then the expiry each up to 2.2 RetryPeriods late
    assert LEASE_DURATION - 0.2 <= handover <= LEASE_DURATION + 2 * 2.2 * RETRY_PERIOD + 0.5, handover
    print(
        f"handover after SIGKILL: {micro(acquired['acquireTime']) - killed_at:.2f}s after the kill, "
        f"{handover:.2f}s after the last renewal (lease {LEASE_DURATION}s, retry {RETRY_PERIOD}s)"
    )

    def reconfigured() -> bool:
        config = cluster.emu.get_object("v1", "ConfigMap", names.serving_config_name(NAME, "base"), NS)
        return config["data"] != config_before["data"]

    await until(reconfigured, timeout=30, what=f"the new leader to act on the change\n{b.text()[-3000:]}")
    # the ConfigMap is applied mid-reconcile; the reconcile is counted once it finished (status, Events)
    await until(
        lambda: b.metric("redrafter_operator_reconciles_total") > 0,
        timeout=10,
        what="the new leader's reconcile to be counted",
    )
    assert b.metric("redrafter_operator_leader") == 1
    assert [
        r
        for r in by(cluster, "op-b", mark, writes=True)
        if r.path.endswith("/configmaps/" + names.serving_config_name(NAME, "base"))
    ]
    assert cluster.job_names() == jobs_before  # it saw the existing Jobs before deciding: no duplicate build
    assert not [r for r in by(cluster, "op-b", mark) if r.status == 409 and r.path.endswith("/jobs")]
    # the policy resumes from status.policy: the new leader's first evaluation continues the old state
    assert policy_before and policy_before["speculation"]["since"]
    await until(
        lambda: (cluster.status()["policy"]["speculation"].get("last_evaluated") or 0) > micro(acquired["acquireTime"]),
        timeout=20,
        what="the new leader's first policy evaluation",
    )
    policy_after = cluster.status()["policy"]
    assert policy_after["speculation"]["since"] == policy_before["speculation"]["since"], (policy_before, policy_after)
    assert policy_after["speculation"]["engine"] == policy_before["speculation"]["engine"]


@pytest.mark.slow
async def test_partitioned_leader_steps_down_before_the_standby_acts(
    cluster: Cluster, apiserver: EmulatorHandle, kubectl: Any, tmp_path: Path, replicas: list[Replica]
) -> None:
    proxy = Proxy(apiserver.url)
    url = proxy.start()
    try:
        mark = len(cluster.emu.request_log)
        a, b = await start_pair(cluster, apiserver, tmp_path, replicas, leader_url=url)
        apply(kubectl, example())
        await until(lambda: len(cluster.jobs()) == 2 and cluster.status().get("phase") == "Building", what="builds")
        assert by(cluster, "op-b", mark, writes=True) == []

        proxy.partition()  # op-a can no longer reach the API server; op-b can
        cut_at = time.time()
        await until(
            lambda: a.exited_at is not None,
            timeout=RETRY_PERIOD + RENEW_DEADLINE + 15,
            what=f"the partitioned leader to step down\n{a.text()[-3000:]}",
        )
        assert a.proc.returncode == 1, a.text()[-3000:]
        stopped_at = a.logged_at("leader election lost")  # logged once its workers and evaluators had stopped
        assert "reconcile loops stopped" in a.text()
        await until(
            lambda: holder(cluster) == "op-b", timeout=LEASE_DURATION + 10, what=f"op-b to take over\n{b.text()}"
        )
        b_lease_writes = [r for r in by(cluster, "op-b", mark, writes=True) if r.path.startswith(LEASES)]
        acquired_at = min(r.timestamp for r in b_lease_writes if r.status in (200, 201))
        # the old leader stopped every loop before the standby acquired the lease ...
        assert stopped_at < acquired_at, (stopped_at - cut_at, acquired_at - cut_at)
        # ... and made no write after that moment (nor did any reach the server once cut off)
        assert [r for r in by(cluster, "op-a", mark, writes=True) if r.timestamp >= acquired_at] == []
        # the standby wrote nothing before it held the lease
        assert [r for r in by(cluster, "op-b", mark, writes=True) if r.timestamp < acquired_at] == [
            r for r in b_lease_writes if r.timestamp < acquired_at
        ]
        print(
            f"partition: leader stopped its loops {stopped_at - cut_at:.2f}s and exited {a.exited_at - cut_at:.2f}s "
            f"after the cut, standby acquired "
            f"{acquired_at - cut_at:.2f}s after it (renew deadline {RENEW_DEADLINE}s, lease {LEASE_DURATION}s)"
        )
        # the new leader carries on: the build Jobs finish and it brings the resource to Serving
        jobs_before = cluster.job_names()
        cluster.complete_all()
        await until(
            lambda: cluster.status().get("phase") == "Serving",
            timeout=60,
            what=f"Serving under the new leader\n{b.text()[-3000:]}",
        )
        assert cluster.job_names() == jobs_before
        assert json.dumps(cluster.status()).count("BuildFailed") == 0
    finally:
        proxy.close()
