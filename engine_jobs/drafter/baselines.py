"""What a head's acceptance is judged against, in plain Python (no torch, no base forwards).

- **Prompt lookup** (n-gram copying, as TensorRT-LLM's and vLLM's ``ngram`` drafters): the draft is what
  followed the latest earlier occurrence of the context's last n tokens. A head that does not beat it has
  learned nothing a free drafter does not already know. Greedy decoding is deterministic, so its drafting is
  scored against the base's known greedy response step by step as :func:`~.drafting.redrafter_decode` scores
  a head's, without running the base again.
- **Loop figures** of token sequences: the distinct-token ratio and the share of 4-grams repeated within 16
  tokens. A base whose greedy output loops (``#\\n#\\n#...``) makes any drafter look good; its figures sit far
  from those of real text of the same length.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

#: prompt lookup matches the last MAX_NGRAM tokens first, then fewer, down to one
MAX_NGRAM = 3
#: the loop figures' window: a 4-gram seen again within this many tokens is a repeat
REPEAT_WINDOW = 16
REPEAT_NGRAM = 4


@dataclass
class Counts:
    """Verification steps of one drafter over responses: the same counts as ``drafting.DraftStats``."""

    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    committed: int = 0

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_step(self) -> float:
        return self.committed / self.steps if self.steps else 0.0


Proposer = Callable[[Sequence[int], int], list[int]]


def prompt_lookup(context: Sequence[int], draft_len: int, max_ngram: int = MAX_NGRAM) -> list[int]:
    """Up to ``draft_len`` tokens that followed the latest earlier occurrence of the context's last n-gram
    (n from ``max_ngram`` down to 1); empty when no suffix recurs."""
    size = len(context)
    for n in range(min(max_ngram, size - 1), 0, -1):
        suffix = list(context[size - n :])
        for start in range(size - n - 1, -1, -1):  # the latest occurrence that has a token after it
            if list(context[start : start + n]) == suffix:
                return list(context[start + n : start + n + draft_len])
    return []


def score_drafts(prompt: Sequence[int], response: Sequence[int], draft_len: int, propose: Proposer) -> Counts:
    """Replay ``response`` (the base's greedy tokens) as ReDrafter verification steps with ``propose`` drafting.

    Each step commits the guaranteed token and the longest prefix of the draft equal to the base's next
    tokens, cut at the response's end (its token limit or EOS); ``draft_len`` tokens count as drafted per step.
    """
    counts = Counts()
    done = 0
    while done < len(response):
        draft = propose([*prompt, *response[: done + 1]], draft_len)[:draft_len]
        truth = response[done + 1 : done + 1 + draft_len]
        matched = 0
        while matched < min(len(draft), len(truth)) and draft[matched] == truth[matched]:
            matched += 1
        kept = min(1 + matched, len(response) - done)
        counts.steps += 1
        counts.drafted += draft_len
        counts.accepted += kept - 1
        counts.committed += kept
        done += kept
    return counts


def prompt_lookup_counts(
    prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], draft_len: int
) -> Counts:
    """Prompt lookup's counts over every (prompt, greedy response) pair."""
    total = Counts()
    for prompt, response in zip(prompts, responses, strict=True):
        c = score_drafts(prompt, response, draft_len, prompt_lookup)
        total.steps += c.steps
        total.drafted += c.drafted
        total.accepted += c.accepted
        total.committed += c.committed
    return total


def distinct_ratio(sequences: Sequence[Sequence[int]]) -> float | None:
    """Mean over sequences of distinct tokens / tokens (None without a sequence); compare equal lengths."""
    ratios = [len(set(s)) / len(s) for s in sequences if s]
    return sum(ratios) / len(ratios) if ratios else None


def repeat_share(
    sequences: Sequence[Sequence[int]], window: int = REPEAT_WINDOW, ngram: int = REPEAT_NGRAM
) -> float | None:
    """The share of ``ngram``-grams that already occurred starting within the ``window`` tokens before them:
    near 1 for a loop of period up to ``window - ngram``; None when no sequence has an ``ngram``-gram."""
    repeated = total = 0
    for s in sequences:
        grams = [tuple(s[i : i + ngram]) for i in range(len(s) - ngram + 1)]
        for i, gram in enumerate(grams):
            total += 1
            repeated += gram in grams[max(0, i - window) : i]
    return repeated / total if total else None


def loop_figures(sequences: Sequence[Sequence[int]], length: int) -> dict[str, float | None]:
    """``distinct`` and ``repeats`` over the sequences' first ``length`` tokens (shorter ones are left out, so
    the figures of two sets of sequences compare at the same length)."""
    cut = [list(s[:length]) for s in sequences if len(s) >= length]
    distinct, repeats = distinct_ratio(cut), repeat_share(cut)
    return {
        "distinct": None if distinct is None else round(distinct, 4),
        "repeats": None if repeats is None else round(repeats, 4),
        "sequences": len(cut),
    }


def summary_line(evaluation: dict[str, Any]) -> str:
    """The training Job's one line: ``held-out acceptance A (untrained U, prompt lookup P); top-1@1 held-out H,
    train T``."""

    def fmt(value: object) -> str:
        return f"{value:.3f}" if isinstance(value, int | float) and not isinstance(value, bool) else "n/a"

    def first(key: str) -> object:
        values = evaluation.get(key) or []
        return values[0] if values else None

    return (
        f"held-out acceptance {fmt(evaluation.get('heldOutAcceptance'))} "
        f"(untrained {fmt(evaluation.get('untrainedAcceptance'))}, "
        f"prompt lookup {fmt(evaluation.get('promptLookupAcceptance'))}); "
        f"top-1@1 held-out {fmt(first('heldOutTop1'))}, train {fmt(first('trainTop1'))}"
    )
