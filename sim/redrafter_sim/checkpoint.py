"""A tiny fake model checkpoint for the simulated cluster's pvc:// volumes.

What the build reads before any (stand-in) tool runs: a Llama base (config.json with
``LlamaForCausalLM``, a weights file), a ReDrafter drafter (config.json with hidden_size, exit_dim,
num_draft_layers, rnn; model.safetensors) and a tokenizer. The tokenizer is real (a word-level
``tokenizer.json`` of "w<id>" words), so the served model repository tokenizes and detokenizes.

The PyTorch path's checkpoints (an EAGLE-3 head, an MTP base, draft models) are :data:`FIXTURES`, by name:
``hf://redrafter-sim/<name>`` and ``pvc://<claim>/.../<name>`` resolve to them on the simulated node.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
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


def write_tokenizer(directory: Path, vocab_size: int = VOCAB_SIZE, word: str = "w") -> Path:
    """``word``: the words' prefix; another prefix makes a tokenizer of the same size but another vocabulary."""
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)} | {
        f"{word}{i}": i for i in range(len(SPECIAL_TOKENS), vocab_size)
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


def write_base(directory: Path, vocab_size: int = VOCAB_SIZE, layers: int = 2, word: str = "w") -> Path:
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
                "num_hidden_layers": layers,
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
    write_tokenizer(directory, vocab_size, word)
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


# ---- the PyTorch path's checkpoints (EAGLE-3, MTP, draft-target) ---------------------------------


def write_eagle3_head(directory: Path, vocab_size: int = VOCAB_SIZE) -> Path:
    """An EAGLE-3 head for the 64-wide base, shaped as published heads are (config.json keys of
    yuhuili/EAGLE3-LLaMA3.1-Instruct-8B: LlamaForCausalLMEagle3, one decoder layer, a reduced draft vocabulary
    mapped to the target's by d2t/t2d; no tokenizer of its own)."""
    import numpy as np
    from safetensors.numpy import save_file

    hidden, draft_vocab = 64, vocab_size // 4
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLMEagle3"],
                "model_type": "llama",
                "hidden_size": hidden,
                "intermediate_size": 128,
                "num_attention_heads": 4,
                "num_key_value_heads": 4,
                "num_hidden_layers": 1,
                "hidden_act": "silu",
                "rms_norm_eps": 1e-5,
                "max_position_embeddings": 4096,
                "vocab_size": vocab_size,
                "draft_vocab_size": draft_vocab,
                "tie_word_embeddings": False,
                "torch_dtype": "bfloat16",
                "bos_token_id": 1,
                "eos_token_id": 1,
            },
            indent=2,
        )
    )
    tensors = {
        "fc.weight": np.zeros((hidden, 3 * hidden), np.float32),  # the target's three hidden states, fused
        "midlayer.input_layernorm.weight": np.zeros((hidden,), np.float32),
        "midlayer.hidden_norm.weight": np.zeros((hidden,), np.float32),
        "midlayer.self_attn.q_proj.weight": np.zeros((hidden, 2 * hidden), np.float32),
        "norm.weight": np.zeros((hidden,), np.float32),
        "lm_head.weight": np.zeros((draft_vocab, hidden), np.float32),
        "d2t": np.zeros((draft_vocab,), np.int64),
        "t2d": np.zeros((vocab_size,), np.bool_),
    }
    save_file(tensors, str(directory / "model.safetensors"))
    return directory


