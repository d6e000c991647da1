# TEST DOUBLE: stand-in for TensorRT-LLM's examples/models/core/qwen/convert_checkpoint.py (see ../fakelib.py). Never used in production.
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
import fakelib  # noqa: E402

args = fakelib.parse("qwen/convert_checkpoint.py", fakelib.QWEN, required=("model_dir",))
arch = fakelib.hf_architecture(args.model_dir, "qwen/convert_checkpoint.py")
if arch not in ("QWenForCausalLM", "Qwen2ForCausalLM"):
    fakelib.fail("qwen/convert_checkpoint.py", f"ValueError: {arch} is not a Qwen checkpoint")
tp = args.tp_size or 1
fakelib.write_checkpoint(
    args.output_dir or "tllm_checkpoint", fakelib.checkpoint_config(arch, args.dtype or "auto", tp, None), tp
)
