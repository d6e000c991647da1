"""The emulated cluster's CronJobs: the API server validates and defaults them as Kubernetes does, and the
CronJob controller starts Jobs on schedule (on a clock the test moves), honouring concurrencyPolicy,
suspend, startingDeadlineSeconds and the history limits."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from redrafter_sim.apiserver import ApiError, ApiServerEmulator
from redrafter_sim.controllers import complete_job, fail_job
from redrafter_sim.cronjobs import SCHEDULED_TIMESTAMP, CronJobController, ManualClock, job_name, parse_time

NS = "default"


def cronjob(name: str = "gc", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "schedule": "*/5 * * * *",
            "jobTemplate": {
                "metadata": {"labels": {"app": "gc"}, "annotations": {"note": "n"}},
                "spec": {
                    "backoffLimit": 0,
                    "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "img"}]}},
                },
            },
            **spec,
        },
    }


def invalid(emu: ApiServerEmulator, body: dict[str, Any]) -> str:
    with pytest.raises(ApiError) as info:
        emu.create_object(body)
    assert info.value.code == 422 and info.value.reason == "Invalid"
    return info.value.message


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {"schedule": "99 * * * *"},
            'spec.schedule: Invalid value: "99 * * * *": end of range (99) above maximum (59): 99',
        ),
        (
            {"schedule": "@fortnightly"},
            'spec.schedule: Invalid value: "@fortnightly": unrecognized descriptor: @fortnightly',
        ),
        (
            {"schedule": "TZ=UTC 0 3 * * *"},
            'spec.schedule: Invalid value: "TZ=UTC 0 3 * * *": cannot use TZ or CRON_TZ in '
            "schedule, use timeZone field instead",
        ),
        ({"schedule": ""}, "spec.schedule: Required value"),
        (
            {"concurrencyPolicy": "Sometimes"},
            'spec.concurrencyPolicy: Unsupported value: "Sometimes": supported values: "Allow", "Forbid", "Replace"',
        ),
        (
            {"startingDeadlineSeconds": -1},
            "spec.startingDeadlineSeconds: Invalid value: -1: must be greater than or equal to 0",
        ),
        (
            {"successfulJobsHistoryLimit": -1},
            "spec.successfulJobsHistoryLimit: Invalid value: -1: must be greater than or equal to 0",
        ),
        ({"timeZone": "Mars/Olympus"}, 'spec.timeZone: Invalid value: "Mars/Olympus": unknown time zone Mars/Olympus'),
    ],
)
def test_the_api_server_refuses_what_kubernetes_refuses(spec: dict[str, Any], message: str) -> None:
    assert invalid(ApiServerEmulator(), cronjob(**spec)) == f'CronJob.batch "gc" is invalid: {message}'


def test_the_job_template_and_the_name_are_validated_too() -> None:
    emu = ApiServerEmulator()
    body = cronjob()
    body["spec"]["jobTemplate"]["spec"]["template"]["spec"]["restartPolicy"] = "Always"
    assert invalid(emu, body).endswith(
        'spec.jobTemplate.spec.template.spec.restartPolicy: Required value: valid values: "OnFailure", "Never"'
    )
    assert invalid(emu, cronjob("x" * 53)).endswith(
        f'metadata.name: Invalid value: "{"x" * 53}": must be no more than 52 characters'
    )


def test_defaults_and_an_update_keeping_a_tz_schedule() -> None:
    emu = ApiServerEmulator()
    stored = emu.create_object(cronjob())
    assert {
        k: stored["spec"][k]
        for k in ("concurrencyPolicy", "suspend", "successfulJobsHistoryLimit", "failedJobsHistoryLimit")
    } == {"concurrencyPolicy": "Allow", "suspend": False, "successfulJobsHistoryLimit": 3, "failedJobsHistoryLimit": 1}
    with pytest.raises(ApiError, match="cannot use TZ"):
        emu.patch_object("batch/v1", "CronJob", "gc", NS, {"spec": {"schedule": "TZ=UTC 0 3 * * *"}})


class World:
    def __init__(self, **spec: Any) -> None:
        self.emu = ApiServerEmulator()
        self.cj = self.emu.create_object(cronjob(**spec))
        created = parse_time(self.cj["metadata"]["creationTimestamp"])
        self.clock = ManualClock(created)
        self.controller = CronJobController(self.emu, self.clock, NS)

    def next_start(self, after: dt.datetime | None = None) -> dt.datetime:
        after = after or self.clock()
        minute = after.replace(second=0, microsecond=0)
        return minute + dt.timedelta(minutes=5 - minute.minute % 5)

    def to_next_start(self, plus: float = 2.0) -> dt.datetime:
        start = self.next_start()
        self.clock.set(start + dt.timedelta(seconds=plus))
        self.controller.sync()
        return start

    def jobs(self) -> list[str]:
        return sorted(j["metadata"]["name"] for j in self.emu.list_objects("batch/v1", "Job", NS))

    def status(self) -> dict[str, Any]:
        return self.emu.get_object("batch/v1", "CronJob", "gc", NS).get("status") or {}

    def events(self, reason: str) -> list[dict[str, Any]]:
        return [e for e in self.emu.list_objects("v1", "Event", NS) if e["reason"] == reason]


def test_a_job_from_the_template_at_each_start_time() -> None:
    w = World()
    w.controller.sync()
    assert w.jobs() == []  # nothing is due yet
    start = w.to_next_start()
    name = job_name("gc", start)
    assert name == f"gc-{int(start.timestamp()) // 60}" and w.jobs() == [name]
    job = w.emu.get_object("batch/v1", "Job", name, NS)
    assert job["metadata"]["labels"] == {"app": "gc"}
    assert job["metadata"]["annotations"] == {"note": "n", SCHEDULED_TIMESTAMP: start.strftime("%Y-%m-%dT%H:%M:%SZ")}
    (ref,) = job["metadata"]["ownerReferences"]
    assert (ref["kind"], ref["name"], ref["uid"], ref["controller"]) == ("CronJob", "gc", w.cj["metadata"]["uid"], True)
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == "img"
    status = w.status()
    assert [a["name"] for a in status["active"]] == [name]
    assert status["lastScheduleTime"] == start.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert [e["message"] for e in w.events("SuccessfulCreate")] == [f"Created job {name}"]
    w.controller.sync()
    assert w.jobs() == [name], "a start time is started once"
    complete_job(w.emu, name, NS)
    w.controller.sync()  # the finished Job leaves status.active
    assert "active" not in w.status() and "lastSuccessfulTime" not in w.status()
    w.controller.sync()  # that status write brings the CronJob back: the succeeded Job's completion time
    assert w.status()["lastSuccessfulTime"] == w.emu.get_object("batch/v1", "Job", name, NS)["status"]["completionTime"]
    assert w.events("SawCompletedJob")[0]["message"] == f"Saw completed job: {name}, status: Complete"


def test_forbid_skips_while_one_runs_then_starts_the_missed_time() -> None:
    w = World(concurrencyPolicy="Forbid")
    first = w.to_next_start()
    second = w.to_next_start()
    assert w.jobs() == [job_name("gc", first)]
    (skip,) = w.events("JobAlreadyActive")
    assert skip["message"] == "Not starting job because prior execution is running and concurrency policy is Forbid"
    for _ in range(3):
        w.controller.sync()
    assert w.events("JobAlreadyActive")[0].get("count", 1) == 1, "looked at again only when something changes"
    complete_job(w.emu, job_name("gc", first), NS)
    w.controller.sync()  # the missed time is still within startingDeadlineSeconds (none): it starts now
    assert w.jobs() == sorted([job_name("gc", first), job_name("gc", second)])


def test_allow_runs_concurrently_and_replace_deletes_the_running_one() -> None:
    w = World()
    a, b = w.to_next_start(), w.to_next_start()
    assert w.jobs() == sorted([job_name("gc", a), job_name("gc", b)]) and len(w.status()["active"]) == 2
    r = World(concurrencyPolicy="Replace")
    a = r.to_next_start()
    b = r.to_next_start()
    assert r.jobs() == [job_name("gc", b)] and [x["name"] for x in r.status()["active"]] == [job_name("gc", b)]
    assert r.events("SuccessfulDelete")[0]["message"] == f"Deleted job {job_name('gc', a)}"


def test_suspend_and_a_missed_starting_deadline_start_nothing() -> None:
    w = World(suspend=True)
    w.to_next_start()
    assert w.jobs() == []
    # a start time older than startingDeadlineSeconds is not looked for (mostRecentScheduleTime starts at
    # now - deadline); the next one, seen within the deadline, starts
    late = World(startingDeadlineSeconds=10)
    late.to_next_start(plus=30)
    assert late.jobs() == []
    start = late.to_next_start(plus=5)
    assert late.jobs() == [job_name("gc", start)]


def test_finished_jobs_beyond_the_history_limits_are_deleted() -> None:
    w = World(successfulJobsHistoryLimit=1, failedJobsHistoryLimit=1)
    names = []
    for outcome in ("ok", "ok", "fail", "fail"):
        names.append(job_name("gc", w.to_next_start()))
        (complete_job if outcome == "ok" else fail_job)(w.emu, names[-1], NS)
    w.controller.sync()
    assert w.jobs() == sorted([names[1], names[3]])
    assert {e["message"] for e in w.events("SuccessfulDelete")} == {
        f"Deleted job {names[0]}",
        f"Deleted job {names[2]}",
    }
