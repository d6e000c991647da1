"""What the TensorRT-LLM Triton backend (C++, ``backend: "tensorrtllm"``) requires of its config.pbtxt.

The backend reads its settings with ``ModelState::GetParameter<T>(name)``, which throws
``Cannot find parameter with name: <name>`` when the key is absent. Almost every read is wrapped in
try/catch with a default; the ones below are not, so a config without them fails to load
(``unexpected error when creating modelInstanceState: Cannot find parameter with name: ...``).

Pinned release: TensorRT-LLM 1.2.1, which the Triton 26.04-26.07 trtllm-python-py3 images carry (server
v2.71.0 docs/introduction/compatibility.md). The v1.2.1 tag's own commit is not in the stored index this was
read from (only main-branch versions of each file are, and the repository is too large to mirror), so the
facts below are read at the last stored version of each file, all on main before the TensorRT-engine path
was removed there (NVIDIA/TensorRT-LLM PR #15763 examples, 2026-06-30; #15907 the C++ backend), which is after
the 1.2.1 version bump (PR #12755, 2026-04-03): ``READ_AT`` names each commit. The release line itself is
read in triton-inference-server/tensorrtllm_backend branch r26.07 (``READ_AT["tensorrtllm_backend"]``): its
Dockerfile builds ``TENSORRTLLM_REPO_TAG=release/1.2.1`` and copies ``triton_backend/inflight_batcher_llm``,
its submodule pins triton-inference-server/TensorRT-LLM at ca88df0a, and docs/model_config.md lists the same
``decoding_mode`` values, ``redrafter`` among them. All versions read take the same four parameters without
a default as the 1.0.0 reading did.

This module is data only (no imports beyond the standard library): the simulated engine copies it
next to its model so the double rejects exactly what the real backend rejects.
"""

from __future__ import annotations

from dataclasses import dataclass

#: the upstream release the facts below were read for
BACKEND_RELEASE = "TensorRT-LLM 1.2.1 (Triton 26.07, tensorrtllm_backend r26.07)"
SOURCE_DIR = "triton_backend/inflight_batcher_llm/src"
#: the TensorRT-LLM release the serving image runs (images/versions.env TRTLLM_VERSION): engines built by
#: any other release fail to deserialize there, so the cache collection removes them when unreferenced
ENGINE_TRTLLM_VERSION = "1.2.1"
#: where each fact was read: NVIDIA/TensorRT-LLM paths at a commit, and the backend repository's release branch
READ_AT: dict[str, str] = {
    "tensorrtllm_backend": "3bc115373ce1fde1d94891964b492449402e3a68",  # branch r26.07 (Triton 26.07)
    "tensorrt_llm_submodule": "ca88df0a400515b8206a19eb30cd047eb7661035",  # r26.07's tensorrt_llm submodule
    f"{SOURCE_DIR}/model_instance_state.cc": "c8c6df08bd0ead54cd47f7973e1e425c28a174cd",
    "examples/redrafter/convert_checkpoint.py": "31a9cd42fb507b50df39df4e03066fa370e4683c",
    "tensorrt_llm/commands/build.py": "65f1d1536e18aea3380e6e270e00895a709333eb",
}


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

#: the decoding_mode values getExecutorConfigFromParams maps (anything else: a warning and the default);
#: "redrafter" is DecodingMode::ExplicitDraftTokens, the mode trtllm-build's explicit_draft_tokens engines run
DECODING_MODES: tuple[str, ...] = (
    "top_k",
    "top_p",
    "top_k_top_p",
    "beam_search",
    "medusa",
    "redrafter",
    "lookahead",
    "eagle",
)
#: trtllm-build --speculative_decoding_mode choices (tensorrt_llm/commands/build.py)
SPECULATIVE_DECODING_MODES: tuple[str, ...] = (
    "draft_tokens_external",
    "lookahead_decoding",
    "medusa",
    "explicit_draft_tokens",
    "eagle",
)

#: GetParameter<std::string> itself (model_state.cc): the lookup error and the one for no parameters at all
MISSING_PARAMETER_ERROR = "Cannot find parameter with name: {name}"
NO_PARAMETERS_ERROR = "Model config doesn't have a parameters section"
#: ModelInstanceState::Create wraps every constructor exception in this (model_instance_state.cc)
LOAD_ERROR_PREFIX = "unexpected error when creating modelInstanceState: "

#: gpt_model_type values getBatchingTypeFromParams accepts ("v1"/"V1" is static batching, which the
#: executor no longer runs since 1.0; the operator never writes it)
GPT_MODEL_TYPES = ("inflight_fused_batching", "inflight_batching")
INVALID_GPT_MODEL_TYPE_ERROR = "Invalid gpt_model_type. Must be v1/inflight_batching/inflight_fused_batching."
#: getGuidedDecodingConfigFromParams: an empty backend or info path turns guided decoding off;
#: otherwise the backend must be xgrammar and the path must exist
GUIDED_DECODING_BACKENDS = ("xgrammar",)
#: ModelInstanceState's constructor: a decoder-only model needs gpt_model_path (encoder_model_path is
#: for encoder models); both are read in try/catch but one of them must be set
NO_MODEL_PATH_ERROR = "Both encoder and decoder model paths are empty"
