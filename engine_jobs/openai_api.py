"""OpenAI-compatible HTTP API in the serving pod, over Triton's gRPC streaming API on localhost.

``GET /v1/models``, ``POST /v1/completions`` and ``POST /v1/chat/completions`` (streaming as
Server-Sent Events, ending with ``data: [DONE]``), errors in OpenAI's body. Requests go through the
entry model, so they are metered like every other; a response carries its acceptance rate in
``x-redrafter-acceptance-rate`` (streams: in the last chunk, as headers precede the generation).
``GET /health/ready`` answers 200 only while Triton and its entry model are ready: the pod's readiness
probe, so the pod serves only when both protocols work. Triton's own OpenAI frontend is not used: it
runs Triton in-process, which with TP > 1 needs another MPI launch than this project's.

Hostile or excessive input is answered with a 4xx in OpenAI's error body, never a 5xx: every limit is a
field of :class:`FrontSettings` (body size 413, JSON nesting, message count, stop sequences and prompt
length 400, a body that does not arrive in time 408). A bounded number of generations run at once, a
bounded number wait for a slot, and the rest get 429 with ``Retry-After`` (``GET /metrics`` exports the
counts); every generation is bounded in time (504, or an error event ending the stream). With an API
keys directory every request but health, metrics and ``/openapi.json`` needs ``Authorization: Bearer``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from aiohttp import web
from aiohttp_sse import EventSourceResponse
from pydantic import ValidationError

from . import contract
from .api_keys import ApiKeys, bearer
from .chat_template import ChatTemplate, ChatTemplateError, NoChatTemplate
from .contract import (
    ACCEPTANCE_HEADER,
    MANIFEST_FILE,
    OPENAI_READY_PATH,
    TOKENIZER_DIR,
    ServingConfig,
)
from .openai_protocol import ApiError, ChatCompletionRequest, CompletionRequest, _Request, validation_error
from .triton_bridge import Outcome, Sampling, TritonBridge, UpstreamError
from .triton_models._tokenizer import Tokenizer

log = logging.getLogger("redrafter.openai")
_R = TypeVar("_R")

#: OpenAI's documented default of ``max_tokens`` for /v1/completions (chat defaults to the context left)
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
READINESS_POLL_SECONDS = 1.0
#: prompts longer than this (characters) are tokenized off the event loop
LONG_PROMPT_CHARS = 16384
#: paths answered without an API key: probes, scrapers, the API's description
UNAUTHENTICATED_PATHS = frozenset({OPENAI_READY_PATH, "/health/live", "/metrics", "/openapi.json"})


@dataclass(frozen=True)
class FrontSettings:
    """What the front serves and the limits it enforces (defaults: docs/openai-api.md#limits)."""

    model_id: str
    max_input_len: int
    max_seq_len: int
    created: int  # unix time of the engine artifact (its manifest), reported by /v1/models
    owned_by: str = "redrafter-operator"
    #: request body size (413); a prompt of maxInputLen tokens is far smaller
    max_body_bytes: int = 4 * 1024 * 1024
    #: seconds a client may take to send its body (408)
    body_timeout: float = 30.0
    #: nesting of arrays and objects in a body (400); OpenAI's bodies nest a handful of levels
    max_json_depth: int = 32
    #: chat messages per request (400)
    max_messages: int = 1024
    #: characters of one stop sequence (400); OpenAI allows at most 4 sequences, checked by the protocol
    max_stop_chars: int = 256
    #: seconds one generation may take once admitted, queue wait excluded (504, or an error event)
    request_timeout: float = 600.0
    #: generations running at once; the engine batches at most maxBatchSize, Triton queues the rest
    max_in_flight: int = 64
    #: requests waiting for a slot; past it: 429 with Retry-After
    max_queued: int = 256
    #: seconds a request may wait for a slot (429 with Retry-After)
    queue_timeout: float = 30.0
    #: seconds clients are told to wait in Retry-After
    retry_after: int = 1
    #: a readiness check of Triton that takes longer answers "not ready": a stuck server (or a stuck
    #: entry model) turns the pod's readiness false within the probe's period, not never
    ready_timeout: float = 2.0
    #: directory of a mounted Secret of API keys (one per data entry); None: no authentication
    api_keys_dir: str | None = None

    @classmethod
    def from_config(cls, cfg: ServingConfig) -> "FrontSettings":
        manifest = Path(cfg.artifact_dir) / MANIFEST_FILE
        created = int(manifest.stat().st_mtime) if manifest.is_file() else int(time.time())
        # Twice the engine's batch keeps it full while some requests are in pre- or postprocessing.
        in_flight = max(2 * cfg.max_batch_size, 4)
        return cls(
            cfg.served_model_name,
            cfg.max_input_len,
            cfg.max_seq_len,
            created,
            max_in_flight=in_flight,
            max_queued=4 * in_flight,
            api_keys_dir=cfg.api_keys_dir,
        )


class Bridge(Protocol):
    """What the front needs of Triton (:class:`~.triton_bridge.TritonBridge`; tests use a fake)."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def ready(self) -> bool: ...

    def generate(
        self, prompt: str, s: Sampling, outcome: Outcome, count_tokens: Callable[[str], int]
    ) -> AsyncIterator[str]: ...


class Admission:
    """At most ``max_in_flight`` generations at once; the rest get 429 once ``max_in_flight + max_queued``
    requests are held (receiving their body, or waiting for a generation slot).

    A request takes a *place* before its body is read, so the bodies in memory stay bounded by the places;
    it takes a generation *slot* only once its body has fully arrived (bounded by ``body_timeout``, 408) and
    parsed, so a slow upload never holds a slot a ready request could use."""

    def __init__(self, max_in_flight: int, max_queued: int, queue_timeout: float, retry_after: int):
        self.max_in_flight, self.max_queued = max_in_flight, max_queued
        self.queue_timeout, self.retry_after = queue_timeout, retry_after
        self._slots = asyncio.Semaphore(max_in_flight)
        self.in_flight = 0
        self.queued = 0  # received, waiting for a generation slot
        self.receiving = 0  # holding a place while their body arrives
        self.rejected: dict[str, int] = {"queue_full": 0, "queue_timeout": 0}

    def _busy(self, reason: str, message: str) -> ApiError:
        self.rejected[reason] += 1
        return ApiError(
            429, message, type_="rate_limit_error", code=reason, headers={"Retry-After": str(self.retry_after)}
        )

    @asynccontextmanager
    async def slot(self, receive: Callable[[], Awaitable[_R]]) -> AsyncIterator[_R]:
        """Take a place (429 ``queue_full`` when none is left), ``receive()`` the request holding it, then
        wait for a generation slot (429 ``queue_timeout``) and hold it for the block; yields what
        ``receive`` returned. A request that ``receive`` refuses (400, 408, 413) never waits for a slot."""
        if self.in_flight + self.queued + self.receiving >= self.max_in_flight + self.max_queued:
            raise self._busy(
                "queue_full",
                f"the server is at capacity ({self.max_in_flight} requests in flight, {self.max_queued} "
                "queued, the limits max_in_flight and max_queued); retry after a moment",
            )
        self.receiving += 1
        try:
            received = await receive()
        finally:
            self.receiving -= 1
        self.queued += 1
        try:
            async with asyncio.timeout(self.queue_timeout):
                await self._slots.acquire()
        except TimeoutError:
            raise self._busy(
                "queue_timeout",
                f"the request waited {self.queue_timeout:g}s (queue_timeout) for one of the server's "
                f"{self.max_in_flight} slots; retry after a moment",
            ) from None
        finally:
            self.queued -= 1
        self.in_flight += 1
        try:
            yield received
        finally:
            self.in_flight -= 1
            self._slots.release()


class Front:
    """The application's state: settings, tokenizer, chat template, the bridge to Triton, admission."""

    def __init__(self, settings: FrontSettings, tokenizer_dir: str | Path, bridge: Bridge | str):
        self.settings = settings
        self.tokenizer = Tokenizer(str(tokenizer_dir))
        self.template = ChatTemplate(tokenizer_dir, hf=self.tokenizer.hf)
        self.bridge: Bridge = TritonBridge(bridge) if isinstance(bridge, str) else bridge
        self.ready = False
        self._poller: asyncio.Task | None = None
        self.admission = Admission(
            settings.max_in_flight, settings.max_queued, settings.queue_timeout, settings.retry_after
        )
        self.api_keys = ApiKeys(settings.api_keys_dir) if settings.api_keys_dir else None

    # ---- Triton readiness -----------------------------------------------------------------------
    async def check_ready(self) -> bool:
        try:
            self.ready = await asyncio.wait_for(self.bridge.ready(), self.settings.ready_timeout)
        except Exception:  # Triton not listening yet, gone, or stuck past the timeout
            self.ready = False
        return self.ready

    async def _poll(self) -> None:
        while True:
            await self.check_ready()
            await asyncio.sleep(READINESS_POLL_SECONDS)

    async def start(self, _app: web.Application) -> None:
        await self.bridge.start()
        self._poller = asyncio.create_task(self._poll())

    async def stop(self, _app: web.Application) -> None:
        if self._poller is not None:
            self._poller.cancel()
        await self.bridge.close()

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

    def timed_out(self) -> ApiError:
        return ApiError(
            504,
            f"the generation did not finish within the server's limit of {self.settings.request_timeout:g}s "
            "(request_timeout)",
            type_="server_error",
            code="timeout",
        )

    # ---- requests ------------------------------------------------------------------------------
    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False)) if text else 0

    async def prompt_tokens(self, prompt: str, param: str) -> int:
        """Tokens of ``prompt`` as the preprocessing model encodes it; refuses what the engine cannot take.

        A long prompt is encoded in a thread: the event loop keeps serving the other streams meanwhile."""
        if len(prompt) > LONG_PROMPT_CHARS:
            n = len(await asyncio.to_thread(self.tokenizer.encode, prompt))
        else:
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
        too_long = next((i for i, s in enumerate(req.stop_list) if len(s) > self.settings.max_stop_chars), None)
        if too_long is not None:
            raise ApiError(
                400,
                f"stop sequence {too_long} has {len(req.stop_list[too_long])} characters, more than the limit of "
                f"{self.settings.max_stop_chars} (max_stop_chars)",
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


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"the number {text[:32]} is out of range")
    return value


