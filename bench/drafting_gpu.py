"""ReDrafter on a base that has learned something: pretrain, gate the base, distil, train the head, measure.

One prepared run (at most 12 minutes on one H100 or H200; nothing is downloaded):

1. **Corpus.** Python source found on every machine: the standard library and the interpreter's
   site-packages. Files are held out by a hash of their path (one in ten), so no held-out file is seen by the
   tokenizer, the base or the head. A byte-level BPE tokenizer is trained on the training files (``tokenizers``,
   seconds).
2. **Base.** A small Llama pretrained on the training files for its share of the budget (the learning-rate
   schedule spans the steps the budget allows, measured on the first steps).
3. **Base gate.** Its held-out loss, and its greedy continuations of held-out code against the real
   continuations: distinct-token ratio and 4-grams repeated within 16 tokens. A base whose greedy output
   loops (``#\\n#\\n#...``) makes any drafter look good; one that is chaotic (a random base) makes every
   drafter look useless. Neither says anything about drafting on a real model: a failed gate stops the run
   (``--toy`` and ``--no-gate`` go on, to check the plumbing).
4. **Head.** Distilled on real code chunks of the training files (the worker's own code,
   ``engine_jobs.drafter``), trained for the steps its budget allows.
5. **Drafting on held-out files.** Acceptance and tokens per step of the trained head, against the untrained
   head and against prompt lookup (n-gram copying); teacher-forced top-1 per draft position, training
   against held-out; the operator's drafter gate on those figures.
6. **Tokens/s** of drafting against greedy decoding at batch 1, 4, 16 and 64, and the crossover: the
   smallest batch where greedy's tokens/s reach drafting's ("none" if drafting stays ahead). The *break-even*
   column is the tokens a drafting step must commit to match greedy at that batch (its cost in plain steps,
   whatever the head). The engine's own kernels (TensorRT-LLM) move these figures; this bench runs PyTorch.

Run: ``python bench/drafting_gpu.py`` (CUDA), ``--toy`` (every stage at a CPU size, about a minute on 2 cores:
it checks the plumbing, not the figures). Prints each stage's figures, then one JSON line.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import math
import random
import sys
import sysconfig
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "sim"), str(ROOT / "operator")]

import torch  # noqa: E402

from engine_jobs.drafter import train  # noqa: E402
from engine_jobs.drafter.baselines import loop_figures, prompt_lookup_counts  # noqa: E402
from engine_jobs.drafter.distill import Sample, attach_hidden, generate  # noqa: E402
from engine_jobs.drafter.drafting import greedy_decode, redrafter_decode  # noqa: E402
from engine_jobs.drafter.model import DrafterConfig, ReDrafterHead  # noqa: E402

BATCHES = (1, 4, 16, 64)
SPECIALS = ("<s>", "</s>", "<pad>")
BOS, EOS, PAD = 0, 1, 2
#: one file in HELD_OUT_MODULUS is held out (by a hash of its path relative to its root)
HELD_OUT_MODULUS = 10
#: the base gate: greedy output's distinct-token ratio at least this share of real text's, and its
#: repeated 4-grams at most real text's plus this margin
MIN_DISTINCT_SHARE = 0.6
MAX_EXTRA_REPEATS = 0.2
#: shares of --budget-s: pretraining, distillation, head training (what is left: evaluation and tokens/s)
PRETRAIN_SHARE, DISTILL_SHARE, HEAD_SHARE = 0.40, 0.08, 0.20
#: at least this many optimizer steps for the base and for the head, whatever the budget (a loaded CPU)
MIN_STEPS = 30


@dataclass(frozen=True)
class Size:
    corpus_bytes: int  # training text read (held-out files are read up to a tenth of it)
    vocab: int
    hidden: int
    layers: int
    heads: int
    seq: int  # pretraining window
    batch: int  # pretraining windows per step
    lr: float
    prompts: int  # distillation prompts
    prompt_len: int
    response_len: int
    head_batch: int  # training sequences per head step
    held_out: int  # held-out prompts for acceptance
    new_tokens: int  # tokens per prompt in the tokens/s table


TOY = Size(
    corpus_bytes=800_000,
    vocab=1024,
    hidden=64,
    layers=2,
    heads=4,
    seq=64,
    batch=16,
    lr=3e-3,
    prompts=96,
    prompt_len=24,
    response_len=24,
    head_batch=8,
    held_out=16,
    new_tokens=24,
)
GPU = Size(
    corpus_bytes=48_000_000,
    vocab=16384,
    hidden=512,
    layers=8,
    heads=8,
    seq=256,
    batch=64,
    lr=1e-3,
    prompts=4096,
    prompt_len=64,
    response_len=128,
    head_batch=64,
    held_out=256,
    new_tokens=128,
)


def say(line: str) -> None:
    print(line, flush=True)


# ---- 1. corpus and tokenizer -------------------------------------------------------------------------------


def held_out_file(relative: str) -> bool:
    return int(hashlib.sha256(relative.encode()).hexdigest(), 16) % HELD_OUT_MODULUS == 0


def read_corpus(limit: int) -> tuple[list[str], list[str]]:
    """(training texts, held-out texts): .py files of the standard library and site-packages, in path order,
    until ``limit`` bytes of training text (held-out files up to ``limit / HELD_OUT_MODULUS``)."""
    paths = sysconfig.get_paths()
    roots = list(dict.fromkeys(Path(paths[k]) for k in ("stdlib", "purelib") if k in paths))
    training: list[str] = []
    held: list[str] = []
    sizes = [0, 0]
    for root in roots:
        for file in sorted(root.rglob("*.py")):
            relative = str(file.relative_to(root))
            if "site-packages" in relative and root.name != "site-packages":
                continue  # the stdlib root holds site-packages: read once, from its own root
            side = 1 if held_out_file(relative) else 0
            if sizes[side] >= (limit // HELD_OUT_MODULUS if side else limit):
                continue
            try:
                text = file.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            if len(text) < 200:
                continue
            (held if side else training).append(text)
            sizes[side] += len(text)
            if sizes[0] >= limit and sizes[1] >= limit // HELD_OUT_MODULUS:
                return training, held
    return training, held


def train_tokenizer(texts: list[str], vocab: int):
    from tokenizers import ByteLevelBPETokenizer

    tokenizer = ByteLevelBPETokenizer()
    tokenizer.train_from_iterator(
        texts, vocab_size=vocab, min_frequency=2, special_tokens=list(SPECIALS), show_progress=False
    )
    return tokenizer


def encode(tokenizer, texts: list[str]) -> list[list[int]]:
    return [e.ids for e in tokenizer.encode_batch(texts)]


# ---- 2. base -----------------------------------------------------------------------------------------------


def make_base(size: Size, vocab: int, device: torch.device):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=size.hidden,
        intermediate_size=int(size.hidden * 8 / 3) // 16 * 16,
        num_hidden_layers=size.layers,
        num_attention_heads=size.heads,
        num_key_value_heads=size.heads,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=PAD,
    )
    return LlamaForCausalLM(config).to(device)


def windows(stream: torch.Tensor, count: int, length: int, generator: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, len(stream) - length - 1, (count,), generator=generator)
    return torch.stack([stream[s : s + length + 1] for s in starts.tolist()])


def cosine(step: int, total: int, warmup: int) -> float:
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))


def steps_in_budget(seconds: float, per_step: float, done: int, cap: int) -> int:
    """Optimizer steps a budget allows: the ``done`` already taken plus what ``seconds`` left pays for."""
    return max(done + 1, min(cap, done + int(seconds / max(per_step, 1e-9))))


def pretrain(base, stream: torch.Tensor, size: Size, seconds: float, device: torch.device) -> dict[str, Any]:
    """Next-token training on random windows; the cosine schedule spans the steps ``seconds`` allows,
    estimated from steps 2 to ``probe`` (the first pays for warm-up; warmup is 5 % of the estimate)."""
    generator = torch.Generator().manual_seed(0)
    optimizer = torch.optim.AdamW(base.parameters(), lr=size.lr, weight_decay=0.1, betas=(0.9, 0.95))
    autocast = (
        torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else torch.autocast("cpu", enabled=False)
    )
    base.train()
    probe, total, losses = 5, 10**9, []
    started = time.monotonic()
    step, warm = 0, started
    while step < total:
        if step == 1:
            warm = time.monotonic()
        if step == probe:
            per_step = (time.monotonic() - warm) / (probe - 1)
            total = max(MIN_STEPS, steps_in_budget(seconds - (time.monotonic() - started), per_step, probe, 10**6))
        warmup = max(1, total // 20) if total < 10**9 else probe * 4
        for group in optimizer.param_groups:
            group["lr"] = size.lr * cosine(step, total, warmup)
        batch = windows(stream, size.batch, size.seq, generator).to(device)
        with autocast:
            loss = base(input_ids=batch, labels=batch, use_cache=False).loss  # transformers shifts the labels
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(base.parameters(), 1.0)
        optimizer.step()
        losses.append(float(loss.detach()))
        step += 1
    base.eval().requires_grad_(False)
    return {
        "steps": step,
        "seconds": time.monotonic() - started,
        "first_loss": losses[0],
        "last_loss": sum(losses[-20:]) / len(losses[-20:]),
    }


@torch.no_grad()
def mean_loss(base, stream: torch.Tensor, size: Size, device: torch.device, count: int = 32) -> float:
    generator = torch.Generator().manual_seed(1)
    batch = windows(stream, count, size.seq, generator).to(device)
    total = 0.0
    for part in batch.split(16):
        total += float(base(input_ids=part, labels=part, use_cache=False).loss) * len(part)
    return total / len(batch)


def chunks(
    files: list[list[int]], count: int, prompt_len: int, after: int, seed: int
) -> list[tuple[list[int], list[int]]]:
    """``count`` (prompt, real continuation) pairs cut from random places of random files."""
    rng = random.Random(seed)
    usable = [f for f in files if len(f) > prompt_len + after]
    out = []
    for _ in range(count):
        f = usable[rng.randrange(len(usable))]
        start = rng.randrange(len(f) - prompt_len - after)
        out.append((f[start : start + prompt_len], f[start + prompt_len : start + prompt_len + after]))
    return out


# ---- 6. tokens/s -------------------------------------------------------------------------------------------


def timed(fn: Callable[[], Any], device: torch.device) -> tuple[Any, float]:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    result = fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return result, time.perf_counter() - start


def throughput_rows(base, head, prompts, size: Size, args, device, deadline: float | None) -> list[dict[str, Any]]:
    """One row per batch size; batches past ``deadline`` (None: no deadline) are skipped."""
    rows = []
    for batch in BATCHES:
        if deadline is not None and time.monotonic() > deadline:
            say(f"  batch {batch}: skipped, out of budget")
            break
        batch_prompts = [prompts[i % len(prompts)] for i in range(batch)]
        if device.type == "cuda":  # warm-up: kernels and allocator
            greedy_decode(base, batch_prompts, 4, pad_id=PAD)
            redrafter_decode(base, head, batch_prompts, 4, args.draft_len, args.beams, pad_id=PAD)
        plain, greedy_s = timed(lambda: greedy_decode(base, batch_prompts, size.new_tokens, pad_id=PAD), device)
        (drafted, stats), draft_s = timed(
            lambda: redrafter_decode(
                base, head, batch_prompts, size.new_tokens, args.draft_len, args.beams, pad_id=PAD
            ),
            device,
        )
        greedy_rate = sum(len(t) for t in plain) / greedy_s
        draft_rate = sum(len(t) for t in drafted) / draft_s
        rows.append(
            {
                "batch": batch,
                "greedy_tok_s": round(greedy_rate, 1),
                "drafting_tok_s": round(draft_rate, 1),
                "tokens_per_step": round(stats.tokens_per_step, 3),
                "break_even_tokens_per_step": round(stats.tokens_per_step * greedy_rate / draft_rate, 2),
                "acceptance": round(stats.acceptance, 3),
                "same_tokens": drafted == plain,
            }
        )
    return rows


def drafter_gate(figures: dict[str, Any]) -> tuple[bool, str] | None:
    """The operator's gate on these figures, where the operator's package can be imported."""
    try:
        from redrafter_operator.policy.drafter_gate import DrafterFigures, judge
    except ImportError:
        return None
    verdict = judge(DrafterFigures.model_validate(figures))
    return verdict.passed, verdict.message


# ---- the run -----------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--toy", action="store_true", help="every stage at a CPU size (about a minute)")
    parser.add_argument("--budget-s", type=float, help="wall-clock budget of the whole run (600; --toy 60)")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--draft-len", type=int, default=5)
    parser.add_argument("--beams", type=int, default=5)
    parser.add_argument("--head-lr", type=float, default=None, help="the head's learning rate (1e-3; --toy 1e-2)")
    parser.add_argument("--no-gate", action="store_true", help="go on when the base fails its gate")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    started = time.monotonic()
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    toy = args.toy or device.type == "cpu"
    size = TOY if toy else GPU
    budget = args.budget_s or (60.0 if toy else 600.0)
    head_lr = args.head_lr or (1e-2 if toy else 1e-3)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    if device.type == "cpu":
        torch.set_num_threads(min(2, torch.get_num_threads()))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    say(f"device {device} ({name}), torch {torch.__version__}; budget {budget:.0f} s; {'toy' if toy else 'full'} size")

    # 1. corpus and tokenizer
    t0 = time.monotonic()
    train_texts, held_texts = read_corpus(size.corpus_bytes)
    tokenizer = train_tokenizer(train_texts, size.vocab)
    train_files, held_files = encode(tokenizer, train_texts), encode(tokenizer, held_texts)
    vocab = tokenizer.get_vocab_size()
    stream = torch.tensor([t for f in train_files for t in (*f, EOS)], dtype=torch.long)
    held_stream = torch.tensor([t for f in held_files for t in (*f, EOS)], dtype=torch.long)
    say(
        f"1 corpus: {len(train_texts)} training files ({sum(map(len, train_texts)) / 1e6:.1f} MB, {len(stream)} tokens), "
        f"{len(held_texts)} held-out files ({len(held_stream)} tokens); byte-level BPE vocab {vocab} "
        f"in {time.monotonic() - t0:.1f} s"
    )

    # 2. base
    base = make_base(size, vocab, device)
    params = sum(p.numel() for p in base.parameters())
    fit = pretrain(base, stream, size, PRETRAIN_SHARE * budget - (time.monotonic() - started), device)
    held_loss = mean_loss(base, held_stream, size, device)
    train_loss = mean_loss(base, stream, size, device)
    say(
        f"2 base: Llama {params / 1e6:.1f} M parameters (hidden {size.hidden} x {size.layers} layers), pretrained "
        f"{fit['steps']} steps of {size.batch} x {size.seq} tokens in {fit['seconds']:.0f} s: loss {fit['first_loss']:.2f} -> "
        f"{fit['last_loss']:.2f}; held-out loss {held_loss:.3f} (train {train_loss:.3f}, uniform {math.log(vocab):.2f})"
    )

    # 3. base gate: greedy continuations of held-out code against the real ones
    loop_len = min(64, size.response_len)
    probes = chunks(held_files, size.held_out, size.prompt_len, loop_len, args.seed + 1)
    greedy = greedy_decode(base, [p for p, _ in probes], loop_len, pad_id=PAD)
    base_loops = loop_figures(greedy, loop_len)
    text_loops = loop_figures([c for _, c in probes], loop_len)
    gate_ok = (
        base_loops["distinct"] is not None
        and text_loops["distinct"] is not None
        and base_loops["distinct"] >= MIN_DISTINCT_SHARE * text_loops["distinct"]
        and base_loops["repeats"] <= text_loops["repeats"] + MAX_EXTRA_REPEATS
    )
    sample = tokenizer.decode(greedy[0][:40]).replace("\n", "\\n")
    say(
        f"3 base gate: greedy on {len(probes)} held-out prompts x {loop_len} tokens: distinct {base_loops['distinct']} "
        f"(real text {text_loops['distinct']}, needs >= {MIN_DISTINCT_SHARE} x), repeated 4-grams within 16 "
        f"{base_loops['repeats']} (real text {text_loops['repeats']}, needs <= +{MAX_EXTRA_REPEATS}): "
        f"{'PASS' if gate_ok else 'FAIL'}; e.g. {sample[:120]!r}"
    )
    if not gate_ok and not (toy or args.no_gate):
        say("the base failed its gate: no drafting figure would mean anything; stopping (--no-gate goes on)")
        print(
            json.dumps(
                {"device": name, "base_gate": False, "held_out_loss": held_loss, "base": base_loops, "text": text_loops}
            )
        )
        return 1

    # 4. head: distilled on training-file chunks, trained for the steps its budget allows
    t0 = time.monotonic()
    prompts = [p for p, _ in chunks(train_files, size.prompts, size.prompt_len, 0, args.seed + 2)]
    samples: list[Sample] = []
    for begin in range(0, len(prompts), 256):
        samples += generate(base, prompts[begin : begin + 256], size.response_len, None, PAD, 256)
        if time.monotonic() - started > (PRETRAIN_SHARE + DISTILL_SHARE) * budget:
            break
    attach_hidden(base, samples, PAD, 64)
    held_prompts = [p for p, _ in probes]
    held_samples = generate(base, held_prompts, size.response_len, None, PAD, 256)
    attach_hidden(base, held_samples, PAD, 64)
    distill_s = time.monotonic() - t0
    embedding = base.get_input_embeddings().weight.detach()
    torch.manual_seed(args.seed)
    head = ReDrafterHead(DrafterConfig(size.hidden, 2 * size.hidden, 2, True, vocab))
    untrained = copy.deepcopy(head).eval()
    dist = train.Distributed(device=device)
    # the step time, on a copy: steps 2 to 6 (the first pays for warm-up)
    probe_settings = train.TrainConfig(args.draft_len, head_lr, size.head_batch, 1000, 6, args.seed)
    stamps: list[float] = []

    def stamp(step: int, total: int, loss: float) -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()
        stamps.append(time.perf_counter())

    train.train_head(copy.deepcopy(head), samples, embedding, probe_settings, dist, stamp)
    per_step = (stamps[-1] - stamps[0]) / (len(stamps) - 1)
    head_seconds = (PRETRAIN_SHARE + DISTILL_SHARE + HEAD_SHARE) * budget - (time.monotonic() - started)
    head_steps = max(MIN_STEPS, steps_in_budget(head_seconds, per_step, 0, 5000))
    settings = train.TrainConfig(args.draft_len, head_lr, size.head_batch, 1000, head_steps, args.seed)
    t1 = time.monotonic()
    curve = train.train_head(head, samples, embedding, settings, dist)
    head.to(device)
    say(
        f"4 head: distilled {len(samples)} training-file prompts x {size.response_len} tokens in {distill_s:.1f} s; "
        f"{head_steps} steps (the schedule's length, from {per_step * 1000:.0f} ms a step) of {size.head_batch} "
        f"sequences in {time.monotonic() - t1:.1f} s, lr {head_lr:g}: loss {curve[0]['loss']:.3f} -> {curve[-1]['loss']:.3f}"
    )

    # 5. drafting on held-out files
    subset = samples[: len(held_samples)]
    tf_train = train.teacher_forced(head, subset, embedding, args.draft_len)
    tf_held = train.teacher_forced(head, held_samples, embedding, args.draft_len)
    eval_prompts = held_prompts
    _, trained_stats = redrafter_decode(
        base, head, eval_prompts, size.response_len, args.draft_len, args.beams, pad_id=PAD
    )
    _, untrained_stats = redrafter_decode(
        base, untrained.to(device), eval_prompts, size.response_len, args.draft_len, args.beams, pad_id=PAD
    )
    lookup = prompt_lookup_counts(
        [s.ids[: s.prompt_len] for s in held_samples], [s.ids[s.prompt_len :] for s in held_samples], args.draft_len
    )
    figures = {
        "heldOutAcceptance": round(trained_stats.acceptance, 4),
        "untrainedAcceptance": round(untrained_stats.acceptance, 4),
        "promptLookupAcceptance": round(lookup.acceptance, 4),
        "heldOutTop1": tf_held["top1"][0],
        "trainTop1": tf_train["top1"][0],
    }
    say(
        f"5 drafting on {len(eval_prompts)} held-out prompts x {size.response_len} tokens (draft_len {args.draft_len}, "
        f"beams {args.beams}): acceptance {trained_stats.acceptance:.3f} (untrained {untrained_stats.acceptance:.3f}, "
        f"prompt lookup {lookup.acceptance:.3f}); tokens/step {trained_stats.tokens_per_step:.2f} (untrained "
        f"{untrained_stats.tokens_per_step:.2f}, prompt lookup {lookup.tokens_per_step:.2f})"
    )
    for label, tf in (("held-out", tf_held), ("train", tf_train)):
        say(
            f"  teacher-forced {label:>8}: loss/position "
            + " ".join(f"{v:.2f}" for v in tf["loss"])
            + "; top-1/position "
            + " ".join(f"{v:.3f}" for v in tf["top1"])
        )
    verdict = drafter_gate(figures)
    say(
        f"  the operator's drafter gate: {'not importable here' if verdict is None else ('PASS' if verdict[0] else 'REJECT') + ': ' + verdict[1]}"
    )

    # 6. tokens/s
    rows = throughput_rows(base, head, held_prompts, size, args, device, None if toy else started + 0.97 * budget)
    crossover = next((r["batch"] for r in rows if r["greedy_tok_s"] >= r["drafting_tok_s"]), "none")
    say(f"6 tokens/s, {size.new_tokens} new tokens per prompt:")
    say(
        f"{'batch':>5} {'greedy tok/s':>13} {'drafting tok/s':>15} {'speedup':>8} {'tok/step':>9} {'break-even':>10} {'accept':>7} same"
    )
    for r in rows:
        speedup = r["drafting_tok_s"] / r["greedy_tok_s"] if r["greedy_tok_s"] else float("nan")
        say(
            f"{r['batch']:>5} {r['greedy_tok_s']:>13.1f} {r['drafting_tok_s']:>15.1f} {speedup:>8.2f} "
            f"{r['tokens_per_step']:>9.3f} {r['break_even_tokens_per_step']:>10.2f} {r['acceptance']:>7.3f} {r['same_tokens']}"
        )
    say(f"crossover batch (greedy >= drafting): {crossover}; total {time.monotonic() - started:.0f} s")
    summary = {
        "device": name,
        "toy": toy,
        "vocab": vocab,
        "base": {"params": params, "hidden": size.hidden, "layers": size.layers, "pretrain_steps": fit["steps"]},
        "held_out_loss": round(held_loss, 4),
        "base_gate": gate_ok,
        "base_output": base_loops,
        "text": text_loops,
        "head_steps": head_steps,
        **figures,
        "tokensPerStep": round(trained_stats.tokens_per_step, 3),
        "promptLookupTokensPerStep": round(lookup.tokens_per_step, 3),
        "teacherForced": {"heldOut": tf_held, "train": tf_train},
        "drafter_gate": None if verdict is None else verdict[0],
        "rows": rows,
        "crossover": crossover,
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
