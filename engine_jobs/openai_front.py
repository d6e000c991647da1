"""The OpenAI front's state: its settings, the tokenizer and chat template, admission, Triton's readiness, and
the errors a failed or late generation is answered with."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from typing import Protocol

from aiohttp import web

from .api_keys import ApiKeys
from .chat_template import ChatTemplate, ChatTemplateError, NoChatTemplate
from .openai_admission import Admission
from .openai_protocol import ApiError, ChatCompletionRequest, _Request
from .openai_sampling import check_prompt_length
from .openai_settings import FrontSettings
from .triton_bridge import Outcome, Sampling, TritonBridge, UpstreamError
from .triton_models._tokenizer import Tokenizer

READINESS_POLL_SECONDS = 1.0
#: prompts longer than this (characters) are tokenized off the event loop
LONG_PROMPT_CHARS = 16384


class Bridge(Protocol):
    """What the front needs of Triton (:class:`~.triton_bridge.TritonBridge`; tests use a fake)."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def ready(self) -> bool: ...

    def generate(
        self, prompt: str, s: Sampling, outcome: Outcome, count_tokens: Callable[[str], int]
    ) -> AsyncGenerator[str, None]: ...


class Front:
    """The application's state: settings, tokenizer, chat template, the bridge to Triton, admission."""

    def __init__(self, settings: FrontSettings, tokenizer_dir: str | Path, bridge: Bridge | str) -> None:
        self.settings = settings
        self.tokenizer = Tokenizer(str(tokenizer_dir))
        self.template = ChatTemplate(tokenizer_dir, hf=self.tokenizer.hf)
        self.bridge: Bridge = TritonBridge(bridge) if isinstance(bridge, str) else bridge
        self.ready = False
        self._poller: asyncio.Task[None] | None = None
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
        check_prompt_length(n, self.settings, param)
        return n

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

    def check_model(self, req: _Request) -> None:
        """404 for a request naming another model than the one served."""
        if req.model != self.settings.model_id:
            raise ApiError(
                404,
                f"The model '{req.model}' does not exist; this server serves '{self.settings.model_id}'",
                param="model",
                code="model_not_found",
            )
