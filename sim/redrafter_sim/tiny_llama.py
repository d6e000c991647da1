"""TEST DOUBLE: a tiny random-weight Llama that transformers really loads and runs, for drafter training tests.

Unlike ``checkpoint.write_base`` (a config and zeros the stand-in tools only inspect), this writes a real
``LlamaForCausalLM`` checkpoint and the sim's word-level tokenizer, so self-distillation, training and
drafting run end to end on a CPU in seconds.

It is a bigram-like fixture for plumbing, not a model: the acceptance a head reaches on it says the recipe's
pieces fit together, not that a head drafts on a real model (``bench/drafting_gpu.py`` pretrains one for that).
A random Llama's greedy continuation is either chaotic (full-strength blocks, ``mixing`` 1: no head can learn
it, and a head memorises its training continuations instead) or a near-bigram chain (blocks damped): each
token mostly determines the next, with some context mixed in. ``mixing`` scales the attention and MLP output
projections against the embedding; the damping holds at this width only (a wider model's blocks outweigh the
embedding again). At 0.2 a bigram table built from 80 prompts' continuations predicts 83 % of 20 other prompts'
tokens and the continuations use about 400 distinct tokens: varied with the prompt, and learnable.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from .checkpoint import SPECIAL_TOKENS, write_tokenizer

#: the scale of the blocks' output projections against the token embedding in the residual stream
MIXING = 0.2
EOS_TOKEN_ID = SPECIAL_TOKENS.index("</s>")
PAD_TOKEN_ID = SPECIAL_TOKENS.index("[PAD]")


def write_tiny_llama(
    directory: Path,
    vocab_size: int = 1000,
    hidden: int = 64,
    layers: int = 2,
    seed: int = 0,
    mixing: float = MIXING,
) -> Path:
    """A loadable ``LlamaForCausalLM`` (float32 safetensors) with its tokenizer in ``directory``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        bos_token_id=EOS_TOKEN_ID,
        eos_token_id=EOS_TOKEN_ID,
        pad_token_id=PAD_TOKEN_ID,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(mixing)
            layer.mlp.down_proj.weight.mul_(mixing)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, safe_serialization=True)
    write_tokenizer(directory, vocab_size)
    return directory


def write_prompts_jsonl(path: Path, n: int, seed: int = 0, vocab_size: int = 1000) -> Path:
    """``n`` lines of ``{"text": "w12 w873 ..."}``: 4 to 12 random words of the tokenizer's vocabulary."""
    rng = random.Random(seed)
    first = len(SPECIAL_TOKENS)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        for _ in range(n):
            words = [f"w{rng.randrange(first, vocab_size)}" for _ in range(rng.randint(4, 12))]
            fh.write(json.dumps({"text": " ".join(words)}) + "\n")
    return path


if __name__ == "__main__":  # the node writes a claim's model in a process of its own: torch stays out of the demo's
    import sys

    write_tiny_llama(Path(sys.argv[1]))
