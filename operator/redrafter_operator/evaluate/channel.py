"""Where evaluation requests go: Triton's gRPC entry model, or the serving pod's OpenAI-compatible API.

``--protocol openai`` benchmarks the way applications call the service: the official ``openai`` client,
streaming ``/v1/completions`` (greedy: ``temperature 0``; fixed length: the ``min_tokens`` extension),
the model id read from ``/v1/models``. Acceptance comes from the last chunk's ``redrafter`` field.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Protocol, get_args

import aiohttp
import tritonclient.grpc.aio as grpcaio
from yarl import URL

from engine_jobs.contract import ENTRY_MODEL, OPENAI_PORT, OPENAI_READY_PATH

from .stream import RequestOptions, RequestResult, WireProtocol, add_text, describe_error, grpc_target, stream_request
from .tokens import TokenCounter

PROTOCOLS: tuple[WireProtocol, ...] = get_args(WireProtocol)


class Channel(Protocol):
    endpoint: str

    async def send(
        self,
        text: str,
        opts: RequestOptions,
        counter: TokenCounter,
        *,
        prompt_index: int = 0,
        max_tokens: int | None = None,
        on_first_token: Callable[[], None] | None = None,
    ) -> RequestResult: ...

    async def not_ready(self) -> str | None: ...

    async def close(self) -> None: ...


def openai_base_url(url: str) -> str:
    """``http(s)://host[:port][/v1]`` or ``host[:port]`` -> the API base URL (port defaults to 9000)."""
    if "://" not in url:
        url = "http://" + url
    parsed = URL(url.rstrip("/"))
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(f"{url!r}: an OpenAI endpoint is http(s)://host[:port] (port {OPENAI_PORT})")
    if parsed.explicit_port is None and parsed.scheme == "http":
        parsed = parsed.with_port(OPENAI_PORT)
    path = parsed.path.rstrip("/")
    return str(parsed.with_path(path if path.endswith("/v1") else path + "/v1"))


def endpoint_for(url: str, protocol: WireProtocol) -> str:
    """The normalized endpoint of ``url`` (ValueError when it cannot be one)."""
    if protocol == "grpc":
        return grpc_target(url)
    if protocol == "openai":
        return openai_base_url(url)
    raise ValueError(f"unknown protocol {protocol!r} (one of {', '.join(PROTOCOLS)})")


class GrpcChannel:
    """The entry model over Triton's gRPC streaming API."""

    def __init__(self, url: str) -> None:
        self.endpoint = grpc_target(url)
        self.client = grpcaio.InferenceServerClient(self.endpoint)

    async def send(
        self,
        text: str,
        opts: RequestOptions,
        counter: TokenCounter,
        *,
        prompt_index: int = 0,
        max_tokens: int | None = None,
        on_first_token: Callable[[], None] | None = None,
    ) -> RequestResult:
        return await stream_request(
            self.client,
            text,
            opts,
            counter,
            prompt_index=prompt_index,
            max_tokens=max_tokens,
            on_first_token=on_first_token,
        )

    async def not_ready(self) -> str | None:
        try:
            return None if await self.client.is_model_ready(ENTRY_MODEL) else f"model {ENTRY_MODEL} is not ready"
        except Exception as exc:
            return describe_error(exc)

    async def close(self) -> None:
        await self.client.close()


def load_api_key(path: str | Path) -> str:
    """The API key in ``path``: a file holding it, or a mounted Secret directory (its first key by entry
    name, as the serving pods read the same Secret: engine_jobs.api_keys). The key itself is never printed."""
    from engine_jobs.api_keys import read_keys

    p = Path(path)
    keys = read_keys(p) if p.is_dir() else tuple(k for k in (p.read_bytes().strip(),) if k)
    if not keys:
        raise ValueError(f"{path}: no API key in it")
    return keys[0].decode("utf-8")


class OpenAIChannel:
    """Streaming ``/v1/completions`` with the official client (with ``api_key`` when the pods require one)."""

    def __init__(self, url: str, api_key: str | None = None):
        from openai import AsyncOpenAI

        self.endpoint = openai_base_url(url)
        # evaluation counts every failure: the client must not retry behind its back
        self.client = AsyncOpenAI(base_url=self.endpoint, api_key=api_key or "unused", max_retries=0)
        self._model: str | None = None

    async def model(self) -> str:
        if self._model is None:
            models = (await self.client.models.list()).data
            if not models:
                raise RuntimeError(f"{self.endpoint}/models lists no model")
            self._model = models[0].id
        return self._model

    async def send(
        self,
        text: str,
        opts: RequestOptions,
        counter: TokenCounter,
        *,
        prompt_index: int = 0,
        max_tokens: int | None = None,
        on_first_token: Callable[[], None] | None = None,
    ) -> RequestResult:
        result = RequestResult(prompt_index=prompt_index, start=time.monotonic())
        n = max_tokens or opts.max_tokens
        kwargs: dict[str, Any] = {"temperature": 0} if opts.greedy else {}
        if opts.fixed_length:
            kwargs["extra_body"] = {"min_tokens": n}
        stream = None
        counted = 0
        try:
            stream = await self.client.completions.create(
                model=await self.model(),
                prompt=text,
                max_tokens=n,
                stream=True,
                stream_options={"include_usage": True},
                timeout=opts.timeout_s,
                **kwargs,
            )
            async for chunk in stream:
                now = time.monotonic() - result.start
                if chunk.choices and chunk.choices[0].text:
                    counted = add_text(result, chunk.choices[0].text, counter, counted, now, on_first_token)
                speculation = (chunk.model_extra or {}).get("redrafter")
                if opts.want_perf and isinstance(speculation, dict):
                    result.acceptance_rate = float(speculation["acceptance_rate"])
                    result.accepted_draft_tokens = int(speculation["accepted_draft_tokens"])
                    result.draft_tokens = int(speculation["draft_tokens"])
        except Exception as exc:  # HTTP errors, error events in the stream, timeouts, a server going away
            result.error = describe_error(exc)
        finally:
            if stream is not None:
                await stream.close()
        result.end = time.monotonic()
        result.output_tokens = counted
        if result.error is None and counted == 0:
            result.error = "empty generation: no output tokens"
        return result

    async def not_ready(self) -> str | None:
        url = self.endpoint.removesuffix("/v1") + OPENAI_READY_PATH
        try:
            async with aiohttp.ClientSession() as session, session.get(url, timeout=aiohttp.ClientTimeout(5)) as r:
                return None if r.status == 200 else f"{url}: HTTP {r.status}"
        except (aiohttp.ClientError, TimeoutError) as exc:
            return f"{url}: {describe_error(exc)}"

    async def close(self) -> None:
        await self.client.close()


def open_channel(url: str, protocol: WireProtocol = "grpc", api_key: str | None = None) -> Channel:
    """A channel to ``url`` (open it inside the event loop that uses it); ``api_key``: OpenAI only."""
    endpoint_for(url, protocol)
    return OpenAIChannel(url, api_key) if protocol == "openai" else GrpcChannel(url)
