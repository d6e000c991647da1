"""What TensorRT-LLM's ``llmapi`` Triton model (the PyTorch backend) accepts in its model.yaml.

The model (``triton_backend/all_models/llmapi/tensorrt_llm/1/model.py``) reads ``triton_config`` itself
and hands every other top-level key to ``LLM(**args)``; the LLM API validates them with pydantic models
that forbid extra keys (``StrictBaseModel``). ``speculative_config`` is a union discriminated by
``decoding_type``. A typo therefore fails the pod at model load, minutes after scheduling; this module
lets the operator and the simulated engine refuse the same documents up front, in upstream's words.

Pinned release: TensorRT-LLM 1.2.1, which Triton 26.04-26.07 ``-trtllm-python-py3`` carry
(triton-inference-server/server v2.71.0 docs/introduction/compatibility.md). Read in NVIDIA/TensorRT-LLM
files as stored in the search index: model.py at commit 044a90d2 and a release-1.2 era llm_args.py (it
has draft_len_schedule and the pre-rename acceptance_window; main renamed those after the 1.2.1 bump).
The v1.2.1 tag itself could not be opened, so the key lists are the ones read there, not at the tag.

Data only (standard library): the simulated engine copies it next to its model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: the upstream release the facts below were read for
BACKEND_RELEASE = "TensorRT-LLM 1.2.1 (Triton 26.07, server 2.71.0)"
MODEL_DIR = "triton_backend/all_models/llmapi"
MODEL_NAME = "tensorrt_llm"
MODEL_FILES = (
    "tensorrt_llm/config.pbtxt",
    "tensorrt_llm/1/model.py",
    "tensorrt_llm/1/model.yaml",
    "tensorrt_llm/1/helpers.py",
)
LLM_SOURCE = "tensorrt_llm/llmapi/llm_args.py"
MODEL_SOURCE = "triton_backend/all_models/llmapi/tensorrt_llm/1/model.py"

#: the one top-level key model.py consumes itself (everything else goes to LLM(**args))
TRITON_CONFIG_KEY = "triton_config"
#: triton_config keys model.py indexes without a default (KeyError when absent)
TRITON_CONFIG_REQUIRED = frozenset({"decoupled", "max_batch_size"})
#: triton_config keys model.py reads with a default
TRITON_CONFIG_OPTIONAL = frozenset({"cancellation_check_period_ms"})

#: top-level LLM-API keys the operator writes; each is a TorchLlmArgs field name
LLM_KEYS = frozenset(
    {
        "model",
        "tokenizer",
        "backend",
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "max_batch_size",
        "max_num_tokens",
        "max_seq_len",
        "kv_cache_config",
        "enable_chunked_prefill",
        "disable_overlap_scheduler",
        "cuda_graph_config",
        "speculative_config",
        "trust_remote_code",
    }
)
#: model.yaml top-level keys this contract knows (LLM keys plus the one model.py reads)
MODEL_YAML_KEYS = LLM_KEYS | {TRITON_CONFIG_KEY}

#: DecodingBaseConfig fields shared by every decoding_type (llm_args.py, release-1.2 era)
BASE_SPEC_KEYS = frozenset(
    {
        "decoding_type",
        "max_draft_len",
        "max_total_draft_tokens",
        "speculative_model",
        "speculative_model_dir",  # validation alias of speculative_model
        "max_concurrency",
        "draft_len_schedule",
        "load_format",
        "acceptance_window",
        "acceptance_length_threshold",
        "allow_advanced_sampling",
    }
)

#: fields each decoding_type adds to the base, by the class that declares them
METHOD_SPEC_KEYS: dict[str, frozenset[str]] = {
    "Eagle3": frozenset(
        {
            "eagle_choices",
            "greedy_sampling",
            "posterior_threshold",
            "use_dynamic_tree",
            "dynamic_tree_max_topK",
            "num_eagle_layers",
            "max_non_leaves_per_layer",
            "eagle3_one_model",
            "eagle3_layers_to_capture",
            "eagle3_model_arch",
        }
    ),
    "MTP": frozenset(
        {
            "num_nextn_predict_layers",
            "use_relaxed_acceptance_for_thinking",
            "relaxed_topk",
            "relaxed_delta",
            "use_mtp_vanilla",
            "mtp_eagle_one_model",
            "begin_thinking_phase_token",
            "end_thinking_phase_token",
        }
    ),
    "NGram": frozenset({"max_matching_ngram_size", "is_keep_all", "is_use_oldest", "is_public_pool"}),
    "Draft_Target": frozenset(),
}
SPEC_CLASS = {
    "Eagle3": "Eagle3DecodingConfig",
    "MTP": "MTPDecodingConfig",
    "NGram": "NGramDecodingConfig",
    "Draft_Target": "DraftTargetDecodingConfig",
}
#: the spelling the brief and older docs use; upstream's literal is Draft_Target
DECODING_TYPE_ALIASES = {"DraftTarget": "Draft_Target"}
#: every tag of the discriminated union (the contract checks fields only for the four above)
UPSTREAM_DECODING_TYPES = (
    "Draft_Target",
    "Eagle",
    "Eagle3",
    "Lookahead",
    "Medusa",
    "MTP",
    "NGram",
    "User_Provided",
    "SaveState",
    "PARD",
    "AUTO",
)

#: pydantic v2's messages for the three failures upstream raises through StrictBaseModel
EXTRA_FORBIDDEN = "Extra inputs are not permitted"
FIELD_REQUIRED = "Field required"
BAD_TAG = "Input tag '{tag}' found using 'decoding_type' does not match any of the expected tags: {expected}"
#: model-validator messages (llm_args.py), by decoding_type
VALIDATOR_MESSAGES = {
    "Eagle3": {
        "max_draft_len": "max_draft_len must be > 0 for Eagle",
        "speculative_model": "Draft model must be provided for EAGLE",
    },
    "NGram": {"max_draft_len": "max_draft_len must be > 0 for NGram"},
    "Draft_Target": {
        "max_draft_len": "max_draft_len must be > 0 for DraftTarget",
        "speculative_model": "speculative_model must be specified for DraftTarget",
    },
    "MTP": {},
}

#: per-request outputs when the request sets sampling_param_return_perf_metrics (strings)
PERF_REQUEST_INPUT = "sampling_param_return_perf_metrics"
SPEC_PERF_OUTPUTS = ("acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens")
PERF_OUTPUTS = SPEC_PERF_OUTPUTS + (
    "arrival_time_ns",
    "first_scheduled_time_ns",
    "first_token_time_ns",
    "last_token_time_ns",
    "kv_cache_alloc_new_blocks",
    "kv_cache_alloc_total_blocks",
    "kv_cache_hit_rate",
    "kv_cache_missed_block",
    "kv_cache_reused_block",
)


def canonical_decoding_type(value: object) -> str | None:
    """Upstream's tag for a decoding_type, or None when upstream has no such tag."""
    if not isinstance(value, str):
        return None
    value = DECODING_TYPE_ALIASES.get(value, value)
    return value if value in UPSTREAM_DECODING_TYPES else None


