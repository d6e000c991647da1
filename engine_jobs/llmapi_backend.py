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

#: How the pinned release reads ``draft_len_schedule`` ({batch size: draft length}): lower-bound keys, "from this
#: batch size on". The release-1.2 era DecodingBaseConfig documents ``{1: 4, 4: 2, 8: 0}`` as batch >= 1 drafts
#: 4, >= 4 drafts 2, >= 8 drafts 0, requires the key 1 mapped to ``max_draft_len``, and the drafter
#: (``tensorrt_llm/_torch/speculative/drafter.py`` ``get_draft_len_for_batch_size``) takes the largest key <= the
#: batch. PR #10860 (merged on main in 2026-03, after the 1.2 branch, so not in 1.2.1) made the keys upper bounds
#: ({4: 4, 8: 2, 32: 1}: batches 1-4 draft 4, ..., 33+ draft 0) and the field exclusive with max_concurrency.
DRAFT_LEN_SCHEDULE_KEYS = "lower_bound"
#: the decoding types that run a separate drafter at the pin, and so the only ones that read ``max_concurrency`` and
#: ``draft_len_schedule``: both are read by ``Drafter`` (``_torch/speculative/drafter.py``
#: ``should_use_spec_decode``, ``get_draft_len_for_batch_size``), which ``PyExecutor`` consults only
#: ``if self.drafter is not None``, and ``get_spec_drafter`` (``_torch/speculative/utils.py``) builds one for
#: NGram (``NGramDrafter``) and the two-model paths (``ModelDrafter``: draft target, two-model Eagle3 and MTP).
#: Eagle3's default (``eagle3_one_model``) and MTP's (``mtp_eagle_one_model``) are one-model: no drafter, and
#: both fields are silently ignored. Stage 1 of the schedule (PR #8194) wired it into the two-model drafters only
#: (upstream's tests/unittest/_torch/speculative/test_draft_len_schedule.py runs NGram and DraftTarget); the
#: one-model path got it in PR #10860, after 1.2.1. Read in the stored release-1.2 era and later versions of
#: those files (the v1.2.1 tag's commit is not in the index; the routing is the same in all of them).
DRAFTER_DECODING_TYPES = frozenset({"NGram", "Draft_Target"})
#: the release-1.2 era validator's messages (DecodingBaseConfig.validate_draft_len_schedule_and_sort)
SCHEDULE_MESSAGES = {
    "key": "draft_len_schedule: batch size threshold must be >= 1, got {key}",
    "value": "draft_len_schedule: draft length must be >= 0, got {value}",
    "one": "draft_len_schedule must include batch_size=1. All systems can have batch_size=1. "
    "Add {1: <max_draft_len>} to your schedule.",
    "first": "draft_len_schedule[1] must equal max_draft_len for consistency. Got schedule[1]={first}, but "
    "max_draft_len={max_draft_len}. batch_size=1 should use maximum draft length.",
    "max": "draft_len_schedule: all draft lengths must be <= max_draft_len. Got draft_len={value} for "
    "batch_size={key}, but max_draft_len={max_draft_len}.",
}

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


def draft_len_for_batch(schedule: Mapping[int, int], batch: int) -> int:
    """The draft length the pinned release uses at ``batch``: the value of the largest key <= batch (0, and
    no drafting, below the smallest key, as upstream's drafter answers then)."""
    keys = [k for k in sorted(schedule) if k <= batch]
    return schedule[keys[-1]] if keys else 0


def schedule_for_max_concurrency(max_concurrency: int, max_draft_len: int) -> dict[int, int]:
    """The schedule that drafts exactly where ``max_concurrency`` does under the pinned (lower-bound) reading:
    the full draft up to the limit, none from the next batch size on."""
    return {1: max_draft_len, max_concurrency + 1: 0}


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_draft_len_schedule(schedule: object, max_draft_len: object) -> list[str]:
    """Upstream's words for a draft_len_schedule the pinned validator refuses (empty when it accepts it)."""
    if not isinstance(schedule, Mapping) or not all(_is_int(k) and _is_int(v) for k, v in schedule.items()):
        return ["draft_len_schedule: Input should be a valid dictionary of integers to integers"]
    m = SCHEDULE_MESSAGES
    errors = [m["key"].format(key=k) for k in sorted(schedule) if k < 1]
    errors += [m["value"].format(value=v) for _, v in sorted(schedule.items()) if v < 0]
    if errors:
        return errors
    if 1 not in schedule:
        return [m["one"]]
    if _is_int(max_draft_len):
        if schedule[1] != max_draft_len:
            return [m["first"].format(first=schedule[1], max_draft_len=max_draft_len)]
        errors = [
            m["max"].format(value=v, key=k, max_draft_len=max_draft_len)
            for k, v in sorted(schedule.items())
            if v > max_draft_len
        ]
    return errors


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
    if spec.get("draft_len_schedule") is not None:
        errors += [
            f"{loc}.{tag}: {e}" for e in check_draft_len_schedule(spec["draft_len_schedule"], spec.get("max_draft_len"))
        ]
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
