"""Tokenizer loading shared by the preprocessing and postprocessing models.

Production images carry ``transformers``: AutoTokenizer handles every Hugging Face tokenizer layout.
Without it (slim images, CPU tests) a ``tokenizer.json`` is loaded with the ``tokenizers`` library.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

_EOS_CANDIDATES = ("</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>", "[EOS]")
_PAD_CANDIDATES = ("<pad>", "[PAD]", "<|pad|>")


class Tokenizer:
    """encode/decode plus end and pad ids, whatever library backs it."""

    def __init__(self, tokenizer_dir: str) -> None:
        path = Path(tokenizer_dir)
        if not path.is_dir():
            raise FileNotFoundError(f"tokenizer directory {tokenizer_dir!r} does not exist")
        self._hf: Any = None
        self._fast: Any = None
        auto = _auto_tokenizer()
        if auto is not None:
            self._hf = auto.from_pretrained(str(path), legacy=False, padding_side="left", trust_remote_code=False)
            # a directory with tokenizer.json alone names no special tokens: look them up as below
            self.eos_id = self._hf.eos_token_id
            if self.eos_id is None:
                self.eos_id = self._first_id(_EOS_CANDIDATES)
            pad = self._hf.pad_token_id if self._hf.pad_token_id is not None else self._first_id(_PAD_CANDIDATES)
            self.pad_id = pad if pad is not None else self.eos_id
        else:
            from tokenizers import Tokenizer as FastTokenizer

            file = path / "tokenizer.json"
            if not file.is_file():
                raise FileNotFoundError(f"{file} not found and transformers is not installed")
            self._fast = FastTokenizer.from_file(str(file))
            self.eos_id = self._first_id(_EOS_CANDIDATES)
            pad = self._first_id(_PAD_CANDIDATES)
            self.pad_id = pad if pad is not None else self.eos_id
        if self.eos_id is None:
            raise ValueError(f"tokenizer in {tokenizer_dir} has no end-of-sequence token")

    @property
    def hf(self) -> Any:
        """The transformers tokenizer backing this one, if any (its apply_chat_template renders chats)."""
        return self._hf

    def _first_id(self, names: tuple[str, ...]) -> int | None:
        vocab = self._hf.get_vocab() if self._hf is not None else self._fast.get_vocab(with_added_tokens=True)
        return next((vocab[name] for name in names if name in vocab), None)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if self._hf is not None:
            return list(self._hf.encode(text, add_special_tokens=add_special_tokens))
        return list(self._fast.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        if self._hf is not None:
            return str(self._hf.decode(ids, skip_special_tokens=skip_special_tokens))
        return str(self._fast.decode(ids, skip_special_tokens=skip_special_tokens))


def _auto_tokenizer() -> Any:
    """transformers' AutoTokenizer where the image carries it, else None."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        return None
    return AutoTokenizer


def word_list(tokenizer: Tokenizer, words: list[str]) -> list[list[int]]:
    """TRT-LLM's stop/bad words format for one request: [[flat ids...], [end offsets..., -1 pad]]."""
    flat: list[int] = []
    offsets: list[int] = []
    for word in words:
        ids = tokenizer.encode(word, add_special_tokens=False)
        if not ids:
            continue
        flat += ids
        offsets.append(len(flat))
    if not flat:
        return [[0], [-1]]
    pad = len(flat) - len(offsets)
    return [flat, offsets + [-1] * pad]
