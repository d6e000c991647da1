"""The training worker: distill -> train -> evaluate -> write the drafter directory.

``python -m engine_jobs.drafter --base DIR --prompts FILE.jsonl --recipe JSON --out DIR --progress FILE``,
one process, or one per GPU under ``torchrun`` (ranks share the distillation and the training; rank 0
evaluates and writes). ``--progress`` is rewritten atomically (TrainingProgress as JSON, at most once a
second): while distilling, step counts prompts; while training, optimizer steps. A known failure exits
with its :class:`~engine_jobs.errors.ExitCode` and a ``<CODE>: <reason>`` line on stderr.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

from ..cache import write_json_atomic
from ..contract import (
    DRAFTER_CURVES_FILE,
    DRAFTER_EVALUATION_FILE,
    DrafterRecipe,
)
from ..errors import BuildError, bad_input, format_termination_message
from .baselines import loop_figures, prompt_lookup_counts, summary_line

#: curves.json keeps at most this many points (evenly subsampled, the last step always kept)
MAX_CURVE_POINTS = 1000
#: teacher-forced figures (training against held-out) this many times over the training, and before it
CURVE_EVALUATIONS = 10
#: the training-side teacher-forced figures use at least this many training sequences
MIN_TRAIN_SUBSET = 16
#: loop figures compare the base's responses and the prompts over their first this many tokens
LOOP_LENGTH = 32
PROGRESS_INTERVAL_S = 1.0


def log(message: str) -> None:
    print(f"drafter: {message}", file=sys.stderr, flush=True)


class Progress:
    """Writes TrainingProgress JSON atomically (tmp + rename), throttled; only rank 0 writes."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.phase = ""
        self.last = 0.0

    def __call__(
        self, phase: str, step: int = 0, total: int = 0, loss: float | None = None, force: bool = False
    ) -> None:
        now = time.monotonic()
        if self.path is None or (phase == self.phase and not force and now - self.last < PROGRESS_INTERVAL_S):
            return
        self.phase, self.last = phase, now
        write_json_atomic(self.path, {"phase": phase, "step": step, "totalSteps": total, "loss": loss})


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m engine_jobs.drafter", description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, type=Path, help="the base model (a transformers checkpoint)")
    parser.add_argument("--prompts", required=True, type=Path, help='JSONL, one {"text": ...} per line')
    parser.add_argument("--recipe", required=True, help="DrafterRecipe as JSON")
    parser.add_argument("--out", required=True, type=Path, help="where the drafter directory is written")
    parser.add_argument("--progress", type=Path, default=None, help="progress file (TrainingProgress JSON)")
    return parser.parse_args(argv)


def split_prompts(prompts: list[str], fraction: float, seed: int) -> tuple[list[str], list[str]]:
    """(train, held out): a seeded shuffle; at least one held out when there are two or more prompts."""
    order = list(range(len(prompts)))
    random.Random(seed).shuffle(order)
    held = min(len(prompts) - 1, max(1, round(len(prompts) * fraction))) if len(prompts) >= 2 else 0
    return [prompts[i] for i in sorted(order[held:])], [prompts[i] for i in sorted(order[:held])]


def subsample(curve: list[dict[str, float]], limit: int = MAX_CURVE_POINTS) -> list[dict[str, float]]:
    if len(curve) <= limit:
        return curve
    stride = len(curve) / limit
    picked = [curve[int(i * stride)] for i in range(limit - 1)]
    return [*picked, curve[-1]]


def baseline_figures(held: list[Any], draft_len: int) -> dict[str, Any]:
    """Prompt lookup's acceptance on the base's held-out greedy responses, and the loop figures of those
    responses against the held-out prompts' own tokens (real text) at the same length."""
    if not held:
        return {"promptLookupAcceptance": None, "promptLookupTokensPerStep": None, "baseOutput": None, "text": None}
    prompts = [s.ids[: s.prompt_len] for s in held]
    responses = [s.ids[s.prompt_len :] for s in held]
    lookup = prompt_lookup_counts(prompts, responses, draft_len)
    return {
        "promptLookupAcceptance": round(lookup.acceptance, 6),
        "promptLookupTokensPerStep": round(lookup.tokens_per_step, 6),
        "baseOutput": loop_figures(responses, LOOP_LENGTH),
        "text": loop_figures(prompts, LOOP_LENGTH),
    }


