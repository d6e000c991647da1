"""Counting output tokens on the client side.

The entry model returns text (TensorRT-LLM ensemble interface), so tokens are counted the way
genai-perf does: by tokenizing the output. With a tokenizer directory (``tokenizer.json``, loaded
with the ``tokenizers`` library) the count is exact; without one, whitespace-separated words are
counted (exact for word-level vocabularies such as the simulated engine's, approximate otherwise —
the report says which method was used).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol


class TokenCounter(Protocol):
    method: str

    def count(self, text: str) -> int: ...


class WordCounter:
    """Whitespace-separated words."""

    method = "words"

    def count(self, text: str) -> int:
        return len(text.split())


class TokenizerCounter:
    """Tokens of a Hugging Face ``tokenizer.json`` (no special tokens added)."""

    method = "tokenizer"

    def __init__(self, tokenizer_dir: str | Path):
        from tokenizers import Tokenizer

        path = Path(tokenizer_dir)
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.is_file():
            raise FileNotFoundError(f"{file} not found")
        self._tok = Tokenizer.from_file(str(file))

    def count(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False).ids) if text else 0


def make_counter(tokenizer: str | Path | None) -> TokenCounter:
    return TokenizerCounter(tokenizer) if tokenizer else WordCounter()
