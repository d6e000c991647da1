"""Jobs that read or collect an engine cache: ``python -m engine_jobs cache ls|gc`` on the cache claim.

They run the operator image (it carries engine_jobs), unprivileged under the restricted Pod Security
Standard: non-root, no capabilities, RuntimeDefault seccomp, read-only root filesystem. The listing
mounts the claim read-only. They run as the builder image's user (images/engine-builder.Dockerfile
``USER 10001``), which owns every engine file: a collection as another user could not remove them.

The references (which keys any ReDrafterDeployment still needs) reach the pod as a ConfigMap; the
result comes back as the container's termination message (readable with ``get pods`` alone).
"""

from __future__ import annotations

from typing import Any

from engine_jobs.contract import CACHE_MOUNT, TERMINATION_LOG

from . import names

COMPONENT = "engine-cache"
CONTAINER = "cache"
REFERENCES_MOUNT = "/etc/redrafter/cache"
REFERENCES_FILE = "references.json"
#: the builder image's user, owner of the engine files
CACHE_UID = 10001
LIST_DEADLINE_SECONDS = 300
GC_DEADLINE_SECONDS = 3600
FINISHED_JOB_TTL_SECONDS = 3600
RESOURCES = {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}}


LABEL_CLAIM = f"{names.DOMAIN}/cache-claim"
LABEL_VERB = f"{names.DOMAIN}/cache-verb"
#: a build Job whose init container collects unreferenced engines first (the retry after out of disk)
VERB_BEFORE_BUILD = "gc-before-build"
COLLECT_CONTAINER = "collect"


def cache_labels(claim: str, verb: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "redrafter",
        names.LABEL_COMPONENT: COMPONENT,
        "app.kubernetes.io/managed-by": names.MANAGED_BY,
        LABEL_CLAIM: names.label_value(claim),
        LABEL_VERB: verb,
    }


def restricted_pod(container: dict[str, Any], volumes: list[dict[str, Any]]) -> dict[str, Any]:
    """A pod spec that passes the restricted Pod Security Standard."""
    container["securityContext"] = {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }
    return {
        "restartPolicy": "Never",
        "containers": [container],
        "volumes": volumes,
        "automountServiceAccountToken": False,  # it reads files only, never the API
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": CACHE_UID,
            "runAsGroup": CACHE_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }


def cache_job(
    *,
    name: str,
    namespace: str,
    claim: str,
    sub_path: str,
    references_config_map: str,
    image: str,
    args: list[str],
    verb: str,
    read_only: bool,
) -> dict[str, Any]:
    """One pod running ``python -m engine_jobs cache <args>`` on ``<claim>/<sub_path>``, no retries."""
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["python", "-m", "engine_jobs", "cache", *args],
        "resources": RESOURCES,
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [
            {"name": "cache", "mountPath": CACHE_MOUNT, "subPath": sub_path, "readOnly": read_only},
            {"name": "references", "mountPath": REFERENCES_MOUNT, "readOnly": True},
        ],
    }
    volumes = [
        {"name": "cache", "persistentVolumeClaim": {"claimName": claim, "readOnly": read_only}},
        {"name": "references", "configMap": {"name": references_config_map}},
    ]
    labels = cache_labels(claim, verb)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": LIST_DEADLINE_SECONDS if read_only else GC_DEADLINE_SECONDS,
            "ttlSecondsAfterFinished": FINISHED_JOB_TTL_SECONDS,
            "template": {"metadata": {"labels": labels}, "spec": restricted_pod(container, volumes)},
        },
    }


def references_path() -> str:
    return f"{REFERENCES_MOUNT}/{REFERENCES_FILE}"


def list_args() -> list[str]:
    return [
        "ls",
        "--local",
        CACHE_MOUNT,
        "--references",
        references_path(),
        "-o",
        "json",
        "--termination-log",
        TERMINATION_LOG,
    ]


