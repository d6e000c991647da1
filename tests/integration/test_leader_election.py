"""Leader election against the real kube-apiserver: the Lease as the server keeps it, two electors in one loop
(optimistic concurrency, expiry, stepping down), and two `redrafter-operator run --leader-elect` processes (the
standby writes nothing; SIGKILL and a network partition of the leader hand over safely).

Every client runs under the chart's ServiceAccount and RBAC (``replicas: 2``: the Lease Role) through a fault
proxy; each operator process has a token of its own, which the proxy names, so every request in its log is
attributed to the process that sent it (kopf's and ours alike). A partition is the leader's own proxy answering
503 to everything and resetting its watches.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.chaos import Replica
from harness.cluster import Kube
from harness.lifecycle import NAME, Cluster, example
from harness.operator import chart_identity
from harness.waiting import until
from redrafter_operator.api import API_VERSION, KIND
from redrafter_operator.controller.apply import ApiError, KubeClient
from redrafter_operator.controller.leader import ElectionConfig, LeaderElector, LeaseRecord
from redrafter_operator.kubeconfig import load_configuration
from redrafter_operator.render import names
from redrafter_sim.chartrbac import chart_rbac
from redrafter_sim.controlplane import ControlPlane, free_port
from redrafter_sim.faultproxy import FaultProxy, Request

LEASE = "redrafter-operator"
LEASE_API = "coordination.k8s.io/v1"
# Short durations keep the tests quick; the ratios are client-go's (15/10/2 s by default).
# A leader steps down by RetryPeriod + RenewDeadline after its last renewal, 3 s before the lease can expire.
LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD = 8, 4.0, 1.0
ELECTED = {"replicas": 2}  # the chart's values with which it grants the Lease Role


def leases(namespace: str) -> str:
    return f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"


# ------------------------------------------------------------------------------------ the Lease itself
@dataclass
class Electorate:
    """A namespace, the chart's identity in it (with the Lease Role) and a proxy that logs what that identity
    sent; ``lease()`` reads the Lease as the admin, straight from kube-apiserver."""

    kube: Kube
    proxy: FaultProxy
    kubeconfig: Path

    @property
    def ns(self) -> str:
        return self.kube.namespace

    @property
    def path(self) -> str:
        return leases(self.ns)

    def lease(self) -> dict[str, Any] | None:
        return self.kube.get(f"{self.path}/{LEASE}")

    def record(self) -> LeaseRecord:
        found = self.lease()
        assert found is not None, "no Lease"
        return LeaseRecord.from_lease(found)


@pytest.fixture
def electorate(kube: Kube, control_plane: ControlPlane) -> Iterator[Electorate]:
    token = chart_identity(kube, [kube.namespace], ELECTED)
    proxy = FaultProxy(control_plane).start()
    try:
        yield Electorate(kube, proxy, proxy.kubeconfig(token, kube.home / "elector.kubeconfig", name="elector"))
    finally:
        proxy.stop()


def lease_body(namespace: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": LEASE_API,
        "kind": "Lease",
        "metadata": {"name": LEASE, "namespace": namespace},
        "spec": spec,
    }


@contextlib.asynccontextmanager
async def client_for(kubeconfig: Path) -> AsyncIterator[KubeClient]:
    client = KubeClient(await load_configuration(str(kubeconfig)), backoff=())
    try:
        yield client
    finally:
        await client.close()


async def test_lease_round_trips_micro_times_and_conflicts_like_the_server(electorate: Electorate) -> None:
    ns, path = electorate.ns, electorate.path
    async with client_for(electorate.kubeconfig) as c:
        created = await c.request(
            "POST",
            path,
            lease_body(
                ns,
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
            "PUT", f"{path}/{LEASE}", {**created, "spec": {**created["spec"], "holderIdentity": "b"}}
        )
        with pytest.raises(ApiError) as stale:
            await c.request(
                "PUT",
                f"{path}/{LEASE}",
                {**created, "spec": {**created["spec"], "holderIdentity": "c"}},
                retry_conflict=False,
            )
        assert stale.value.status == 409 and stale.value.reason == "Conflict"
        assert (await c.request("GET", f"{path}/{LEASE}"))["spec"]["holderIdentity"] == "b"
        assert int(first["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])
        # decoding (400) and validation (422)
        with pytest.raises(ApiError) as bad_time:
            await c.request("PUT", f"{path}/{LEASE}", {**first, "spec": {"renewTime": "2026-12-02T18:00:00Z"}})
        assert bad_time.value.status == 400 and "2006-01-02T15:04:05.000000Z07:00" in bad_time.value.message
        with pytest.raises(ApiError) as bad_duration:
            await c.request("PUT", f"{path}/{LEASE}", {**first, "spec": {"leaseDurationSeconds": 0}})
        assert bad_duration.value.status == 422 and "spec.leaseDurationSeconds" in bad_duration.value.message
        with pytest.raises(ApiError) as bad_type:
            await c.request(
                "POST", path, {**lease_body(ns, leaseTransitions="1"), "metadata": {"name": "x", "namespace": ns}}
            )
        assert bad_type.value.status == 400
    table = electorate.kube.kubectl("get", "lease", check=True).stdout.split()
    assert table[:3] == ["NAME", "HOLDER", "AGE"] and table[3:5] == [LEASE, "b"]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def _noop() -> None:
    return None


def config(namespace: str, identity: str) -> ElectionConfig:
    return ElectionConfig(
        namespace=namespace,
        name=LEASE,
        identity=identity,
        lease_duration=LEASE_DURATION,
        renew_deadline=RENEW_DEADLINE,
        retry_period=RETRY_PERIOD,
    )


def elector(client: KubeClient, namespace: str, identity: str, clock: Clock) -> LeaderElector:
    cfg = config(namespace, identity)
    return LeaderElector(client, cfg, on_started_leading=_noop, on_stopped_leading=_noop, clock=clock)


async def test_two_electors_one_leader_takeover_only_after_expiry_and_a_stale_leader_loses(
    electorate: Electorate,
) -> None:
    ns = electorate.ns
    async with client_for(electorate.kubeconfig) as ca, client_for(electorate.kubeconfig) as cb:
        clock_a, clock_b = Clock(), Clock()
        a, b = elector(ca, ns, "pod-a", clock_a), elector(cb, ns, "pod-b", clock_b)
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
        record = electorate.record()
        assert record.holder == "pod-a" and record.transitions == 0
        # a stops renewing (partitioned, or paused): b takes over once the record is older than the lease
        clock_b.now += 0.2
        mark = electorate.proxy.mark()
        assert await b.try_acquire_or_renew() and b.is_leader()
        taken = electorate.record()
        assert taken.holder == "pod-b" and taken.transitions == 1 and taken.acquire_time != record.acquire_time
        # a still believes it leads (its clock says its lease is valid): its optimistic renewal carries the old
        # resourceVersion and is refused with 409; it reads the Lease, sees b, and is no longer the leader
        clock_a.now = 2.0
        assert not await a.try_acquire_or_renew() and not a.is_leader() and not a.may_write()
        puts = [(r.method, r.status) for r in electorate.proxy.requests(mark) if r.path.startswith(electorate.path)]
        assert ("PUT", 409) in puts
        assert electorate.record().holder == "pod-b"


async def test_a_fenced_client_sends_no_write(electorate: Electorate) -> None:
    allowed = False
    client = KubeClient(await load_configuration(str(electorate.kubeconfig)), may_write=lambda: allowed)
    body = lease_body(electorate.ns, holderIdentity="x", leaseDurationSeconds=1)
    try:
        mark = electorate.proxy.mark()
        with pytest.raises(ApiError) as refused:
            await client.request("POST", electorate.path, body)
        assert refused.value.reason == "NotLeader"
        # reads still go through (the chart grants get, not list: a Lease not there yet is a 404 from the server)
        with pytest.raises(ApiError) as missing:
            await client.request("GET", f"{electorate.path}/{LEASE}")
        assert missing.value.status == 404
        sent = electorate.proxy.requests(mark)
        assert [(r.method, r.status) for r in sent] == [("GET", 404)]  # the write was refused before it was sent
        allowed = True
        await client.request("POST", electorate.path, body)
        assert [(r.method, r.status) for r in electorate.proxy.requests(mark) if r.write] == [("POST", 201)]
    finally:
        await client.close()


async def test_concurrent_takeover_of_an_expired_lease_has_one_winner(electorate: Electorate) -> None:
    ns = electorate.ns
    electorate.kube.cp.request(
        "POST",
        electorate.path,
        lease_body(
            ns,
            holderIdentity="gone",
            leaseDurationSeconds=LEASE_DURATION,
            renewTime="2026-12-02T18:00:00.000000Z",
            leaseTransitions=4,
        ),
    )
    clients = [client_for(electorate.kubeconfig) for _ in range(4)]
    async with contextlib.AsyncExitStack() as stack:
        opened = [await stack.enter_async_context(c) for c in clients]
        clocks = [Clock() for _ in opened]
        electors = [elector(c, ns, f"pod-{i}", k) for i, (c, k) in enumerate(zip(opened, clocks))]
        assert not any(await asyncio.gather(*(e.try_acquire_or_renew() for e in electors)))
        for k in clocks:
            k.now = LEASE_DURATION + 1
        mark = electorate.proxy.mark()
        won = await asyncio.gather(*(e.try_acquire_or_renew() for e in electors))
    assert sum(won) == 1
    record = electorate.record()
    assert record.holder == f"pod-{won.index(True)}" and record.transitions == 5
    # the losers' updates carried the same resourceVersion as the winner's: kube-apiserver refused them
    puts = [r.status for r in electorate.proxy.requests(mark) if r.method == "PUT"]
    assert sorted(puts) == [200, 409, 409, 409], puts


async def test_a_leader_that_cannot_renew_stops_within_the_renew_deadline(electorate: Electorate) -> None:
    events: list[tuple[str, float]] = []

    async def started() -> None:
        events.append(("started", time.monotonic()))

    async def stopped() -> None:
        events.append(("stopped", time.monotonic()))

    async with client_for(electorate.kubeconfig) as c:
        e = LeaderElector(c, config(electorate.ns, "pod-a"), on_started_leading=started, on_stopped_leading=stopped)
        task = asyncio.create_task(e.run())
        await until(lambda: events, timeout=10, what="leading")

        def renewed() -> bool:
            found = electorate.lease()
            return found is not None and LeaseRecord.from_lease(found).renew_time != found["spec"]["acquireTime"]

        await until(renewed, timeout=10, what="a renewal after the acquisition")
        electorate.proxy.inject(
            503, methods=["*"], path="/leases", times=10_000, message="etcdserver: request timed out"
        )
        failing_since = time.monotonic()
        async with asyncio.timeout(RETRY_PERIOD + RENEW_DEADLINE + 3):
            await task
    assert [name for name, _ in events] == ["started", "stopped"]
    # stopped by the last successful renewal + RetryPeriod + RenewDeadline, before a standby could take over
    assert events[1][1] - failing_since <= RETRY_PERIOD + RENEW_DEADLINE + 0.5
    assert events[1][1] - failing_since < LEASE_DURATION
    assert not e.leading


# ------------------------------------------------------------------------------ two operator processes
class Elected:
    """A leader-elected replica (:class:`harness.chaos.Replica`, never restarted) with its /metrics port."""

    def __init__(self, pod: str, cluster: Cluster, proxy: FaultProxy, account: str) -> None:
        self.pod, self.metrics_port = pod, free_port()
        timing = (
            f"--lease-duration={LEASE_DURATION}s",
            f"--renew-deadline={RENEW_DEADLINE}s",
            f"--retry-period={RETRY_PERIOD}s",
            "--resync-seconds=2",
            f"--metrics-port={self.metrics_port}",
            "--metrics-address=127.0.0.1",
        )
        self.replica = Replica(pod, cluster.kube, proxy, cluster.workdir, elect=True, sa=account, args=timing)
        self.exited_at: float | None = None  # time.monotonic(), comparable with the proxy's request times
        self._waiter: asyncio.Task[None] | None = None

    async def start(self) -> Elected:
        await self.replica.start()
        self._waiter = asyncio.create_task(self._wait())
        return self

    async def _wait(self) -> None:
        proc = self.replica.process.proc
        assert proc is not None
        await proc.wait()
        self.exited_at = time.monotonic()

    @property
    def returncode(self) -> int | None:
        proc = self.replica.process.proc
        return None if proc is None else proc.returncode

    def text(self) -> str:
        try:
            return self.replica.process.log_path.read_text(errors="replace")
        except OSError:
            return ""

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
        """When (time.monotonic()) the process logged a message containing ``fragment`` (JSON log lines)."""
        offset = time.time() - time.monotonic()
        for line in self.text().splitlines():
            if line.startswith("{") and fragment in (record := json.loads(line)).get("message", ""):
                return dt.datetime.fromisoformat(record["timestamp"]).timestamp() - offset
        raise AssertionError(f"{self.pod} never logged {fragment!r}")

    async def stop(self) -> None:
        await self.replica.stop()
        if self._waiter is not None:
            await asyncio.gather(self._waiter, return_exceptions=True)


@pytest.fixture
async def replicas(cluster: Cluster) -> AsyncIterator[list[Elected]]:
    """The chart's identity with the Lease Role (``replicas: 2``); the started replicas stop after the test."""
    chart_identity(cluster.kube, [cluster.ns], ELECTED)
    started: list[Elected] = []
    yield started
    for r in started:
        await r.stop()


