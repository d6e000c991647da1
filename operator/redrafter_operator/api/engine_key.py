"""Content-addressed engine keys: a stable hash of every input that changes the built artifact.

Same inputs => same key => the same artifact directory in the cache, in any process, on any machine.
Serving, autoscaling and speculation fields are deliberately absent, so changing them never rebuilds.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from engine_jobs.contract import CONTRACT_VERSION, VARIANTS, Variant

from .spec import DrafterTraining, ModelSource, ReDrafterDeploymentSpec

KEY_LENGTH = 20  # hex chars (80 bits): collision-free in any realistic cache, short enough for labels


def _source(src: ModelSource | None) -> dict[str, str | None] | None:
    if src is None:
        return None
    return {
        "source": src.source.rstrip("/"),
        "revision": src.revision or ("main" if src.source.startswith("hf://") else None),
    }


def build_inputs(spec: ReDrafterDeploymentSpec, variant: Variant) -> dict[str, Any]:
    """Every build input of one variant, as a JSON-able dict (recorded in the engine manifest).

    ReDrafter specs hash exactly the inputs they always did, so their keys never change."""
    if spec.method != "redrafter":
        return prepared_inputs(spec)
    e = spec.engine
    inputs: dict[str, Any] = {
        "contract": CONTRACT_VERSION,
        "variant": variant,
        "base": _source(spec.model.base),
        "tokenizer": _source(spec.model.tokenizer or spec.model.base),
        "architecture": spec.model.architecture,
        "dtype": spec.precision.dtype,
        "quantization": spec.precision.quantization,
        "tensorParallel": spec.parallelism.tensor,
        "maxBatchSize": e.max_batch_size,
        "maxInputLen": e.max_input_len,
        "maxSeqLen": e.max_seq_len,
        "maxNumTokens": e.max_num_tokens,
        "pagedContextFmha": e.paged_context_fmha,
        # The builder image pins the TensorRT-LLM version; the GPU product pins the kernels.
        "builderImage": e.builder_image,
        "gpuProduct": e.build.gpu_product or "",
    }
    if variant == "redrafter":
        key = drafter_key(spec)
        assert spec.model.drafter is not None  # the spec's rules require one for method redrafter
        # a trained drafter is named by its key, which covers everything that changes it
        inputs["drafter"] = {"trained": key} if key else _source(spec.model.drafter.as_source())
        inputs["redrafter"] = {
            "numBeams": spec.redrafter.num_beams,
            "draftLenPerBeam": spec.redrafter.draft_len_per_beam,
            "greedySearch": spec.redrafter.greedy_search,
        }
    return inputs


def prepared_inputs(spec: ReDrafterDeploymentSpec) -> dict[str, Any]:
    """The inputs of a PyTorch-backend artifact: the checkpoints it holds, verified for the method.

    There is no engine build: the prepare Job fetches and verifies checkpoints that the serving pods load.
    Both variants serve the same artifact (the base one without speculative_config), so the key does not
    depend on the variant, and draft length, dtype and limits are serving settings (model.yaml at pod start).
    """
    drafter = spec.model.drafter.as_source() if spec.model.drafter is not None else None
    inputs: dict[str, Any] = {
        "contract": CONTRACT_VERSION,
        "backend": "pytorch",
        "method": spec.method,
        "base": _source(spec.model.base),
        "tokenizer": _source(spec.model.tokenizer or spec.model.base),
        "drafter": _source(drafter),
        "builderImage": spec.engine.builder_image,
    }
    if spec.mtp is not None:  # the prepare Job checks these against the layers config.json declares
        inputs["mtp"] = spec.mtp.model_dump(by_alias=True)
    return inputs


def training_inputs(spec: ReDrafterDeploymentSpec, train: DrafterTraining) -> dict[str, Any]:
    """Every input of the drafter's training, as a JSON-able dict (recorded in the drafter's manifest).

    Revisions are the declared ones (a branch defaults to main); the Job records the commit it resolved to.
    Pin a commit for an exact key.
    """
    return {
        "contract": CONTRACT_VERSION,
        "base": _source(spec.model.base),
        "dataset": {**(_source(train.dataset) or {}), "column": train.dataset.column},
        "samples": train.samples,
        "recipe": train.recipe.model_dump(by_alias=True),
        "gpus": train.gpus,
        "trainerImage": train.image or spec.engine.builder_image,
        "gpuProduct": train.gpu_product or spec.engine.build.gpu_product or "",
    }


def drafter_key(spec: ReDrafterDeploymentSpec) -> str | None:
    """The key of the drafter the operator trains for ``spec`` (None when the spec brings a trained one)."""
    train = spec.trained_drafter()
    return key_of(training_inputs(spec, train)) if train is not None else None


def key_of(inputs: dict[str, Any]) -> str:
    canonical = json.dumps(inputs, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:KEY_LENGTH]


def engine_key(spec: ReDrafterDeploymentSpec, variant: Variant) -> str:
    return key_of(build_inputs(spec, variant))


def engine_keys(spec: ReDrafterDeploymentSpec | None) -> dict[str, str]:
    """Each variant's engine key, and ``drafter``: the key of the drafter the operator trains, if it does
    (computed once per parsed spec by the reconciler; {} for an invalid spec)."""
    if spec is None:
        return {}
    keys: dict[str, str] = {v: engine_key(spec, v) for v in VARIANTS}
    if (trained := drafter_key(spec)) is not None:
        keys["drafter"] = trained
    return keys