def gc_args(*, keep: int | None, max_age: str | None, dry_run: bool) -> list[str]:
    args = ["gc", "--local", CACHE_MOUNT, "--references", references_path(), "--termination-log", TERMINATION_LOG]
    if keep is not None:
        args += ["--keep", str(keep)]
    if max_age:
        args += ["--max-age", max_age]
    if dry_run:
        args.append("--dry-run")
    return args


def references_config_map(
    *, name: str, namespace: str, claim: str, document: str, owners: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": cache_labels(claim, "references")}
    if owners:
        meta["ownerReferences"] = owners
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {REFERENCES_FILE: document}}


#: the API server refuses a new CronJob whose name is longer: its Jobs are named ``<name>-<minutes>``
CRONJOB_NAME_MAX = 52


def collection_name(claim: str) -> str:
    """One CronJob and one references ConfigMap per claim (and namespace): a pure function of the claim."""
    return names.safe_name("engine-cache-gc", claim, limit=CRONJOB_NAME_MAX)


def collection_cronjob(
    *,
    namespace: str,
    claim: str,
    sub_path: str,
    image: str,
    schedule: str,
    keep: int | None,
    max_age: str | None,
    owners: list[dict[str, Any]],
) -> dict[str, Any]:
    """The scheduled collection: a CronJob whose Jobs run ``cache gc`` with the claim's references.

    ``owners``: owner references to every ReDrafterDeployment using the claim (none of them the controller),
    so the CronJob goes with the last of them. concurrencyPolicy Forbid: two collections of one claim
    never run at once.
    """
    name = collection_name(claim)
    job = cache_job(
        name=name,
        namespace=namespace,
        claim=claim,
        sub_path=sub_path,
        references_config_map=name,
        image=image,
        args=gc_args(keep=keep, max_age=max_age, dry_run=False),
        verb="gc",
        read_only=False,
    )
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": cache_labels(claim, "gc"),
            "ownerReferences": owners,
        },
        "spec": {
            "schedule": schedule,
            "concurrencyPolicy": "Forbid",
            "startingDeadlineSeconds": 3600,
            "successfulJobsHistoryLimit": 1,
            "failedJobsHistoryLimit": 1,
            "jobTemplate": {"metadata": {"labels": cache_labels(claim, "gc")}, "spec": job["spec"]},
        },
    }


def collect_before_build(job: dict[str, Any], *, claim: str, keep: int | None, max_age: str | None) -> dict[str, Any]:
    """``job`` (a build Job) with an init container that first collects the claim's unreferenced engines.

    The retry of a build that ran out of disk: Kubernetes runs init containers to completion before the
    build container, so the collection is over before the build looks at the free space. It runs the
    build's own image (engine_jobs, the engine files' user) with the claim's references ConfigMap.
    """
    pod = job["spec"]["template"]["spec"]
    build = pod["containers"][0]
    cache_mount = next(m for m in build["volumeMounts"] if m["name"] == "cache")
    pod["volumes"] = [*pod["volumes"], {"name": "references", "configMap": {"name": collection_name(claim)}}]
    pod["initContainers"] = [
        {
            "name": COLLECT_CONTAINER,
            "image": build["image"],
            "imagePullPolicy": build.get("imagePullPolicy", "IfNotPresent"),
            "command": ["python", "-m", "engine_jobs", "cache", *gc_args(keep=keep, max_age=max_age, dry_run=False)],
            "resources": RESOURCES,
            "terminationMessagePath": TERMINATION_LOG,
            "terminationMessagePolicy": "FallbackToLogsOnError",
            "volumeMounts": [
                dict(cache_mount),
                {"name": "references", "mountPath": REFERENCES_MOUNT, "readOnly": True},
            ],
            "securityContext": {
                "allowPrivilegeEscalation": False,
                "readOnlyRootFilesystem": True,
                "capabilities": {"drop": ["ALL"]},
            },
        }
    ]
    for labels in (job["metadata"]["labels"], job["spec"]["template"]["metadata"]["labels"]):
        labels.update({LABEL_CLAIM: names.label_value(claim), LABEL_VERB: VERB_BEFORE_BUILD})
    return job
