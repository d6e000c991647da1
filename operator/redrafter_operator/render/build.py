"""Build Jobs: (resource, variant) -> the BuildSpec ConfigMap and the GPU Job that runs engine_jobs.

Credentials reach the Job only as mounted Secret files; the ConfigMap carries paths, never values.
"""

from __future__ import annotations

import posixpath
from typing import Any

from engine_jobs import contract
from engine_jobs.contract import BuildSpec, EngineLimits, RedrafterParams, SourceRef, SpeculativeParams, Variant

from ..api.engine_key import build_inputs, drafter_key, key_of
from ..api.spec import ModelSource, Mtp, NGram, ReDrafterDeploymentSpec
from ..api.types import parse_source
from . import names, resources, security
from .common import Owner, metadata
from .gpu_job import GpuJob, gpu_job, gpu_resources, node_selector

BUILD_CONTAINER = "build"


def artifact_path(spec: ReDrafterDeploymentSpec, key: str) -> str:
    """Where the engine lives inside the cache claim (what status.engines.*.path shows)."""
    return posixpath.join(spec.engine.cache.sub_path, key)


def drafter_path(spec: ReDrafterDeploymentSpec, key: str) -> str:
    """Where a trained drafter lives inside the cache claim (what status.drafter.path shows)."""
    return posixpath.join(spec.engine.cache.sub_path, contract.DRAFTERS_DIR, key)


def drafter_source(spec: ReDrafterDeploymentSpec) -> ModelSource:
    """The drafter as the ReDrafter build reads it: the given source, or the trained one in the cache claim."""
    assert spec.model.drafter is not None  # the spec's rules require one for the methods that draft with one
    given = spec.model.drafter.as_source()
    if given is not None:
        return given
    key = drafter_key(spec)
    assert key is not None
    return ModelSource(source=f"pvc://{spec.engine.cache.claim_name}/{drafter_path(spec, key)}")


def speculative_params(spec: ReDrafterDeploymentSpec) -> SpeculativeParams | None:
    """The PyTorch-backend method of ``spec`` in the contract's terms (None for ReDrafter)."""
    p = spec.method_params()
    if p is None:
        return None
    draft_len = p.num_nextn_predict_layers if isinstance(p, Mtp) else p.max_draft_len
    return SpeculativeParams(
        method=spec.method,  # type: ignore[arg-type]  # not redrafter: method_params() said so
        max_draft_len=draft_len,
        max_matching_ngram_size=p.max_matching_ngram_size if isinstance(p, NGram) else None,
    )


def source_ref(src: ModelSource) -> SourceRef:
    creds = posixpath.join(contract.SECRETS_MOUNT, src.credentials_secret) if src.credentials_secret else None
    revision = src.revision or ("main" if src.source.startswith("hf://") else None)
    return SourceRef(uri=src.source, revision=revision, credentials_dir=creds)


def build_spec(spec: ReDrafterDeploymentSpec, variant: Variant) -> BuildSpec:
    inputs = build_inputs(spec, variant)
    e = spec.engine
    common: dict[str, Any] = {
        "variant": variant,
        "key": key_of(inputs),
        "inputs": inputs,
        "base": source_ref(spec.model.base),
        "tokenizer": source_ref(spec.model.tokenizer or spec.model.base),
        "dtype": spec.precision.dtype,
        "tensor_parallel": spec.parallelism.tensor,
        "limits": EngineLimits(
            max_batch_size=e.max_batch_size,
            max_input_len=e.max_input_len,
            max_seq_len=e.max_seq_len,
            max_num_tokens=e.max_num_tokens,
            paged_context_fmha=e.paged_context_fmha,
        ),
    }
    if spec.method != "redrafter":
        # The prepare Job: both variants share one artifact, so either Job prepares all of it.
        return BuildSpec(
            **common,
            drafter=source_ref(drafter_source(spec)) if spec.model.drafter is not None else None,
            backend="pytorch",
            speculative=speculative_params(spec),
        )
    return BuildSpec(
        **common,
        drafter=source_ref(drafter_source(spec)) if variant == "redrafter" else None,
        architecture=spec.model.architecture,
        quantization=spec.precision.quantization,
        redrafter=RedrafterParams(
            num_beams=spec.redrafter.num_beams,
            draft_len_per_beam=spec.redrafter.draft_len_per_beam,
            greedy_search=spec.redrafter.greedy_search,
        )
        if variant == "redrafter"
        else None,
    )


