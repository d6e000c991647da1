"""The CronJob controller the emulated cluster lacked: Jobs from ``spec.jobTemplate`` on schedule.

As kubernetes pkg/controller/cronjob/cronjob_controllerv2.go (syncCronJob, cleanupFinishedJobs) and
utils.go (mostRecentScheduleTime, getJobFromTemplate2) do it, for each CronJob:

* its Jobs are those whose controller owner reference is the CronJob; a finished Job leaves
  ``status.active`` (Event SawCompletedJob), a succeeded one advances ``status.lastSuccessfulTime``,
  an active Job that is gone leaves it too (MissingJob);
* unless deleting, ``suspend``ed, or the timeZone is unknown: the most recent start time due since
  ``status.lastScheduleTime`` (else the creation time; no earlier than now - startingDeadlineSeconds).
  Missed by more than startingDeadlineSeconds: Event MissSchedule. Already started: nothing.
  ``Forbid`` with an active Job: Event JobAlreadyActive; ``Replace``: the active Jobs are deleted first;
* the Job ``<cronjob>-<start time in minutes since the epoch>``: the template's labels, annotations and
  spec, annotation ``batch.kubernetes.io/cronjob-scheduled-timestamp`` (RFC 3339 in the CronJob's time
  zone), a controller owner reference to the CronJob; ``status.active`` and ``lastScheduleTime`` follow
  (Event SuccessfulCreate);
* finished Jobs beyond ``successfulJobsHistoryLimit`` / ``failedJobsHistoryLimit`` (oldest start first)
  are deleted (Event SuccessfulDelete).

Start times come from the operator's robfig/cron-compatible parser (redrafter_operator.api.cron),
the schedule parser the API server validates with. The clock is injectable: tests pass a
:class:`ManualClock` and move it past the next start time; the default is the real clock (the demo,
``redrafter-sim server --controllers``). As the real controller requeues a CronJob only at its next start
time or when it or one of its Jobs changes, a pass skips a CronJob until one of those happens (so a
Forbid skip is one Event, not one per pass). Writes go straight into the emulator object, like the
other stand-ins in :mod:`.controllers`.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import zoneinfo
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from redrafter_operator.api.cron import CronError, Schedule, parse_standard

from .apiserver import ApiError, ApiServerEmulator
from .objects import suffix

log = logging.getLogger("redrafter.sim.cronjobs")

SCHEDULED_TIMESTAMP = "batch.kubernetes.io/cronjob-scheduled-timestamp"
COMPONENT = "cronjob-controller"
MANY_MISSED = 100
Clock = Callable[[], datetime.datetime]


def real_clock() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class ManualClock:
    """A clock a test moves: starts at the real time (objects get real creation timestamps)."""

    def __init__(self, start: datetime.datetime | None = None) -> None:
        self.time = start or real_clock()

    def __call__(self) -> datetime.datetime:
        return self.time

    def advance(self, seconds: float) -> datetime.datetime:
        self.time += datetime.timedelta(seconds=seconds)
        return self.time

    def set(self, when: datetime.datetime) -> datetime.datetime:
        self.time = when
        return self.time


def parse_time(stamp: str | None) -> datetime.datetime | None:
    if not stamp:
        return None
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def rfc3339(when: datetime.datetime) -> str:
    return when.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def job_name(cronjob: str, scheduled: datetime.datetime) -> str:
    """getJobName: the start time in minutes since the epoch."""
    return f"{cronjob}-{int(scheduled.timestamp()) // 60}"


def finished(job: dict[str, Any]) -> str | None:
    """``Complete`` or ``Failed`` when the Job has that condition True."""
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("type") in ("Complete", "Failed") and c.get("status") == "True":
            return str(c["type"])
    return None


@dataclass
class _Queue:
    fingerprint: tuple[Any, ...]
    due: datetime.datetime | None  # None: only a change brings the CronJob back


class CronJobController:
    """``sync()`` is one pass over every CronJob (of ``namespace``) that is due or changed."""

    def __init__(self, emu: ApiServerEmulator, clock: Clock = real_clock, namespace: str | None = None) -> None:
        self.emu = emu
        self.clock = clock
        self.namespace = namespace
        self._queue: dict[str, _Queue] = {}  # by CronJob uid

    def sync(self) -> None:
        seen = set()
        jobs = self.emu.list_objects("batch/v1", "Job", self.namespace)
        for cj in self.emu.list_objects("batch/v1", "CronJob", self.namespace):
            uid = cj["metadata"]["uid"]
            seen.add(uid)
            own = [
                j
                for j in jobs
                if j["metadata"].get("namespace") == cj["metadata"]["namespace"]
                and any(r.get("uid") == uid and r.get("controller") for r in j["metadata"].get("ownerReferences") or [])
            ]
            fingerprint = (
                cj["metadata"]["resourceVersion"],
                tuple(sorted((j["metadata"]["uid"], j["metadata"]["resourceVersion"]) for j in own)),
            )
            queued = self._queue.get(uid)
            now = self.clock()
            if queued and queued.fingerprint == fingerprint and (queued.due is None or now < queued.due):
                continue
            try:
                due = self.sync_cronjob(cj, own, now)
            except (ApiError, KeyError) as exc:  # gone or conflicting meanwhile: the next pass retries
                log.debug("cronjob %s: %s", cj["metadata"]["name"], exc)
                self._queue.pop(uid, None)
                continue
            # what this pass saw: its own writes bring the CronJob back once, as their watch events requeue it
            self._queue[uid] = _Queue(fingerprint, due)
        for uid in set(self._queue) - seen:
            del self._queue[uid]

    # ------------------------------------------------------------------ one CronJob
    def sync_cronjob(
        self, cj: dict[str, Any], jobs: list[dict[str, Any]], now: datetime.datetime
    ) -> datetime.datetime | None:
        """syncCronJob then cleanupFinishedJobs; the status written once; returns when to look again."""
        meta, spec = cj["metadata"], cj.get("spec") or {}
        ns, name = meta["namespace"], meta["name"]
        status = dict(cj.get("status") or {})
        before = dict(status)
        active = list(status.get("active") or [])
        children = {j["metadata"]["uid"] for j in jobs}
        for job in jobs:
            uid, in_active = job["metadata"]["uid"], any(a.get("uid") == job["metadata"]["uid"] for a in active)
            state = finished(job)
            if not in_active and state is None:
                self._event(
                    cj,
                    "Warning",
                    "UnexpectedJob",
                    f"Saw a job that the controller did not create or forgot: {job['metadata']['name']}",
                )
            elif in_active and state is not None:
                active = [a for a in active if a.get("uid") != uid]
                self._event(
                    cj, "Normal", "SawCompletedJob", f"Saw completed job: {job['metadata']['name']}, status: {state}"
                )
            elif state == "Complete":
                done = (job.get("status") or {}).get("completionTime")
                last = status.get("lastSuccessfulTime")
                if done and (last is None or parse_time(done) > parse_time(last)):  # type: ignore[operator]
                    status["lastSuccessfulTime"] = done
        for ref in list(active):
            if (
                ref.get("uid") not in children
                and self.emu.find_object("batch/v1", "Job", ref.get("name", ""), ns) is None
            ):
                self._event(cj, "Normal", "MissingJob", f"Active job went missing: {ref.get('name')}")
                active = [a for a in active if a.get("uid") != ref.get("uid")]
        due = self._schedule(cj, spec, status, active, now)
        jobs = [j for j in jobs if self.emu.find_object("batch/v1", "Job", j["metadata"]["name"], ns) is not None]
        active = self._cleanup(cj, spec, jobs, status.pop("_active", active))
        status["active"] = active or None
        if {k: v for k, v in status.items() if v is not None} != {k: v for k, v in before.items() if v is not None}:
            self.emu.patch_object("batch/v1", "CronJob", name, ns, {"status": status}, subresource="status")
        return due

    def _schedule(
        self,
        cj: dict[str, Any],
        spec: dict[str, Any],
        status: dict[str, Any],
        active: list[dict[str, Any]],
        now: datetime.datetime,
    ) -> datetime.datetime | None:
        """The scheduling half of syncCronJob: maybe a new Job. Sets status["_active"]; returns the requeue time."""
        status["_active"] = active
        meta = cj["metadata"]
        if meta.get("deletionTimestamp"):
            return None
        tz_name = spec.get("timeZone")
        try:
            tz = zoneinfo.ZoneInfo(tz_name) if tz_name else datetime.UTC
        except (zoneinfo.ZoneInfoNotFoundError, ValueError) as exc:
            self._event(cj, "Warning", "UnknownTimeZone", f'invalid timeZone: "{tz_name}": {exc}')
            return None
        if spec.get("suspend"):
            return None
        try:
            sched = parse_standard(spec.get("schedule") or "")
        except CronError as exc:
            self._event(cj, "Warning", "UnparseableSchedule", f'unparseable schedule: "{spec.get("schedule")}" : {exc}')
            return None
        if "TZ" in (spec.get("schedule") or ""):
            self._event(
                cj,
                "Warning",
                "UnsupportedSchedule",
                f'CRON_TZ or TZ used in schedule "{spec["schedule"]}" is '
                "not officially supported, see https://kubernetes.io/docs/concepts/workloads/controllers/"
                "cron-jobs/ for more details",
            )
        tz_used = None if sched.location else tz
        deadline = spec.get("startingDeadlineSeconds")
        try:
            scheduled, many = most_recent_schedule_time(cj, status, now, sched, tz_used, deadline)
        except ValueError as exc:
            self._event(cj, "Warning", "InvalidSchedule", f"invalid schedule: {spec.get('schedule')} : {exc}")
            return None
        next_time = next_schedule_time(cj, status, now, sched, tz_used)
        if scheduled is None:
            return next_time
        if many:
            self._event(
                cj,
                "Warning",
                "TooManyMissedTimes",
                "too many missed start times. Set or decrease .spec.startingDeadlineSeconds or check clock skew",
            )
        if deadline is not None and scheduled + datetime.timedelta(seconds=deadline) < now:
            self._event(
                cj,
                "Warning",
                "MissSchedule",
                "Missed scheduled time to start a job: "
                + scheduled.astimezone(datetime.UTC).strftime("%a, %d %b %Y %H:%M:%S +0000"),
            )
            return next_time
        name = job_name(meta["name"], scheduled)
        if any(a.get("name") == name for a in active) or status.get("lastScheduleTime") == rfc3339(scheduled):
            return next_time
        policy = spec.get("concurrencyPolicy") or "Allow"
        if policy == "Forbid" and active:
            self._event(
                cj,
                "Normal",
                "JobAlreadyActive",
                "Not starting job because prior execution is running and concurrency policy is Forbid",
            )
            return next_time
        if policy == "Replace":
            for ref in list(active):
                with contextlib.suppress(ApiError):
                    self.emu.delete_object("batch/v1", "Job", ref["name"], meta["namespace"])
                active = [a for a in active if a.get("uid") != ref.get("uid")]
                status["_active"] = active
                self._event(cj, "Normal", "SuccessfulDelete", f"Deleted job {ref['name']}")
        try:
            job = self.emu.create_object(job_from_template(cj, scheduled, tz))
            self._event(cj, "Normal", "SuccessfulCreate", f"Created job {name}")
        except ApiError as exc:
            if exc.code != 409:
                self._event(cj, "Warning", "FailedCreate", f"Error creating job: {exc.message}")
                raise
            job = self.emu.get_object("batch/v1", "Job", name, meta["namespace"])
            if not any(
                r.get("uid") == meta["uid"] and r.get("controller")
                for r in job["metadata"].get("ownerReferences") or []
            ):
                return next_time
            if any(a.get("uid") == job["metadata"]["uid"] for a in active):
                return next_time
        jm = job["metadata"]
        status["_active"] = [
            *active,
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": jm["name"],
                "namespace": jm["namespace"],
                "uid": jm["uid"],
                "resourceVersion": jm["resourceVersion"],
            },
        ]
        status["lastScheduleTime"] = rfc3339(scheduled)
        return next_schedule_time(cj, status, now, sched, tz_used)

    def _cleanup(
        self, cj: dict[str, Any], spec: dict[str, Any], jobs: list[dict[str, Any]], active: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """cleanupFinishedJobs: the oldest finished Jobs beyond the history limits are deleted."""
        for state, limit in (
            ("Complete", spec.get("successfulJobsHistoryLimit")),
            ("Failed", spec.get("failedJobsHistoryLimit")),
        ):
            if limit is None:
                continue
            done = [j for j in jobs if finished(j) == state]
            done.sort(
                key=lambda j: (
                    (j.get("status") or {}).get("startTime") is None,
                    (j.get("status") or {}).get("startTime") or "",
                    j["metadata"]["name"],
                )
            )
            for job in done[: max(len(done) - int(limit), 0)]:
                try:
                    self.emu.delete_object("batch/v1", "Job", job["metadata"]["name"], job["metadata"]["namespace"])
                except ApiError as exc:
                    self._event(cj, "Warning", "FailedDelete", f"Deleted job: {exc.message}")
                    continue
                active = [a for a in active if a.get("uid") != job["metadata"]["uid"]]
                self._event(cj, "Normal", "SuccessfulDelete", f"Deleted job {job['metadata']['name']}")
        return active

    def _event(self, cj: dict[str, Any], type_: str, reason: str, message: str) -> None:
        """Record an Event on the CronJob (a repeat counts on the earlier one, as the event recorder does)."""
        meta, t = cj["metadata"], rfc3339(real_clock())
        for seen in self.emu.list_objects("v1", "Event", meta["namespace"]):
            if (
                seen.get("reason") == reason
                and seen.get("message") == message
                and (seen.get("involvedObject") or {}).get("uid") == meta["uid"]
            ):
                self.emu.patch_object(
                    "v1",
                    "Event",
                    seen["metadata"]["name"],
                    meta["namespace"],
                    {"count": int(seen.get("count") or 1) + 1, "lastTimestamp": t},
                )
                return
        self.emu.create_object(
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": f"{meta['name']}.{suffix(10)}", "namespace": meta["namespace"]},
                "involvedObject": {
                    "apiVersion": "batch/v1",
                    "kind": "CronJob",
                    "name": meta["name"],
                    "namespace": meta["namespace"],
                    "uid": meta["uid"],
                },
                "reason": reason,
                "message": message,
                "type": type_,
                "source": {"component": COMPONENT},
                "reportingComponent": COMPONENT,
                "firstTimestamp": t,
                "lastTimestamp": t,
                "count": 1,
            }
        )


# ----------------------------------------------------------------------------- schedule arithmetic (utils.go)


def _earliest(cj: dict[str, Any], status: dict[str, Any]) -> datetime.datetime:
    return (
        parse_time(status.get("lastScheduleTime"))
        or parse_time(cj["metadata"].get("creationTimestamp"))
        or real_clock()
    )


def most_recent_schedule_time(
    cj: dict[str, Any],
    status: dict[str, Any],
    now: datetime.datetime,
    sched: Schedule,
    tz: datetime.tzinfo | None,
    deadline: int | None = None,
) -> tuple[datetime.datetime | None, bool]:
    """(the most recent start time due by ``now`` or None, whether more than 100 were missed);
    ValueError when the schedule never fires (mostRecentScheduleTime's "less than 1 second")."""
    earliest = _earliest(cj, status)
    if deadline is not None:
        earliest = max(earliest, now - datetime.timedelta(seconds=deadline))
    t1 = sched.next(earliest, tz)
    if t1 is not None and now < t1:
        return None, False
    t2 = sched.next(t1, tz) if t1 is not None else None
    if t1 is not None and t2 is not None and now < t2:
        return t1, False
    if t1 is None or t2 is None or (t2 - t1).total_seconds() < 1:
        raise ValueError("time difference between two schedules is less than 1 second")
    between = round((t2 - t1).total_seconds())
    missed = int((now - t1).total_seconds()) // between + 1
    recent = None
    t = sched.next(t1 + datetime.timedelta(seconds=(missed - 2) * between), tz)
    while t is not None and t <= now:
        recent = t
        t = sched.next(t, tz)
    return recent, missed > MANY_MISSED


def next_schedule_time(
    cj: dict[str, Any], status: dict[str, Any], now: datetime.datetime, sched: Schedule, tz: datetime.tzinfo | None
) -> datetime.datetime | None:
    """When the controller looks at the CronJob again (nextScheduleTimeDuration, without its 100 ms pad)."""
    try:
        recent, _ = most_recent_schedule_time(cj, status, now, sched, tz)
    except ValueError:
        recent = now
    if recent is None:
        recent = _earliest(cj, status)
        first = sched.next(recent, tz)
        if first is not None and first <= now:
            recent = now
    return sched.next(recent, tz)


def job_from_template(cj: dict[str, Any], scheduled: datetime.datetime, tz: datetime.tzinfo) -> dict[str, Any]:
    """getJobFromTemplate2: the template's metadata and spec, named and owned by the CronJob."""
    meta = cj["metadata"]
    template = (cj.get("spec") or {}).get("jobTemplate") or {}
    tmeta = template.get("metadata") or {}
    annotations = {
        **(tmeta.get("annotations") or {}),
        SCHEDULED_TIMESTAMP: scheduled.astimezone(tz).isoformat().replace("+00:00", "Z"),
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name(meta["name"], scheduled),
            "namespace": meta["namespace"],
            "labels": dict(tmeta.get("labels") or {}),
            "annotations": annotations,
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "CronJob",
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": dict(template.get("spec") or {}),
    }


async def run_cronjob_controller(controller: CronJobController, stop: asyncio.Event, interval: float = 1.0) -> None:
    """``controller.sync()`` every ``interval`` seconds until ``stop`` is set (the demo, the server)."""
    while not stop.is_set():
        try:
            controller.sync()
        except Exception as exc:  # a controller keeps going
            log.warning("cronjob sync failed: %s", exc)
        try:
            await asyncio.wait_for(stop.wait(), interval)
        except TimeoutError:
            pass
