"""A generation as OpenAI's response: one JSON body, or Server-Sent Events ending with ``data: [DONE]``.

Completions and chat completions differ only in their wire shape (:class:`Kind`). The acceptance rate travels
in ``x-redrafter-acceptance-rate`` (streams: in the last chunk, as headers precede the generation). A
generation is bounded in time: 504, or an error event ending a stream whose headers are gone.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp_sse import EventSourceResponse

from .contract import ACCEPTANCE_HEADER
from .openai_front import Front
from .openai_protocol import ApiError, _Request
from .triton_bridge import Outcome, Sampling, UpstreamError

log = logging.getLogger("redrafter.openai")
Json = dict[str, Any]


def _usage(prompt_tokens: int, outcome: Outcome) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": outcome.completion_tokens,
        "total_tokens": prompt_tokens + outcome.completion_tokens,
    }


def _speculation(outcome: Outcome) -> dict[str, Any] | None:
    rate = outcome.acceptance_rate
    if rate is None:
        return None
    return {
        "acceptance_rate": rate,
        "accepted_draft_tokens": outcome.accepted_draft_tokens,
        "draft_tokens": outcome.draft_tokens,
    }


@dataclass(frozen=True)
class Kind:
    """How completions and chat completions differ on the wire."""

    object: str
    chunk_object: str
    id_prefix: str
    choice: Callable[[str, str | None], Json]  # (text, finish_reason) -> full choice
    delta: Callable[[str | None, str | None], Json]  # (text or None, finish_reason) -> chunk choice
    first: Json | None = None  # chunk choice sent before any text


COMPLETION = Kind(
    "text_completion",
    "text_completion",
    "cmpl-",
    lambda text, fin: {"index": 0, "text": text, "logprobs": None, "finish_reason": fin},
    lambda text, fin: {"index": 0, "text": text or "", "logprobs": None, "finish_reason": fin},
)
CHAT = Kind(
    "chat.completion",
    "chat.completion.chunk",
    "chatcmpl-",
    lambda text, fin: {
        "index": 0,
        "message": {"role": "assistant", "content": text},
        "logprobs": None,
        "finish_reason": fin,
    },
    lambda text, fin: {
        "index": 0,
        "delta": {} if text is None else {"content": text},
        "logprobs": None,
        "finish_reason": fin,
    },
    first={"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None},
)


async def _until(deltas: AsyncIterator[str], deadline: float) -> AsyncGenerator[str, None]:
    """``deltas``, each of which must arrive before ``deadline`` (loop time): TimeoutError after it, which
    cancels the generation (the bridge cancels its Triton request)."""
    while True:
        try:
            async with asyncio.timeout_at(deadline):
                delta = await anext(deltas)
        except StopAsyncIteration:
            return
        yield delta


async def respond(
    request: web.Request, front: Front, kind: Kind, req: _Request, prompt: str, prompt_tokens: int, sampling: Sampling
) -> web.StreamResponse:
    """One generation of ``prompt`` as ``kind``'s response: a JSON body, or a stream once Triton answers."""
    outcome = Outcome()
    created = int(time.time())
    head: Json = {"id": kind.id_prefix + uuid.uuid4().hex, "created": created, "model": front.settings.model_id}
    deltas = front.bridge.generate(prompt, sampling, outcome, front.count_tokens)
    bounded = _until(deltas, asyncio.get_running_loop().time() + front.settings.request_timeout)
    try:
        if not req.stream:
            try:
                text = "".join([d async for d in bounded])
            except UpstreamError as exc:
                raise front.failure(exc) from None
            except TimeoutError:
                raise front.timed_out() from None
            body: Json = {
                **head,
                "object": kind.object,
                "choices": [kind.choice(text, outcome.finish_reason)],
                "usage": _usage(prompt_tokens, outcome),
            }
            headers: dict[str, str] = {}
            if outcome.acceptance_rate is not None:
                headers[ACCEPTANCE_HEADER] = f"{outcome.acceptance_rate:.6f}"
            return web.json_response(body, headers=headers)
        # The headers wait for Triton's first answer: a request that fails before any text still gets its
        # HTTP status (503 lets clients retry); later failures can only be an event in the stream.
        try:
            first = await anext(bounded, None)
        except UpstreamError as exc:
            raise front.failure(exc) from None
        except TimeoutError:
            raise front.timed_out() from None
        return await _stream(request, front, kind, req, head, first, bounded, outcome, prompt_tokens)
    finally:
        # Whatever ended the request (the client went away, a time limit, an error): the Triton request ends.
        await bounded.aclose()
        await deltas.aclose()


async def _stream(
    request: web.Request,
    front: Front,
    kind: Kind,
    req: _Request,
    head: Json,
    first: str | None,
    deltas: AsyncIterator[str],
    outcome: Outcome,
    prompt_tokens: int,
) -> web.StreamResponse:
    resp = EventSourceResponse(allow_all_methods=True, sep="\n")  # LF line ends, as OpenAI's own stream
    usage_field: Json = {"usage": None} if req.include_usage else {}

    async def send(choices: list[Json], **extra: Any) -> None:
        await resp.send(json.dumps({**head, "object": kind.chunk_object, "choices": choices, **usage_field, **extra}))

    try:
        await resp.prepare(request)
        async with resp:
            # Headers are gone: an error travels as an event, as OpenAI sends it, and the stream still ends.
            err: ApiError | None = None
            try:
                if kind.first is not None:
                    await send([kind.first])
                if first is not None:
                    await send([kind.delta(first, None)])
                async for delta in deltas:
                    await send([kind.delta(delta, None)])
                speculation = _speculation(outcome)
                await send(
                    [kind.delta(None, outcome.finish_reason)], **({"redrafter": speculation} if speculation else {})
                )
                if req.include_usage:
                    await resp.send(
                        json.dumps(
                            {
                                **head,
                                "object": kind.chunk_object,
                                "choices": [],
                                "usage": _usage(prompt_tokens, outcome),
                            }
                        )
                    )
            except UpstreamError as exc:
                err = front.failure(exc)
            except TimeoutError:
                err = front.timed_out()
            except (ConnectionResetError, asyncio.CancelledError):
                raise
            except Exception:
                log.exception("%s: failed mid-stream", head["id"])
                err = ApiError(500, "internal server error", type_="server_error", code="internal_error")
            if err is not None:
                log.info("%s: ended mid-stream: %s", head["id"], err.message)
                await resp.send(json.dumps(err.body()))
            await resp.send("[DONE]")
    except ConnectionResetError:
        log.info("%s: the client went away mid-stream", head["id"])
    return resp