def write_mtp_base(directory: Path, vocab_size: int = VOCAB_SIZE, mtp_layers: int = 1) -> Path:
    """A DeepSeek-V3-style base that declares ``mtp_layers`` multi-token-prediction layers, sharded as large
    checkpoints are (model.safetensors.index.json and its shards), with the sim's tokenizer."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["DeepseekV3ForCausalLM"],
                "model_type": "deepseek_v3",
                "hidden_size": 64,
                "intermediate_size": 128,
                "moe_intermediate_size": 32,
                "num_attention_heads": 4,
                "num_key_value_heads": 4,
                "num_hidden_layers": 2,
                "num_nextn_predict_layers": mtp_layers,
                "n_routed_experts": 4,
                "num_experts_per_tok": 2,
                "kv_lora_rank": 16,
                "q_lora_rank": 32,
                "qk_rope_head_dim": 8,
                "qk_nope_head_dim": 8,
                "v_head_dim": 16,
                "vocab_size": vocab_size,
                "max_position_embeddings": 4096,
                "torch_dtype": "bfloat16",
                "bos_token_id": 1,
                "eos_token_id": 1,
            },
            indent=2,
        )
    )
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    for shard in shards:
        (directory / shard).write_bytes(b"\0" * 2048)
    layers = 2 + mtp_layers  # the MTP layers follow the decoder layers, as DeepSeek-V3 numbers them
    weight_map = {
        f"model.layers.{i}.self_attn.kv_a_proj_with_mqa.weight": shards[i * 2 // layers] for i in range(layers)
    }
    weight_map |= {"model.embed_tokens.weight": shards[0], "lm_head.weight": shards[1]}
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 4096}, "weight_map": weight_map}, indent=2)
    )
    write_tokenizer(directory, vocab_size)
    return directory


def write_draft_model(directory: Path, vocab_size: int = VOCAB_SIZE) -> Path:
    """A smaller sibling of the base (one layer) with the same tokenizer: a draft-target draft model."""
    return write_base(directory, vocab_size, layers=1)


def write_draft_model_other_tokenizer(directory: Path, vocab_size: int = VOCAB_SIZE) -> Path:
    """A draft model whose tokenizer has the base's size but other words: drafts the target cannot verify."""
    return write_base(directory, vocab_size, layers=1, word="v")


#: checkpoints the simulated cluster provides by name: ``hf://redrafter-sim/<name>`` (a Hugging Face cache
#: entry the node writes before the Job runs), and ``pvc://<claim>/.../<name>`` (the claim's directory)
FIXTURES: dict[str, Callable[[Path], Path]] = {
    "tiny-llama": write_base,
    "tiny-llama-drafter": write_drafter,
    "tiny-llama-eagle3": write_eagle3_head,
    "tiny-deepseek-mtp": write_mtp_base,
    "tiny-llama-draft": write_draft_model,
    "tiny-llama-draft-other-tokenizer": write_draft_model_other_tokenizer,
}
HF_FIXTURE_ORG = "redrafter-sim"


def fixture_commit(repo_id: str) -> str:
    """The commit a fixture's revision resolves to: stable per repository, 40 hex digits as the Hub's."""
    return hashlib.sha1(repo_id.encode()).hexdigest()


def write_hf_fixture(hub: Path, repo_id: str, revision: str = "main") -> Path | None:
    """Put the fixture ``repo_id`` (``redrafter-sim/<name>``) into the Hugging Face cache at ``hub`` as
    ``snapshot_download`` leaves it (refs/<revision> -> snapshots/<commit>/); None when no fixture has that
    name. An entry whose files were taken (the prepare Job moves downloads into its artifact) is rewritten."""
    org, _, name = repo_id.partition("/")
    if org != HF_FIXTURE_ORG or name not in FIXTURES:
        return None
    commit = fixture_commit(repo_id)
    repo = hub / f"models--{org}--{name}"
    snapshot = repo / "snapshots" / commit
    if not (snapshot / "config.json").exists():
        FIXTURES[name](snapshot)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / revision).write_text(commit)
    return snapshot


def write_fake_checkpoint(root: Path, base: str = "base", drafter: str = "drafter") -> FakeCheckpoint:
    """Base (with its tokenizer) and drafter under ``root`` (a claim's directory)."""
    return FakeCheckpoint(base=write_base(root / base), drafter=write_drafter(root / drafter), tokenizer=root / base)
