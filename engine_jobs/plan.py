"""Pure planning: (BuildSpec, Settings, architecture, directories) -> ordered steps with exact argv.

Follows TensorRT-LLM's examples/redrafter/README.md flag for flag: the base checkpoint is converted by
its own architecture's converter (or quantize.py for FP8), the ReDrafter converter adds the drafter
(``--base_model_checkpoint_dir``), and ``trtllm-build`` builds with
``--speculative_decoding_mode explicit_draft_tokens``. The base variant stops after the base
conversion and builds it plainly with the same limits. Nothing here touches the filesystem.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from typing import Any, Literal

from .contract import BuildSpec
from .errors import bad_input
from .settings import Settings

Architecture = Literal["llama", "qwen"]

#: HF ``architectures`` entries -> converter family. ReDrafter's converter maps exactly these TensorRT-LLM
#: base classes (LlamaForCausalLM, QWenForCausalLM, Qwen2ForCausalLM), which these HF classes convert to.
HF_ARCHITECTURES: dict[str, Architecture] = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen",  # Qwen1.5, Qwen2, Qwen2.5
}
#: HF ``model_type`` -> converter family (used when ``architectures`` is absent)
HF_MODEL_TYPES: dict[str, Architecture] = {"llama": "llama", "qwen2": "qwen"}
#: Qwen v1 converts (TensorRT-LLM maps QWenLMHeadModel), but its tokenizer is remote code
#: (tokenization_qwen.py via auto_map): serving it needs trust_remote_code, which the pre/post-processing
#: models never enable. Refused up front rather than after GPU time is spent.
QWEN_V1_ARCHITECTURE = "QWenLMHeadModel"
QWEN_V1_MODEL_TYPE = "qwen"
QWEN_V1_REFUSED = (
    "Qwen v1 (QWenLMHeadModel) needs trust_remote_code tokenizers, which this operator does not run; use Qwen2/Qwen2.5"
)

#: converter script per family, relative to the examples root
CONVERTERS: dict[Architecture, str] = {
    "llama": "models/core/llama/convert_checkpoint.py",
    "qwen": "models/core/qwen/convert_checkpoint.py",
}
QUANTIZE_SCRIPT = "quantization/quantize.py"
REDRAFTER_CONVERTER = "redrafter/convert_checkpoint.py"

#: an engine key names a directory on the shared volume: no separators, no dot-files
KEY_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")

BASE_CKPT = "base_ckpt"
REDRAFTER_CKPT = "redrafter_ckpt"


@dataclass(frozen=True)
class Step:
    """One subprocess of the build."""

    name: str
    argv: tuple[str, ...]
    output_dir: str  # what the step produces (its size is logged and recorded)
    description: str


@dataclass(frozen=True)
class Layout:
    """Where the inputs are and where the steps write (all absolute paths)."""

    base_model_dir: str
    drafter_model_dir: str | None
    work_dir: str  # intermediate checkpoints, removed before publishing
    engine_dir: str  # trtllm-build output inside the artifact being assembled


def detect_architecture(config: dict[str, Any], where: str = "base config.json") -> Architecture:
    """Converter family from an HF config.json; anything but Llama or Qwen2/Qwen2.5 is bad input."""
    archs = config.get("architectures") or []
    if not isinstance(archs, list):
        archs = [archs]
    if QWEN_V1_ARCHITECTURE in archs or (not archs and config.get("model_type") == QWEN_V1_MODEL_TYPE):
        raise bad_input(f"{QWEN_V1_REFUSED} ({where})")
    for arch in archs:
        if arch in HF_ARCHITECTURES:
            return HF_ARCHITECTURES[arch]
    model_type = config.get("model_type")
    if not archs and model_type in HF_MODEL_TYPES:
        return HF_MODEL_TYPES[model_type]
    found = ", ".join(map(str, archs)) or f"model_type={model_type!r}"
    raise bad_input(
        f"unsupported base architecture in {where}: {found}; ReDrafter in TensorRT-LLM supports "
        f"{', '.join(HF_ARCHITECTURES)}"
    )


def resolve_architecture(requested: str, config: dict[str, Any] | None) -> Architecture:
    """``auto`` reads config.json; an explicit choice must not contradict it."""
    if requested == "auto":
        if config is None:
            raise bad_input("architecture is auto but the base model has no readable config.json")
        return detect_architecture(config)
    if config is not None:
        detected = detect_architecture(config)
        if detected != requested:
            raise bad_input(f"spec says architecture {requested} but the base config.json is {detected}")
    return requested  # type: ignore[return-value]


def gemm_plugin(spec: BuildSpec) -> str:
    """README: ``--gemm_plugin <dtype>``, and ``fp8`` for an FP8-quantized base."""
    return "fp8" if spec.quantization == "fp8" else spec.dtype


def _script(settings: Settings, rel: str) -> str:
    return posixpath.join(settings.examples_root, rel)


def base_conversion(spec: BuildSpec, settings: Settings, arch: Architecture, layout: Layout) -> Step:
    out = posixpath.join(layout.work_dir, BASE_CKPT)
    tp = str(spec.tensor_parallel)
    if spec.quantization == "fp8":
        argv = [
            settings.python,
            _script(settings, QUANTIZE_SCRIPT),
            "--model_dir",
            layout.base_model_dir,
            "--dtype",
            spec.dtype,
            "--qformat",
            "fp8",
            "--output_dir",
            out,
            "--tp_size",
            tp,
            "--calib_size",
            str(settings.fp8_calib_size),
        ]
        if settings.fp8_calib_dataset:
            argv += ["--calib_dataset", settings.fp8_calib_dataset]
        return Step(
            "quantize-base", tuple(argv), out, f"FP8-quantize the {arch} base into a TensorRT-LLM checkpoint (TP {tp})"
        )
    argv = [
        settings.python,
        _script(settings, CONVERTERS[arch]),
        "--model_dir",
        layout.base_model_dir,
        "--output_dir",
        out,
        "--dtype",
        spec.dtype,
        "--tp_size",
        tp,
    ]
    return Step("convert-base", tuple(argv), out, f"convert the {arch} base to a TensorRT-LLM checkpoint (TP {tp})")


def redrafter_conversion(spec: BuildSpec, settings: Settings, layout: Layout) -> Step:
    assert spec.redrafter is not None and layout.drafter_model_dir is not None
    r = spec.redrafter
    out = posixpath.join(layout.work_dir, REDRAFTER_CKPT)
    argv = [
        settings.python,
        _script(settings, REDRAFTER_CONVERTER),
        "--base_model_checkpoint_dir",
        posixpath.join(layout.work_dir, BASE_CKPT),
        "--drafter_model_dir",
        layout.drafter_model_dir,
        "--output_dir",
        out,
        "--dtype",
        spec.dtype,
        "--tp_size",
        str(spec.tensor_parallel),
        "--redrafter_num_beams",
        str(r.num_beams),
        "--redrafter_draft_len_per_beam",
        str(r.draft_len_per_beam),
    ]
    if not r.greedy_search:
        argv.append("--redrafter_no_greedy_search")
    return Step(
        "convert-redrafter",
        tuple(argv),
        out,
        f"add the drafter ({r.num_beams} beams x {r.draft_len_per_beam} tokens, "
        f"{'greedy' if r.greedy_search else 'sampled'})",
    )


def engine_build(spec: BuildSpec, settings: Settings, checkpoint_dir: str, layout: Layout) -> Step:
    lim = spec.limits
    argv = [
        settings.trtllm_build,
        "--checkpoint_dir",
        checkpoint_dir,
        "--output_dir",
        layout.engine_dir,
        "--gemm_plugin",
        gemm_plugin(spec),
    ]
    if spec.variant == "redrafter":
        argv += ["--speculative_decoding_mode", "explicit_draft_tokens"]
    argv += [
        "--max_beam_width",
        "1",
        "--kv_cache_type",
        "paged",
        "--max_batch_size",
        str(lim.max_batch_size),
        "--max_input_len",
        str(lim.max_input_len),
        "--max_seq_len",
        str(lim.max_seq_len),
        "--max_num_tokens",
        str(lim.max_num_tokens),
        # explicit both ways: the default changed between TensorRT-LLM releases
        "--use_paged_context_fmha",
        "enable" if lim.paged_context_fmha else "disable",
        # one worker per GPU of the Job (it requests tensor_parallel GPUs)
        "--workers",
        str(spec.tensor_parallel),
    ]
    return Step(
        "trtllm-build",
        tuple(argv),
        layout.engine_dir,
        f"build the {spec.variant} engine ({spec.tensor_parallel} rank(s))",
    )


def plan_steps(spec: BuildSpec, settings: Settings, arch: Architecture, layout: Layout) -> list[Step]:
    """The ordered subprocesses that turn the fetched checkpoints into ``layout.engine_dir``."""
    validate_spec(spec)
    base = base_conversion(spec, settings, arch, layout)
    if spec.variant == "base":
        return [base, engine_build(spec, settings, base.output_dir, layout)]
    redrafter = redrafter_conversion(spec, settings, layout)
    return [base, redrafter, engine_build(spec, settings, redrafter.output_dir, layout)]


def validate_location(spec: BuildSpec) -> None:
    """The key and cache directory name a path on the shared volume: check them before they become one."""
    if not KEY_PATTERN.fullmatch(spec.key):
        raise bad_input(f"engine key {spec.key!r} is not a plain directory name")
    if not posixpath.isabs(spec.cache_dir):
        raise bad_input(f"cache_dir {spec.cache_dir!r} must be an absolute path")


def validate_spec(spec: BuildSpec) -> None:
    """Cross-field rules the contract's types cannot express."""
    validate_location(spec)
    if spec.variant == "redrafter" and (spec.drafter is None or spec.redrafter is None):
        raise bad_input("the redrafter variant needs both drafter and redrafter in the build spec")
    if spec.tensor_parallel < 1:
        raise bad_input(f"tensor_parallel must be at least 1, got {spec.tensor_parallel}")
    lim = spec.limits
    if lim.max_input_len >= lim.max_seq_len:
        raise bad_input("max_input_len must be less than max_seq_len")
    if lim.max_num_tokens < lim.max_batch_size:
        raise bad_input("max_num_tokens must be at least max_batch_size")


