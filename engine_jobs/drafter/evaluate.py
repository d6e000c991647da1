"""Held-out acceptance of a head: ReDrafter drafting on prompts the head was not trained on.

Definitions (what evaluation.json reports):

- acceptance = accepted draft tokens / drafted tokens, summed over every verification step of every
  held-out sequence; each step drafts ``draft_len`` tokens (the chosen beam's) and accepts the longest
  prefix the base's greedy tokens confirm. It is the engine's ``redrafter_accepted_draft_tokens_total /
  redrafter_draft_tokens_total``.
- tokens_per_step = tokens committed / verification steps: the guaranteed token plus the accepted ones, so
  ``1 + acceptance * draft_len``; what one base forward yields, against 1 for plain decoding.
"""

from __future__ import annotations

from typing import Any

import torch

from .distill import pad_id, tokenize
from .drafting import redrafter_decode
from .model import ReDrafterHead


@torch.no_grad()
def evaluate(
    base: Any,
    tokenizer: Any,
    head: ReDrafterHead,
    prompts: list[str],
    draft_len: int,
    beams: int,
    max_new_tokens: int,
    batch_size: int = 16,
) -> dict[str, Any]:
    """Drafting with ``head`` on ``prompts``: acceptance, tokens_per_step and the raw counts."""
    device = next(base.parameters()).device
    head = head.to(device).eval()
    ids = [p for p in tokenize(tokenizer, prompts) if p]
    steps = drafted = accepted = committed = 0
    for start in range(0, len(ids), batch_size):
        _, stats = redrafter_decode(
            base,
            head,
            ids[start : start + batch_size],
            max_new_tokens,
            draft_len,
            beams,
            tokenizer.eos_token_id,
            pad_id(tokenizer),
        )
        steps += stats.steps
        drafted += stats.drafted
        accepted += stats.accepted
        committed += stats.committed
    return {
        "acceptance": accepted / drafted if drafted else 0.0,
        "tokens_per_step": committed / steps if steps else 0.0,
        "steps": steps,
        "drafted": drafted,
        "accepted": accepted,
        "prompts": len(ids),
    }
