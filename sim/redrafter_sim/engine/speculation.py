"""The simulated engines' greedy "model" and drafting, pure and stdlib only.

Copied next to the simulated models as ``_sim_speculation.py`` (Triton imports it from there); tests
import it as ``redrafter_sim.engine.speculation``.

- :func:`greedy_token`: the hash "model" of both simulators: a deterministic token per (prompt, index).
- :func:`greedy_next`: the PyTorch-path simulator's greedy model. It copies on repetitive text: when
  the current suffix (at least :data:`COPY_MIN_NGRAM` tokens) occurred earlier in the prompt, the next
  token is the one that followed its most recent earlier occurrence; otherwise the hash token. So
  prompt-lookup (NGram) drafting pays on prompts that repeat themselves and not on novel ones.
- :func:`ngram_propose`: NGram drafting as upstream's prompt-lookup pool does it: the tokens that
  followed the most recent earlier occurrence of the longest matching suffix.
- :func:`accept_prefix` / :func:`chain_accepted`: verification of a drafted chain (accepted as a prefix).
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable, Sequence

#: the shortest suffix the simulated model copies on (a lone repeated token is not a pattern)
COPY_MIN_NGRAM = 2
#: the longest suffix the simulated model looks up
COPY_MAX_NGRAM = 8


def greedy_token(prompt_crc: int, index: int, diverge: bool, first_id: int, vocab: int) -> int:
    """The base model's greedy token at ``index`` (deterministic across processes)."""
    h = zlib.crc32(index.to_bytes(4, "little"), prompt_crc)
    if diverge and index > 0:
        h = zlib.crc32(b"diverge", h)
    return first_id + h % (vocab - first_id)


def _last_occurrence(seq: Sequence[int], pattern: Sequence[int], end: int) -> int | None:
    """Start of the most recent occurrence of ``pattern`` in ``seq`` that ends before index ``end``."""
    n = len(pattern)
    for start in range(end - n, -1, -1):
        if list(seq[start : start + n]) == list(pattern):
            return start
    return None


def copy_continuation(prompt: Sequence[int], seq: Sequence[int]) -> int | None:
    """The token after the most recent earlier prompt occurrence of ``seq``'s longest suffix, if any.

    The occurrence and the token after it lie inside the prompt; suffixes shorter than
    :data:`COPY_MIN_NGRAM` do not count.
    """
    for n in range(min(COPY_MAX_NGRAM, len(seq) - 1), COPY_MIN_NGRAM - 1, -1):
        start = _last_occurrence(prompt, seq[-n:], min(len(prompt) - 1, len(seq) - 1))
        if start is not None:
            return int(prompt[start + n])
    return None


def greedy_next(
    prompt: Sequence[int], generated: Sequence[int], prompt_crc: int, diverge: bool, first_id: int, vocab: int
) -> int:
    """The simulated model's greedy token after ``prompt + generated`` (the PyTorch-path simulator)."""
    index = len(generated)
    if not (diverge and index > 0):
        copied = copy_continuation(prompt, [*prompt, *generated])
        # a model copies text, never special tokens (ids below first_id: pad, end, unknown words)
        if copied is not None and copied >= first_id:
            return copied
    return greedy_token(prompt_crc, index, diverge, first_id, vocab)


def ngram_propose(seq: Sequence[int], max_draft_len: int, max_ngram: int) -> list[int]:
    """Up to ``max_draft_len`` tokens that followed the most recent earlier occurrence of the longest
    suffix of ``seq`` (at most ``max_ngram`` tokens long); empty when no suffix occurred before."""
    for n in range(min(max_ngram, len(seq) - 1), 0, -1):
        start = _last_occurrence(seq, seq[-n:], len(seq) - 1)
        if start is not None:
            return [int(t) for t in seq[start + n : start + n + max_draft_len]]
    return []


def accept_prefix(draft: Sequence[int], truth: Callable[[int], int]) -> int:
    """How many draft tokens verification accepts: the longest prefix where ``draft[j] == truth(j)``,
    ``truth(j)`` being the target model's greedy token after the first ``j`` draft tokens."""
    for j, tok in enumerate(draft):
        if truth(j) != tok:
            return j
    return len(draft)


def chain_accepted(draft_len: int, acceptance_rate: float, rng: random.Random) -> int:
    """Accepted tokens of a drafted chain: each next one with probability ``acceptance_rate``, up to the
    first rejection (expected sum of rate**k for k = 1..draft_len)."""
    accepted = 0
    while accepted < draft_len and rng.random() < acceptance_rate:
        accepted += 1
    return accepted
