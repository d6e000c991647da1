"""Engine cache retention in the running operator, on the real control plane: the references ConfigMap and
collection CronJob per claim, and a finished collection's report as Events and metrics.

The real CronJob controller runs on the real clock, so the tests give the CronJob a schedule that does not come
due while they run and start a collection as a user would, ``kubectl create job --from=cronjob/<name>``: a Job from
the jobTemplate, controlled by the CronJob. The nodes run no process (:mod:`harness.lifecycle`): the test completes
each Job with the termination message ``engine_jobs cache gc`` writes (the collection itself runs for real in
tests/integration/test_engine_cache_gc.py and, on a simulated node, tests/integration/test_cache_cli.py).
A schedule the API server would refuse never reaches a CronJob: the operator reports it on the resource, in the
API server's own words.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from engine_jobs.cache_gc import Report
from harness.cluster import Kube
from harness.lifecycle import Cluster, LifecycleOperator, example, quiesce, running_operator, to_serving
from harness.waiting import until
from redrafter_operator.api.cron import schedule_errors
from redrafter_operator.controller.retention import ANNOTATION_REPORTED, RetentionMonitor
from redrafter_operator.render import cache_jobs, names

pytestmark = pytest.mark.timeout(120)

CLAIM = "engine-cache"
MANUAL = "cronjob.kubernetes.io/instantiate"  # kubectl create job --from=cronjob/... marks its Job so


@pytest.fixture
async def operator(cluster: Cluster) -> AsyncIterator[LifecycleOperator]:
    async with running_operator(cluster, resync=1.0) as op:
        assert op.controller is not None
        retention = next(m for m in op.controller.monitors if isinstance(m, RetentionMonitor))
        retention.interval_seconds = 0.5  # the production interval is a minute
        yield op


def not_due() -> str:
    """A daily schedule twelve hours away: the real CronJob controller starts nothing of its own during the test."""
    now = datetime.datetime.now(datetime.UTC)
    return f"{now.minute} {(now.hour + 12) % 24} * * *"


def retention_runs(op: LifecycleOperator) -> float:
    assert op.controller is not None
    return op.controller.metrics.monitor_runs.labels("RetentionMonitor")._value.get()


def metrics(op: LifecycleOperator) -> str:
    assert op.controller is not None
    return op.controller.metrics.render().decode()


def cronjob(cluster: Cluster, claim: str = CLAIM) -> dict[str, Any] | None:
    return cluster.find("batch/v1", "CronJob", cache_jobs.collection_name(claim))


def collection_jobs(cluster: Cluster, cj: dict[str, Any]) -> list[str]:
    """The Jobs ``cj`` controls (controller owner reference), by name."""
    return sorted(
        j["metadata"]["name"]
        for j in cluster.list("batch/v1", "Job")
        if any(
            r.get("uid") == cj["metadata"]["uid"] and r.get("controller")
            for r in j["metadata"].get("ownerReferences") or []
        )
    )


def start_collection(cluster: Cluster, cj: dict[str, Any], job: str) -> dict[str, Any]:
    """Start the CronJob's Job now, as a user would; the Job created."""
    cluster.kubectl("create", "job", job, f"--from=cronjob/{cj['metadata']['name']}", check=True)
    return cluster.get("batch/v1", "Job", job)


def references(cluster: Cluster, claim: str = CLAIM) -> list[dict[str, str]]:
    cm = cluster.find("v1", "ConfigMap", cache_jobs.collection_name(claim))
    return json.loads(cm["data"][cache_jobs.REFERENCES_FILE])["references"] if cm else []


def collected(cluster: Cluster) -> list[str]:
    return [m for r, _, m in cluster.events() if r == "EngineCacheCollected"]


def patch_spec(cluster: Cluster, spec: dict[str, Any]) -> None:
    cluster.kubectl("patch", "rdd", "llama3-8b", "--type=merge", "-p", json.dumps({"spec": spec}), check=True)