def _check_shape(body: Any, max_depth: int) -> None:
    """Refuses nesting deeper than ``max_depth`` and strings that are not Unicode text (lone surrogates,
    which ``\\ud800`` escapes produce and no tokenizer can encode). Iterative: its cost is the body's size."""
    stack: list[tuple[Any, int]] = [(body, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list)):
            if depth > max_depth:
                raise ApiError(
                    400,
                    f"the request body nests arrays and objects deeper than {max_depth} levels (max_json_depth)",
                    code="invalid_json",
                )
            if isinstance(value, dict):
                for k, v in value.items():
                    _check_text(k)
                    stack.append((v, depth + 1))
            else:
                stack.extend((v, depth + 1) for v in value)
        elif isinstance(value, str):
            _check_text(value)


def _check_text(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError(
            400, "the request body holds a string that is not valid Unicode (a lone surrogate)", code="invalid_json"
        ) from None


async def _read_body(request: web.Request, s: FrontSettings) -> bytes:
    """The body, at most ``max_body_bytes`` (413) and arriving within ``body_timeout`` (408)."""
    too_large = ApiError(
        413,
        f"the request body exceeds this server's limit of {s.max_body_bytes} bytes (max_body_bytes)",
        code="request_too_large",
    )
    if request.content_length is not None and request.content_length > s.max_body_bytes:
        raise too_large
    try:
        async with asyncio.timeout(s.body_timeout):
            return await request.read()  # the app's client_max_size bounds chunked bodies too
    except web.HTTPRequestEntityTooLarge:
        raise too_large from None
    except TimeoutError:
        raise ApiError(
            408,
            f"the request body did not arrive within {s.body_timeout:g}s (body_timeout)",
            code="request_timeout",
        ) from None


def parse_body(raw: bytes, model: type[_Request], s: FrontSettings) -> _Request:
    """A request model from a body: every way a body can be wrong is a 400 in OpenAI's error body."""
    try:
        body = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant, parse_float=_finite)
    except RecursionError:  # deeper than the interpreter's own limit: certainly deeper than ours
        raise ApiError(
            400,
            f"the request body nests arrays and objects deeper than {s.max_json_depth} levels (max_json_depth)",
            code="invalid_json",
        ) from None
    except UnicodeDecodeError as exc:
        raise ApiError(
            400, f"the request body is not UTF-8: {exc.reason} at byte {exc.start}", code="invalid_json"
        ) from None
    except ValueError as exc:  # JSONDecodeError, NaN/Infinity, integers past Python's digit limit
        raise ApiError(400, f"the request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
    _check_shape(body, s.max_json_depth)
    try:
        req = model.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc) from None
    if isinstance(req, ChatCompletionRequest) and len(req.messages) > s.max_messages:
        raise ApiError(
            400,
            f"the request has {len(req.messages)} messages, more than this server's limit of {s.max_messages} "
            "(max_messages)",
            param="messages",
            code="invalid_value",
        )
    return req