def run(args: argparse.Namespace) -> dict[str, Any] | None:
    import torch

    from . import distill, train
    from .evaluate import evaluate
    from .export import save_drafter
    from .model import DrafterConfig, ReDrafterHead
    from .prompts import load_prompts

    try:
        recipe = DrafterRecipe.model_validate_json(args.recipe)
    except ValueError as exc:
        raise bad_input(f"--recipe is not a DrafterRecipe: {' '.join(str(exc).split())[:300]}") from None
    dist = train.init_distributed()
    progress = Progress(args.progress if dist.main else None)
    random.seed(recipe.seed)
    torch.manual_seed(recipe.seed)
    prompts = load_prompts(args.prompts, "text", sys.maxsize)
    train_prompts, held_out = split_prompts(prompts, recipe.held_out_fraction, recipe.seed)

    progress("distilling", 0, len(train_prompts), force=True)
    started = time.monotonic()
    base, tokenizer = distill.load_base(args.base, dist.device)
    ids = [p for p in distill.tokenize(tokenizer, train_prompts) if p]
    if not ids:
        raise bad_input(f"no prompt in {args.prompts} has a token")
    pad = distill.pad_id(tokenizer)
    mine = list(range(dist.rank, len(ids), dist.world))  # each rank generates its share

    def on_batch(finished: int, total: int) -> None:
        progress("distilling", finished * dist.world, len(ids))

    samples = distill.generate(
        base, [ids[i] for i in mine], recipe.response_len, tokenizer.eos_token_id, pad, 32, on_batch
    )
    if dist.world > 1:
        import torch.distributed as tdist

        gathered: list[Any] = [None] * dist.world
        tdist.all_gather_object(gathered, [(i, s.ids, s.prompt_len) for i, s in zip(mine, samples, strict=True)])
        by_index = {i: distill.Sample(ids=seq, prompt_len=p) for part in gathered for i, seq, p in part}
        samples = [by_index[i] for i in range(len(ids))]
    samples = [samples[i] for i in train.shard(len(samples), dist, recipe.seed)]
    distill.attach_hidden(base, samples, pad)
    held_samples: list[distill.Sample] = []
    if dist.main and held_out:  # the base's greedy responses on held-out prompts: teacher-forced figures
        held_ids = [p for p in distill.tokenize(tokenizer, held_out) if p]
        held_samples = distill.generate(base, held_ids, recipe.response_len, tokenizer.eos_token_id, pad, 32)
        distill.attach_hidden(base, held_samples, pad)
    if dist.main:
        log(f"distilled {len(ids)} prompts x {recipe.response_len} tokens in {time.monotonic() - started:.1f} s")
        started = time.monotonic()

    embedding = base.get_input_embeddings().weight.detach()
    hidden = int(base.config.hidden_size)
    config = DrafterConfig(
        hidden_size=hidden,
        exit_dim=recipe.exit_dim or 2 * hidden,
        num_draft_layers=recipe.layers,
        rnn=recipe.rnn,
        vocab_size=int(embedding.shape[0]),
    )
    torch.manual_seed(recipe.seed)
    head = ReDrafterHead(config)
    untrained = copy.deepcopy(head).eval()
    settings = train.TrainConfig(
        draft_len=recipe.draft_len,
        learning_rate=recipe.learning_rate,
        batch_size=recipe.batch_size,
        epochs=recipe.epochs,
        max_steps=recipe.max_steps,
        seed=recipe.seed,
    )
    progress("training", 0, train.total_steps(len(samples), settings), force=True)

    total = train.total_steps(len(samples), settings)
    every = max(1, total // CURVE_EVALUATIONS)
    train_subset = samples[: max(len(held_samples), MIN_TRAIN_SUBSET)]
    evaluations: list[dict[str, Any]] = []

    def teacher_forced(step: int) -> None:
        if held_samples:
            evaluations.append(
                {
                    "step": step,
                    "train": train.teacher_forced(head, train_subset, embedding, recipe.draft_len),
                    "heldOut": train.teacher_forced(head, held_samples, embedding, recipe.draft_len),
                }
            )

    def on_step(step: int, total: int, loss: float) -> None:
        progress("training", step, total, loss, force=step == total)
        if dist.main and (step % every == 0 or step == total):
            teacher_forced(step)

    if dist.main:
        teacher_forced(0)
    curve = train.train_head(head, samples, embedding, settings, dist, on_step)
    if not dist.main:
        return None
    log(f"trained {len(curve)} steps in {time.monotonic() - started:.1f} s")
    started = time.monotonic()

    steps = len(curve)
    per_epoch = max(1, -(-len(samples) // recipe.batch_size))
    last = [p["loss"] for p in curve[-per_epoch:]]
    final_loss = sum(last) / len(last) if last else None
    progress("evaluating", steps, steps, final_loss, force=True)
    trained_eval = untrained_eval = None
    if held_out:
        common = {"draft_len": recipe.draft_len, "beams": recipe.eval_beams, "max_new_tokens": recipe.response_len}
        trained_eval = evaluate(base, tokenizer, head, held_out, **common)
        untrained_eval = evaluate(base, tokenizer, untrained, held_out, **common)
    newest = evaluations[-1] if evaluations else None
    evaluation = {
        "heldOutAcceptance": trained_eval and round(trained_eval["acceptance"], 6),
        "untrainedAcceptance": untrained_eval and round(untrained_eval["acceptance"], 6),
        "tokensPerStep": trained_eval and round(trained_eval["tokens_per_step"], 6),
        "untrainedTokensPerStep": untrained_eval and round(untrained_eval["tokens_per_step"], 6),
        **baseline_figures(held_samples, recipe.draft_len),
        "heldOutLoss": newest and newest["heldOut"]["loss"],
        "trainLoss": newest and newest["train"]["loss"],
        "heldOutTop1": newest and newest["heldOut"]["top1"],
        "trainTop1": newest and newest["train"]["top1"],
        "heldOutPrompts": len(held_out),
        "steps": steps,
        "loss": None if final_loss is None else round(final_loss, 6),
        "draftLen": recipe.draft_len,
        "beams": recipe.eval_beams,
    }
    log(f"evaluated {len(held_out)} held-out prompts in {time.monotonic() - started:.1f} s")
    log(summary_line(evaluation))
    out: Path = args.out
    save_drafter(head, config.to_json(), out)
    curves = {"loss": subsample(curve), "teacherForced": evaluations}
    (out / DRAFTER_CURVES_FILE).write_text(json.dumps(curves), encoding="utf-8")
    (out / DRAFTER_EVALUATION_FILE).write_text(json.dumps(evaluation, indent=2) + "\n", encoding="utf-8")
    progress("evaluating", steps, steps, final_loss, force=True)
    return evaluation


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        evaluation = run(args)
    except BuildError as exc:
        print(format_termination_message(exc.code, exc.reason, exc.detail), file=sys.stderr)
        return int(exc.code)
    if evaluation is not None:
        print(json.dumps(evaluation), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
