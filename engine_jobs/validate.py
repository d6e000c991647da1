"""Check what arrived before any GPU time is spent: each failure names the file and what is wrong."""

from __future__ import annotations

import json
from pathlib import Path

from .errors import bad_input

#: files copied into <artifact>/tokenizer (pre/post-processing load it with AutoTokenizer)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
    "generation_config.json",
    "config.json",
)
#: at least one of these must exist for a tokenizer to load
TOKENIZER_VOCAB = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")


def read_config(directory: Path, role: str) -> dict:
    path = directory / "config.json"
    if not path.is_file():
        raise bad_input(f"{role} model has no config.json (looked in {directory})")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise bad_input(f"{role} config.json is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise bad_input(f"{role} config.json is not a JSON object")
    return config


def validate_base(directory: Path) -> dict:
    """The base needs config.json and HF weights the converters can read; returns the config."""
    config = read_config(directory, "base")
    if not any(directory.glob("*.safetensors")) and not any(directory.glob("*.bin")):
        raise bad_input(f"base model has no *.safetensors or *.bin weights (looked in {directory})")
    return config


def validate_drafter(directory: Path) -> dict:
    """What examples/redrafter/convert_checkpoint.py reads: the config keys, and every tensor of
    model.safetensors by name and shape (model.pt, which only torch can open, by its presence)."""
    from .drafter.export import check_drafter_dir
    from .drafter.export import read_config as read_drafter_config

    read_config(directory, "drafter")  # a missing or unreadable file, in the words used for every role
    try:
        if (directory / "model.safetensors").is_file():
            return check_drafter_dir(directory)
        config = read_drafter_config(directory)
    except ValueError as exc:
        raise bad_input(str(exc)) from None
    if not (directory / "model.pt").is_file():
        raise bad_input(f"drafter has neither model.safetensors nor model.pt (looked in {directory})")
    return config


def validate_tokenizer(directory: Path) -> list[str]:
    """Names of the tokenizer files present; at least one vocabulary file is required.

    A tokenizer whose class is remote code (``auto_map`` in tokenizer_config.json, as Qwen v1's) is
    refused: pre/post-processing load tokenizers without trust_remote_code, so serving it would fail.
    """
    present = [name for name in TOKENIZER_FILES if (directory / name).is_file()]
    if not any(name in present for name in TOKENIZER_VOCAB):
        raise bad_input(f"tokenizer files missing: none of {', '.join(TOKENIZER_VOCAB)} in {directory}")
    remote = _remote_tokenizer_class(directory / "tokenizer_config.json")
    if remote:
        raise bad_input(
            f"tokenizer_config.json maps AutoTokenizer to remote code ({remote}), which needs "
            "trust_remote_code; this operator does not run remote code"
        )
    return present


def _remote_tokenizer_class(path: Path) -> str | None:
    """The ``auto_map.AutoTokenizer`` entry of tokenizer_config.json, if any (unreadable: None)."""
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    auto_map = config.get("auto_map") if isinstance(config, dict) else None
    entry = auto_map.get("AutoTokenizer") if isinstance(auto_map, dict) else None
    if not entry:
        return None
    return ", ".join(str(e) for e in entry if e) if isinstance(entry, list) else str(entry)