async def _parse(request: web.Request, model: type[_Request], s: FrontSettings) -> _Request:
    return parse_body(await _read_body(request, s), model, s)


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


async def _until(deltas: AsyncIterator[str], deadline: float) -> AsyncIterator[str]:
    """``deltas``, each of which must arrive before ``deadline`` (loop time): TimeoutError after it, which
    cancels the generation (the bridge cancels its Triton request)."""
    while True:
        try:
            async with asyncio.timeout_at(deadline):
                delta = await anext(deltas)
        except StopAsyncIteration:
            return
        yield delta


async def _respond(
    request: web.Request, front: Front, kind: _Kind, req: _Request, prompt: str, prompt_tokens: int, sampling: Sampling
) -> web.StreamResponse:
    outcome = Outcome()
    created = int(time.time())
    head = {"id": kind.id_prefix + uuid.uuid4().hex, "created": created, "model": front.settings.model_id}
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


def _handlers(front: Front) -> list[web.RouteDef]:
    async def models(_request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [_model_card(front)]})

    async def model(request: web.Request) -> web.Response:
        if request.match_info["model"] != front.settings.model_id:
            raise ApiError(
                404, f"The model '{request.match_info['model']}' does not exist", param="model", code="model_not_found"
            )
        return web.json_response(_model_card(front))

    async def receive(request: web.Request, model: type[_Request]) -> _Request:
        req = await _parse(request, model, front.settings)
        _check_model(front, req)
        return req

    async def completions(request: web.Request) -> web.StreamResponse:
        async with front.admission.slot(lambda: receive(request, CompletionRequest)) as req:
            assert isinstance(req, CompletionRequest)
            await front.require_ready()
            n = await front.prompt_tokens(req.text, "prompt")
            sampling = front.sampling(req, n, COMPLETIONS_DEFAULT_MAX_TOKENS)
            return await _respond(request, front, COMPLETION, req, req.text, n, sampling)

    async def chat(request: web.Request) -> web.StreamResponse:
        async with front.admission.slot(lambda: receive(request, ChatCompletionRequest)) as req:
            assert isinstance(req, ChatCompletionRequest)
            await front.require_ready()
            prompt = front.chat_prompt(req)
            n = await front.prompt_tokens(prompt, "messages")
            return await _respond(request, front, CHAT, req, prompt, n, front.sampling(req, n, None))

    async def ready(_request: web.Request) -> web.Response:
        ok = await front.check_ready()
        return web.json_response({"ready": ok}, status=200 if ok else 503)

    async def live(_request: web.Request) -> web.Response:
        return web.json_response({"live": True})

    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(text=front_metrics(front), content_type="text/plain", charset="utf-8")

    async def openapi(_request: web.Request) -> web.Response:
        from .openai_schema import openapi_document

        return web.json_response(openapi_document())

    return [
        web.get("/v1/models", models),
        web.get("/v1/models/{model:.+}", model),
        web.post("/v1/completions", completions),
        web.post("/v1/chat/completions", chat),
        web.get(OPENAI_READY_PATH, ready),
        web.get("/health/live", live),
        web.get("/metrics", metrics),
        web.get("/openapi.json", openapi),
    ]