async def test_retention_cronjob_references_and_reported_collection(cluster: Cluster, operator: LifecycleOperator):
    schedule = not_due()
    doc = example(engine__cache={"retention": {"keep": 0, "schedule": schedule}})
    cluster.apply(doc)
    await to_serving(cluster)
    cj = await until(lambda: cronjob(cluster), what="the collection CronJob")
    assert cj["spec"]["schedule"] == schedule and cj["spec"]["concurrencyPolicy"] == "Forbid"
    assert cj["spec"]["successfulJobsHistoryLimit"] == 1 and cj["spec"]["startingDeadlineSeconds"] == 3600
    assert [o["name"] for o in cj["metadata"]["ownerReferences"]] == [doc["metadata"]["name"]]
    pod = cj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    args = pod["containers"][0]["command"]
    assert args[:5] == ["python", "-m", "engine_jobs", "cache", "gc"] and args[args.index("--keep") + 1] == "0"
    assert "--max-age" not in args and pod["securityContext"]["runAsNonRoot"] is True
    engines = cluster.status()["engines"]
    old = {v: engines[v]["key"] for v in ("redrafter", "base")}
    await until(lambda: {r["key"] for r in references(cluster)} >= set(old.values()), what="references")
    roles = {(r["key"], r["role"]) for r in references(cluster)}
    assert (old["redrafter"], "spec.redrafter") in roles and (old["redrafter"], "status.engines.redrafter") in roles

    # a build-input change: new keys are referenced at once (spec), the old stay referenced while they serve
    patch_spec(cluster, {"engine": {"maxBatchSize": 4}})
    await until(lambda: cluster.status()["engines"]["redrafter"]["key"] != old["redrafter"], what="new keys")
    new = {v: cluster.status()["engines"][v]["key"] for v in ("redrafter", "base")}
    await until(lambda: {r["key"] for r in references(cluster)} >= set(new.values()), what="new references")
    await until(lambda: len(cluster.running_jobs()) == 2, what="the new builds")
    cluster.complete_all()
    await until(
        lambda: cluster.deployment("redrafter")["metadata"]["labels"][names.LABEL_ENGINE_KEY] == new["redrafter"],
        what="the new engine serving",
    )
    await until(
        lambda: old["redrafter"] not in {r["key"] for r in references(cluster)},
        what="the old ReDrafter engine to be unreferenced",
    )

    # the API server took the schedule and the real CronJob controller starts nothing before it comes due; a
    # collection started now is a Job from the template, under the CronJob
    assert collection_jobs(cluster, cj) == [], "nothing before the first start time"
    job = start_collection(cluster, cj, "collect-1")
    assert collection_jobs(cluster, cj) == ["collect-1"]
    assert job["metadata"]["labels"] == cj["spec"]["jobTemplate"]["metadata"]["labels"]
    assert job["metadata"]["annotations"][MANUAL] == "manual"
    assert job["spec"]["template"]["spec"]["containers"][0]["command"] == args

    # the collection's report (its termination message) becomes an Event and metrics, once
    report = Report(
        dry_run=False,
        removed=[{"key": old["redrafter"], "variant": "redrafter", "model": "m", "bytes": 5_000_000_000}],
        kept=3,
        cache_bytes=40_000_000_000,
    )
    cluster.complete_job("collect-1", report.termination_message())
    await until(lambda: collected(cluster), what="the Event")
    (message,) = collected(cluster)
    assert f"removed 1 engine(s), freed 4.7 GiB: {old['redrafter']}" in message and "3 kept" in message
    await until(
        lambda: (cluster.get("batch/v1", "Job", "collect-1")["metadata"].get("annotations") or {}).get(
            ANNOTATION_REPORTED
        ),
        what="the Job marked reported",
    )
    assert f'redrafter_engine_cache_bytes{{claim="{CLAIM}"}} 4e+10' in metrics(operator)
    assert "redrafter_engine_cache_reclaimed_bytes_total 5e+09" in metrics(operator)
    runs = retention_runs(operator)
    await until(lambda: retention_runs(operator) >= runs + 2, what="two more runs of the retention monitor")
    await quiesce(cluster, operator, doc["metadata"]["name"])
    assert len(collected(cluster)) == 1  # reported once only

    # a second collection: when it succeeds too, successfulJobsHistoryLimit 1 has the CronJob controller keep
    # only it
    start_collection(cluster, cj, "collect-2")
    cluster.complete_job(
        "collect-2", Report(dry_run=False, removed=[], kept=3, cache_bytes=35_000_000_000).termination_message()
    )
    await until(
        lambda: collection_jobs(cluster, cj) == ["collect-2"], what="the older Job beyond the history limit deleted"
    )
    await until(lambda: len(collected(cluster)) == 2, what="its Event")
    await until(
        lambda: f'redrafter_engine_cache_bytes{{claim="{CLAIM}"}} 3.5e+10' in metrics(operator),
        what="the cache size updated",
    )

    # the retention removed: no more scheduled collections
    patch_spec(cluster, {"engine": {"cache": {"retention": None}}})
    await until(lambda: cronjob(cluster) is None, what="the CronJob deleted")


async def test_no_retention_no_cronjob(cluster: Cluster, operator: LifecycleOperator):
    cluster.apply(example())
    await to_serving(cluster)
    runs = retention_runs(operator)
    await until(lambda: retention_runs(operator) >= runs + 2, what="two more runs of the retention monitor")
    await quiesce(cluster, operator)
    assert cluster.find("v1", "ConfigMap", cache_jobs.collection_name(CLAIM)) is None
    assert cronjob(cluster) is None