def estimate_required_bytes(spec: BuildSpec, base_bytes: int, drafter_bytes: int, tokenizer_bytes: int) -> int:
    """Peak disk use of one build on the cache volume (intermediates are kept until publishing).

    A converted checkpoint is about the size of a 16-bit source (half for FP8); the ReDrafter
    checkpoint adds the drafter; the engine is about the size of the checkpoint it was built from.
    """
    ckpt = base_bytes // 2 if spec.quantization == "fp8" else base_bytes
    if spec.variant == "base":
        return ckpt * 2 + tokenizer_bytes
    with_drafter = ckpt + drafter_bytes
    return ckpt + with_drafter * 2 + tokenizer_bytes


def expected_engine_files(spec: BuildSpec) -> list[str]:
    """What a complete trtllm-build output contains."""
    return ["config.json", *(f"rank{r}.engine" for r in range(spec.tensor_parallel))]


def estimate_prepared_bytes(base_bytes: int, drafter_bytes: int, tokenizer_bytes: int, moved: frozenset[str]) -> int:
    """Disk the PyTorch path's layout adds to the cache volume: a copy of every source not moved into place
    (``moved``: the roles downloaded onto the cache volume itself, renamed rather than copied), and the
    tokenizer, which is always copied (it is small, and may be the base's own files)."""
    copied = (0 if "base" in moved else base_bytes) + (0 if "drafter" in moved else drafter_bytes)
    return copied + tokenizer_bytes
