"""The drafter directory TensorRT-LLM's converter reads: config.json and model.safetensors.

:func:`check_drafter_dir` reads what ``examples/redrafter/convert_checkpoint.py --drafter_model_dir`` reads
(``create_and_save_config``: the config keys; ``hf_drafter``: the tensors) and fails with the reason the
converter would fail for, before an engine build spends GPU time on it. It parses the safetensors header by
hand, so it runs without torch (in the training Job's shell and on the operator's side).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from ..contract import (
    APPLE_MODEL_TYPE,
    DRAFTER_CONFIG_FILE,
    DRAFTER_WEIGHTS_FILE,
    ENGINE_RECURRENCE,
    RECURRENCE_KEY,
)

#: config.json keys the converter reads (vocab_size, the head's output width, is checked where present: this
#: operator's heads carry it, a head trained elsewhere may not)
POSITIVE_INT_KEYS = ("hidden_size", "exit_dim", "num_draft_layers")
BOOL_KEYS = ("rnn",)
OPTIONAL_INT_KEYS = ("vocab_size",)
#: a header larger than this is not a drafter's (a guard against reading a corrupt length)
MAX_HEADER_BYTES = 100 * 1024 * 1024


def expected_tensors(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every tensor ``hf_drafter`` reads for this config, with its torch shape (``[out, in]`` for weights)."""
    hidden, exit_dim = int(config["hidden_size"]), int(config["exit_dim"])
    layers, vocab = int(config["num_draft_layers"]), int(config.get("vocab_size") or -1)
    shapes: dict[str, tuple[int, ...]] = {}
    if exit_dim != 2 * hidden:
        shapes["input_proj.weight"] = (exit_dim, 2 * hidden)
        shapes["input_proj.bias"] = (exit_dim,)
    for i in range(layers):
        shapes[f"lm_head.{i}.linear.weight"] = (exit_dim, exit_dim)
        shapes[f"lm_head.{i}.linear.bias"] = (exit_dim,)
    shapes[f"lm_head.{layers}.weight"] = (vocab, exit_dim)
    if config["rnn"]:
        shapes["rnn_u.weight"] = (hidden, hidden)
        shapes["rnn_u.bias"] = (hidden,)
        shapes["rnn_w.weight"] = (hidden, hidden)
    return shapes


def read_config(path: Path) -> dict[str, Any]:
    """The drafter's config.json, checked key by key."""
    file = path / DRAFTER_CONFIG_FILE
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(
            f"drafter {DRAFTER_CONFIG_FILE} is missing in {path} (convert_checkpoint.py reads it)"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"drafter {DRAFTER_CONFIG_FILE} in {path} is unreadable: {exc}") from None
    if not isinstance(config, dict):
        raise ValueError(f"drafter {DRAFTER_CONFIG_FILE} must hold a JSON object, got {type(config).__name__}")
    for key in (*POSITIVE_INT_KEYS, *BOOL_KEYS):
        if key not in config:
            raise ValueError(f"drafter {DRAFTER_CONFIG_FILE} lacks {key} (convert_checkpoint.py reads it)")
    for key in (*POSITIVE_INT_KEYS, *(k for k in OPTIONAL_INT_KEYS if k in config)):
        value = config[key]
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"drafter {DRAFTER_CONFIG_FILE}: {key} must be a positive integer, got {value!r}")
    for key in BOOL_KEYS:
        if not isinstance(config[key], bool):
            raise ValueError(f"drafter {DRAFTER_CONFIG_FILE}: {key} must be true or false, got {config[key]!r}")
    return config


