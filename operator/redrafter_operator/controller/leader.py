"""Leader election on a ``coordination.k8s.io/v1`` Lease, with client-go's semantics.

Why a Lease and not kopf peering: kopf peering pauses only kopf's watch streams on the losing replica,
while this operator's workers and evaluators are its own tasks; they would go on writing. Here the
operator starts its loops only while it holds the Lease and stops them before anyone else can take it.

The algorithm follows client-go ``tools/leaderelection`` (v0.36.3, Kubernetes 1.36):
``leaderelection.go`` ``NewLeaderElector`` (config checks), ``acquire`` (retry every RetryPeriod with
JitterFactor 1.2), ``renew`` (retry every RetryPeriod; a renewal that does not succeed within
RenewDeadline ends the leadership), ``tryAcquireOrRenew`` (steps 1-4 below), ``isLeaseValid`` (expiry
is measured from the *local* time the record last changed, never from the renewTime written by another
clock) and ``tryRelease``; ``resourcelock/leaselock.go`` (Get/Create/Update of the Lease, the record
<-> LeaseSpec mapping, Update sends the last object read so its resourceVersion makes a concurrent
writer fail with 409 Conflict).

The decisions are pure functions of (record, when it was observed, now, identity, config); the
:class:`LeaderElector` only adds the API calls and the timing loops around them.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import random
import socket
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any, Awaitable, Callable, Mapping

from .apply import ApiError, KubeClient

log = logging.getLogger("redrafter_operator.leader")

JITTER_FACTOR = 1.2  # client-go leaderelection.JitterFactor
LEASES = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"


@dataclass(frozen=True)
class ElectionConfig:
    """Where the Lease lives, who we are, and client-go's three durations (seconds)."""

    namespace: str
    name: str
    identity: str
    lease_duration: float = 15.0  # a standby takes over this long after it last saw the record change
    renew_deadline: float = 10.0  # a leader that cannot renew for this long stops leading
    retry_period: float = 2.0  # time between attempts to acquire or renew

    def __post_init__(self) -> None:
        problems = config_errors(self)
        if problems:
            raise ValueError("; ".join(problems))


def config_errors(cfg: ElectionConfig) -> list[str]:
    """client-go NewLeaderElector's checks, plus what a Lease needs (whole seconds, DNS names)."""
    errors = []
    if not cfg.identity:
        errors.append("the leader election identity must not be empty")
    if not cfg.namespace or not cfg.name:
        errors.append("the leader election namespace and id (Lease name) must not be empty")
    if cfg.lease_duration <= 0 or cfg.renew_deadline <= 0 or cfg.retry_period <= 0:
        errors.append("lease duration, renew deadline and retry period must be greater than zero")
    elif cfg.lease_duration <= cfg.renew_deadline:
        errors.append(
            f"lease duration ({cfg.lease_duration:g}s) must be greater than renew deadline ({cfg.renew_deadline:g}s)"
        )
    elif cfg.renew_deadline <= JITTER_FACTOR * cfg.retry_period:
        errors.append(
            f"renew deadline ({cfg.renew_deadline:g}s) must be greater than retry period × {JITTER_FACTOR} "
            f"({JITTER_FACTOR * cfg.retry_period:g}s)"
        )
    if cfg.lease_duration > 0 and cfg.lease_duration != int(cfg.lease_duration):
        errors.append(
            f"lease duration must be whole seconds (Lease spec.leaseDurationSeconds), got {cfg.lease_duration:g}s"
        )
    return errors


