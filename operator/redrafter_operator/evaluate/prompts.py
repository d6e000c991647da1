"""Prompt sets: a small built-in default, or a JSON/YAML file (e.g. a mounted ConfigMap key).

Accepted file shapes (JSON or YAML):

* a list of strings: ``["Explain ...", "Write ..."]``;
* a list of objects: ``[{"text": "Explain ...", "max_tokens": 64}, ...]`` (``max_tokens`` optional);
* an object with a ``prompts`` key holding either list.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

#: repeated to build a max-length input; " the" is a single token in every common BPE vocabulary
FILLER_WORD = "the"


@dataclass(frozen=True)
class Prompt:
    text: str
    max_tokens: int | None = None  # None: the run's --max-tokens


DEFAULT_PROMPTS: tuple[Prompt, ...] = tuple(
    Prompt(t)
    for t in (
        "Explain speculative decoding to a new engineer in three sentences.",
        "Write a Python function that returns the n-th Fibonacci number iteratively.",
        "Summarise the causes of the French Revolution.",
        "What is the difference between a process and a thread?",
        "Translate to French: The weather is lovely today and we are going to the beach.",
        "List five uses of a Kubernetes operator.",
        "Describe how a transformer attention layer works.",
        "Give a recipe for a simple tomato soup.",
        "Why is the sky blue? Answer for a ten-year-old.",
        "Write a haiku about GPUs waiting for memory.",
        "Compare TCP and UDP in a short table.",
        "What are the trade-offs of tensor parallelism versus pipeline parallelism?",
        "Draft a polite email declining a meeting invitation.",
        "Explain the birthday paradox with numbers.",
        "How does a hash map handle collisions?",
        "Tell a short story about a lighthouse keeper and a storm.",
    )
)


def parse_prompts(data: Any) -> list[Prompt]:
    """Prompts from already-decoded JSON/YAML (see the module doc for the shapes)."""
    if isinstance(data, dict):
        if "prompts" not in data:
            raise ValueError("a prompt file object needs a 'prompts' key")
        data = data["prompts"]
    if not isinstance(data, list) or not data:
        raise ValueError("prompts must be a non-empty list")
    out: list[Prompt] = []
    for i, item in enumerate(data):
        if isinstance(item, str):
            text, max_tokens = item, None
        elif isinstance(item, dict) and isinstance(item.get("text"), str):
            text, max_tokens = item["text"], item.get("max_tokens")
            if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
                raise ValueError(f"prompt {i}: max_tokens must be an integer >= 1")
        else:
            raise ValueError(f"prompt {i}: expected a string or an object with a 'text' string")
        if not text.strip():
            raise ValueError(f"prompt {i} is empty")
        out.append(Prompt(text, max_tokens))
    return out


def load_prompts(path: str | Path | None) -> list[Prompt]:
    """The prompts in ``path`` (JSON or YAML by content), or the built-in default when None."""
    if path is None:
        return list(DEFAULT_PROMPTS)
    text = Path(path).read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = yaml.safe_load(text)
    return parse_prompts(data)


def max_length_prompt(max_input_len: int, reserve: int = 8) -> Prompt:
    """A prompt of about ``max_input_len - reserve`` tokens (room for BOS/chat tokens)."""
    words = max(max_input_len - reserve, 1)
    return Prompt(" ".join([FILLER_WORD] * words))
