"""Check what arrived before any GPU time is spent: each failure names the file and what is wrong."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


def read_config(directory: Path, role: str) -> dict[str, Any]:
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


def validate_base(directory: Path) -> dict[str, Any]:
    """The base needs config.json and HF weights the converters can read; returns the config."""
    config = read_config(directory, "base")
    if not any(directory.glob("*.safetensors")) and not any(directory.glob("*.bin")):
        raise bad_input(f"base model has no *.safetensors or *.bin weights (looked in {directory})")
    return config


def validate_drafter(directory: Path, warn: Callable[[str], None] | None = None) -> dict[str, Any]:
    """What examples/redrafter/convert_checkpoint.py reads: the config keys, and every tensor of
    model.safetensors by name and shape (model.pt, which only torch can open, by its presence); and a head
    whose files show another trainer's recurrence than the engine's is refused (``warn`` is told when the
    files cannot show it)."""
    from .drafter.export import check_drafter_dir, recurrence_warning
    from .drafter.export import read_config as read_drafter_config

    read_config(directory, "drafter")  # a missing or unreadable file, in the words used for every role
    try:
        if (directory / "model.safetensors").is_file():
            config = check_drafter_dir(directory)
        else:
            config = read_drafter_config(directory)
            if not (directory / "model.pt").is_file():
                raise ValueError(f"drafter has neither model.safetensors nor model.pt (looked in {directory})")
        warning = recurrence_warning(config)
    except ValueError as exc:
        raise bad_input(str(exc)) from None
    if warning is not None and warn is not None:
        warn(f"warning: {warning}")
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


# ---- the PyTorch path: checkpoints the LLM API loads as they are ----------------------------------

#: weight layouts TensorRT-LLM's PyTorch-backend loader reads (HfWeightLoader globs *.safetensors, then *.bin),
#: index first: a sharded checkpoint is complete only if every shard its weight_map names is there
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def model_architecture(config: dict[str, Any], role: str) -> str:
    """The first ``architectures`` entry of an HF config.json: the PyTorch backend picks its model class by it."""
    archs = config.get("architectures")
    if isinstance(archs, str):
        archs = [archs]
    if not isinstance(archs, list) or not archs or not all(isinstance(a, str) and a for a in archs):
        raise bad_input(
            f"{role} config.json names no architecture (architectures: {archs!r}); the PyTorch backend "
            "chooses the model class from it"
        )
    return str(archs[0])


def validate_weights(directory: Path, role: str) -> dict[str, Any]:
    """The checkpoint's weights: an index whose shards all exist, or one weights file. Returns what was found.

    ``pytorch_model.bin`` (and its index) is accepted because upstream's loader reads it (EAGLE-3 heads are
    commonly published that way); safetensors are preferred when both are present, as upstream does.
    """
    for index in WEIGHT_INDEXES:
        path = directory / index
        if not path.is_file():
            continue
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise bad_input(f"{role} {index} is not valid JSON: {exc}") from None
        weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise bad_input(f"{role} {index} has no weight_map")
        shards = sorted({str(v) for v in weight_map.values()})
        unsafe = [s for s in shards if not s or "/" in s or "\\" in s or s.startswith(".")]
        if unsafe:
            raise bad_input(f"{role} {index} names a shard outside the checkpoint directory: {unsafe[0]!r}")
        missing = [s for s in shards if not (directory / s).is_file()]
        if missing:
            more = f" (and {len(missing) - 1} more of {len(shards)})" if len(missing) > 1 else ""
            raise bad_input(f"{role} checkpoint is missing shard {missing[0]}{more}, named in {index}'s weight_map")
        return {"index": index, "files": shards, "tensors": len(weight_map)}
    for name in WEIGHT_FILES:
        if (directory / name).is_file():
            return {"index": None, "files": [name]}
    raise bad_input(
        f"{role} checkpoint has no weights: expected {' or '.join(WEIGHT_FILES[:1] + WEIGHT_INDEXES[:1])} "
        f"(or {' or '.join(WEIGHT_FILES[1:] + WEIGHT_INDEXES[1:])}) in {directory}"
    )


#: the API field that asks for MTP layers (its path in the resource, for messages)
MTP_FIELD = "spec.mtp.numNextnPredictLayers"


def mtp_layers(config: dict[str, Any], requested: int) -> int:
    """The MTP layers the base declares (DeepSeek-V3's ``num_nextn_predict_layers``); at least ``requested``."""
    declared = config.get("num_nextn_predict_layers")
    if isinstance(declared, bool) or not isinstance(declared, int) or declared <= 0:
        raise bad_input(
            f"{MTP_FIELD} is {requested} but the base config.json declares no MTP layers "
            f"(num_nextn_predict_layers: {json.dumps(declared)}); mtp needs a checkpoint trained with them "
            "(DeepSeek-V3 family)"
        )
    if declared < requested:
        raise bad_input(
            f"{MTP_FIELD} is {requested} but the base config.json declares only {declared} MTP layer"
            f"{'s' if declared != 1 else ''} (num_nextn_predict_layers: {declared})"
        )
    return declared


def eagle3_hidden_size(head: dict[str, Any], base: dict[str, Any]) -> int | None:
    """The target hidden size the head expects, checked against the base's (they must agree to load)."""
    want = head.get("target_hidden_size") or head.get("hidden_size")
    have = base.get("hidden_size")
    if isinstance(want, int) and isinstance(have, int) and want != have:
        raise bad_input(
            f"the EAGLE-3 head expects a target hidden size of {want} but the base config.json has hidden_size {have}"
        )
    return want if isinstance(want, int) else None


@dataclass(frozen=True)
class Vocabulary:
    """What identifies a tokenizer's vocabulary: the file it was read from, its size and a digest of it."""

    source: str  # tokenizer.json | tokenizer.model | vocab.json | config.json vocab_size
    size: int | None
    digest: str | None

    def describe(self) -> str:
        size = f"{self.size}-token " if self.size is not None else ""
        digest = f", sha256:{self.digest[:12]}" if self.digest else ""
        return f"a {size}vocabulary ({self.source}{digest})"


def vocabularies(directory: Path, config: dict[str, Any] | None) -> dict[str, Vocabulary]:
    """Every way this directory's vocabulary can be compared, by source file (best first)."""
    out: dict[str, Vocabulary] = {}
    tok = directory / "tokenizer.json"
    if tok.is_file():
        try:
            doc = json.loads(tok.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise bad_input(f"{tok} is not valid JSON: {exc}") from None
        model = doc.get("model") if isinstance(doc, dict) else None
        vocab = model.get("vocab") if isinstance(model, dict) else None
        added = doc.get("added_tokens") if isinstance(doc, dict) else None
        pairs: set[tuple[int, str]] = set()
        if isinstance(vocab, dict):
            pairs |= {(int(i), str(t)) for t, i in vocab.items() if isinstance(i, int)}
        elif isinstance(vocab, list):  # Unigram: [[piece, score], ...], ids by position
            pairs |= {(i, str(p[0] if isinstance(p, list) and p else p)) for i, p in enumerate(vocab)}
        if isinstance(added, list):
            pairs |= {(int(a["id"]), str(a.get("content"))) for a in added if isinstance(a, dict) and "id" in a}
        if pairs:
            canonical = json.dumps(sorted(pairs), separators=(",", ":"), ensure_ascii=True)
            out["tokenizer.json"] = Vocabulary(
                "tokenizer.json", len({i for i, _ in pairs}), hashlib.sha256(canonical.encode()).hexdigest()
            )
    for name in ("tokenizer.model", "vocab.json"):
        path = directory / name
        if path.is_file():
            out[name] = Vocabulary(name, None, hashlib.sha256(path.read_bytes()).hexdigest())
    size = (config or {}).get("vocab_size")
    if isinstance(size, int) and not isinstance(size, bool):
        out["config.json vocab_size"] = Vocabulary("config.json vocab_size", size, None)
    return out


def same_vocabulary(
    draft: dict[str, Vocabulary], target: dict[str, Vocabulary], draft_name: str, target_name: str
) -> Vocabulary:
    """The draft model's vocabulary must be the target's; compared on the best source both have.

    config.json's vocab_size is the last resort: embedding tables are often padded, so equal tokenizers can
    declare different sizes there and only a tokenizer file is conclusive.
    """
    common = [k for k in draft if k in target]
    if not common:
        raise bad_input(
            f"cannot compare the draft model's tokenizer with the target's: {draft_name} has "
            f"{', '.join(draft) or 'no tokenizer files'}, {target_name} has {', '.join(target) or 'no tokenizer files'}"
        )
    source = common[0]
    a, b = draft[source], target[source]
    if (a.digest, a.size) != (b.digest, b.size):
        raise bad_input(
            f"the draft model's tokenizer does not match the target's: {draft_name} has {a.describe()}, "
            f"{target_name} has {b.describe()}; draftModel needs the same vocabulary"
        )
    return a
