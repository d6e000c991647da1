"""TEST DOUBLE shared by the stand-in TensorRT-LLM tools in sim/redrafter_sim/toolchain (used by the tests and the demo; never by production).

Each stand-in parses its argv with the *complete* flag set of the real tool (transcribed from
TensorRT-LLM's argparse: examples/models/core/{llama,qwen}/convert_checkpoint.py,
examples/quantization/quantize.py, examples/redrafter/convert_checkpoint.py and
tensorrt_llm/commands/build.py + plugin.add_plugin_argument), so a flag TensorRT-LLM does not have, or
a value outside its choices, exits 2 like the real tool. Then it checks the inputs the real tool would
read and writes outputs of the same shape (config.json, rank<N>.safetensors / rank<N>.engine).

Environment knobs (tests only):
  FAKE_TRTLLM_LOG      append one JSON line per invocation: tool, argv, environment
  FAKE_TRTLLM_FAIL     tool name that must fail (exit 1 with a Python-like traceback on stderr)
  FAKE_TRTLLM_SLEEP    seconds trtllm-build sleeps after writing rank files (to kill it midway)
  FAKE_TRTLLM_STARTED  file trtllm-build creates when it starts
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

DTYPES = ["auto", "float16", "bfloat16", "float32"]


def _add(p: argparse.ArgumentParser, spec: list[tuple]) -> None:
    for flag, kind, *rest in spec:
        names = [flag] if isinstance(flag, str) else list(flag)
        kwargs: dict = {}
        if kind == "flag":
            kwargs["action"] = "store_true"
        elif kind == "false":
            kwargs.update(action="store_false", dest=rest[0])
            rest = []
        else:
            kwargs["type"] = kind
        if rest:
            kwargs["choices"] = rest[0]
        if kind == "nargs+":
            kwargs.pop("type")
            kwargs["nargs"] = "+"
        p.add_argument(*names, **kwargs)


LLAMA = [
    ("--model_dir", str),
    ("--meta_ckpt_dir", str),
    ("--tp_size", int),
    ("--pp_size", int),
    ("--moe_tp_size", int),
    ("--cp_size", int),
    ("--moe_ep_size", int),
    ("--dtype", str, DTYPES),
    ("--vocab_size", int),
    ("--n_positions", int),
    ("--n_layer", int),
    ("--n_head", int),
    ("--n_kv_head", int),
    ("--n_embd", int),
    ("--inter_size", int),
    ("--multiple_of", int),
    ("--ffn_dim_multiplier", float),
    ("--rms_norm_eps", float),
    ("--use_weight_only", "flag"),
    ("--disable_weight_only_quant_plugin", "flag"),
    ("--weight_only_precision", str, ["int8", "int4", "int8_gptq", "int4_gptq", "int4_awq"]),
    ("--calib_dataset", str),
    ("--calib_size", int),
    ("--calib_max_seq_length", int),
    (("--smoothquant", "-sq"), float),
    ("--use_qserve", "flag"),
    ("--per_channel", "flag"),
    ("--per_token", "flag"),
    ("--int8_kv_cache", "flag"),
    ("--fp8_kv_cache", "flag"),
    ("--quant_ckpt_path", str),
    ("--use_fp8", "flag"),
    ("--use_nvfp4", "flag"),
    ("--use_fp8_rowwise", "flag"),
    ("--use_meta_fp8_rowwise_recipe", "flag"),
    ("--per_group", "flag"),
    ("--load_by_shard", "flag"),
    ("--hidden_act", str),
    ("--rotary_base", float),
    ("--group_size", int),
    ("--load_model_on_cpu", "flag"),
    ("--use_parallel_embedding", "flag"),
    ("--embedding_sharding_dim", int, [0, 1]),
    ("--output_dir", str),
    ("--workers", int),
    ("--moe_num_experts", int),
    ("--moe_top_k", int),
    ("--moe_renorm_mode", int),
    ("--save_config_only", "flag"),
    ("--remove_duplicated_kv_heads", "flag"),
    ("--log_level", str),
]
QWEN = [
    ("--model_dir", str),
    ("--tp_size", int),
    ("--pp_size", int),
    ("--cp_size", int),
    ("--dtype", str, DTYPES),
    ("--use_weight_only", "flag"),
    ("--disable_weight_only_quant_plugin", "flag"),
    ("--weight_only_precision", str, ["int8", "int4", "int4_gptq", "int8_gptq"]),
    ("--calib_dataset", str),
    (("--smoothquant", "-sq"), float),
    ("--per_channel", "flag"),
    ("--per_token", "flag"),
    ("--int8_kv_cache", "flag"),
    ("--per_group", "flag"),
    ("--group_size", int),
    ("--load_model_on_cpu", "flag"),
    ("--use_parallel_embedding", "flag"),
    ("--embedding_sharding_dim", int, [0, 1]),
    ("--output_dir", str),
    ("--workers", int),
    ("--moe_tp_size", int),
    ("--moe_ep_size", int),
]
QUANTIZE = [
    ("--model_dir", str),
    ("--nemo_ckpt_path", str),
    ("--decoder_type", str, ["gptnext", "llama"]),
    ("--device", str, ["cuda", "cpu"]),
    ("--device_map", str, ["auto", "sequential", "cpu", "gpu"]),
    ("--calib_dataset", str),
    ("--calib_tp_size", int),
    ("--calib_pp_size", int),
    ("--dtype", str, DTYPES),
    ("--qformat", str, ["nvfp4", "fp8", "int8_sq", "int4_awq", "w4a8_awq", "int8_wo", "int4_wo", "full_prec"]),
    ("--seed", int),
    ("--tokenizer_max_seq_length", int),
    ("--batch_size", int),
    ("--calib_size", int),
    ("--calib_max_seq_length", int),
    ("--output_dir", str),
    ("--tp_size", int),
    ("--pp_size", int),
    ("--cp_size", int),
    ("--awq_block_size", int),
    ("--kv_cache_dtype", str, ["int8", "fp8"]),
    ("--quantize_lm_head", "flag"),
    ("--num_medusa_heads", int),
    ("--num_medusa_layers", int),
    ("--max_draft_len", int),
    ("--medusa_hidden_act", str),
    ("--medusa_model_dir", str),
    ("--quant_medusa_head", "flag"),
    ("--autoq_format", str),
    ("--auto_quantize_bits", float),
    ("--export_format", str, ["tensorrt_llm", "hf"]),
]
REDRAFTER = [
    ("--base_model_checkpoint_dir", str),
    ("--drafter_model_dir", str),
    ("--tp_size", int),
    ("--dtype", str, ["float32", "bfloat16", "float16"]),
    (("--storage-type", "-t"), str, ["fp32", "fp16"]),
    ("--load_model_on_cpu", "flag"),
    ("--use_parallel_embedding", "flag"),
    ("--embedding_sharding_dim", int, [0, 1]),
    ("--output_dir", str),
    ("--workers", int),
    ("--dense_context_fmha", "flag"),
    ("--redrafter_draft_len_per_beam", int),
    ("--redrafter_num_beams", int),
    ("--redrafter_no_greedy_search", "false", "redrafter_greedy_search"),
]
_PLUGIN_DTYPES = ["auto", "float16", "float32", "bfloat16", "int32", "disable"]
_ENABLE = ["enable", "disable"]
TRTLLM_BUILD = [
    ("--checkpoint_dir", str),
    ("--model_config", str),
    ("--build_config", str),
    ("--model_cls_file", str),
    ("--model_cls_name", str),
    ("--output_dir", str),
    ("--max_batch_size", int),
    ("--max_input_len", int),
    (("--max_seq_len", "--max_decoder_seq_len"), int),
    ("--max_beam_width", int),
    ("--max_num_tokens", int),
    ("--opt_num_tokens", int),
    ("--max_encoder_input_len", int),
    (("--max_prompt_embedding_table_size", "--max_multimodal_len"), int),
    ("--kv_cache_type", str, ["continuous", "paged", "disabled"]),
    ("--paged_kv_cache", str),
    ("--input_timing_cache", str),
    ("--output_timing_cache", str),
    ("--profiling_verbosity", str, ["layer_names_only", "detailed", "none"]),
    ("--strip_plan", "flag"),
    ("--weight_sparsity", "flag"),
    ("--weight_streaming", "flag"),
    ("--fast_build", "flag"),
    ("--workers", int),
    ("--log_level", str),
    ("--enable_debug_output", "flag"),
    ("--visualize_network", str),
    ("--dry_run", "flag"),
    ("--monitor_memory", "flag"),
    ("--logits_dtype", str, ["float16", "float32"]),
    ("--gather_context_logits", "flag"),
    ("--gather_generation_logits", "flag"),
    ("--gather_all_token_logits", "flag"),
    ("--lora_dir", "nargs+"),
    ("--lora_ckpt_source", str, ["hf", "nemo"]),
    ("--lora_target_modules", "nargs+"),
    ("--max_lora_rank", int),
    (
        "--speculative_decoding_mode",
        str,
        ["draft_tokens_external", "lookahead_decoding", "medusa", "explicit_draft_tokens", "eagle"],
    ),
    ("--max_draft_len", int),
    # no auto-parallel group (--auto_parallel, --gpus_per_node, --cluster_key): build.py at the pinned 1.2.1
    # line (NVIDIA/TensorRT-LLM 65f1d1536e18aea3380e6e270e00895a709333eb) no longer defines it
    # plugin.add_plugin_argument (cli_plugin_args)
    ("--bert_attention_plugin", str, _PLUGIN_DTYPES),
    ("--gpt_attention_plugin", str, _PLUGIN_DTYPES),
    ("--gemm_plugin", str, ["auto", "float16", "float32", "bfloat16", "int32", "fp8", "nvfp4", "disable"]),
    ("--gemm_swiglu_plugin", str, ["fp8", "disable"]),
    ("--fp8_rowwise_gemm_plugin", str, _PLUGIN_DTYPES),
    ("--lora_plugin", str, _PLUGIN_DTYPES),
    ("--dora_plugin", str, _ENABLE),
    ("--moe_plugin", str, _PLUGIN_DTYPES),
    ("--mamba_conv1d_plugin", str, _PLUGIN_DTYPES),
    ("--nccl_plugin", str, _PLUGIN_DTYPES),
    ("--low_latency_gemm_plugin", str, ["fp8", "disable"]),
    ("--low_latency_gemm_swiglu_plugin", str, ["fp8", "disable"]),
    ("--gemm_allreduce_plugin", str, ["float16", "bfloat16", "disable"]),
    ("--context_fmha", str, _ENABLE),
    ("--bert_context_fmha_fp32_acc", str, _ENABLE),
    ("--remove_input_padding", str, _ENABLE),
    ("--tokens_per_block", int),
    ("--use_paged_context_fmha", str, _ENABLE),
    ("--use_fp8_context_fmha", str, _ENABLE),
    ("--fuse_fp4_quant", str, _ENABLE),
    ("--multiple_profiles", str, _ENABLE),
    ("--paged_state", str, _ENABLE),
    ("--streamingllm", str, _ENABLE),
    ("--norm_quant_fusion", str, _ENABLE),
    ("--reduce_fusion", str, _ENABLE),
    ("--user_buffer", str, _ENABLE),
    ("--use_fused_mlp", str, _ENABLE),
    ("--pp_reduce_scatter", str, _ENABLE),
]

#: tensorrt_llm checkpoint architecture produced per HF architecture
HF_TO_TLLM = {
    "LlamaForCausalLM": "LlamaForCausalLM",
    "QWenLMHeadModel": "QWenForCausalLM",
    "Qwen2ForCausalLM": "Qwen2ForCausalLM",
}
#: examples/redrafter/convert_checkpoint.py REDRAFTER_MAP
REDRAFTER_MAP = {
    "QWenForCausalLM": "ReDrafterForQWenLM",
    "Qwen2ForCausalLM": "ReDrafterForQWenLM",
    "LlamaForCausalLM": "ReDrafterForLLaMALM",
}
MODEL_MAP = set(HF_TO_TLLM.values()) | set(REDRAFTER_MAP.values())


def parse(tool: str, spec: list[tuple], required: tuple[str, ...] = ()) -> argparse.Namespace:
    _log_invocation(tool)
    p = argparse.ArgumentParser(prog=tool)
    _add(p, spec)
    args = p.parse_args()
    for name in required:
        if getattr(args, name) is None:
            p.error(f"the following arguments are required: --{name}")
    if os.environ.get("FAKE_TRTLLM_FAIL") == tool:
        fail(tool, "RuntimeError: [TensorRT-LLM][ERROR] CUDA out of memory (simulated by the test double)")
    return args


def _log_invocation(tool: str) -> None:
    path = os.environ.get("FAKE_TRTLLM_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"tool": tool, "argv": sys.argv[1:], "env": dict(os.environ)}) + "\n")


def fail(tool: str, message: str) -> None:
    print(f"[{tool}] starting", flush=True)
    print('Traceback (most recent call last):\n  File "<fake>", line 1, in <module>', file=sys.stderr)
    print(message, file=sys.stderr, flush=True)
    sys.exit(1)


def read_json(path: Path, tool: str) -> dict:
    if not path.is_file():
        fail(tool, f"FileNotFoundError: [Errno 2] No such file or directory: '{path}'")
    return json.loads(path.read_text())


def hf_architecture(model_dir: str, tool: str) -> str:
    config = read_json(Path(model_dir, "config.json"), tool)
    arch = (config.get("architectures") or [""])[0]
    if arch not in HF_TO_TLLM:
        fail(tool, f"NotImplementedError: unsupported architecture {arch}")
    return HF_TO_TLLM[arch]


def write_checkpoint(out: str, config: dict, tp: int) -> None:
    Path(out).mkdir(parents=True, exist_ok=True)
    Path(out, "config.json").write_text(json.dumps(config, indent=2))
    for rank in range(tp):
        Path(out, f"rank{rank}.safetensors").write_bytes(b"\0" * 4096)
    print(f"Total time of converting checkpoints: 00:00:00 ({tp} rank(s) -> {out})", flush=True)


def checkpoint_config(arch: str, dtype: str, tp: int, quant_algo: str | None) -> dict:
    return {
        "architecture": arch,
        "dtype": dtype,
        "mapping": {"world_size": tp, "tp_size": tp, "pp_size": 1},
        "quantization": {"quant_algo": quant_algo, "kv_cache_quant_algo": None, "exclude_modules": []},
    }


def sleep_if_asked() -> None:
    started = os.environ.get("FAKE_TRTLLM_STARTED")
    if started:
        Path(started).write_text(str(os.getpid()))
    seconds = float(os.environ.get("FAKE_TRTLLM_SLEEP", "0") or 0)
    if seconds:
        time.sleep(seconds)
