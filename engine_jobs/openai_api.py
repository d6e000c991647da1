"""OpenAI-compatible HTTP API in the serving pod, over Triton's gRPC streaming API on localhost.

``GET /v1/models``, ``POST /v1/completions`` and ``POST /v1/chat/completions`` (streaming as
Server-Sent Events, ending with ``data: [DONE]``), errors in OpenAI's body. Requests go through the
entry model, so they are metered like every other; a response carries its acceptance rate in
``x-redrafter-acceptance-rate`` (streams: in the last chunk, as headers precede the generation).
``GET /health/ready`` answers 200 only while Triton and its entry model are ready: the pod's readiness
probe, so the pod serves only when both protocols work. Triton's own OpenAI frontend is not used: it
runs Triton in-process, which with TP > 1 needs another MPI launch than this project's.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tritonclient.grpc.aio as grpcaio
from aiohttp import web
from aiohttp_sse import EventSourceResponse
from pydantic import ValidationError

from .chat_template import ChatTemplate, ChatTemplateError, NoChatTemplate
from .contract import (
    ACCEPTANCE_HEADER,
    ENTRY_MODEL,
    MANIFEST_FILE,
    OPENAI_READY_PATH,
    TOKENIZER_DIR,
    ServingConfig,
)
from .openai_protocol import ApiError, ChatCompletionRequest, CompletionRequest, _Request, validation_error
from .triton_bridge import Outcome, Sampling, UpstreamError, generate
from .triton_models._tokenizer import Tokenizer

log = logging.getLogger("redrafter.openai")

#: OpenAI's documented default of ``max_tokens`` for /v1/completions (chat defaults to the context left)
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
READINESS_POLL_SECONDS = 1.0


@dataclass(frozen=True)
class FrontSettings:
    model_id: str
    max_input_len: int
    max_seq_len: int
    created: int  # unix time of the engine artifact (its manifest), reported by /v1/models
    owned_by: str = "redrafter-operator"

    @classmethod
    def from_config(cls, cfg: ServingConfig) -> "FrontSettings":
        manifest = Path(cfg.artifact_dir) / MANIFEST_FILE
        created = int(manifest.stat().st_mtime) if manifest.is_file() else int(time.time())
        return cls(cfg.served_model_name, cfg.max_input_len, cfg.max_seq_len, created)


class Front:
    """The application's state: settings, tokenizer, chat template, one gRPC channel to Triton."""

    def __init__(self, settings: FrontSettings, tokenizer_dir: str | Path, grpc_url: str):
        self.settings = settings
        self.tokenizer = Tokenizer(str(tokenizer_dir))
        self.template = ChatTemplate(tokenizer_dir, hf=self.tokenizer.hf)
        self.grpc_url = grpc_url
        self.client: grpcaio.InferenceServerClient | None = None
        self.ready = False
        self._poller: asyncio.Task | None = None

    # ---- Triton readiness -----------------------------------------------------------------------
    async def check_ready(self) -> bool:
        assert self.client is not None
        try:
            self.ready = bool(await self.client.is_server_ready() and await self.client.is_model_ready(ENTRY_MODEL))
        except Exception:  # Triton not listening yet, or gone
            self.ready = False
        return self.ready

    async def _poll(self) -> None:
        while True:
            await self.check_ready()
            await asyncio.sleep(READINESS_POLL_SECONDS)

    async def start(self, _app: web.Application) -> None:
        self.client = grpcaio.InferenceServerClient(self.grpc_url)
        self._poller = asyncio.create_task(self._poll())

    async def stop(self, _app: web.Application) -> None:
        if self._poller is not None:
            self._poller.cancel()
        if self.client is not None:
            await self.client.close()

    async def require_ready(self) -> None:
        if not self.ready and not await self.check_ready():
            raise ApiError(
                503,
                "the inference server is not ready yet; retry shortly",
                type_="server_error",
                code="service_unavailable",
            )

    def failure(self, exc: UpstreamError) -> ApiError:
        """A failed generation in OpenAI's terms: 503 (retry) when Triton went away, else 500."""
        if exc.unavailable:
            self.ready = False  # the poller may not have noticed yet
            return ApiError(
                503, f"the inference server is unavailable: {exc}", type_="server_error", code="service_unavailable"
            )
        return ApiError(500, f"inference failed: {exc}", type_="server_error", code="upstream_error")

    # ---- requests ------------------------------------------------------------------------------
    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False)) if text else 0

    def prompt_tokens(self, prompt: str, param: str) -> int:
        """Tokens of ``prompt`` as the preprocessing model encodes it; refuses what the engine cannot take."""
        n = len(self.tokenizer.encode(prompt))
        if n == 0:
            raise ApiError(400, "the prompt encodes to zero tokens", param=param, code="invalid_value")
        if n > self.settings.max_input_len:
            raise ApiError(
                400,
                f"the prompt has {n} tokens, more than this model's maximum input length of "
                f"{self.settings.max_input_len} tokens",
                param=param,
                code="context_length_exceeded",
            )
        return n

    def sampling(self, req: _Request, prompt_tokens: int, default_max: int | None) -> Sampling:
        room = self.settings.max_seq_len - prompt_tokens
        limit = req.output_limit
        if limit is None:
            limit = room if default_max is None else min(default_max, room)
        elif prompt_tokens + limit > self.settings.max_seq_len:
            raise ApiError(
                400,
                f"{prompt_tokens} prompt tokens + {limit} output tokens exceed this model's "
                f"maximum sequence length of {self.settings.max_seq_len} tokens",
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

    def chat_prompt(self, req: ChatCompletionRequest) -> str:
        try:
            text = self.template.render([m.for_template() for m in req.messages])
        except NoChatTemplate as exc:
            raise ApiError(400, str(exc), param="messages", code="chat_template_missing") from None
        except ChatTemplateError as exc:
            raise ApiError(400, str(exc), param="messages", code="invalid_value") from None
        return self._without_template_bos(text)

    def _without_template_bos(self, text: str) -> str:
        """Drop a BOS the template wrote when the tokenizer adds one itself (else the prompt gets two)."""
        bos = self.template.special_tokens.get("bos_token")
        if not bos or not text.startswith(bos):
            return text
        bos_ids = self.tokenizer.encode(bos, add_special_tokens=False)
        added = self.tokenizer.encode("", add_special_tokens=True)
        return text[len(bos) :] if len(bos_ids) == 1 and added[:1] == bos_ids else text


def _check_model(front: Front, req: _Request) -> None:
    if req.model != front.settings.model_id:
        raise ApiError(
            404,
            f"The model '{req.model}' does not exist; this server serves '{front.settings.model_id}'",
            param="model",
            code="model_not_found",
        )


async def _parse(request: web.Request, model: type[_Request]) -> _Request:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc) from None


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
class _Kind:
    """How completions and chat completions differ on the wire."""

    object: str
    chunk_object: str
    id_prefix: str
    choice: Callable[[str, str | None], dict]  # (text, finish_reason) -> full choice
    delta: Callable[[str | None, str | None], dict]  # (text or None, finish_reason) -> chunk choice
    first: dict | None = None  # chunk choice sent before any text


