# TEST DOUBLE: stand-in for TensorRT-LLM's examples/quantization/quantize.py (see ../fakelib.py). Never used in production.
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import fakelib  # noqa: E402

args = fakelib.parse("quantization/quantize.py", fakelib.QUANTIZE)
if args.model_dir is None:
    fakelib.fail(
        "quantization/quantize.py", "ValueError: One of source checkpoint (model_dir, nemo_ckpt_path) must be specified"
    )
if args.qformat != "fp8":
    fakelib.fail(
        "quantization/quantize.py", f"ValueError: this test double only models --qformat fp8, got {args.qformat}"
    )
arch = fakelib.hf_architecture(args.model_dir, "quantization/quantize.py")
tp = args.tp_size or 1
fakelib.write_checkpoint(
    args.output_dir or "exported_model", fakelib.checkpoint_config(arch, args.dtype or "auto", tp, "FP8"), tp
)
