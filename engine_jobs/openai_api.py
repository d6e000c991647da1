"""OpenAI-compatible HTTP API in the serving pod, over Triton's gRPC streaming API on localhost.

``GET /v1/models``, ``POST /v1/completions`` and ``POST /v1/chat/completions`` (streaming as
Server-Sent Events, ending with ``data: [DONE]``), errors in OpenAI's body. Requests go through the
entry model, so they are metered like every other; a response carries its acceptance rate in
``x-redrafter-acceptance-rate`` (streams: in the last chunk, as headers precede the generation).
``GET /health/ready`` answers 200 only while Triton and its entry model are ready: the pod's readiness
probe, so the pod serves only when both protocols work. Triton's own OpenAI frontend is not used: it
runs Triton in-process, which with TP > 1 needs another MPI launch than this project's.

Hostile or excessive input is answered with a 4xx in OpenAI's error body, never a 5xx: every limit is a
field of :class:`~.openai_settings.FrontSettings` (body size 413, JSON nesting, message count, stop sequences
and prompt length 400, a body that does not arrive in time 408). A bounded number of generations run at once, a
bounded number wait for a slot, and the rest get 429 with ``Retry-After`` (``GET /metrics`` exports the
counts); every generation is bounded in time (504, or an error event ending the stream). With an API
keys directory every request but health, metrics and ``/openapi.json`` needs ``Authorization: Bearer``.

This module is the app: its routes, its error middleware and the server. The rest is one job a module:
the limits (:mod:`.openai_settings`), admission (:mod:`.openai_admission`), the body's checks
(:mod:`.openai_input`), sampling (:mod:`.openai_sampling`), the state over Triton (:mod:`.openai_front`),
the responses (:mod:`.openai_responses`) and the API keys (:mod:`.openai_auth`).
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from .contract import OPENAI_READY_PATH, TOKENIZER_DIR, ServingConfig
from .openai_admission import admission_metrics
from .openai_auth import auth
from .openai_front import Front
from .openai_input import receive
from .openai_protocol import ApiError, ChatCompletionRequest, CompletionRequest, _Request
from .openai_responses import CHAT, COMPLETION, respond
from .openai_sampling import COMPLETIONS_DEFAULT_MAX_TOKENS, sampling
from .openai_schema import openapi_document
from .openai_settings import FrontSettings

log = logging.getLogger("redrafter.openai")


class Routes:
    """The front's endpoints, each a method over the one :class:`Front`."""

    def __init__(self, front: Front):
        self.front = front

    def table(self) -> list[web.RouteDef]:
        return [
            web.get("/v1/models", self.models),
            web.get("/v1/models/{model:.+}", self.model),
            web.post("/v1/completions", self.completions),
            web.post("/v1/chat/completions", self.chat),
            web.get(OPENAI_READY_PATH, self.ready),
            web.get("/health/live", self.live),
            web.get("/metrics", self.metrics),
            web.get("/openapi.json", self.openapi),
        ]

    def _model_card(self) -> dict[str, Any]:
        s = self.front.settings
        return {"id": s.model_id, "object": "model", "created": s.created, "owned_by": s.owned_by}

    async def models(self, _request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [self._model_card()]})

    async def model(self, request: web.Request) -> web.Response:
        if request.match_info["model"] != self.front.settings.model_id:
            raise ApiError(
                404, f"The model '{request.match_info['model']}' does not exist", param="model", code="model_not_found"
            )
        return web.json_response(self._model_card())

    async def _receive(self, request: web.Request, model: type[_Request]) -> _Request:
        req = await receive(request, model, self.front.settings)
        self.front.check_model(req)
        return req

    async def completions(self, request: web.Request) -> web.StreamResponse:
        front = self.front
        async with front.admission.slot(lambda: self._receive(request, CompletionRequest)) as req:
            assert isinstance(req, CompletionRequest)
            await front.require_ready()
            n = await front.prompt_tokens(req.text, "prompt")
            s = sampling(req, n, COMPLETIONS_DEFAULT_MAX_TOKENS, front.settings)
            return await respond(request, front, COMPLETION, req, req.text, n, s)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        front = self.front
        async with front.admission.slot(lambda: self._receive(request, ChatCompletionRequest)) as req:
            assert isinstance(req, ChatCompletionRequest)
            await front.require_ready()
            prompt = front.chat_prompt(req)
            n = await front.prompt_tokens(prompt, "messages")
            return await respond(request, front, CHAT, req, prompt, n, sampling(req, n, None, front.settings))

    async def ready(self, _request: web.Request) -> web.Response:
        ok = await self.front.check_ready()
        return web.json_response({"ready": ok}, status=200 if ok else 503)

    async def live(self, _request: web.Request) -> web.Response:
        return web.json_response({"live": True})

    async def metrics(self, _request: web.Request) -> web.Response:
        text = admission_metrics(self.front.admission)
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    async def openapi(self, _request: web.Request) -> web.Response:
        return web.json_response(openapi_document())


def _error_response(err: ApiError) -> web.Response:
    headers = dict(err.headers)
    if err.status == 503:
        headers.setdefault("Retry-After", "1")
    return web.json_response(err.body(), status=err.status, headers=headers)


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
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


#: options of aiohttp's server the front needs: a client that disconnects cancels its handler, which
#: cancels its Triton request
SERVER_OPTIONS: dict[str, Any] = {"handler_cancellation": True}


def make_app(front: Front) -> web.Application:
    """The front as an aiohttp application; it starts and stops the bridge to Triton with the server."""
    app = web.Application(middlewares=[_errors, auth(front.api_keys)], client_max_size=front.settings.max_body_bytes)
    app.add_routes(Routes(front).table())
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