COMPLETION = _Kind(
    "text_completion",
    "text_completion",
    "cmpl-",
    lambda text, fin: {"index": 0, "text": text, "logprobs": None, "finish_reason": fin},
    lambda text, fin: {"index": 0, "text": text or "", "logprobs": None, "finish_reason": fin},
)
CHAT = _Kind(
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


async def _respond(
    request: web.Request, front: Front, kind: _Kind, req: _Request, prompt: str, prompt_tokens: int, sampling: Sampling
) -> web.StreamResponse:
    assert front.client is not None
    outcome = Outcome()
    created = int(time.time())
    head = {"id": kind.id_prefix + uuid.uuid4().hex, "created": created, "model": front.settings.model_id}
    deltas = generate(front.client, prompt, sampling, outcome, front.count_tokens)
    if not req.stream:
        try:
            text = "".join([d async for d in deltas])
        except UpstreamError as exc:
            raise front.failure(exc) from None
        body = {
            **head,
            "object": kind.object,
            "choices": [kind.choice(text, outcome.finish_reason)],
            "usage": _usage(prompt_tokens, outcome),
        }
        headers = {}
        if outcome.acceptance_rate is not None:
            headers[ACCEPTANCE_HEADER] = f"{outcome.acceptance_rate:.6f}"
        return web.json_response(body, headers=headers)
    # The headers wait for Triton's first answer: a request that fails before any text still gets its
    # HTTP status (503 lets clients retry); later failures can only be an event in the stream.
    try:
        first = await anext(deltas, None)
    except UpstreamError as exc:
        raise front.failure(exc) from None
    return await _stream(request, kind, req, head, first, deltas, outcome, prompt_tokens)


async def _stream(
    request: web.Request,
    kind: _Kind,
    req: _Request,
    head: dict,
    first: str | None,
    deltas: AsyncIterator[str],
    outcome: Outcome,
    prompt_tokens: int,
) -> web.StreamResponse:
    resp = EventSourceResponse(allow_all_methods=True, sep="\n")  # LF line ends, as OpenAI's own stream
    usage_field = {"usage": None} if req.include_usage else {}

    async def send(choices: list[dict], **extra) -> None:
        await resp.send(json.dumps({**head, "object": kind.chunk_object, "choices": choices, **usage_field, **extra}))

    try:
        await resp.prepare(request)
        async with resp:
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
            except UpstreamError as exc:  # headers are gone: the error travels as an event, as OpenAI sends it
                err = ApiError(500, f"inference failed: {exc}", type_="server_error", code="upstream_error")
                await resp.send(json.dumps(err.body()))
            await resp.send("[DONE]")
    except ConnectionResetError:
        log.info("%s: the client went away mid-stream", head["id"])
    finally:
        await deltas.aclose()  # a client that went away: cancels the Triton request
    return resp


def _handlers(front: Front) -> list[web.RouteDef]:
    async def models(_request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [_model_card(front)]})

    async def model(request: web.Request) -> web.Response:
        if request.match_info["model"] != front.settings.model_id:
            raise ApiError(
                404, f"The model '{request.match_info['model']}' does not exist", param="model", code="model_not_found"
            )
        return web.json_response(_model_card(front))

    async def completions(request: web.Request) -> web.StreamResponse:
        req = await _parse(request, CompletionRequest)
        assert isinstance(req, CompletionRequest)
        _check_model(front, req)
        await front.require_ready()
        n = front.prompt_tokens(req.text, "prompt")
        return await _respond(
            request, front, COMPLETION, req, req.text, n, front.sampling(req, n, COMPLETIONS_DEFAULT_MAX_TOKENS)
        )

    async def chat(request: web.Request) -> web.StreamResponse:
        req = await _parse(request, ChatCompletionRequest)
        assert isinstance(req, ChatCompletionRequest)
        _check_model(front, req)
        await front.require_ready()
        prompt = front.chat_prompt(req)
        n = front.prompt_tokens(prompt, "messages")
        return await _respond(request, front, CHAT, req, prompt, n, front.sampling(req, n, None))

    async def ready(_request: web.Request) -> web.Response:
        ok = await front.check_ready()
        return web.json_response({"ready": ok}, status=200 if ok else 503)

    async def live(_request: web.Request) -> web.Response:
        return web.json_response({"live": True})

    return [
        web.get("/v1/models", models),
        web.get("/v1/models/{model:.+}", model),
        web.post("/v1/completions", completions),
        web.post("/v1/chat/completions", chat),
        web.get(OPENAI_READY_PATH, ready),
        web.get("/health/live", live),
    ]