def default_identity() -> str:
    """The pod name (POD_NAME from the downward API); off-cluster the hostname plus a random suffix,
    as controller-runtime does, so two processes on one host never share an identity."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}_{uuid.uuid4()}"


def micro_time(moment: dt.datetime) -> str:
    """A metav1.MicroTime on the wire: RFC 3339 with exactly six fractional digits, UTC."""
    return moment.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class LeaseRecord:
    """client-go's LeaderElectionRecord, as stored in a Lease's spec."""

    holder: str = ""
    lease_duration_seconds: int = 0
    acquire_time: str | None = None
    renew_time: str | None = None
    transitions: int = 0

    @classmethod
    def from_lease(cls, lease: Mapping[str, Any]) -> "LeaseRecord":
        spec = lease.get("spec") or {}
        return cls(
            holder=spec.get("holderIdentity") or "",
            lease_duration_seconds=int(spec.get("leaseDurationSeconds") or 0),
            acquire_time=spec.get("acquireTime"),
            renew_time=spec.get("renewTime"),
            transitions=int(spec.get("leaseTransitions") or 0),
        )

    def to_spec(self) -> dict[str, Any]:
        """LeaderElectionRecordToLeaseSpec: every field is written (an empty holder releases the lease)."""
        return {
            "holderIdentity": self.holder,
            "leaseDurationSeconds": self.lease_duration_seconds,
            "acquireTime": self.acquire_time,
            "renewTime": self.renew_time,
            "leaseTransitions": self.transitions,
        }


def lease_valid(record: LeaseRecord, observed_at: float, now: float) -> bool:
    """isLeaseValid: the record changed less than its leaseDurationSeconds ago, on *our* clock."""
    return observed_at + record.lease_duration_seconds > now


def desired_record(
    current: LeaseRecord | None, observed_at: float, now: float, wall: dt.datetime, cfg: ElectionConfig
) -> LeaseRecord | None:
    """tryAcquireOrRenew steps 3-4: the record to write, or None while another holder's lease is valid.

    ``current`` is the record just read (None: no Lease yet, create it) and ``observed_at`` the local
    monotonic time it was first seen with its present content.
    """
    stamp = micro_time(wall)
    mine = LeaseRecord(cfg.identity, int(cfg.lease_duration), stamp, stamp, 0)
    if current is None:
        return mine
    if current.holder and current.holder != cfg.identity and lease_valid(current, observed_at, now):
        return None
    if current.holder == cfg.identity:  # a renewal keeps when we acquired it and the count
        return replace(mine, acquire_time=current.acquire_time, transitions=current.transitions)
    return replace(mine, transitions=current.transitions + 1)  # a takeover (of an expired or released lease)


def released_record(current: LeaseRecord, wall: dt.datetime) -> LeaseRecord:
    """tryRelease: no holder and a 1 s lease, so a standby takes over on its next attempt."""
    stamp = micro_time(wall)
    return LeaseRecord("", 1, stamp, stamp, current.transitions)


class LeaderElector:
    """Acquire, renew and (on a graceful stop) release one Lease; tell the caller when leading starts and stops.

    ``run`` returns when the leadership is lost (after awaiting ``on_stopped_leading``, which must stop
    every writer: client-go then ends the process, and so does ``redrafter-operator run``), or never
    while it is a standby. Cancel it to stop without having led.
    """

    def __init__(
        self,
        client: KubeClient,
        cfg: ElectionConfig,
        *,
        on_started_leading: Callable[[], Awaitable[None]],
        on_stopped_leading: Callable[[], Awaitable[None]],
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.timezone.utc),
        on_leader: Callable[[bool], None] | None = None,
    ) -> None:
        self.client, self.cfg = client, cfg
        self._started, self._stopped = on_started_leading, on_stopped_leading
        self._clock, self._wall = clock, wall
        self._on_leader = on_leader
        self._lease: dict[str, Any] | None = None  # the last object read or written (carries resourceVersion)
        self._observed: LeaseRecord | None = None
        self._observed_at = 0.0
        self._reported = ""
        self._renewed_at = float("-inf")  # local start time of the last successful acquire or renewal
        self.leading = False

    @property
    def path(self) -> str:
        return f"{LEASES.format(namespace=self.cfg.namespace)}/{self.cfg.name}"

    def describe(self) -> str:
        return f"{self.cfg.namespace}/{self.cfg.name}"

    def is_leader(self) -> bool:
        return self._observed is not None and self._observed.holder == self.cfg.identity

    def may_write(self) -> bool:
        """Fencing for the leader's writes: it holds the lease and renewed it less than RenewDeadline ago.

        A standby takes over no earlier than LeaseDuration after the last renewal it saw, which began
        after this one started; so within RenewDeadline < LeaseDuration nobody else can lead, even if this
        process was paused (a stalled event loop) and its elector has not noticed yet.
        """
        return self.is_leader() and self._clock() - self._renewed_at < self.cfg.renew_deadline

    def _observe(self, record: LeaseRecord, *, written: bool = False) -> None:
        """setObservedRecord: a changed (or just written) record restarts the expiry clock."""
        if written or record != self._observed:
            self._observed, self._observed_at = record, self._clock()
        if record.holder != self._reported:  # maybeReportTransition
            self._reported = record.holder
            log.info("lease %s: the leader is now %s", self.describe(), record.holder or "<none>")

    def _body(self, record: LeaseRecord) -> dict[str, Any]:
        if self._lease is None:
            return {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.cfg.name, "namespace": self.cfg.namespace},
                "spec": record.to_spec(),
            }
        return {**self._lease, "spec": {**(self._lease.get("spec") or {}), **record.to_spec()}}

    async def _update(self, record: LeaseRecord) -> None:
        """leaselock Update: PUT the last object read with the new spec (409 if anyone wrote in between)."""
        self._lease = await self.client.request("PUT", self.path, self._body(record), retry_conflict=False)
        self._observe(record, written=True)

    async def try_acquire_or_renew(self) -> bool:
        """One attempt (client-go tryAcquireOrRenew); True when we hold the lease afterwards."""
        started = self._clock()
        held = await self._try_acquire_or_renew(started)
        if held:
            self._renewed_at = started
        return held

    async def _try_acquire_or_renew(self, now: float) -> bool:
        wall = self._wall()
        # 1. fast path: the leader updates the object it last wrote, without reading it first
        if self.is_leader() and self._observed is not None and lease_valid(self._observed, self._observed_at, now):
            desired = desired_record(self._observed, self._observed_at, now, wall, self.cfg)
            assert desired is not None
            try:
                await self._update(desired)
                return True
            except ApiError as exc:
                log.debug("optimistic renewal of lease %s failed (%s); reading it", self.describe(), exc)
        # 2. read the record, or create the Lease when there is none
        try:
            self._lease = await self.client.request("GET", self.path)
        except ApiError as exc:
            if exc.status != 404:
                log.warning("cannot read lease %s: %s", self.describe(), exc)
                return False
            desired = desired_record(None, 0.0, now, wall, self.cfg)
            assert desired is not None
            try:
                self._lease = await self.client.request(
                    "POST", LEASES.format(namespace=self.cfg.namespace), self._body(desired), retry_conflict=False
                )
            except ApiError as exc2:
                log.warning("cannot create lease %s: %s", self.describe(), exc2)
                return False
            self._observe(desired, written=True)
            return True
        # 3. check the holder and the time
        current = LeaseRecord.from_lease(self._lease)
        self._observe(current)
        desired = desired_record(current, self._observed_at, now, wall, self.cfg)
        if desired is None:
            return False
        # 4. acquire (transitions + 1) or renew (keep acquireTime and transitions)
        try:
            await self._update(desired)
        except ApiError as exc:
            log.warning("cannot update lease %s: %s", self.describe(), exc)
            return False
        return True

    async def _attempt(self, timeout: float) -> bool:
        """An attempt that also fails when it takes longer than ``timeout`` (a hung connection)."""
        try:
            async with asyncio.timeout(max(timeout, 0.0)):
                return await self.try_acquire_or_renew()
        except TimeoutError:
            log.warning("lease %s: no answer within %.1fs", self.describe(), max(timeout, 0.0))
            return False
        except Exception as exc:  # noqa: BLE001 - any failure to reach the server is a failed attempt
            log.warning("lease %s: %s: %s", self.describe(), type(exc).__name__, exc)
            return False

    async def _acquire(self) -> None:
        log.info("attempting to acquire leader lease %s as %s", self.describe(), self.cfg.identity)
        while not await self._attempt(self.cfg.renew_deadline):
            # wait.JitterUntil: RetryPeriod plus up to JitterFactor × RetryPeriod
            await asyncio.sleep(self.cfg.retry_period * (1 + random.random() * JITTER_FACTOR))
        log.info("successfully acquired lease %s as %s", self.describe(), self.cfg.identity)

    async def _renew(self) -> None:
        """Returns when a renewal did not succeed within RenewDeadline (the leadership is over)."""
        while True:
            await asyncio.sleep(self.cfg.retry_period)  # wait.Until with RetryPeriod
            deadline = self._clock() + self.cfg.renew_deadline  # PollUntilContextTimeout(RetryPeriod, RenewDeadline)
            while not await self._attempt(deadline - self._clock()):
                left = deadline - self._clock()
                if left <= 0:
                    log.warning(
                        "failed to renew lease %s within %gs: stopping leading",
                        self.describe(),
                        self.cfg.renew_deadline,
                    )
                    return
                await asyncio.sleep(min(self.cfg.retry_period, left))

    def _set_leading(self, leading: bool) -> None:
        self.leading = leading
        if self._on_leader:
            self._on_leader(leading)

    async def run(self) -> None:
        """Acquire, lead until a renewal fails, then await ``on_stopped_leading`` and return.

        Cancelling it (a graceful shutdown) skips ``on_stopped_leading``: the caller stops its writers.
        """
        await self._acquire()
        self._set_leading(True)
        try:
            await self._started()
            await self._renew()
        finally:
            self._set_leading(False)
        await self._stopped()

    async def release(self) -> bool:
        """Give the lease up (after every writer stopped), so a standby need not wait for it to expire."""
        if not self.is_leader() or self._lease is None:
            return False
        for _ in range(3):  # a conflict with our own in-flight renewal: read again and retry
            try:
                self._lease = await self.client.request("GET", self.path)
                current = LeaseRecord.from_lease(self._lease)
                if current.holder != self.cfg.identity:
                    return False
                await self._update(released_record(current, self._wall()))
                log.info("released lease %s", self.describe())
                return True
            except ApiError as exc:
                if exc.status != 409:
                    log.warning("cannot release lease %s: %s", self.describe(), exc)
                    return False
        return False


__all__ = [
    "ElectionConfig",
    "LeaderElector",
    "LeaseRecord",
    "config_errors",
    "default_identity",
    "desired_record",
    "lease_valid",
    "micro_time",
    "released_record",
]
