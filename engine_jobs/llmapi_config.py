"""The PyTorch path's engine model: Triton's ``llmapi`` Python model and the ``model.yaml`` it reads.

TensorRT-LLM's ``triton_backend/all_models/llmapi/tensorrt_llm`` is a Python model named ``tensorrt_llm``
that builds ``tensorrt_llm.LLM(**model.yaml)`` at load and serves text in, text out. :func:`model_yaml` is
the pure renderer of that file from a pod's :class:`ServingConfig`; the keys it writes are the LLM API's
(``engine_jobs/llmapi_backend.py`` holds what upstream reads, checked by the contract test). The base
variant is the same checkpoint without ``speculative_config``.
"""

from __future__ import annotations

import posixpath
from typing import Any

from .contract import CHECKPOINT_DIR, DRAFT_DIR, TOKENIZER_DIR, ServingConfig, SpeculativeParams
from .llmapi_backend import DRAFTER_DECODING_TYPES

#: the API's method names -> speculative_config.decoding_type (tensorrt_llm/llmapi/llm_args.py)
DECODING_TYPES: dict[str, str] = {
    "eagle3": "Eagle3",
    "mtp": "MTP",
    "ngram": "NGram",
    "draftModel": "Draft_Target",  # upstream's literal (llm_args.py DraftTargetDecodingConfig)
}
#: methods whose engine stops drafting above max_concurrency (or follows a draft_len_schedule) at the pin: the ones
#: with a separate drafter (llmapi_backend.DRAFTER_DECODING_TYPES)
IN_ENGINE_LIMIT_METHODS = frozenset(m for m, t in DECODING_TYPES.items() if t in DRAFTER_DECODING_TYPES)
#: methods whose speculative_config names a draft checkpoint (speculative_model_dir)
DRAFT_CHECKPOINT_METHODS = frozenset({"eagle3", "draftModel"})


def speculative_config(
    params: SpeculativeParams,
    draft_dir: str | None,
    max_concurrency: int | None = None,
    draft_len_schedule: dict[int, int] | None = None,
) -> dict[str, Any]:
    """``speculative_config`` for one method (the LLM API's DecodingBaseConfig subclasses). The in-engine limits
    go only where the pinned release has a drafter that reads them (``DRAFTER_DECODING_TYPES``): a measured
    ``draft_len_schedule``, else ``max_concurrency``; a one-model method (Eagle3, MTP) would ignore both."""
    out: dict[str, Any] = {"decoding_type": DECODING_TYPES[params.method]}
    if params.method == "mtp":
        out["num_nextn_predict_layers"] = params.max_draft_len
    else:
        out["max_draft_len"] = params.max_draft_len
    if params.method in DRAFT_CHECKPOINT_METHODS:
        if not draft_dir:
            raise ValueError(f"method {params.method} needs its draft checkpoint")
        out["speculative_model_dir"] = draft_dir
    if params.method == "ngram":
        out["max_matching_ngram_size"] = params.max_matching_ngram_size or params.max_draft_len
    if out["decoding_type"] not in DRAFTER_DECODING_TYPES:
        return out
    if draft_len_schedule:
        # shorter drafts at middle batch sizes, none above the crossover (lower-bound keys at the pin)
        out["draft_len_schedule"] = dict(sorted(draft_len_schedule.items()))
    elif max_concurrency is not None:
        # drafting stops inside the engine above the measured crossover; the fleet switch stays for the rest
        out["max_concurrency"] = max_concurrency
    return out


def model_yaml(cfg: ServingConfig) -> dict[str, Any]:
    """The LLM arguments of one pod (its variant decides whether there is a speculative_config)."""
    artifact = cfg.artifact_dir.rstrip("/")
    t = cfg.triton
    doc: dict[str, Any] = {
        "model": posixpath.join(artifact, CHECKPOINT_DIR),
        "tokenizer": posixpath.join(artifact, TOKENIZER_DIR),
        "backend": "pytorch",
        "tensor_parallel_size": cfg.tensor_parallel,
        "max_batch_size": cfg.max_batch_size,
        "max_seq_len": cfg.max_seq_len,
        "enable_chunked_prefill": t.enable_chunked_context,
        "kv_cache_config": {
            "free_gpu_memory_fraction": t.kv_cache_free_gpu_mem_fraction,
            "enable_block_reuse": t.enable_kv_cache_reuse,
        },
        # the model's own request batching is off (Triton's max_batch_size 0): the LLM batches in flight
        "triton_config": {"max_batch_size": 0, "decoupled": t.decoupled},
    }
    if cfg.max_num_tokens:
        doc["max_num_tokens"] = cfg.max_num_tokens
    if cfg.variant == "redrafter" and cfg.speculative is not None:
        doc["speculative_config"] = speculative_config(
            cfg.speculative, posixpath.join(artifact, DRAFT_DIR), cfg.max_concurrency, cfg.draft_len_schedule
        )
        if cfg.speculative.method == "draftModel":
            # as upstream's draft-target example runs it (docs/source/features/speculative-decoding.md)
            doc["disable_overlap_scheduler"] = True
    return doc