def front_metrics(front: Front) -> str:
    """The front's gauges and counters in Prometheus' text format (names in engine_jobs.contract)."""
    a = front.admission
    lines = []
    for name, kind, help_, samples in (
        (contract.METRIC_FRONT_IN_FLIGHT, "gauge", "Generations the OpenAI front is running.", [("", a.in_flight)]),
        (contract.METRIC_FRONT_QUEUED, "gauge", "Requests waiting for a generation slot.", [("", a.queued)]),
        (
            contract.METRIC_FRONT_MAX_IN_FLIGHT,
            "gauge",
            "Generation slots of the OpenAI front (max_in_flight).",
            [("", a.max_in_flight)],
        ),
        (
            contract.METRIC_FRONT_MAX_QUEUED,
            "gauge",
            "Queue places of the OpenAI front (max_queued).",
            [("", a.max_queued)],
        ),
        (
            contract.METRIC_FRONT_REJECTED,
            "counter",
            "Requests refused with 429, by reason.",
            [(f'{{reason="{reason}"}}', n) for reason, n in sorted(a.rejected.items())],
        ),
    ):
        lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]
        lines += [f"{name}{labels} {value}" for labels, value in samples]
    return "\n".join(lines) + "\n"


def _model_card(front: Front) -> dict[str, Any]:
    s = front.settings
    return {"id": s.model_id, "object": "model", "created": s.created, "owned_by": s.owned_by}