def lease(cluster: Cluster) -> dict[str, Any] | None:
    return cluster.find(LEASE_API, "Lease", LEASE)


def holder(cluster: Cluster) -> str:
    found = lease(cluster)
    return ((found or {}).get("spec") or {}).get("holderIdentity") or ""


def by(proxies: list[FaultProxy], who: str, *, writes: bool = False, sent: bool = True) -> list[Request]:
    """What ``who`` sent through these proxies, in time order (``writes``: only writes; ``sent``: only what
    reached kube-apiserver, not what a proxy answered itself)."""
    records = sorted((r for p in proxies for r in p.requests()), key=lambda r: r.at)
    return [r for r in records if r.who == who and (r.write or not writes) and (not r.injected or not sent)]


def micro(ts: str) -> float:
    """A Lease MicroTime as time.monotonic() (the proxy's clock)."""
    return dt.datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp() - (time.time() - time.monotonic())


async def start_pair(
    cluster: Cluster, replicas: list[Elected], leader_proxy: FaultProxy | None = None
) -> tuple[Elected, Elected]:
    """op-a first (it becomes the leader), then op-b once the Lease names op-a; both with warm watches."""
    account = chart_rbac(f"rdo-{cluster.ns}", cluster.ns, [cluster.ns], ELECTED)[1]
    a = await Elected("op-a", cluster, leader_proxy or cluster.proxy, account).start()
    replicas.append(a)
    await until(lambda: holder(cluster) == "op-a", timeout=60, what=f"op-a to acquire the lease\n{a.text()}")
    b = await Elected("op-b", cluster, cluster.proxy, account).start()
    replicas.append(b)
    path = leases(cluster.ns)
    await until(
        lambda: (
            any(r.watch and "redrafterdeployments" in r.path for r in by([cluster.proxy], "op-b"))
            and any(r.path.startswith(path) for r in by([cluster.proxy], "op-b"))
        ),
        timeout=60,
        what=f"op-b to watch and poll the lease\n{b.text()}",
    )
    return a, b


