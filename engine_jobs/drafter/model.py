"""The ReDrafter head with the parameter names and math TensorRT-LLM's engine uses.

Names are what ``examples/redrafter/convert_checkpoint.py`` (``hf_drafter``) reads from
``model.safetensors``; the forward math is ``tensorrt_llm/models/redrafter/drafter.py`` (``Drafter``,
``ResBlock``, ``rnn_embed``) and ``redrafter_helper._beam_search_candidates``, so a head trained here drafts
in the engine as it drafted in training. Apple's reference (``recurrent_drafting/modeling_drafter.py``)
differs in the recurrence only: it computes ``silu(W e + U s + b)`` from ``s = 0``, while the engine computes
``W e`` at the first draft step and ``W e + U s + b`` after; the engine is what serves, so its form is trained.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..contract import ENGINE_RECURRENCE, RECURRENCE_KEY


@dataclass(frozen=True)
class DrafterConfig:
    """The drafter's config.json (what ``create_and_save_config`` reads, plus vocab_size)."""

    hidden_size: int
    exit_dim: int
    num_draft_layers: int
    rnn: bool
    vocab_size: int

    def to_json(self) -> dict[str, Any]:
        return {
            "hidden_size": self.hidden_size,
            "exit_dim": self.exit_dim,
            "num_draft_layers": self.num_draft_layers,
            "rnn": self.rnn,
            "vocab_size": self.vocab_size,
            RECURRENCE_KEY: ENGINE_RECURRENCE,  # what the build checks before it builds an engine
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DrafterConfig:
        return cls(
            hidden_size=int(data["hidden_size"]),
            exit_dim=int(data["exit_dim"]),
            num_draft_layers=int(data["num_draft_layers"]),
            rnn=bool(data["rnn"]),
            vocab_size=int(data["vocab_size"]),
        )


class ResBlock(nn.Module):
    """``x + silu(linear(x))``: ``lm_head.<i>.linear``."""

    def __init__(self, exit_dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(exit_dim, exit_dim, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + nn.functional.silu(self.linear(x))


class ReDrafterHead(nn.Module):
    """Drafts tokens from the base's last hidden state and a recurrent state over drafted tokens' embeddings.

    The input is ``concat(context, state)`` (2 x hidden): ``context`` is the base's final-norm hidden state
    at the position that produced the guaranteed token, ``state`` summarises the embeddings (the base's
    input embedding table, not part of this checkpoint) of the tokens drafted so far, starting with the
    guaranteed token.
    """

    def __init__(self, config: DrafterConfig) -> None:
        super().__init__()
        self.config = config
        if config.exit_dim != 2 * config.hidden_size:
            self.input_proj = nn.Linear(2 * config.hidden_size, config.exit_dim, bias=True)
        self.lm_head = nn.Sequential(
            *[ResBlock(config.exit_dim) for _ in range(config.num_draft_layers)],
            nn.Linear(config.exit_dim, config.vocab_size, bias=False),
        )
        if config.rnn:
            self.rnn_u = nn.Linear(config.hidden_size, config.hidden_size, bias=True)
            self.rnn_w = nn.Linear(config.hidden_size, config.hidden_size, bias=False)

    def logits(self, context: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """Next-token logits from ``[..., hidden]`` context and state (``Drafter.forward``)."""
        x = torch.cat([context, state], dim=-1)
        if self.config.exit_dim != 2 * self.config.hidden_size:
            x = self.input_proj(x)
        out: torch.Tensor = self.lm_head(x)
        return out

    def step(self, embedding: torch.Tensor, state: torch.Tensor | None) -> torch.Tensor:
        """The state after one more token (``state`` None before the first, the guaranteed token)."""
        if self.config.rnn:
            w: torch.Tensor = self.rnn_w(embedding)
            return w if state is None else w + self.rnn_u(state)
        return embedding if state is None else embedding + state

    def forward(self, context: torch.Tensor, embeddings: torch.Tensor) -> torch.Tensor:
        """Teacher-forced logits: ``context`` [..., H], ``embeddings`` [..., K, H] of the guaranteed token and
        the K-1 tokens after it; logits [..., K, V], the i-th predicting the token after the i-th input."""
        state: torch.Tensor | None = None
        out = []
        for i in range(embeddings.shape[-2]):
            state = self.step(embeddings[..., i, :], state)
            out.append(self.logits(context, state))
        return torch.stack(out, dim=-2)