def read_safetensors_header(file: Path) -> dict[str, dict[str, Any]]:
    """Tensor name -> {dtype, shape, data_offsets}: the 8-byte little-endian length, then the JSON header."""
    try:
        with open(file, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise ValueError(f"drafter {file.name} is not a safetensors file (shorter than its header length)")
            (length,) = struct.unpack("<Q", head)
            if length > MAX_HEADER_BYTES:
                raise ValueError(f"drafter {file.name} is not a safetensors file (header length {length})")
            raw = fh.read(length)
    except FileNotFoundError:
        raise ValueError(f"drafter {file.name} is missing in {file.parent} (convert_checkpoint.py loads it)") from None
    except OSError as exc:
        raise ValueError(f"drafter {file.name} is unreadable: {exc}") from None
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ValueError(f"drafter {file.name} is not a safetensors file (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise ValueError(f"drafter {file.name} is not a safetensors file (its header is not an object)")
    header.pop("__metadata__", None)
    return header


def check_drafter_dir(path: str | Path) -> dict[str, Any]:
    """The config of a drafter directory the converter can read; ValueError naming what it would trip on."""
    path = Path(path)
    config = read_config(path)
    header = read_safetensors_header(path / DRAFTER_WEIGHTS_FILE)
    for name, shape in expected_tensors(config).items():
        entry = header.get(name)
        if not isinstance(entry, dict):
            raise ValueError(f"drafter {DRAFTER_WEIGHTS_FILE} lacks {name} (convert_checkpoint.py reads it)")
        found = tuple(entry.get("shape") or ())
        if len(found) == len(shape) and all(want in (-1, got) for want, got in zip(shape, found)):
            continue  # -1: a width config.json does not give (vocab_size)
        if found != shape:
            raise ValueError(
                f"drafter {DRAFTER_WEIGHTS_FILE}: {name} has shape {list(found)}, but config.json "
                f"(hidden_size {config['hidden_size']}, exit_dim {config['exit_dim']}, "
                f"vocab_size {config.get('vocab_size', 'unset')}) needs {list(shape)}"
            )
    return config


def recurrence_warning(config: dict[str, Any]) -> str | None:
    """None when the engine computes the head's recurrence as it was trained; a warning when the files cannot
    tell; ValueError when they show a trainer with another recurrence (the engine would serve other drafts).

    Without ``rnn`` the state is a running sum of embeddings in every trainer and in the engine.
    """
    if not config.get("rnn"):
        return None
    marked = config.get(RECURRENCE_KEY)
    if marked == ENGINE_RECURRENCE:
        return None
    if config.get("model_type") == APPLE_MODEL_TYPE or "num_lookback_tokens" in config:
        raise ValueError(
            "drafter was trained with Apple's ml-recurrent-drafter (config.json model_type "
            f"{config.get('model_type')!r}), whose recurrence is s = silu(W e + U s + b) from s = 0; TensorRT-LLM's "
            "engine computes W e at the first draft step and W e + U s + b after, without silu, so it would not "
            "draft what the head learned. Retrain it with spec.model.drafter.train, or with a trainer that "
            "computes the engine's recurrence"
        )
    if marked is not None:
        raise ValueError(
            f"drafter config.json names recurrence {marked!r}; the engine computes only {ENGINE_RECURRENCE!r} "
            "(s = W e at the first draft step, W e + U s + b after)"
        )
    return (
        "drafter config.json does not say which recurrence the head was trained with; TensorRT-LLM computes "
        "s = W e at the first draft step and W e + U s + b after (no silu). A head trained with silu in the "
        "recurrence (Apple's trainer) drafts poorly in the engine: check its acceptance after validation"
    )


def save_drafter(head: Any, config: dict[str, Any], out_dir: str | Path) -> None:
    """config.json and float32 model.safetensors with the converter's names (``head`` a ReDrafterHead)."""
    import torch
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.detach().to("cpu", torch.float32).contiguous() for name, t in head.state_dict().items()}
    missing = set(expected_tensors(config)) ^ set(tensors)
    if missing:
        raise ValueError(f"the head's tensors do not match its config: {sorted(missing)}")
    save_file(tensors, str(out / DRAFTER_WEIGHTS_FILE))
    (out / DRAFTER_CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def load_drafter(path: str | Path) -> Any:
    """A ReDrafterHead from a checked drafter directory (float32, eval mode)."""
    from safetensors.torch import load_file

    from .model import DrafterConfig, ReDrafterHead

    path = Path(path)
    config = check_drafter_dir(path)
    head = ReDrafterHead(DrafterConfig.from_json(config))
    head.load_state_dict(load_file(str(path / DRAFTER_WEIGHTS_FILE)))
    return head.eval()