pytestmark = pytest.mark.timeout(240)


@pytest.mark.slow
async def test_standby_writes_nothing_and_takes_over_after_sigkill(cluster: Cluster, replicas: list[Elected]) -> None:
    proxies = [cluster.proxy]
    a, b = await start_pair(cluster, replicas)
    cluster.apply(example(speculation__interval="2s"))  # the policy evaluates often: its state must carry over
    await until(lambda: len(cluster.jobs()) == 2 and cluster.status().get("phase") == "Building", what="builds")
    cluster.complete_all()
    await until(lambda: cluster.status().get("phase") == "Serving", what="Serving")
    # evaluators and resyncs (every 2 s) run on the leader meanwhile: wait for a few of each
    await until(
        lambda: (
            a.metric("redrafter_operator_speculation_evaluations_total") >= 2
            and a.metric("redrafter_operator_reconciles_total") >= 3
        ),
        timeout=30,
        what="the leader's evaluations and resyncs",
    )
    # the standby: watches and lease reads only, not one write; the leader did all the work
    assert by(proxies, "op-b", writes=True) == []
    assert {r.method for r in by(proxies, "op-b")} == {"GET"}
    leader_writes = by(proxies, "op-a", writes=True)
    assert any(r.method == "POST" and r.path.endswith("/jobs") for r in leader_writes)
    assert any(r.path.endswith("/status") for r in leader_writes)
    resource = f"{cluster.ns}/{NAME}"
    assert resource not in b.text() and resource in a.text()
    # ... and ran no reconcile, no policy evaluation (speculation and autoscaler), no validation Job
    assert b.metric("redrafter_operator_leader") == 0 and a.metric("redrafter_operator_leader") == 1
    assert b.metric("redrafter_operator_reconciles_total") == 0 < a.metric("redrafter_operator_reconciles_total")
    assert b.metric("redrafter_operator_speculation_evaluations_total") == 0
    assert a.metric("redrafter_operator_speculation_evaluations_total") > 0
    assert b.metric("redrafter_operator_resources") == 1  # its watches are warm all the same
    policy_before = cluster.status().get("policy")
    jobs_before = cluster.job_names()
    transitions = lease(cluster)["spec"]["leaseTransitions"]  # type: ignore[index]

    a.replica.kill()  # SIGKILL: no release, no cleanup
    killed_at = time.monotonic()
    await until(lambda: a.exited_at is not None, timeout=10, what="op-a to die")
    last_renew = micro(lease(cluster)["spec"]["renewTime"])  # type: ignore[index]
    # a change only a live leader acts on: the serving config (ConfigMap) and a rolled Deployment
    config_name = names.serving_config_name(NAME, "base")
    config_before = cluster.get("v1", "ConfigMap", config_name)
    cluster.patch(API_VERSION, KIND, NAME, {"spec": {"serving": {"triton": {"kvCacheFreeGpuMemFraction": 0.8}}}})
    await until(lambda: holder(cluster) == "op-b", timeout=LEASE_DURATION + 10, what=f"op-b to take over\n{b.text()}")
    acquired = lease(cluster)["spec"]  # type: ignore[index]
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
        return cluster.get("v1", "ConfigMap", config_name)["data"] != config_before["data"]

    await until(reconfigured, timeout=30, what=f"the new leader to act on the change\n{b.text()[-3000:]}")
    # the ConfigMap is applied mid-reconcile; the reconcile is counted once it finished (status, Events)
    await until(
        lambda: b.metric("redrafter_operator_reconciles_total") > 0,
        timeout=10,
        what="the new leader's reconcile to be counted",
    )
    assert b.metric("redrafter_operator_leader") == 1
    assert [r for r in by(proxies, "op-b", writes=True) if r.path.endswith("/configmaps/" + config_name)]
    assert cluster.job_names() == jobs_before  # it saw the existing Jobs before deciding: no duplicate build
    assert not [r for r in by(proxies, "op-b") if r.status == 409 and r.path.endswith("/jobs")]
    # the policy resumes from status.policy: the new leader's first evaluation continues the old state
    assert policy_before and policy_before["speculation"]["since"]
    acquired_wall = dt.datetime.fromisoformat(acquired["acquireTime"].replace("Z", "+00:00")).timestamp()
    await until(
        lambda: (cluster.status()["policy"]["speculation"].get("last_evaluated") or 0) > acquired_wall,
        timeout=20,
        what="the new leader's first policy evaluation",
    )
    policy_after = cluster.status()["policy"]
    assert policy_after["speculation"]["since"] == policy_before["speculation"]["since"], (policy_before, policy_after)
    assert policy_after["speculation"]["engine"] == policy_before["speculation"]["engine"]


