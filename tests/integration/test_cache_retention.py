"""Engine cache retention in the running operator, against the emulated API server: the references
ConfigMap and collection CronJob per claim, and a finished collection's report as Events and metrics.

The emulated cluster's CronJob controller (redrafter_sim.cronjobs) starts the collection Jobs: the test
moves its clock past the schedule's next start time and finds the Job it created from the jobTemplate.
No simulated node runs these Jobs here (the Deployments' stand-in runs in-process): the test completes
each with the termination message ``engine_jobs cache gc`` writes (the collection itself runs for real
in tests/integration/test_engine_cache_gc.py and, through a simulated node, tests/integration/test_cache_cli.py).
A schedule the API server would refuse never reaches a CronJob: the operator reports it on the resource.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import pytest
from test_lifecycle import NS, Cluster, Operator, apply, cluster, example, quiesce, to_serving, until  # noqa: F401

from engine_jobs.cache_gc import Report
from redrafter_operator.api.cron import parse_standard
from redrafter_operator.controller.retention import ANNOTATION_REPORTED, RetentionMonitor
from redrafter_operator.render import cache_jobs, names
from redrafter_sim import controllers
from redrafter_sim.cronjobs import SCHEDULED_TIMESTAMP, job_name

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def operator(cluster: Cluster, kubeconfig: Path):  # noqa: F811
    op = Operator(kubeconfig, resync=1.0)
    await op.start()
    assert op.controller is not None
    retention = next(m for m in op.controller.monitors if isinstance(m, RetentionMonitor))
    retention.interval_seconds = 0.5  # the production interval is a minute
    try:
        yield op
    finally:
        await op.stop()


def retention_runs(op: Operator) -> float:
    assert op.controller is not None
    return op.controller.metrics.monitor_runs.labels("RetentionMonitor")._value.get()


def cronjob(cluster: Cluster, claim: str) -> dict[str, Any] | None:
    return cluster.emu.find_object("batch/v1", "CronJob", cache_jobs.collection_name(claim), NS)


def collection_jobs(cluster: Cluster, cj: dict[str, Any]) -> list[str]:
    """The Jobs the CronJob controller created for ``cj`` (controller owner reference), by name."""
    return sorted(
        j["metadata"]["name"]
        for j in cluster.emu.list_objects("batch/v1", "Job", NS)
        if any(
            r.get("uid") == cj["metadata"]["uid"] and r.get("controller")
            for r in j["metadata"].get("ownerReferences") or []
        )
    )


def to_next_start(cluster: Cluster, cj: dict[str, Any]) -> Any:
    """Move the CronJob controller's clock a little past the schedule's next start time; that time."""
    start = parse_standard(cj["spec"]["schedule"]).next(cluster.clock())
    cluster.clock.set(start + datetime.timedelta(seconds=3))
    return start


def cronjob_events(cluster: Cluster, reason: str) -> list[dict[str, Any]]:
    return [
        e
        for e in cluster.emu.list_objects("v1", "Event", NS)
        if e["reason"] == reason and e["involvedObject"].get("kind") == "CronJob"
    ]


def references(cluster: Cluster, claim: str) -> list[dict[str, str]]:
    cm = cluster.emu.find_object("v1", "ConfigMap", cache_jobs.collection_name(claim), NS)
    return json.loads(cm["data"][cache_jobs.REFERENCES_FILE])["references"] if cm else []


async def test_retention_cronjob_references_and_reported_collection(cluster: Cluster, operator: Operator, kubectl: Any):
    doc = example(engine__cache={"retention": {"keep": 0, "schedule": "*/5 * * * *"}})
    apply(kubectl, doc)
    await to_serving(cluster)
    claim = "engine-cache"
    cj = await until(lambda: cronjob(cluster, claim), what="the collection CronJob")
    assert cj["spec"]["schedule"] == "*/5 * * * *" and cj["spec"]["concurrencyPolicy"] == "Forbid"
    assert [o["name"] for o in cj["metadata"]["ownerReferences"]] == [doc["metadata"]["name"]]
    pod = cj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    args = pod["containers"][0]["command"]
    assert args[:5] == ["python", "-m", "engine_jobs", "cache", "gc"] and args[args.index("--keep") + 1] == "0"
    assert "--max-age" not in args and pod["securityContext"]["runAsNonRoot"] is True
    engines = cluster.status()["engines"]
    old = {v: engines[v]["key"] for v in ("redrafter", "base")}
    await until(lambda: {r["key"] for r in references(cluster, claim)} >= set(old.values()), what="references")
    roles = {(r["key"], r["role"]) for r in references(cluster, claim)}
    assert (old["redrafter"], "spec.redrafter") in roles and (old["redrafter"], "status.engines.redrafter") in roles

    # a build-input change: new keys are referenced at once (spec), the old stay referenced while they serve
    kubectl(
        "patch",
        "rdd",
        doc["metadata"]["name"],
        "-n",
        NS,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"engine": {"maxBatchSize": 4}}}),
        check=True,
    )
    await until(lambda: cluster.status()["engines"]["redrafter"]["key"] != old["redrafter"], what="new keys")
    new = {v: cluster.status()["engines"][v]["key"] for v in ("redrafter", "base")}
    await until(lambda: {r["key"] for r in references(cluster, claim)} >= set(new.values()), what="new references")
    cluster.complete_all()
    await until(
        lambda: cluster.deployment("redrafter")["metadata"]["labels"][names.LABEL_ENGINE_KEY] == new["redrafter"],
        what="the new engine serving",
    )
    await until(
        lambda: old["redrafter"] not in {r["key"] for r in references(cluster, claim)},
        what="the old ReDrafter engine to be unreferenced",
    )

    # the CronJob controller starts the collection at the schedule's next start time: a Job from the template
    assert collection_jobs(cluster, cj) == [], "nothing before the first start time"
    first = to_next_start(cluster, cj)
    name = job_name(cj["metadata"]["name"], first)
    await until(lambda: collection_jobs(cluster, cj) == [name], what="the CronJob controller's Job")
    job = cluster.emu.get_object("batch/v1", "Job", name, NS)
    assert job["metadata"]["labels"] == cj["spec"]["jobTemplate"]["metadata"]["labels"]
    assert job["metadata"]["annotations"][SCHEDULED_TIMESTAMP] == first.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert job["spec"]["template"]["spec"]["containers"][0]["command"] == args
    status = cluster.emu.get_object("batch/v1", "CronJob", cj["metadata"]["name"], NS)["status"]
    assert [a["name"] for a in status["active"]] == [name]

    # Forbid: while it runs, the next start time starts nothing
    second = to_next_start(cluster, cj)
    await until(lambda: cronjob_events(cluster, "JobAlreadyActive"), what="the Forbid skip")
    assert collection_jobs(cluster, cj) == [name]

    # the collection's report (its termination message) becomes an Event and metrics, once
    report = Report(
        dry_run=False,
        removed=[{"key": old["redrafter"], "variant": "redrafter", "model": "m", "bytes": 5_000_000_000}],
        kept=3,
        cache_bytes=40_000_000_000,
    )
    controllers.complete_job(cluster.emu, name, NS, message=report.termination_message())
    await until(lambda: any(r == "EngineCacheCollected" for r, _, _ in cluster.events()), what="the Event")
    (message,) = [m for r, _, m in cluster.events() if r == "EngineCacheCollected"]
    assert f"removed 1 engine(s), freed 4.7 GiB: {old['redrafter']}" in message and "3 kept" in message
    await until(
        lambda: (cluster.emu.get_object("batch/v1", "Job", name, NS)["metadata"].get("annotations") or {}).get(
            ANNOTATION_REPORTED
        ),
        what="the Job marked reported",
    )
    metrics = operator.controller.metrics.render().decode()
    assert f'redrafter_engine_cache_bytes{{claim="{claim}"}} 4e+10' in metrics
    assert "redrafter_engine_cache_reclaimed_bytes_total 5e+09" in metrics
    runs = retention_runs(operator)
    await until(lambda: retention_runs(operator) >= runs + 2, what="two more runs of the retention monitor")
    await quiesce(cluster, operator, doc["metadata"]["name"])
    assert [r for r, _, _ in cluster.events()].count("EngineCacheCollected") == 1  # reported once only

    # the start time skipped under Forbid is within startingDeadlineSeconds: it starts once the first ended;
    # when that one succeeds too, successfulJobsHistoryLimit 1 keeps only it
    later = job_name(cj["metadata"]["name"], second)
    await until(lambda: later in collection_jobs(cluster, cj), what="the skipped start time's Job")
    controllers.complete_job(
        cluster.emu,
        later,
        NS,
        message=Report(dry_run=False, removed=[], kept=3, cache_bytes=35_000_000_000).termination_message(),
    )
    await until(lambda: collection_jobs(cluster, cj) == [later], what="the older Job beyond the history limit deleted")
    await until(lambda: [r for r, _, _ in cluster.events()].count("EngineCacheCollected") == 2, what="its Event")
    await until(
        lambda: (
            f'redrafter_engine_cache_bytes{{claim="{claim}"}} 3.5e+10' in operator.controller.metrics.render().decode()
        ),
        what="the cache size updated",
    )

    # the retention removed: no more scheduled collections
    kubectl(
        "patch",
        "rdd",
        doc["metadata"]["name"],
        "-n",
        NS,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"engine": {"cache": {"retention": None}}}}),
        check=True,
    )
    await until(lambda: cronjob(cluster, claim) is None, what="the CronJob deleted")


async def test_no_retention_no_cronjob(cluster: Cluster, operator: Operator, kubectl: Any):
    apply(kubectl, example())
    await to_serving(cluster)
    await until(
        lambda: cluster.emu.find_object("v1", "ConfigMap", cache_jobs.collection_name("engine-cache"), NS) is None,
        what="nothing",
    )
    runs = retention_runs(operator)
    await until(lambda: retention_runs(operator) >= runs + 2, what="two more runs of the retention monitor")
    await quiesce(cluster, operator)
    assert cronjob(cluster, "engine-cache") is None


async def test_out_of_disk_collects_then_retries_once(cluster: Cluster, operator: Operator, kubectl: Any):
    doc = example(engine__build__retries=0, engine__cache={"retention": {"keep": 0}})
    apply(kubectl, doc)
    await until(lambda: len(cluster.running_jobs()) == 2, what="build Jobs")
    first = next(j for j in cluster.running_jobs() if "redrafter" in j)
    controllers.fail_job(
        cluster.emu,
        first,
        NS,
        exit_code=4,
        termination_message=(
            "OUT_OF_DISK: not enough free space on the cache volume: about 16.0 GiB needed, 1.0 GiB free"
        ),
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
        lambda: cluster.emu.find_object("v1", "ConfigMap", cache_jobs.collection_name("engine-cache"), NS),
        what="the references ConfigMap",
    )
    # the node ran the init container (the collection), then the build
    name = retry["metadata"]["name"]
    report = Report(
        dry_run=False,
        removed=[{"key": "0123", "variant": "base", "model": "m", "bytes": 2**34}],
        kept=2,
        cache_bytes=2**35,
    )
    controllers.complete_job(cluster.emu, name, NS, message="OK: engine built")
    (pod,) = cluster.emu.list_objects("v1", "Pod", NS, label_selector=f"job-name={name}")
    cluster.emu.patch_object(
        "v1",
        "Pod",
        pod["metadata"]["name"],
        NS,
        {
            "status": {
                "initContainerStatuses": [
                    {
                        "name": "collect",
                        "ready": False,
                        "restartCount": 0,
                        "image": collect["image"],
                        "imageID": "",
                        "state": {
                            "terminated": {
                                "exitCode": 0,
                                "reason": "Completed",
                                "message": report.termination_message(),
                            }
                        },
                    }
                ]
            }
        },
        subresource="status",
    )
    await until(lambda: cluster.status()["engines"]["redrafter"]["state"] == "Ready", what="the retry built it")
    await until(lambda: any(r == "EngineCacheCollected" for r, _, _ in cluster.events()), what="the Event")
    (message,) = [m for r, _, m in cluster.events() if r == "EngineCacheCollected"]
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
    cluster: Cluster, operator: Operator, kubectl: Any, schedule: str, why: str
):
    # the CRD's pattern takes five fields; the operator checks them as the API server would check the CronJob
    apply(kubectl, example(engine__cache={"retention": {"keep": 1, "schedule": schedule}}))
    await until(lambda: cluster.status().get("phase") == "Failed", what="Failed")
    cond = cluster.condition("SpecValid")
    assert (cond["status"], cond["reason"]) == ("False", "InvalidSpec")
    assert cond["message"] == f'spec.engine.cache.retention.schedule: Invalid value: "{schedule}": {why}'
    await until(lambda: ("InvalidSpec", "Warning", cond["message"]) in cluster.events(), what="the InvalidSpec Event")
    assert cronjob(cluster, "engine-cache") is None and cluster.jobs() == []


async def test_the_emulated_api_server_refuses_an_invalid_cronjob(cluster: Cluster, kubectl: Any):
    base = {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": "bad", "namespace": NS},
        "spec": {
            "jobTemplate": {
                "spec": {
                    "template": {
                        "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox:1.36"}]}
                    }
                }
            }
        },
    }
    for schedule, message in (
        ("@fortnightly", 'spec.schedule: Invalid value: "@fortnightly": unrecognized descriptor: @fortnightly'),
        (
            "TZ=UTC 0 3 * * *",
            'spec.schedule: Invalid value: "TZ=UTC 0 3 * * *": cannot use TZ or CRON_TZ in '
            "schedule, use timeZone field instead",
        ),
        (
            "0 3 * * * *",
            'spec.schedule: Invalid value: "0 3 * * * *": expected exactly 5 fields, found 6: [0 3 * * * *]',
        ),
    ):
        doc = {**base, "spec": {**base["spec"], "schedule": schedule}}
        result = kubectl("apply", "-f", "-", input=json.dumps(doc))
        assert result.returncode != 0
        assert f'The CronJob "bad" is invalid: {message}' in result.stderr, result.stderr
    assert cluster.emu.find_object("batch/v1", "CronJob", "bad", NS) is None
    doc = {**base, "spec": {**base["spec"], "schedule": "@every 1h30m"}}
    kubectl("apply", "-f", "-", input=json.dumps(doc), check=True)
