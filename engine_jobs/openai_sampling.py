"""What a request may ask of the engine: its prompt and output within the engine's lengths, its stop sequences
within the front's limit; the answer is the :class:`~.triton_bridge.Sampling` of one generation."""

from __future__ import annotations

from .openai_protocol import ApiError, _Request
from .openai_settings import FrontSettings
from .triton_bridge import Sampling

#: OpenAI's documented default of ``max_tokens`` for /v1/completions (chat defaults to the context left)
COMPLETIONS_DEFAULT_MAX_TOKENS = 16


def check_prompt_length(n: int, settings: FrontSettings, param: str) -> None:
    """Refuses a prompt of ``n`` tokens that the engine cannot take."""
    if n == 0:
        raise ApiError(400, "the prompt encodes to zero tokens", param=param, code="invalid_value")
    if n > settings.max_input_len:
        raise ApiError(
            400,
            f"the prompt has {n} tokens, more than this model's maximum input length of "
            f"{settings.max_input_len} tokens",
            param=param,
            code="context_length_exceeded",
        )


def sampling(req: _Request, prompt_tokens: int, default_max: int | None, settings: FrontSettings) -> Sampling:
    """``req``'s sampling; its output limit defaults to ``default_max`` (None: the context left)."""
    room = settings.max_seq_len - prompt_tokens
    limit = req.output_limit
    if limit is None:
        limit = room if default_max is None else min(default_max, room)
    elif prompt_tokens + limit > settings.max_seq_len:
        raise ApiError(
            400,
            f"{prompt_tokens} prompt tokens + {limit} output tokens exceed this model's "
            f"maximum sequence length of {settings.max_seq_len} tokens",
            param="max_completion_tokens" if getattr(req, "max_completion_tokens", None) else "max_tokens",
            code="context_length_exceeded",
        )
    if req.min_tokens is not None and req.min_tokens > limit:
        raise ApiError(
            400,
            f"min_tokens ({req.min_tokens}) exceeds max_tokens ({limit})",
            param="min_tokens",
            code="invalid_value",
        )
    too_long = next((i for i, s in enumerate(req.stop_list) if len(s) > settings.max_stop_chars), None)
    if too_long is not None:
        raise ApiError(
            400,
            f"stop sequence {too_long} has {len(req.stop_list[too_long])} characters, more than the limit of "
            f"{settings.max_stop_chars} (max_stop_chars)",
            param="stop",
            code="invalid_value",
        )
    return Sampling(
        max_tokens=limit,
        stop=tuple(req.stop_list),
        temperature=req.temperature,
        top_p=req.top_p,
        seed=req.seed,
        presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty,
        min_tokens=req.min_tokens,
    )
