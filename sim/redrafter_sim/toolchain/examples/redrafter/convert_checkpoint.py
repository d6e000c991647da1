# TEST DOUBLE: stand-in for TensorRT-LLM's examples/redrafter/convert_checkpoint.py (see ../fakelib.py). Never used in production.
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import fakelib  # noqa: E402

TOOL = "redrafter/convert_checkpoint.py"
args = fakelib.parse(TOOL, fakelib.REDRAFTER, required=("base_model_checkpoint_dir", "drafter_model_dir"))
base = fakelib.read_json(Path(args.base_model_checkpoint_dir, "config.json"), TOOL)
if base["architecture"] not in fakelib.REDRAFTER_MAP:
    fakelib.fail(TOOL, f"KeyError: '{base['architecture']}'")
drafter = fakelib.read_json(Path(args.drafter_model_dir, "config.json"), TOOL)
for key in ("hidden_size", "exit_dim", "num_draft_layers", "rnn"):
    if key not in drafter:
        fakelib.fail(TOOL, f"AttributeError: 'Namespace' object has no attribute '{key}'")
if Path(args.drafter_model_dir, "model.safetensors").is_file():
    # hf_drafter reads each tensor by name and splits it by shape: a head with other names or shapes fails there
    from engine_jobs.drafter.export import check_drafter_dir

    try:
        check_drafter_dir(args.drafter_model_dir)
    except ValueError as exc:
        fakelib.fail(TOOL, f"KeyError: {exc}")
elif not Path(args.drafter_model_dir, "model.pt").is_file():
    fakelib.fail(TOOL, f"FileNotFoundError: {args.drafter_model_dir}/model.pt")
tp = args.tp_size or 1
for rank in range(tp):  # the real converter opens rank<r>.safetensors of the base checkpoint per rank
    if not Path(args.base_model_checkpoint_dir, f"rank{rank}.safetensors").is_file():
        fakelib.fail(TOOL, f"FileNotFoundError: No such file: rank{rank}.safetensors")
config = dict(
    base,
    base_model_architecture=base["architecture"],
    architecture=fakelib.REDRAFTER_MAP[base["architecture"]],
    redrafter_num_layers=drafter["num_draft_layers"],
    redrafter_hidden_size=drafter["hidden_size"],
    redrafter_exit_dim=drafter["exit_dim"],
    redrafter_is_rnn=drafter["rnn"],
    redrafter_num_beams=args.redrafter_num_beams or 5,
    redrafter_draft_len_per_beam=args.redrafter_draft_len_per_beam or 5,
    redrafter_greedy_search=args.redrafter_greedy_search,
)
fakelib.write_checkpoint(args.output_dir or "tllm_checkpoint", config, tp)
