"""The Triton model repository of one engine: preprocessing -> tensorrt_llm -> postprocessing, fronted
by the acceptance-metering BLS model that clients call (``contract.ENTRY_MODEL``).

The build Job writes it once with default :class:`TritonParams` (so an artifact is servable as is); the
serving launcher rewrites it at pod start from the pod's :class:`ServingConfig`, so serving-only
changes never rebuild an engine. :func:`model_configs` is pure (text in, text out); the writer only
lays files out.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import yaml

from .contract import (
    ENGINE_MODEL,
    ENTRY_MODEL,
    METRIC_ACCEPTANCE_HISTOGRAM,
    METRIC_ACCEPTED_DRAFT_TOKENS,
    METRIC_DRAFT_TOKENS,
    METRIC_LABEL_MODEL,
    METRIC_LABEL_VARIANT,
    METRIC_OUTPUT_TOKENS,
    METRIC_REQUESTS,
    METRIC_STEPS,
    OUTPUT_TOKEN_COUNT,
    POSTPROCESSING_MODEL,
    PREPROCESSING_MODEL,
    ServingConfig,
)
from .llmapi_config import model_yaml

#: python-backend sources shipped as package data: model name -> files copied into <model>/1/
MODEL_SOURCES: dict[str, dict[str, str]] = {
    ENTRY_MODEL: {"model.py": "metering.py"},
    PREPROCESSING_MODEL: {"model.py": "preprocessing.py", "_tokenizer.py": "_tokenizer.py"},
    POSTPROCESSING_MODEL: {"model.py": "postprocessing.py", "_tokenizer.py": "_tokenizer.py"},
}
#: the perf outputs of TRT-LLM's tensorrt_llm model that carry speculation figures (cumulative)
PERF_OUTPUTS = ("acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens")
ACCEPTANCE_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)


@dataclass(frozen=True)
class Tensor:
    """One input or output of a model config."""

    name: str
    dtype: str  # TYPE_INT32, TYPE_STRING, ...
    dims: tuple[int, ...]
    optional: bool = False
    reshape: tuple[int, ...] | None = None
    ragged: bool = False

    def pbtxt(self) -> str:
        lines = [
            f'    name: "{self.name}"',
            f"    data_type: {self.dtype}",
            f"    dims: [ {', '.join(map(str, self.dims))} ]",
        ]
        if self.reshape is not None:
            lines.append(f"    reshape: {{ shape: [ {', '.join(map(str, self.reshape))} ] }}")
        if self.optional:
            lines.append("    optional: true")
        if self.ragged:
            lines.append("    allow_ragged_batch: true")
        return "  {\n" + "\n".join(lines) + "\n  }"


def _scalar(name: str, dtype: str, optional: bool = True) -> Tensor:
    """A per-request scalar as TRT-LLM declares it (dims [1], reshaped away)."""
    return Tensor(name, dtype, (1,), optional=optional, reshape=())


# Inputs/outputs of TRT-LLM's tensorrt_llm model (tensorrtllm_backend all_models/inflight_batcher_llm/
# tensorrt_llm/config.pbtxt), the subset a text LLM with speculative decoding uses.
ENGINE_INPUTS: tuple[Tensor, ...] = (
    Tensor("input_ids", "TYPE_INT32", (-1,), ragged=True),
    Tensor("input_lengths", "TYPE_INT32", (1,), reshape=()),
    Tensor("request_output_len", "TYPE_INT32", (1,), reshape=()),
    _scalar("end_id", "TYPE_INT32"),
    _scalar("pad_id", "TYPE_INT32"),
    Tensor("stop_words_list", "TYPE_INT32", (2, -1), optional=True, ragged=True),
    Tensor("bad_words_list", "TYPE_INT32", (2, -1), optional=True, ragged=True),
    _scalar("beam_width", "TYPE_INT32"),
    _scalar("temperature", "TYPE_FP32"),
    _scalar("runtime_top_k", "TYPE_INT32"),
    _scalar("runtime_top_p", "TYPE_FP32"),
    _scalar("len_penalty", "TYPE_FP32"),
    _scalar("repetition_penalty", "TYPE_FP32"),
    _scalar("min_length", "TYPE_INT32"),
    _scalar("presence_penalty", "TYPE_FP32"),
    _scalar("frequency_penalty", "TYPE_FP32"),
    _scalar("random_seed", "TYPE_UINT64"),
    _scalar("return_log_probs", "TYPE_BOOL"),
    _scalar("return_perf_metrics", "TYPE_BOOL"),
    Tensor("stop", "TYPE_BOOL", (1,), optional=True),
    Tensor("streaming", "TYPE_BOOL", (1,), optional=True),
)
ENGINE_OUTPUTS: tuple[Tensor, ...] = (
    Tensor("output_ids", "TYPE_INT32", (-1, -1)),
    Tensor("sequence_length", "TYPE_INT32", (-1,)),
    Tensor("cum_log_probs", "TYPE_FP32", (-1,)),
    Tensor("output_log_probs", "TYPE_FP32", (-1, -1)),
    Tensor("kv_cache_alloc_new_blocks", "TYPE_INT32", (1,)),
    Tensor("kv_cache_reused_blocks", "TYPE_INT32", (1,)),
    Tensor("kv_cache_alloc_total_blocks", "TYPE_INT32", (1,)),
    Tensor("arrival_time_ns", "TYPE_INT64", (1,)),
    Tensor("first_scheduled_time_ns", "TYPE_INT64", (1,)),
    Tensor("first_token_time_ns", "TYPE_INT64", (1,)),
    Tensor("last_token_time_ns", "TYPE_INT64", (1,)),
    Tensor("acceptance_rate", "TYPE_FP32", (1,)),
    Tensor("total_accepted_draft_tokens", "TYPE_INT32", (1,)),
    Tensor("total_draft_tokens", "TYPE_INT32", (1,)),
)

# Inputs/outputs of the PyTorch path's tensorrt_llm model, Triton's llmapi model (TensorRT-LLM
# triton_backend/all_models/llmapi/tensorrt_llm/config.pbtxt): text in, text out, the subset this repository
# uses. Its own batching is off (max_batch_size 0): the LLM batches in flight.
LLMAPI_INPUTS: tuple[Tensor, ...] = (
    Tensor("text_input", "TYPE_STRING", (-1,)),
    Tensor("streaming", "TYPE_BOOL", (1,), optional=True),
    Tensor("sampling_param_temperature", "TYPE_FP32", (1,), optional=True),
    Tensor("sampling_param_top_k", "TYPE_INT32", (1,), optional=True),
    Tensor("sampling_param_top_p", "TYPE_FP32", (1,), optional=True),
    Tensor("sampling_param_frequency_penalty", "TYPE_FP32", (1,), optional=True),
    Tensor("sampling_param_presence_penalty", "TYPE_FP32", (1,), optional=True),
    Tensor("sampling_param_max_tokens", "TYPE_INT32", (1,), optional=True),
    Tensor("sampling_param_stop", "TYPE_STRING", (-1,), optional=True),
    Tensor("sampling_param_seed", "TYPE_UINT64", (1,), optional=True),
    Tensor("sampling_param_exclude_input_from_output", "TYPE_BOOL", (1,), optional=True),
    Tensor("sampling_param_return_perf_metrics", "TYPE_BOOL", (1,), optional=True),
    Tensor("return_finish_reason", "TYPE_BOOL", (1,), optional=True),
    Tensor("stop", "TYPE_BOOL", (1,), optional=True),
)
LLMAPI_OUTPUTS: tuple[Tensor, ...] = (
    Tensor("text_output", "TYPE_STRING", (-1,)),
    Tensor("finish_reason", "TYPE_STRING", (-1,)),
    Tensor("arrival_time_ns", "TYPE_INT64", (1,)),
    Tensor("first_token_time_ns", "TYPE_INT64", (1,)),
    Tensor("last_token_time_ns", "TYPE_INT64", (1,)),
    Tensor("acceptance_rate", "TYPE_FP32", (1,)),
    Tensor("total_accepted_draft_tokens", "TYPE_INT32", (1,)),
    Tensor("total_draft_tokens", "TYPE_INT32", (1,)),
)
#: upstream's llmapi model code (model.py, helpers.py), which the runtime image takes from TensorRT-LLM's
#: tag at build time; the repository writer copies it next to the generated model.yaml
LLMAPI_MODEL_FILES = ("model.py", "helpers.py")
LLMAPI_CONFIG_FILE = "model.yaml"

# The entry model keeps the interface of TRT-LLM's ensemble / tensorrt_llm_bls.
ENTRY_INPUTS: tuple[Tensor, ...] = (
    Tensor("text_input", "TYPE_STRING", (1,)),
    Tensor("max_tokens", "TYPE_INT32", (1,)),
    Tensor("bad_words", "TYPE_STRING", (-1,), optional=True),
    Tensor("stop_words", "TYPE_STRING", (-1,), optional=True),
    Tensor("end_id", "TYPE_INT32", (1,), optional=True),
    Tensor("pad_id", "TYPE_INT32", (1,), optional=True),
    Tensor("top_k", "TYPE_INT32", (1,), optional=True),
    Tensor("top_p", "TYPE_FP32", (1,), optional=True),
    Tensor("temperature", "TYPE_FP32", (1,), optional=True),
    Tensor("length_penalty", "TYPE_FP32", (1,), optional=True),
    Tensor("repetition_penalty", "TYPE_FP32", (1,), optional=True),
    Tensor("min_tokens", "TYPE_INT32", (1,), optional=True),
    Tensor("presence_penalty", "TYPE_FP32", (1,), optional=True),
    Tensor("frequency_penalty", "TYPE_FP32", (1,), optional=True),
    Tensor("seed", "TYPE_UINT64", (1,), optional=True),
    Tensor("return_log_probs", "TYPE_BOOL", (1,), optional=True),
    Tensor("return_perf_metrics", "TYPE_BOOL", (1,), optional=True),
    Tensor("beam_width", "TYPE_INT32", (1,), optional=True),
    Tensor("stream", "TYPE_BOOL", (1,), optional=True),
)
ENTRY_OUTPUTS: tuple[Tensor, ...] = (
    Tensor("text_output", "TYPE_STRING", (-1,)),
    # Returned with the perf outputs: tokens the engine generated (true usage, not a re-tokenization).
    Tensor(OUTPUT_TOKEN_COUNT, "TYPE_INT32", (1,)),
    Tensor("acceptance_rate", "TYPE_FP32", (1,)),
    Tensor("total_accepted_draft_tokens", "TYPE_INT32", (1,)),
    Tensor("total_draft_tokens", "TYPE_INT32", (1,)),
)

PRE_INPUTS: tuple[Tensor, ...] = (
    Tensor("QUERY", "TYPE_STRING", (1,)),
    Tensor("BAD_WORDS_DICT", "TYPE_STRING", (-1,), optional=True),
    Tensor("STOP_WORDS_DICT", "TYPE_STRING", (-1,), optional=True),
    Tensor("END_ID", "TYPE_INT32", (1,), optional=True),
    Tensor("PAD_ID", "TYPE_INT32", (1,), optional=True),
    # false: tokenize text as it stands (the metering model counts generated tokens so on the PyTorch path)
    Tensor("ADD_SPECIAL_TOKENS", "TYPE_BOOL", (1,), optional=True),
)
PRE_OUTPUTS: tuple[Tensor, ...] = (
    Tensor("INPUT_ID", "TYPE_INT32", (-1,)),
    Tensor("REQUEST_INPUT_LEN", "TYPE_INT32", (1,)),
    Tensor("BAD_WORDS_IDS", "TYPE_INT32", (2, -1)),
    Tensor("STOP_WORDS_IDS", "TYPE_INT32", (2, -1)),
    Tensor("OUT_END_ID", "TYPE_INT32", (1,)),
    Tensor("OUT_PAD_ID", "TYPE_INT32", (1,)),
)
POST_INPUTS: tuple[Tensor, ...] = (Tensor("TOKENS_BATCH", "TYPE_INT32", (-1,)),)
POST_OUTPUTS: tuple[Tensor, ...] = (Tensor("OUTPUT", "TYPE_STRING", (1,)),)


def _bool(v: bool) -> str:
    return "true" if v else "false"


def _params(params: dict[str, str]) -> str:
    return "\n".join(
        f'parameters: {{\n  key: "{k}"\n  value: {{ string_value: "{_escape(v)}" }}\n}}' for k, v in params.items()
    )


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"')


def _io(kind: str, tensors: tuple[Tensor, ...]) -> str:
    return f"{kind} [\n" + ",\n".join(t.pbtxt() for t in tensors) + "\n]"


def model_config(
    name: str,
    backend: str,
    inputs: tuple[Tensor, ...],
    outputs: tuple[Tensor, ...],
    params: dict[str, str],
    *,
    max_batch_size: int = 0,
    decoupled: bool = False,
    dynamic_batching_delay_us: int | None = None,
    instance_count: int = 1,
) -> str:
    """One config.pbtxt as text (parses into tritonclient's model_config_pb2.ModelConfig)."""
    parts = [f'name: "{name}"', f'backend: "{backend}"', f"max_batch_size: {max_batch_size}"]
    parts.append(f"model_transaction_policy {{\n  decoupled: {_bool(decoupled)}\n}}")
    if dynamic_batching_delay_us is not None:
        parts.append(
            "dynamic_batching {\n"
            f"  preferred_batch_size: [ {max_batch_size} ]\n"
            f"  max_queue_delay_microseconds: {dynamic_batching_delay_us}\n"
            "}"
        )
    parts += [_io("input", inputs), _io("output", outputs)]
    parts.append(f"instance_group [\n  {{\n    count: {instance_count}\n    kind: KIND_CPU\n  }}\n]")
    if params:
        parts.append(_params(params))
    return "\n".join(parts) + "\n"


def engine_parameters(cfg: ServingConfig, engine_dir: str) -> dict[str, str]:
    """tensorrt_llm parameters (names as in tensorrtllm_backend's config.pbtxt / model_config docs).

    Every name in :data:`trtllm_backend.REQUIRED_PARAMETER_NAMES` must be here (the contract test checks it).
    """
    t = cfg.triton
    params = {
        "max_beam_width": "1",
        "FORCE_CPU_ONLY_INPUT_TENSORS": "no",
        "gpt_model_type": t.batching_strategy,
        "gpt_model_path": engine_dir,
        "engine_dir": engine_dir,
        "batch_scheduler_policy": "guaranteed_no_evict",
        "kv_cache_free_gpu_mem_fraction": f"{t.kv_cache_free_gpu_mem_fraction:g}",
        "enable_kv_cache_reuse": _bool(t.enable_kv_cache_reuse),
        "exclude_input_in_output": "true",
        "cancellation_check_period_ms": "100",
        "iter_stats_max_iterations": "1000",
        "request_stats_max_iterations": "1000",
        "executor_worker_path": "/opt/tritonserver/backends/tensorrtllm/trtllmExecutorWorker",
        # Read with no default when the backend builds its guided-decoding config (trtllm_backend.py):
        # without them the model does not load. Empty = guided decoding off, as upstream's
        # config.pbtxt leaves them; the C++ backend does not use tokenizer_dir.
        "tokenizer_dir": "",
        "guided_decoding_backend": "",
        "xgrammar_tokenizer_info_path": "",
    }
    # Chunked context needs paged context FMHA in the engine; elsewhere the backend refuses to start.
    if cfg.paged_context_fmha:
        params["enable_chunked_context"] = _bool(t.enable_chunked_context)
    # Valid modes: top_k, top_p, top_k_top_p, beam_search, medusa, redrafter, lookahead, eagle.
    if cfg.variant == "redrafter":
        params["decoding_mode"] = "redrafter"
    return params


def metering_parameters(cfg: ServingConfig) -> dict[str, str]:
    """What the metering model needs: metric labels, inner model names, draft geometry."""
    return {
        "deployment": cfg.deployment,
        "variant": cfg.variant,
        "engine_key": cfg.engine_key,
        "draft_len_per_beam": str(cfg.draft_len_per_beam),
        "num_beams": str(cfg.num_beams),
        "preprocessing_model": PREPROCESSING_MODEL,
        "engine_model": ENGINE_MODEL,
        "postprocessing_model": POSTPROCESSING_MODEL,
        "output_token_count": OUTPUT_TOKEN_COUNT,
        "acceptance_buckets": ",".join(f"{b:g}" for b in ACCEPTANCE_BUCKETS),
        # metric and label names travel as parameters: the contract module is the one spelling
        "label_model": METRIC_LABEL_MODEL,
        "label_variant": METRIC_LABEL_VARIANT,
        "metric_requests": METRIC_REQUESTS,
        "metric_output_tokens": METRIC_OUTPUT_TOKENS,
        "metric_draft_tokens": METRIC_DRAFT_TOKENS,
        "metric_accepted_draft_tokens": METRIC_ACCEPTED_DRAFT_TOKENS,
        "metric_steps": METRIC_STEPS,
        "metric_acceptance_histogram": METRIC_ACCEPTANCE_HISTOGRAM,
        "max_inflight": str(max(4 * cfg.max_batch_size, 64)),
        # tensorrt: token ids through pre/post-processing; llmapi: text straight to the engine model
        "engine_api": "llmapi" if cfg.backend == "pytorch" else "tensorrt",
    }


def model_configs(cfg: ServingConfig, engine_dir: str, tokenizer_dir: str) -> dict[str, str]:
    """Model name -> config.pbtxt text of the whole repository (pure)."""
    t = cfg.triton
    return {
        ENTRY_MODEL: model_config(
            ENTRY_MODEL,
            "python",
            ENTRY_INPUTS,
            ENTRY_OUTPUTS,
            metering_parameters(cfg),
            max_batch_size=cfg.max_batch_size,
            decoupled=True,
        ),
        PREPROCESSING_MODEL: model_config(
            PREPROCESSING_MODEL,
            "python",
            PRE_INPUTS,
            PRE_OUTPUTS,
            {"tokenizer_dir": tokenizer_dir},
            instance_count=2,
        ),
        ENGINE_MODEL: model_config(ENGINE_MODEL, "python", LLMAPI_INPUTS, LLMAPI_OUTPUTS, {}, decoupled=t.decoupled)
        if cfg.backend == "pytorch"
        else model_config(
            ENGINE_MODEL,
            "tensorrtllm",
            ENGINE_INPUTS,
            ENGINE_OUTPUTS,
            engine_parameters(cfg, engine_dir),
            max_batch_size=cfg.max_batch_size,
            decoupled=t.decoupled,
            dynamic_batching_delay_us=t.max_queue_delay_microseconds,
        ),
        POSTPROCESSING_MODEL: model_config(
            POSTPROCESSING_MODEL,
            "python",
            POST_INPUTS,
            POST_OUTPUTS,
            {"tokenizer_dir": tokenizer_dir, "skip_special_tokens": "true"},
            instance_count=2,
        ),
    }


def _source_text(filename: str) -> str:
    return resources.files("engine_jobs.triton_models").joinpath(filename).read_text(encoding="utf-8")


def write_model_repository(
    out_dir: Path, cfg: ServingConfig, engine_dir: str, tokenizer_dir: str, llmapi_model_dir: str | None = None
) -> None:
    """Write the repository to ``out_dir`` atomically (built next to it, then renamed into place).

    An existing repository at ``out_dir`` is replaced: the launcher rewrites it on every pod start. The
    PyTorch path's engine model is upstream's llmapi code from ``llmapi_model_dir`` (None: only model.yaml
    is written, for a caller that installs the model code itself) with the generated model.yaml.
    """
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        for name, text in model_configs(cfg, engine_dir, tokenizer_dir).items():
            version = tmp / name / "1"
            version.mkdir(parents=True)
            (tmp / name / "config.pbtxt").write_text(text, encoding="utf-8")
            for dest, src in MODEL_SOURCES.get(name, {}).items():
                (version / dest).write_text(_source_text(src), encoding="utf-8")
        if cfg.backend == "pytorch":
            engine_version = tmp / ENGINE_MODEL / "1"
            (engine_version / LLMAPI_CONFIG_FILE).write_text(
                yaml.safe_dump(model_yaml(cfg), sort_keys=False), encoding="utf-8"
            )
            if llmapi_model_dir is not None:
                for filename in LLMAPI_MODEL_FILES:
                    shutil.copyfile(Path(llmapi_model_dir) / filename, engine_version / filename)
        os.chmod(tmp, 0o755)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        tmp.rename(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
