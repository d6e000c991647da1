"""Comparing the ReDrafter engine's greedy outputs with the base engine's (pure).

Greedy speculative decoding must not change the output: every accepted draft token is the token the
base model would have produced. Any difference is a divergence, reported with the prompt and the
first differing position.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

from .tokens import TokenCounter, WordCounter

CONTEXT_CHARS = 24


@dataclass(frozen=True)
class Divergence:
    key: str  # scenario/request identifier
    prompt: str
    char: int  # first differing character
    token: int  # index of the first differing output token (as counted client-side)
    redrafter: str  # excerpt around the difference
    base: str

    def describe(self) -> str:
        return (
            f"{self.key} prompt {_excerpt(self.prompt, 0, 40)!r}: outputs differ at character {self.char} "
            f"(token {self.token}): redrafter {self.redrafter!r} vs base {self.base!r}"
        )


def _excerpt(text: str, at: int, width: int = CONTEXT_CHARS) -> str:
    start = max(at - width // 2, 0)
    out = text[start : start + width]
    return ("…" if start else "") + out + ("…" if start + width < len(text) else "")


def first_divergence(
    key: str, prompt: str, redrafter: str, base: str, counter: TokenCounter | None = None
) -> Divergence | None:
    """None when the outputs are identical, else where they first differ."""
    if redrafter == base:
        return None
    counter = counter or WordCounter()
    i = len(os.path.commonprefix([redrafter, base]))
    prefix = redrafter[:i]
    token = counter.count(prefix)
    if prefix and not prefix[-1].isspace() and token and i < max(len(redrafter), len(base)):
        # the prefix ends inside the differing token: it was counted as a (partial) token
        nxt_r, nxt_b = redrafter[i : i + 1], base[i : i + 1]
        if (nxt_r and not nxt_r.isspace()) or (nxt_b and not nxt_b.isspace()):
            token -= 1
    return Divergence(key, prompt, i, token, _excerpt(redrafter, i), _excerpt(base, i))


def compare_outputs(
    prompts: Mapping[str, str],
    redrafter: Mapping[str, str],
    base: Mapping[str, str],
    counter: TokenCounter | None = None,
) -> list[Divergence]:
    """Divergences over the keys both engines answered (keys in ``prompts`` order)."""
    out = []
    for key, prompt in prompts.items():
        if key in redrafter and key in base:
            d = first_divergence(key, prompt, redrafter[key], base[key], counter)
            if d is not None:
                out.append(d)
    return out
