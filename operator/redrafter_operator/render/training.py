"""Drafter training Jobs: resource -> the TrainSpec ConfigMap and the GPU Job that trains the ReDrafter head.

The Job runs ``python -m engine_jobs train``: self-distillation from the base model (arXiv 2403.09919),
published content-addressed at ``<cache>/drafters/<key>/`` with the engines' cache semantics (lock with a
heartbeat, atomic publish, manifest last). While it runs, the pod serves its progress on
``TRAINING_PROGRESS_PORT``; the operator reads it into ``status.drafter``.
"""

from __future__ import annotations

from typing import Any

from engine_jobs import contract
from engine_jobs.contract import DrafterRecipe, TrainSpec

from ..api.engine_key import key_of, training_inputs
from ..api.spec import DrafterTraining, ReDrafterDeploymentSpec
from . import names, resources
from .build import drafter_path, source_ref, source_volumes
from .common import Owner, metadata
from .gpu_job import GpuJob, gpu_job, gpu_resources, node_selector

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


def training_job(owner: Owner, attempt: int = 0) -> dict[str, Any]:
    """The training Job: engine_jobs starts the recipe's ranks itself, one process or one per GPU under torchrun
    (spec.gpus); the pod serves its progress for status.drafter."""
    spec = owner.spec
    train = _training(spec)
    ts = train_spec(spec)
    b = spec.engine.build
    src_volumes, src_mounts = source_volumes([spec.model.base, train.dataset])
    return gpu_job(
        owner,
        GpuJob(
            name=names.training_job_name(owner.name, ts.key, attempt),
            labels=training_labels(owner, ts.key),
            annotations={"redrafter.dev/attempt": str(attempt), "redrafter.dev/artifact": drafter_path(spec, ts.key)},
            container=TRAIN_CONTAINER,
            image=train.image or spec.engine.builder_image,
            subcommand="train",
            spec_file=contract.TRAIN_SPEC_FILE,
            config_map=names.training_config_name(owner.name, ts.key),
            config_volume="train-spec",
            resources=gpu_resources(spec, train.resources, resources.BUILD_PER_RANK, ranks=train.gpus),
            node_selector=node_selector(spec, b.node_selector, train.gpu_product),
            active_deadline_seconds=train.active_deadline_seconds,
            source_volumes=src_volumes,
            source_mounts=src_mounts,
            extra_env=({"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},),
            ports=({"name": "progress", "containerPort": contract.TRAINING_PROGRESS_PORT, "protocol": "TCP"},),
        ),
    )
