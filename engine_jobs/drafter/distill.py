"""Self-distillation: the base writes its own greedy responses, the head learns to predict them.

The head is trained on what the base generates, not on a dataset's human responses: drafting only pays when
the head predicts the base's tokens, and at inference the base's greedy tokens are what it is checked
against. Each sample keeps the token ids (prompt + response) and the base's final-norm hidden states.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import bad_input
from .drafting import greedy_decode

#: above this many bytes of float32 hidden states, samples keep them in bfloat16 (a base the size of
#: Llama 8B has 16 KiB of hidden state per token)
FLOAT32_HIDDEN_LIMIT = 2 * 1024**3


@dataclass
class Sample:
    """One distilled sequence: ``ids`` = prompt + response; ``hidden[i]`` is the base's final-norm hidden
    state at position ``prompt_len - 1 + i`` (the positions whose next token the base wrote)."""

    ids: list[int]
    prompt_len: int
    hidden: torch.Tensor | None = None


def pick_device() -> torch.device:
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        return torch.device("cuda", local)
    return torch.device("cpu")


def load_base(base_dir: str | Path, device: torch.device | None = None) -> tuple[Any, Any]:
    """(model, tokenizer) in float32 and eval mode; BAD_INPUT when transformers cannot load them."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(base_dir))
        model: Any = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
    except Exception as exc:  # transformers raises OSError, ValueError, KeyError... for a bad checkpoint
        raise bad_input(f"transformers cannot load the base model in {base_dir}: {exc}", repr(exc)) from None
    model.eval().requires_grad_(False)
    return model.to(device or pick_device()), tokenizer


def tokenize(tokenizer: Any, prompts: list[str]) -> list[list[int]]:
    """Token ids per prompt (the tokenizer's special tokens included, as serving adds them)."""
    return [list(tokenizer(text)["input_ids"]) for text in prompts]


def pad_id(tokenizer: Any) -> int:
    for value in (tokenizer.pad_token_id, tokenizer.eos_token_id, 0):
        if value is not None:
            return int(value)
    return 0


@torch.no_grad()
def generate(
    base: Any,
    prompt_ids: list[list[int]],
    response_len: int,
    eos_token_id: int | None,
    pad: int = 0,
    batch_size: int = 32,
    on_batch: Callable[[int, int], None] | None = None,
) -> list[Sample]:
    """The base's greedy responses (up to ``response_len`` tokens, EOS included), batched by prompt length."""
    order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))  # little padding per batch
    samples: list[Sample | None] = [None] * len(prompt_ids)
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        responses = greedy_decode(base, [prompt_ids[i] for i in chunk], response_len, eos_token_id, pad)
        for i, response in zip(chunk, responses, strict=True):
            samples[i] = Sample(ids=prompt_ids[i] + response, prompt_len=len(prompt_ids[i]))
        if on_batch is not None:
            on_batch(min(start + batch_size, len(order)), len(order))
    return [s for s in samples if s is not None]


@torch.no_grad()
def attach_hidden(base: Any, samples: list[Sample], pad: int = 0, batch_size: int = 32) -> None:
    """Fill each sample's ``hidden`` with one forward over its full sequence (``hidden_states[-1]``)."""
    device = next(base.parameters()).device
    width = base.config.hidden_size
    total = sum(len(s.ids) - s.prompt_len + 1 for s in samples) * width * 4
    dtype = torch.float32 if total <= FLOAT32_HIDDEN_LIMIT else torch.bfloat16
    order = sorted(range(len(samples)), key=lambda i: len(samples[i].ids))
    for start in range(0, len(order), batch_size):
        chunk = [samples[i] for i in order[start : start + batch_size]]
        length = max(len(s.ids) for s in chunk)
        ids = torch.full((len(chunk), length), pad, dtype=torch.long, device=device)
        mask = torch.zeros_like(ids)
        for row, s in enumerate(chunk):
            ids[row, length - len(s.ids) :] = torch.tensor(s.ids, device=device)
            mask[row, length - len(s.ids) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = base(input_ids=ids, attention_mask=mask, position_ids=positions, output_hidden_states=True)
        last = out.hidden_states[-1]
        for row, s in enumerate(chunk):
            begin = length - len(s.ids) + s.prompt_len - 1
            s.hidden = last[row, begin:].to("cpu", dtype).clone()


def distill(
    base: Any,
    tokenizer: Any,
    prompts: list[str],
    response_len: int,
    batch_size: int = 32,
    on_batch: Callable[[int, int], None] | None = None,
) -> list[Sample]:
    """Per prompt: the ids of prompt + the base's greedy response, and the base's hidden states over them."""
    ids = [p for p in tokenize(tokenizer, prompts) if p]
    pad = pad_id(tokenizer)
    samples = generate(base, ids, response_len, tokenizer.eos_token_id, pad, batch_size, on_batch)
    attach_hidden(base, samples, pad, batch_size)
    return samples
