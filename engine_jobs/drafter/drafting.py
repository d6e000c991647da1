"""ReDrafter drafting and plain greedy decoding in PyTorch, batched, for evaluation and the bench.

The drafting step is TensorRT-LLM's with greedy verification (``redrafter_helper``): the head beam-searches
``beams`` candidates of ``draft_len`` tokens after the guaranteed token; the base scores every candidate in
one forward; the longest prefix that matches the base's own greedy tokens is accepted, and the base's token
after it is the next guaranteed token. Every committed token is the base's greedy token, so the output
equals :func:`greedy_decode` token for token; only the number of base forwards changes.

Both use the base's KV cache. Sequences of a batch accept different numbers of tokens, so each step appends
all ``1 + draft_len`` positions of the chosen candidate to the cache and masks the rejected ones out
(explicit position ids skip them): the cache never has to be cut per sequence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from .model import ReDrafterHead

#: the beam score of the beams that start empty (TensorRT-LLM's NEG_INF): only beam 0 grows at first
NEG_INF = -50000.0


@dataclass
class DraftStats:
    """Counts over the sequences' verification steps (until each reaches its length or EOS).

    A step counts only the tokens the response keeps: the last step's accepted run is cut at the token
    limit or at EOS, and what lies past the cut is neither committed nor accepted.
    """

    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    committed: int = 0
    per_step: list[int] = field(default_factory=list)

    @property
    def acceptance(self) -> float:
        """Accepted draft tokens / drafted tokens (draft_len per step)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_step(self) -> float:
        """Tokens one verification step commits: the guaranteed token plus the accepted ones."""
        return self.committed / self.steps if self.steps else 0.0


