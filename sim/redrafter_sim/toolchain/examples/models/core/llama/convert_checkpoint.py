# TEST DOUBLE: stand-in for TensorRT-LLM's examples/models/core/llama/convert_checkpoint.py (see ../fakelib.py). Never used in production.
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
import fakelib  # noqa: E402

args = fakelib.parse("llama/convert_checkpoint.py", fakelib.LLAMA)
if args.model_dir is None:
    fakelib.fail("llama/convert_checkpoint.py", "AssertionError: --model_dir or --meta_ckpt_dir is required")
arch = fakelib.hf_architecture(args.model_dir, "llama/convert_checkpoint.py")
if arch != "LlamaForCausalLM":
    fakelib.fail("llama/convert_checkpoint.py", f"ValueError: {arch} is not a Llama checkpoint")
tp = args.tp_size or 1
fakelib.write_checkpoint(
    args.output_dir or "tllm_checkpoint", fakelib.checkpoint_config(arch, args.dtype or "auto", tp, None), tp
)