def _model_card(front: Front) -> dict[str, Any]:
    s = front.settings
    return {"id": s.model_id, "object": "model", "created": s.created, "owned_by": s.owned_by}


@web.middleware
async def _errors(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
    """Every error in OpenAI's body, including aiohttp's own (unknown path, wrong method)."""
    try:
        return await handler(request)
    except ApiError as exc:
        headers = {"Retry-After": "1"} if exc.status == 503 else None
        return web.json_response(exc.body(), status=exc.status, headers=headers)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(exc.status)
        err = ApiError(exc.status, f"{request.method} {request.path}: {exc.reason}", code=code)
        return web.json_response(err.body(), status=exc.status)
    except Exception:
        log.exception("unhandled error serving %s %s", request.method, request.path)
        err = ApiError(500, "internal server error", type_="server_error", code="internal_error")
        return web.json_response(err.body(), status=500)


def make_app(front: Front) -> web.Application:
    app = web.Application(middlewares=[_errors], client_max_size=16 * 1024 * 1024)
    app.add_routes(_handlers(front))
    app.on_startup.append(front.start)
    app.on_cleanup.append(front.stop)
    return app


def run(
    cfg: ServingConfig,
    *,
    host: str,
    port: int,
    grpc_url: str,
    tokenizer_dir: str | None = None,
    shutdown_timeout: float = 60.0,
) -> None:
    """Serve until SIGTERM/SIGINT, then drain: stop accepting, let in-flight requests finish."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    tok = tokenizer_dir or str(Path(cfg.artifact_dir) / TOKENIZER_DIR)
    front = Front(FrontSettings.from_config(cfg), tok, grpc_url)
    log.info("OpenAI API for model %r on %s:%d over Triton gRPC %s", front.settings.model_id, host, port, grpc_url)
    # handler_cancellation: a client that disconnects cancels its handler, which cancels its Triton request
    web.run_app(
        make_app(front),
        host=host,
        port=port,
        shutdown_timeout=shutdown_timeout,
        handler_cancellation=True,
        print=None,
        access_log=None,
    )