def _has_draft_model(spec: Mapping[str, Any]) -> bool:
    return spec.get("speculative_model") is not None or spec.get("speculative_model_dir") is not None


def _positive(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def check_speculative_config(spec: object, loc: str = "speculative_config") -> list[str]:
    """Upstream-worded errors for one speculative_config mapping (empty when upstream accepts it)."""
    if not isinstance(spec, Mapping):
        return [f"{loc}: Input should be a valid dictionary or instance of a decoding config"]
    raw = spec.get("decoding_type")
    if raw is None:
        return [
            f"{loc}: Unable to extract tag using discriminator 'decoding_type'",
        ]
    tag = canonical_decoding_type(raw)
    if tag is None:
        expected = ", ".join(f"'{t}'" for t in UPSTREAM_DECODING_TYPES)
        return [f"{loc}: " + BAD_TAG.format(tag=raw, expected=expected)]
    if tag not in METHOD_SPEC_KEYS:
        return [f"{loc}: decoding_type '{tag}' is not one this operator serves"]
    errors = [
        f"{loc}.{tag}.{key}: {EXTRA_FORBIDDEN}" for key in sorted(set(spec) - BASE_SPEC_KEYS - METHOD_SPEC_KEYS[tag])
    ]
    messages = VALIDATOR_MESSAGES[tag]
    if "max_draft_len" in messages and not _positive(spec.get("max_draft_len")):
        errors.append(f"{loc}.{tag}: {messages['max_draft_len']}")
    if "speculative_model" in messages and not _has_draft_model(spec):
        errors.append(f"{loc}.{tag}: {messages['speculative_model']}")
    return errors


def check_model_yaml(doc: Mapping[str, Any]) -> list[str]:
    """Upstream-worded errors for a whole model.yaml document (empty when the model would load it).

    Top-level keys outside MODEL_YAML_KEYS are refused even where TorchLlmArgs has such a field: the
    contract vouches only for the names it pins, so the operator cannot write an unchecked one.
    """
    errors: list[str] = []
    triton = doc.get(TRITON_CONFIG_KEY)
    if not isinstance(triton, Mapping):
        errors.append(f"{TRITON_CONFIG_KEY}: {FIELD_REQUIRED}")
    else:
        for key in sorted(TRITON_CONFIG_REQUIRED - set(triton)):
            errors.append(f"{TRITON_CONFIG_KEY}.{key}: {FIELD_REQUIRED}")
    if "model" not in doc:
        errors.append(f"model: {FIELD_REQUIRED}")
    for key in sorted(set(doc) - MODEL_YAML_KEYS):
        errors.append(f"{key}: {EXTRA_FORBIDDEN}")
    if doc.get("speculative_config") is not None:
        errors.extend(check_speculative_config(doc["speculative_config"]))
    return errors
