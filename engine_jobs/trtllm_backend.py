"""What the TensorRT-LLM Triton backend (C++, ``backend: "tensorrtllm"``) requires of its config.pbtxt.

The backend reads its settings with ``ModelState::GetParameter<T>(name)``, which throws
``Cannot find parameter with name: <name>`` when the key is absent. Almost every read is wrapped in
try/catch with a default; the ones below are not, so a config without them fails to load
(``unexpected error when creating modelInstanceState: Cannot find parameter with name: ...``).

Pinned release: TensorRT-LLM 1.0.0, which the Triton 25.09 trtllm-python-py3 image pairs with
(tensorrtllm_backend tag v1.0.0 and branch r25.09 pin their ``tensorrt_llm`` submodule at
ae8270b713446948246f16fadf4e2a32e35d0f62; since 0.20 the backend source lives in that repository under
``triton_backend/inflight_batcher_llm/src/``, tensorrtllm_backend keeps only docs and build files).
Read in: NVIDIA/TensorRT-LLM ``triton_backend/inflight_batcher_llm/src/{model_instance_state,model_state,
utils}.cc`` as stored at commits c8c6df08 and 0c8de69a (after the move; the exact submodule commit's
snapshot was not retrievable), and tensorrtllm_backend's own last copy (commit c2e65b8, May 2025). All
three read the same four parameters without a default (c2e65b8's utils.cc reads no parameter). docs/model_config.md at
tensorrtllm_backend v1.0.0 lists the same three guided-decoding keys.

This module is data only (no imports beyond the standard library): the simulated engine copies it
next to its model so the double rejects exactly what the real backend rejects.
"""

from __future__ import annotations

from dataclasses import dataclass

#: the upstream release the facts below were read at
BACKEND_RELEASE = "TensorRT-LLM 1.0.0 (Triton 25.09, tensorrtllm_backend v1.0.0)"
SOURCE_DIR = "triton_backend/inflight_batcher_llm/src"


@dataclass(frozen=True)
class RequiredParameter:
    """One parameter the backend reads with no default, and where upstream reads it."""

    name: str
    source: str  # file under SOURCE_DIR
    function: str  # the function that reads it
    release: str = BACKEND_RELEASE


#: in the order the backend reads them (the first missing one is the error a real load reports)
REQUIRED_PARAMETERS: tuple[RequiredParameter, ...] = (
    RequiredParameter("gpt_model_type", "model_instance_state.cc", "getBatchingTypeFromParams"),
    RequiredParameter("tokenizer_dir", "model_instance_state.cc", "getGuidedDecodingConfigFromParams"),
    RequiredParameter("xgrammar_tokenizer_info_path", "model_instance_state.cc", "getGuidedDecodingConfigFromParams"),
    RequiredParameter("guided_decoding_backend", "model_instance_state.cc", "getGuidedDecodingConfigFromParams"),
)
REQUIRED_PARAMETER_NAMES: tuple[str, ...] = tuple(p.name for p in REQUIRED_PARAMETERS)

#: read inside try/catch with a default (model_instance_state.cc, and model_state.cc for gpu_device_ids,
#: participant_ids, executor_worker_path): a config may leave them out
OPTIONAL_PARAMETER_NAMES: tuple[str, ...] = (
    "max_tokens_in_paged_kv_cache",
    "kv_cache_free_gpu_mem_fraction",
    "cross_kv_cache_fraction",
    "kv_cache_host_memory_bytes",
    "kv_cache_onboard_blocks",
    "max_attention_window_size",
    "sink_token_length",
    "enable_kv_cache_reuse",
    "multi_block_mode",
    "enable_context_fmha_fp32_acc",
    "cuda_graph_mode",
    "cuda_graph_cache_size",
    "num_nodes",
    "lora_cache_max_adapter_size",
    "lora_cache_optimal_adapter_size",
    "lora_cache_gpu_memory_fraction",
    "lora_cache_host_memory_bytes",
    "lora_prefetch_dir",
    "batch_scheduler_policy",
    "speculative_decoding_fast_logits",
    "max_beam_width",
    "iter_stats_max_iterations",
    "request_stats_max_iterations",
    "enable_trt_overlap",
    "normalize_log_probs",
    "enable_chunked_context",
    "decoding_mode",
    "medusa_choices",
    "eagle_choices",
    "gpu_weights_percent",
    "recv_poll_period_ms",
    "gpt_model_path",
    "encoder_model_path",
    "exclude_input_in_output",
    "cancellation_check_period_ms",
    "stats_check_period_ms",
    "gpu_device_ids",
    "participant_ids",
    "executor_worker_path",
)
#: read in try/catch whose catch throws: required exactly when decoding_mode is lookahead
LOOKAHEAD_PARAMETER_NAMES: tuple[str, ...] = (
    "lookahead_window_size",
    "lookahead_ngram_size",
    "lookahead_verification_set_size",
)
LOOKAHEAD_ERROR = (
    "Decoding mode is set to lookahead but lookahead parameters are not specified. Please set "
    "parameters lookahead_window_size, lookahead_ngram_size, and lookahead_verification_set_size."
)

#: GetParameter<std::string> itself (model_state.cc): the lookup error and the one for no parameters at all
MISSING_PARAMETER_ERROR = "Cannot find parameter with name: {name}"
NO_PARAMETERS_ERROR = "Model config doesn't have a parameters section"
#: ModelInstanceState::Create wraps every constructor exception in this (model_instance_state.cc)
LOAD_ERROR_PREFIX = "unexpected error when creating modelInstanceState: "

#: gpt_model_type values getBatchingTypeFromParams accepts ("v1"/"V1" is static batching, which the
#: TensorRT-LLM 1.0 executor no longer runs; the operator never writes it)
GPT_MODEL_TYPES = ("inflight_fused_batching", "inflight_batching")
INVALID_GPT_MODEL_TYPE_ERROR = "Invalid gpt_model_type. Must be v1/inflight_batching/inflight_fused_batching."
#: getGuidedDecodingConfigFromParams: an empty backend or info path turns guided decoding off;
#: otherwise the backend must be xgrammar and the path must exist
GUIDED_DECODING_BACKENDS = ("xgrammar",)
#: ModelInstanceState's constructor: a decoder-only model needs gpt_model_path (encoder_model_path is
#: for encoder models); both are read in try/catch but one of them must be set
NO_MODEL_PATH_ERROR = "Both encoder and decoder model paths are empty"