def _error_response(err: ApiError) -> web.Response:
    headers = dict(err.headers)
    if err.status == 503:
        headers.setdefault("Retry-After", "1")
    return web.json_response(err.body(), status=err.status, headers=headers)


@web.middleware
async def _errors(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
    """Every error in OpenAI's body, including aiohttp's own (unknown path, wrong method)."""
    try:
        return await handler(request)
    except ApiError as exc:
        return _error_response(exc)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(exc.status)
        return _error_response(ApiError(exc.status, f"{request.method} {request.path}: {exc.reason}", code=code))
    except Exception:
        log.exception("unhandled error serving %s %s", request.method, request.path)
        return _error_response(ApiError(500, "internal server error", type_="server_error", code="internal_error"))


def _auth(front: Front) -> Callable[..., Awaitable[web.StreamResponse]]:
    """``Authorization: Bearer <key>`` on every path but health, metrics and the API's description."""

    @web.middleware
    async def auth(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
        keys = front.api_keys
        if keys is not None and request.path not in UNAUTHENTICATED_PATHS:
            token = bearer(request.headers.get("Authorization"))
            if not keys.check(token):
                raise ApiError(
                    401,
                    "Incorrect API key provided." if token else "Missing API key: send Authorization: Bearer <key>.",
                    code="invalid_api_key",
                    headers={"WWW-Authenticate": "Bearer"},
                )
        return await handler(request)

    return auth


#: options of aiohttp's server the front needs: a client that disconnects cancels its handler, which
#: cancels its Triton request
SERVER_OPTIONS: dict[str, Any] = {"handler_cancellation": True}


def make_app(front: Front) -> web.Application:
    app = web.Application(middlewares=[_errors, _auth(front)], client_max_size=front.settings.max_body_bytes)
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
    api_keys_dir: str | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT, then drain: stop accepting, let in-flight requests finish."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    tok = tokenizer_dir or str(Path(cfg.artifact_dir) / TOKENIZER_DIR)
    settings = FrontSettings.from_config(cfg)
    if api_keys_dir:
        settings = dataclasses.replace(settings, api_keys_dir=api_keys_dir)
    front = Front(settings, tok, grpc_url)
    log.info(
        "OpenAI API for model %r on %s:%d over Triton gRPC %s (%s)",
        front.settings.model_id,
        host,
        port,
        grpc_url,
        "API keys required" if front.api_keys else "no API keys",
    )
    web.run_app(
        make_app(front),
        host=host,
        port=port,
        shutdown_timeout=shutdown_timeout,
        print=None,
        access_log=None,
        **SERVER_OPTIONS,
    )