@pytest.mark.slow
async def test_partitioned_leader_steps_down_before_the_standby_acts(
    cluster: Cluster, control_plane: ControlPlane, replicas: list[Elected]
) -> None:
    link = FaultProxy(control_plane).start()  # op-a's own way to kube-apiserver: the one the partition cuts
    proxies = [cluster.proxy, link]
    try:
        a, b = await start_pair(cluster, replicas, leader_proxy=link)
        cluster.apply(example())
        await until(lambda: len(cluster.jobs()) == 2 and cluster.status().get("phase") == "Building", what="builds")
        assert by(proxies, "op-b", writes=True) == []

        # op-a can no longer reach the API server; op-b can
        link.inject(503, path=r"^/", times=10**9, message="the network is partitioned")
        link.cut_watches(reset=True)
        cut_at = time.monotonic()
        await until(
            lambda: a.exited_at is not None,
            timeout=RETRY_PERIOD + RENEW_DEADLINE + 15,
            what=f"the partitioned leader to step down\n{a.text()[-3000:]}",
        )
        assert a.returncode == 1, a.text()[-3000:]
        stopped_at = a.logged_at("leader election lost")  # logged once its workers and evaluators had stopped
        assert "reconcile loops stopped" in a.text()
        await until(
            lambda: holder(cluster) == "op-b", timeout=LEASE_DURATION + 10, what=f"op-b to take over\n{b.text()}"
        )
        path = leases(cluster.ns)
        b_lease_writes = [r for r in by(proxies, "op-b", writes=True) if r.path.startswith(path)]
        acquired_at = min(r.at for r in b_lease_writes if r.ok)
        # the old leader stopped every loop before the standby acquired the lease ...
        assert stopped_at < acquired_at, (stopped_at - cut_at, acquired_at - cut_at)
        # ... and none of its writes reached the server once it was cut off, nor after the takeover
        assert [r for r in by(proxies, "op-a", writes=True) if r.at >= cut_at] == []
        # the standby wrote nothing before it held the lease
        assert [r for r in by(proxies, "op-b", writes=True) if r.at < acquired_at] == [
            r for r in b_lease_writes if r.at < acquired_at
        ]
        assert a.exited_at is not None
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
        for r in replicas:
            await r.stop()
        link.stop()
