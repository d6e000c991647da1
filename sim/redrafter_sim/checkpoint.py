"""A tiny fake model checkpoint for the simulated cluster's pvc:// volumes.

What the build reads before any (stand-in) tool runs: a Llama base (config.json with
``LlamaForCausalLM``, a weights file), a ReDrafter drafter (config.json with hidden_size, exit_dim,
num_draft_layers, rnn; model.safetensors) and a tokenizer. The tokenizer is real (a word-level
``tokenizer.json`` of "w<id>" words), so the served model repository tokenizes and detokenizes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers

VOCAB_SIZE = 1000
SPECIAL_TOKENS = ("[PAD]", "</s>", "[UNK]")
#: a chat template in the vocabulary (role markers w10 system, w11 user, w12 assistant), so chat
#: completions through the OpenAI-compatible API render as they do for a real instruct model
CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}w10 {{ m['content'] }} "
    "{% elif m['role'] == 'user' %}w11 {{ m['content'] }} "
    "{% elif m['role'] == 'assistant' %}w12 {{ m['content'] }}{{ eos_token }} "
    "{% else %}{{ raise_exception('Only system, user and assistant roles are supported') }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}w12{% endif %}"
)


@dataclass(frozen=True)
class FakeCheckpoint:
    base: Path
    drafter: Path
    tokenizer: Path


def write_tokenizer(directory: Path, vocab_size: int = VOCAB_SIZE) -> Path:
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)} | {
        f"w{i}": i for i in range(len(SPECIAL_TOKENS), vocab_size)
    }
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "eos_token": "</s>",
                "pad_token": "[PAD]",
                "unk_token": "[UNK]",
                "chat_template": CHAT_TEMPLATE,
            },
            indent=2,
        )
    )
    return directory


def write_base(directory: Path, vocab_size: int = VOCAB_SIZE) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_attention_heads": 4,
                "num_key_value_heads": 4,
                "num_hidden_layers": 2,
                "vocab_size": vocab_size,
                "max_position_embeddings": 4096,
                "torch_dtype": "bfloat16",
                "bos_token_id": 1,
                "eos_token_id": 1,
            },
            indent=2,
        )
    )
    (directory / "model.safetensors").write_bytes(b"\0" * 4096)
    write_tokenizer(directory, vocab_size)
    return directory


def write_drafter(directory: Path, vocab_size: int = VOCAB_SIZE) -> Path:
    """A drafter head for the 64-wide base, with the tensor names and shapes TensorRT-LLM's converter reads
    (zeros: the simulated engine never runs it)."""
    import numpy as np
    from safetensors.numpy import save_file

    hidden, exit_dim, layers = 64, 128, 2
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(
        json.dumps(
            {
                "hidden_size": hidden,
                "exit_dim": exit_dim,
                "num_draft_layers": layers,
                "rnn": True,
                "vocab_size": vocab_size,
            },
            indent=2,
        )
    )
    tensors = {
        **{f"lm_head.{i}.linear.weight": np.zeros((exit_dim, exit_dim), np.float32) for i in range(layers)},
        **{f"lm_head.{i}.linear.bias": np.zeros((exit_dim,), np.float32) for i in range(layers)},
        f"lm_head.{layers}.weight": np.zeros((vocab_size, exit_dim), np.float32),
        "rnn_u.weight": np.zeros((hidden, hidden), np.float32),
        "rnn_u.bias": np.zeros((hidden,), np.float32),
        "rnn_w.weight": np.zeros((hidden, hidden), np.float32),
    }
    save_file(tensors, str(directory / "model.safetensors"))
    return directory


def write_fake_checkpoint(root: Path, base: str = "base", drafter: str = "drafter") -> FakeCheckpoint:
    """Base (with its tokenizer) and drafter under ``root`` (a claim's directory)."""
    return FakeCheckpoint(base=write_base(root / base), drafter=write_drafter(root / drafter), tokenizer=root / base)
