"""Drafter training Jobs: resource -> the TrainSpec ConfigMap and the GPU Job that trains the ReDrafter head.

The Job runs ``python -m engine_jobs train``: self-distillation from the base model (arXiv 2403.09919),
published content-addressed at ``<cache>/drafters/<key>/`` with the engines' cache semantics (lock with a
heartbeat, atomic publish, manifest last). While it runs, the pod serves its progress on
``TRAINING_PROGRESS_PORT``; the operator reads it into ``status.drafter``.
"""

from __future__ import annotations

import posixpath
from typing import Any

from engine_jobs import contract
from engine_jobs.contract import DrafterRecipe, TrainSpec

from ..api.engine_key import key_of, training_inputs
from ..api.spec import DrafterTraining, ReDrafterDeploymentSpec
from . import names, resources, security
from .build import (
    FINISHED_JOB_TTL_SECONDS,
    drafter_path,
    gpu_resources,
    node_selector,
    pod_failure_policy,
    source_ref,
    source_volumes,
)
from .common import Owner, metadata

COMPONENT = "drafter-training"
STAGE = "drafter"  # the Job's variant label: the stage of the pipeline it produces
TRAIN_CONTAINER = "train"


def _training(spec: ReDrafterDeploymentSpec) -> DrafterTraining:
    train = spec.trained_drafter()
    if train is None:
        raise ValueError("the spec brings a trained drafter (model.drafter.source); nothing to train")
    return train


def train_spec(spec: ReDrafterDeploymentSpec) -> TrainSpec:
    train = _training(spec)
    inputs = training_inputs(spec, train)
    return TrainSpec(
        key=key_of(inputs),
        inputs=inputs,
        base=source_ref(spec.model.base),
        dataset=source_ref(train.dataset),
        column=train.dataset.column,
        samples=train.samples,
        recipe=DrafterRecipe.model_validate(train.recipe.model_dump()),
        gpus=train.gpus,
    )


def training_labels(owner: Owner, key: str) -> dict[str, str]:
    return {**names.common_labels(owner.name, COMPONENT), names.LABEL_VARIANT: STAGE, names.LABEL_ENGINE_KEY: key}


def training_configmap(owner: Owner) -> dict[str, Any]:
    ts = train_spec(owner.spec)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(owner, names.training_config_name(owner.name, ts.key), training_labels(owner, ts.key)),
        "data": {contract.TRAIN_SPEC_FILE: ts.model_dump_json(indent=2)},
    }


def training_command() -> list[str]:
    """engine_jobs starts the recipe's ranks itself: one process, or one per GPU under torchrun (spec.gpus)."""
    return [
        "python",
        "-m",
        "engine_jobs",
        "train",
        "--spec",
        posixpath.join(contract.CONFIG_MOUNT, contract.TRAIN_SPEC_FILE),
    ]


def training_job(owner: Owner, attempt: int = 0) -> dict[str, Any]:
    spec = owner.spec
    train = _training(spec)
    ts = train_spec(spec)
    b = spec.engine.build
    labels = training_labels(owner, ts.key)
    config_name = names.training_config_name(owner.name, ts.key)
    src_volumes, src_mounts = source_volumes([spec.model.base, train.dataset])
    tmp_volume, tmp_mount = security.tmp_volume()
    container = {
        "name": TRAIN_CONTAINER,
        "image": train.image or spec.engine.builder_image,
        "imagePullPolicy": "IfNotPresent",
        "command": training_command(),
        "env": [
            {"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"},
            {"name": "HF_HOME", "value": posixpath.join(contract.CACHE_MOUNT, ".hf-home")},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        ],
        "ports": [{"name": "progress", "containerPort": contract.TRAINING_PROGRESS_PORT, "protocol": "TCP"}],
        "resources": gpu_resources(spec, train.resources, resources.BUILD_PER_RANK, ranks=train.gpus),
        "volumeMounts": [
            {"name": "cache", "mountPath": contract.CACHE_MOUNT, "subPath": spec.engine.cache.sub_path},
            {"name": "train-spec", "mountPath": contract.CONFIG_MOUNT, "readOnly": True},
            {"name": "dshm", "mountPath": "/dev/shm"},
            tmp_mount,
            *src_mounts,
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
            {"name": "train-spec", "configMap": {"name": config_name}},
            {"name": "dshm", "emptyDir": {"medium": "Memory"}},
            tmp_volume,
            *src_volumes,
        ],
        "securityContext": security.pod_security_context(security.IMAGE_USER),
        "automountServiceAccountToken": False,  # the trainer reads files and the Hub/S3, never the API
        "enableServiceLinks": False,
    }
    if selector := node_selector(spec, b.node_selector, train.gpu_product):
        pod_spec["nodeSelector"] = selector
    if b.tolerations:
        pod_spec["tolerations"] = list(b.tolerations)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata(
            owner,
            names.training_job_name(owner.name, ts.key, attempt),
            labels,
            {"redrafter.dev/attempt": str(attempt), "redrafter.dev/artifact": drafter_path(spec, ts.key)},
        ),
        "spec": {
            "backoffLimit": b.backoff_limit,
            "podFailurePolicy": pod_failure_policy(TRAIN_CONTAINER),
            "activeDeadlineSeconds": train.active_deadline_seconds,
            "ttlSecondsAfterFinished": FINISHED_JOB_TTL_SECONDS,
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }
