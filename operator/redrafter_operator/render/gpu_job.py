"""The pod every engine_jobs Job runs in (engine build, checkpoint prepare, drafter training), rendered once.

The Jobs differ in their command, spec file, resources and placement (:class:`GpuJob`); the pod around them
is the same: the cache claim at its sub path, the spec ConfigMap, shared memory, a writable /tmp, the
sources read-only, no API token, and a pod failure policy that fails at once on an exit code no retry fixes.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from typing import Any

from engine_jobs import contract
from engine_jobs.errors import NON_RETRYABLE

from ..api.spec import ReDrafterDeploymentSpec
from . import resources, security
from .common import Owner, metadata

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
FINISHED_JOB_TTL_SECONDS = 86400  # keep failed Jobs a day for `kubectl logs`; status keeps the reason
#: what every engine_jobs container gets: no Hub telemetry, the Hub's cache in the claim, its own pod name
BASE_ENV: tuple[dict[str, Any], ...] = (
    {"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"},
    {"name": "HF_HOME", "value": posixpath.join(contract.CACHE_MOUNT, ".hf-home")},
    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
)


def gpu_resources(
    spec: ReDrafterDeploymentSpec, user: dict[str, Any], per_rank: dict[str, int], ranks: int | None = None
) -> dict[str, Any]:
    """Default CPU/memory requests per rank (:mod:`.resources`) under the user's, plus one GPU per rank
    (``tensor`` unless given) as both request and limit (extended resources need them equal)."""
    ranks = ranks or spec.parallelism.tensor
    gpus = str(ranks)
    gpu = spec.engine.build.gpu_resource
    cpu_memory = resources.merged(resources.per_rank(per_rank, ranks), user)
    return {
        "requests": {**cpu_memory.get("requests", {}), gpu: gpus},
        "limits": {**cpu_memory.get("limits", {}), gpu: gpus},
    }


def node_selector(
    spec: ReDrafterDeploymentSpec, user: dict[str, str], gpu_product: str | None = None
) -> dict[str, str]:
    out = dict(user)
    if product := gpu_product or spec.engine.build.gpu_product:
        out[GPU_PRODUCT_LABEL] = product
    return out


def pod_failure_policy(container: str) -> dict[str, Any]:
    """batch/v1 podFailurePolicy: an exit code no retry can fix (engine_jobs NON_RETRYABLE) fails the Job
    at once (FailJob: no further pod, Job condition reason PodFailurePolicy). Needs restartPolicy Never."""
    codes = sorted(int(c) for c in NON_RETRYABLE)  # the API requires the values ordered
    return {
        "rules": [{"action": "FailJob", "onExitCodes": {"containerName": container, "operator": "In", "values": codes}}]
    }


@dataclass(frozen=True)
class GpuJob:
    """What one engine_jobs Job brings to the shared pod."""

    name: str
    labels: dict[str, str]
    annotations: dict[str, str]
    container: str
    image: str
    #: ``python -m engine_jobs <subcommand> --spec <spec_file>``
    subcommand: str
    spec_file: str
    #: the ConfigMap carrying the spec file, and the name of its volume
    config_map: str
    config_volume: str
    resources: dict[str, Any]
    node_selector: dict[str, str]
    active_deadline_seconds: int | None
    #: the pvc:// sources' and credentials Secrets' read-only volumes and their mounts (build.source_volumes)
    source_volumes: list[dict[str, Any]] = field(default_factory=list)
    source_mounts: list[dict[str, Any]] = field(default_factory=list)
    extra_env: tuple[dict[str, Any], ...] = ()
    ports: tuple[dict[str, Any], ...] = ()


def job_command(subcommand: str, spec_file: str) -> list[str]:
    """engine_jobs reads its spec from the mounted ConfigMap."""
    return ["python", "-m", "engine_jobs", subcommand, "--spec", posixpath.join(contract.CONFIG_MOUNT, spec_file)]


def gpu_job(owner: Owner, job: GpuJob) -> dict[str, Any]:
    """The batch/v1 Job of ``job``, with the pod every engine_jobs Job shares."""
    spec = owner.spec
    build = spec.engine.build
    tmp_volume, tmp_mount = security.tmp_volume()
    container: dict[str, Any] = {
        "name": job.container,
        "image": job.image,
        "imagePullPolicy": "IfNotPresent",
        "command": job_command(job.subcommand, job.spec_file),
        "env": [*BASE_ENV, *job.extra_env],
    }
    if job.ports:
        container["ports"] = list(job.ports)
    container |= {
        "resources": job.resources,
        "volumeMounts": [
            {"name": "cache", "mountPath": contract.CACHE_MOUNT, "subPath": spec.engine.cache.sub_path},
            {"name": job.config_volume, "mountPath": contract.CONFIG_MOUNT, "readOnly": True},
            {"name": "dshm", "mountPath": "/dev/shm"},
            tmp_mount,
            *job.source_mounts,
        ],
        "terminationMessagePath": contract.TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": security.container_security_context(security.IMAGE_USER),
    }
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [container],
        "volumes": [
            {"name": "cache", "persistentVolumeClaim": {"claimName": spec.engine.cache.claim_name}},
            {"name": job.config_volume, "configMap": {"name": job.config_map}},
            {"name": "dshm", "emptyDir": {"medium": "Memory"}},
            tmp_volume,
            *job.source_volumes,
        ],
        "securityContext": security.pod_security_context(security.IMAGE_USER),
        "automountServiceAccountToken": False,  # the Jobs read files and the Hub/S3, never the API
        "enableServiceLinks": False,
    }
    if job.node_selector:
        pod_spec["nodeSelector"] = dict(job.node_selector)
    if build.tolerations:
        pod_spec["tolerations"] = list(build.tolerations)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata(owner, job.name, job.labels, job.annotations),
        "spec": {
            "backoffLimit": build.backoff_limit,  # still applies to every other exit code
            "podFailurePolicy": pod_failure_policy(job.container),
            "activeDeadlineSeconds": job.active_deadline_seconds,
            "ttlSecondsAfterFinished": FINISHED_JOB_TTL_SECONDS,
            "template": {"metadata": {"labels": job.labels}, "spec": pod_spec},
        },
    }