def build_labels(owner: Owner, variant: Variant, key: str) -> dict[str, str]:
    return {
        **names.common_labels(owner.name, "engine-build"),
        names.LABEL_VARIANT: variant,
        names.LABEL_ENGINE_KEY: key,
    }


def build_configmap(owner: Owner, variant: Variant) -> dict[str, Any]:
    bs = build_spec(owner.spec, variant)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(
            owner, names.build_config_name(owner.name, variant, bs.key), build_labels(owner, variant, bs.key)
        ),
        "data": {contract.BUILD_SPEC_FILE: bs.wire_json()},
    }


def _model_sources(spec: ReDrafterDeploymentSpec, variant: Variant) -> list[ModelSource]:
    sources = [spec.model.base, spec.model.tokenizer or spec.model.base]
    if spec.model.drafter is not None and (variant == "redrafter" or spec.method != "redrafter"):
        sources.append(drafter_source(spec))
    return sources


def named_sources(spec: ReDrafterDeploymentSpec) -> list[ModelSource]:
    """Every source the spec names for its Jobs to fetch: base, tokenizer, a drafter given as a source, the
    training dataset (a trained drafter, in the operator's own cache, is not one)."""
    model = spec.model
    sources = [model.base, *([model.tokenizer] if model.tokenizer else [])]
    if model.drafter is not None and (drafter := model.drafter.as_source()) is not None:
        sources.append(drafter)
    if (train := spec.trained_drafter()) is not None:
        sources.append(train.dataset)
    return sources


def source_claims(sources: list[ModelSource]) -> list[str]:
    """The claims of the pvc:// sources, which the Jobs mount read-only (deduplicated, sorted)."""
    return sorted({parse_source(s.source).authority for s in sources if s.source.startswith("pvc://")})


def source_volumes(sources: list[ModelSource]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Read-only mounts for pvc:// sources and credentials Secrets (deduplicated, deterministic order)."""
    claims = source_claims(sources)
    secrets = sorted({s.credentials_secret for s in sources if s.credentials_secret})
    volumes, mounts = [], []
    for i, claim in enumerate(claims):
        volumes.append({"name": f"source-{i}", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}})
        mounts.append(
            {"name": f"source-{i}", "mountPath": posixpath.join(contract.SOURCES_MOUNT, claim), "readOnly": True}
        )
    for i, secret in enumerate(secrets):
        volumes.append(
            {"name": f"credentials-{i}", "secret": {"secretName": secret, "defaultMode": security.SECRET_MODE}}
        )
        mounts.append(
            {"name": f"credentials-{i}", "mountPath": posixpath.join(contract.SECRETS_MOUNT, secret), "readOnly": True}
        )
    return volumes, mounts


def build_job(owner: Owner, variant: Variant, attempt: int = 0) -> dict[str, Any]:
    spec = owner.spec
    bs = build_spec(spec, variant)
    b = spec.engine.build
    src_volumes, src_mounts = source_volumes(_model_sources(spec, variant))
    if spec.method != "redrafter":
        # The prepare Job fetches and verifies checkpoints: no GPU, no GPU product (nothing is compiled).
        job_resources, selector = resources.merged(resources.PREPARE, b.resources), dict(b.node_selector)
    else:
        job_resources = gpu_resources(spec, b.resources, resources.BUILD_PER_RANK)
        selector = node_selector(spec, b.node_selector)
    return gpu_job(
        owner,
        GpuJob(
            name=names.build_job_name(owner.name, variant, bs.key, attempt),
            labels=build_labels(owner, variant, bs.key),
            annotations={"redrafter.dev/attempt": str(attempt), "redrafter.dev/artifact": artifact_path(spec, bs.key)},
            container=BUILD_CONTAINER,
            image=spec.engine.builder_image,
            subcommand="build",
            spec_file=contract.BUILD_SPEC_FILE,
            config_map=names.build_config_name(owner.name, variant, bs.key),
            config_volume="build-spec",
            resources=job_resources,
            node_selector=selector,
            active_deadline_seconds=b.active_deadline_seconds,
            source_volumes=src_volumes,
            source_mounts=src_mounts,
        ),
    )