async def test_out_of_disk_collects_then_retries_once(cluster: Cluster, operator: LifecycleOperator):
    cluster.apply(example(engine__build__retries=0, engine__cache={"retention": {"keep": 0}}))
    await until(lambda: len(cluster.running_jobs()) == 2, what="build Jobs")
    first = next(j for j in cluster.running_jobs() if "redrafter" in j)
    cluster.fail_job(
        first, 4, "OUT_OF_DISK: not enough free space on the cache volume: about 16.0 GiB needed, 1.0 GiB free"
    )
    retry = await until(
        lambda: next(
            (j for j in cluster.jobs() if j["metadata"]["name"] != first and "redrafter" in j["metadata"]["name"]), None
        ),
        what="the retry",
    )
    (collect,) = retry["spec"]["template"]["spec"]["initContainers"]
    assert collect["command"][4:6] == ["gc", "--local"] and "--keep" in collect["command"]
    engine = await until(
        lambda: (
            (e := cluster.status()["engines"]["redrafter"]).get("job") == retry["metadata"]["name"]
            and "collects" in e.get("message", "")
            and e
        ),
        what="status naming the collecting retry",
    )
    assert engine["state"] == "Building" and "OUT_OF_DISK" in engine["message"]
    assert "collects unreferenced engines in cache claim engine-cache, then builds once more" in engine["message"]
    # the references the collection reads exist for the claim
    await until(
        lambda: cluster.find("v1", "ConfigMap", cache_jobs.collection_name(CLAIM)), what="the references ConfigMap"
    )
    # the pod ran the init container (the collection), then the build
    report = Report(
        dry_run=False,
        removed=[{"key": "0123", "variant": "base", "model": "m", "bytes": 2**34}],
        kept=2,
        cache_bytes=2**35,
    )
    cluster.complete_job(retry["metadata"]["name"], "OK: engine built", init_message=report.termination_message())
    await until(lambda: cluster.status()["engines"]["redrafter"]["state"] == "Ready", what="the retry built it")
    await until(lambda: collected(cluster), what="the Event")
    (message,) = collected(cluster)
    assert "removed 1 engine(s), freed 16.0 GiB" in message
    assert len([j for j in cluster.jobs() if "redrafter" in j["metadata"]["name"]]) == 2, "one retry only"


@pytest.mark.parametrize(
    ("schedule", "why"),
    [
        ("99 * * * *", "end of range (99) above maximum (59): 99"),
        ("0 3 * * 7", "end of range (7) above maximum (6): 7"),  # croniter would take 7 for Sunday
    ],
)
async def test_a_schedule_kubernetes_refuses_is_reported_on_the_resource(
    cluster: Cluster, operator: LifecycleOperator, schedule: str, why: str
):
    # the CRD's pattern takes five fields; the operator checks them as the API server would check the CronJob
    cluster.apply(example(engine__cache={"retention": {"keep": 1, "schedule": schedule}}))
    await until(lambda: cluster.status().get("phase") == "Failed", what="Failed")
    cond = cluster.condition("SpecValid")
    assert (cond["status"], cond["reason"]) == ("False", "InvalidSpec")
    assert cond["message"] == f'spec.engine.cache.retention.schedule: Invalid value: "{schedule}": {why}'
    await until(lambda: ("InvalidSpec", "Warning", cond["message"]) in cluster.events(), what="the InvalidSpec Event")
    assert cronjob(cluster) is None and cluster.jobs() == []


SCHEDULES = (
    "@fortnightly",
    "TZ=UTC 0 3 * * *",
    "CRON_TZ=Europe/Paris 0 3 * * *",
    "0 3 * * * *",
    "99 * * * *",
    "0 3 * * 7",
    "0 3 * * SUN",
    "*/5 * * * *",
    "@daily",
    "@every 1h30m",
    "@every 90",
)


def causes(stderr: str) -> list[str]:
    """The causes of an Invalid status as kubectl prints them: inline after ``is invalid:``, or one per ``*`` line."""
    text = stderr.split(" is invalid: ", 1)[-1]
    lines = (line.strip().removeprefix("* ") for line in text.splitlines())
    return [line for line in lines if line.startswith("spec.")]


def test_the_api_server_judges_a_cronjob_schedule_as_the_operator_does(kube: Kube):
    """The operator refuses a retention schedule the API server would refuse in its CronJob, in the same words:
    each schedule applied (server-side dry run) as a CronJob, and checked by the operator's api/cron.py."""
    template = {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox:1.36"}]}}
    for schedule in SCHEDULES:
        doc = {
            "apiVersion": "batch/v1",
            "kind": "CronJob",
            "metadata": {"name": "bad"},
            "spec": {"schedule": schedule, "jobTemplate": {"spec": {"template": template}}},
        }
        result = kube.apply(doc, dry_run=True, check=False)
        expected = [f"spec.schedule: {e}" for e in schedule_errors(schedule)]
        assert (result.returncode != 0) == bool(expected), (schedule, result.stderr)
        assert causes(result.stderr) == expected, (schedule, result.stderr)
    assert kube.get("/apis/batch/v1/namespaces/{ns}/cronjobs/bad") is None
