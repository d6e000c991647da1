"""ReDrafter drafting against plain greedy decoding in PyTorch: tokens/s by batch size, and the crossover.

One prepared run: it builds a random Llama (damped blocks, so its continuations are learnable: see
``redrafter_sim.tiny_llama``), distils and trains a head with the worker's own code (engine_jobs.drafter),
then decodes held-out prompts at batch 1, 4, 16 and 64 both ways. Drafting commits several tokens per base
forward but runs ``beams x (1 + draft_len)`` positions through it; as the batch grows the base stops being
latency-bound and plain decoding catches up: the crossover is the smallest batch where greedy's tokens/s
reach drafting's ("none" if drafting stays ahead). It is the figure the speculation policy's cost model
stands for; the engine's own kernels (TensorRT-LLM) move it, this bench does not measure them.

Run: ``python bench/drafting_gpu.py`` (CUDA when available: hidden 1024, 8 layers, vocab 32000;
on a CPU the toy size), ``--toy`` (CPU-sized, about 2 minutes on 2 cores), ``--budget-s`` (default 360:
distillation and training stop early to leave the measurements their share). Prints a table (with the
break-even tokens per drafting step: a drafting step's cost in plain steps, whatever the head), then one JSON
line; nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "sim")]

import torch  # noqa: E402

from engine_jobs.drafter import distill, train  # noqa: E402
from engine_jobs.drafter.drafting import greedy_decode, redrafter_decode  # noqa: E402
from engine_jobs.drafter.model import DrafterConfig, ReDrafterHead  # noqa: E402
from redrafter_sim.tiny_llama import write_tiny_llama  # noqa: E402

BATCHES = (1, 4, 16, 64)
FIRST_WORD = 3  # after the tokenizer's special tokens


@dataclass(frozen=True)
class Size:
    vocab: int
    hidden: int
    layers: int
    prompts: int
    response_len: int
    new_tokens: int
    max_steps: int
    batch: int  # training sequences per step


TOY = Size(vocab=1000, hidden=64, layers=2, prompts=200, response_len=40, new_tokens=32, max_steps=150, batch=8)
GPU = Size(vocab=32000, hidden=1024, layers=8, prompts=1024, response_len=128, new_tokens=128, max_steps=1500, batch=64)


class OutOfTime(Exception):
    pass


def random_prompts(n: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(FIRST_WORD, vocab) for _ in range(rng.randint(4, 12))] for _ in range(n)]


def timed(fn, device: torch.device):
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    result = fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return result, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--toy", action="store_true", help="CPU-sized base and training (about 2 minutes)")
    parser.add_argument("--budget-s", type=float, default=360.0, help="wall-clock budget of the whole run")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--draft-len", type=int, default=5)
    parser.add_argument("--beams", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocab", type=int, help="override the size's vocabulary")
    parser.add_argument("--hidden", type=int, help="override the size's hidden width")
    parser.add_argument("--layers", type=int, help="override the size's layer count")
    parser.add_argument("--prompts", type=int, help="override the size's training prompts")
    parser.add_argument("--steps", type=int, help="override the size's training steps")
    parser.add_argument("--mixing", type=float, help="the base's block damping (default: 0.4 / layers)")
    parser.add_argument("--lr", type=float, default=1e-2)
    args = parser.parse_args()
    started = time.monotonic()
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    size = TOY if args.toy or device.type == "cpu" else GPU
    overrides = {"vocab": args.vocab, "hidden": args.hidden, "layers": args.layers, "prompts": args.prompts}
    size = replace(size, max_steps=args.steps or size.max_steps, **{k: v for k, v in overrides.items() if v})
    # the blocks' total mixing stays that of the 2-layer toy at 0.2, so deeper bases stay near-bigram
    mixing = args.mixing if args.mixing is not None else 0.4 / size.layers
    torch.manual_seed(args.seed)

    with tempfile.TemporaryDirectory() as tmp:
        write_tiny_llama(
            Path(tmp) / "base",
            vocab_size=size.vocab,
            hidden=size.hidden,
            layers=size.layers,
            seed=args.seed,
            mixing=mixing,
        )
        base, tokenizer = distill.load_base(Path(tmp) / "base", device)
    prompts = random_prompts(size.prompts + max(BATCHES), size.vocab, args.seed)
    train_prompts, held_out = prompts[: size.prompts], prompts[size.prompts :]

    t0 = time.monotonic()
    samples = []
    for start in range(0, len(train_prompts), 64):  # stop distilling at a quarter of the budget
        samples += distill.generate(base, train_prompts[start : start + 64], size.response_len, None, 0, 64)
        if time.monotonic() - started > 0.25 * args.budget_s:
            break
    distill.attach_hidden(base, samples, 0, 64)
    distill_s = time.monotonic() - t0

    config = DrafterConfig(size.hidden, 2 * size.hidden, 2, True, size.vocab)
    head = ReDrafterHead(config)
    settings = train.TrainConfig(args.draft_len, args.lr, size.batch, 100, size.max_steps, args.seed)

    curve: list[dict[str, float]] = []  # kept when the budget stops training early

    def stop_at_budget(step: int, total: int, loss: float) -> None:
        curve.append({"step": step, "loss": loss})
        if time.monotonic() - started > 0.55 * args.budget_s:
            raise OutOfTime

    t0 = time.monotonic()
    try:
        train.train_head(
            head,
            samples,
            base.get_input_embeddings().weight.detach(),
            settings,
            train.Distributed(device=device),
            stop_at_budget,
        )
    except OutOfTime:
        head.eval()
    train_s = time.monotonic() - t0
    head.to(device)

    rows = []
    for batch in BATCHES:
        if time.monotonic() - started > 0.95 * args.budget_s:
            break
        batch_prompts = [held_out[i % len(held_out)] for i in range(batch)]
        if device.type == "cuda":  # warm-up: kernels and allocator
            greedy_decode(base, batch_prompts, 4)
            redrafter_decode(base, head, batch_prompts, 4, args.draft_len, args.beams)
        plain, greedy_s = timed(lambda: greedy_decode(base, batch_prompts, size.new_tokens), device)
        (drafted, stats), draft_s = timed(
            lambda: redrafter_decode(base, head, batch_prompts, size.new_tokens, args.draft_len, args.beams), device
        )
        tokens = sum(len(t) for t in plain)
        rows.append(
            {
                "batch": batch,
                "greedy_tok_s": round(tokens / greedy_s, 1),
                "drafting_tok_s": round(sum(len(t) for t in drafted) / draft_s, 1),
                "tokens_per_step": round(stats.tokens_per_step, 3),
                # tokens per drafting step at which drafting would match greedy's tokens/s at this batch:
                # the cost of one drafting step in plain steps (independent of how well the head drafts)
                "break_even_tokens_per_step": round(
                    stats.tokens_per_step * (tokens / greedy_s) / (sum(len(t) for t in drafted) / draft_s), 2
                ),
                "acceptance": round(stats.acceptance, 3),
                "same_tokens": drafted == plain,
            }
        )
    crossover = next((r["batch"] for r in rows if r["greedy_tok_s"] >= r["drafting_tok_s"]), "none")

    print(
        f"device {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}), base hidden "
        f"{size.hidden} x {size.layers} layers (mixing {mixing:g}), vocab {size.vocab}; draft_len {args.draft_len}, beams {args.beams}"
    )
    print(
        f"distilled {len(samples)} prompts x {size.response_len} tokens in {distill_s:.1f} s; trained "
        f"{len(curve)} steps in {train_s:.1f} s (loss {curve[0]['loss'] if curve else float('nan'):.3f} -> "
        f"{curve[-1]['loss'] if curve else float('nan'):.3f})"
    )
    print(
        f"{'batch':>5} {'greedy tok/s':>13} {'drafting tok/s':>15} {'speedup':>8} {'tok/step':>9} "
        f"{'break-even':>10} {'accept':>7} same"
    )
    for r in rows:
        speedup = r["drafting_tok_s"] / r["greedy_tok_s"] if r["greedy_tok_s"] else float("nan")
        print(
            f"{r['batch']:>5} {r['greedy_tok_s']:>13.1f} {r['drafting_tok_s']:>15.1f} {speedup:>8.2f} "
            f"{r['tokens_per_step']:>9.3f} {r['break_even_tokens_per_step']:>10.2f} {r['acceptance']:>7.3f} "
            f"{r['same_tokens']}"
        )
    print(f"crossover batch (greedy >= drafting): {crossover}; total {time.monotonic() - started:.0f} s")
    summary = {
        "device": str(device),
        "hidden": size.hidden,
        "layers": size.layers,
        "vocab": size.vocab,
        "draft_len": args.draft_len,
        "beams": args.beams,
        "train_steps": len(curve),
        "rows": rows,
        "crossover": crossover,
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