def _left_pad(prompts: list[list[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros((len(prompts), width), dtype=torch.long, device=device)
    for row, p in enumerate(prompts):
        if p:
            ids[row, width - len(p) :] = torch.tensor(p, dtype=torch.long, device=device)
            mask[row, width - len(p) :] = 1
    return ids, mask


def _forward(base: Any, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Any) -> Any:
    out = base(
        input_ids=ids,
        attention_mask=mask,
        position_ids=positions,
        past_key_values=cache,
        use_cache=True,
        output_hidden_states=True,
    )
    return out.logits, out.hidden_states[-1], out.past_key_values


def _prefill(base: Any, prompts: list[list[int]], pad_id: int) -> Any:
    """The prompts through the base: the first greedy token, the hidden state that produced it, the cache."""
    from transformers import DynamicCache

    if any(not p for p in prompts):
        raise ValueError("every prompt needs at least one token")
    device = next(base.parameters()).device
    ids, mask = _left_pad(prompts, pad_id, device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    logits, hidden, cache = _forward(base, ids, mask, positions, DynamicCache())
    next_pos = positions[:, -1] + 1
    return logits[:, -1].argmax(-1), hidden[:, -1], cache, mask, next_pos


def _finish(tokens: list[int], max_new_tokens: int, eos_token_id: int | None) -> tuple[list[int], bool]:
    tokens = tokens[:max_new_tokens]
    if eos_token_id is not None and eos_token_id in tokens:
        tokens = tokens[: tokens.index(eos_token_id) + 1]
        return tokens, True
    return tokens, len(tokens) >= max_new_tokens


@torch.no_grad()
def greedy_decode(
    base: Any, prompts: list[list[int]], max_new_tokens: int, eos_token_id: int | None = None, pad_id: int = 0
) -> list[list[int]]:
    """The base's greedy continuation of each prompt (new tokens only; up to and including EOS)."""
    token, _, cache, mask, next_pos = _prefill(base, prompts, pad_id)
    out: list[list[int]] = [[] for _ in prompts]
    done = [False] * len(prompts)
    while True:
        for row, t in enumerate(token.tolist()):
            if not done[row]:
                out[row], done[row] = _finish(out[row] + [t], max_new_tokens, eos_token_id)
        if all(done):
            return out
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        logits, _, cache = _forward(base, token[:, None], mask, next_pos[:, None], cache)
        token = logits[:, -1].argmax(-1)
        next_pos = next_pos + 1


def beam_search(
    head: ReDrafterHead,
    embeddings: torch.nn.Embedding,
    context: torch.Tensor,
    init_token: torch.Tensor,
    beams: int,
    draft_len: int,
) -> torch.Tensor:
    """Candidates [batch, beams, 1 + draft_len] starting with ``init_token`` (``_beam_search_candidates``)."""
    batch, hidden = context.shape
    dtype = next(head.parameters()).dtype
    vocab = head.config.vocab_size
    scores = torch.full((batch, beams), NEG_INF, dtype=dtype, device=context.device)
    scores[:, 0] = 0.0
    ctx = context.to(dtype)[:, None, :].expand(batch, beams, hidden)
    tokens = init_token[:, None, None].expand(batch, beams, 1)
    last = tokens[..., 0]
    state: torch.Tensor | None = None
    rows = torch.arange(batch, device=context.device)[:, None]
    for _ in range(draft_len):
        state = head.step(embeddings(last).to(dtype), state)
        log_probs = head.logits(ctx, state).log_softmax(-1)  # [batch, beams, vocab]
        top, index = (log_probs + scores[..., None]).reshape(batch, beams * vocab).topk(beams, dim=-1)
        parent, last = index // vocab, index % vocab
        tokens = torch.cat([tokens[rows, parent], last[..., None]], dim=-1)
        state = state[rows, parent]
        scores = top
    return tokens


@torch.no_grad()
def redrafter_decode(
    base: Any,
    head: ReDrafterHead,
    prompts: list[list[int]],
    max_new_tokens: int,
    draft_len: int,
    beams: int,
    eos_token_id: int | None = None,
    pad_id: int = 0,
) -> tuple[list[list[int]], DraftStats]:
    """Greedy decoding accelerated by the head: the same tokens as :func:`greedy_decode`, and the counts."""
    embeddings = base.get_input_embeddings()
    guaranteed, context, cache, mask, next_pos = _prefill(base, prompts, pad_id)
    batch, span = len(prompts), 1 + draft_len
    device = mask.device
    out: list[list[int]] = [[] for _ in prompts]
    done = [False] * batch
    stats = DraftStats()
    offsets = torch.arange(span, device=device)
    rows = torch.arange(batch, device=device)
    while not all(done):
        candidates = beam_search(head, embeddings, context, guaranteed, beams, draft_len)  # [B, nb, span]
        cache.batch_repeat_interleave(beams)
        logits, hidden, cache = _forward(
            base,
            candidates.reshape(batch * beams, span),
            torch.cat([mask.repeat_interleave(beams, 0), mask.new_ones(batch * beams, span)], dim=1),
            next_pos.repeat_interleave(beams)[:, None] + offsets,
            cache,
        )
        predicted = logits.argmax(-1).reshape(batch, beams, span)
        matches = (candidates[..., 1:] == predicted[..., :-1]).long().cumprod(-1)
        accepted = matches.sum(-1)  # [B, nb]
        best = accepted.argmax(-1)  # the first of the longest
        count = accepted[rows, best]
        chosen = best + rows * beams
        cache.batch_select_indices(chosen)
        guaranteed = predicted[rows, best, count]
        context = hidden.reshape(batch, beams, span, -1)[rows, best, count]
        mask = torch.cat([mask, (offsets[None, :] <= count[:, None]).long()], dim=1)
        next_pos = next_pos + 1 + count
        for row, (n, toks) in enumerate(zip(count.tolist(), candidates[rows, best].tolist(), strict=True)):
            if done[row]:
                continue
            before = len(out[row])
            out[row], done[row] = _finish(out[row] + toks[: 1 + n], max_new_tokens, eos_token_id)
            kept = len(out[row]) - before  # the last step's run is cut at the token limit or EOS
            stats.steps += 1
            stats.drafted += draft_len
            stats.accepted += min(n, kept - 1)
            stats.committed += kept
            stats.per_step.append(kept)
    return out, stats
