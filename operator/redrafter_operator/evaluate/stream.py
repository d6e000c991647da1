"""One streaming request to the entry model over gRPC (``tritonclient.grpc.aio``), timed per chunk."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Literal

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio

from engine_jobs.contract import ENTRY_MODEL, GRPC_PORT
from engine_jobs.triton_bridge import describe as describe_error

from .tokens import TokenCounter

if TYPE_CHECKING:
    from .stats import Sample

__all__ = ["describe_error"]  # shared with .channel

#: how evaluation requests reach an engine: the gRPC entry model or the OpenAI-compatible API
WireProtocol = Literal["grpc", "openai"]
PERF_OUTPUTS = ("acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens")


def grpc_target(url: str) -> str:
    """``host:port`` from ``grpc://host[:port]`` or ``host[:port]`` (port defaults to Triton's gRPC)."""
    target = url.removeprefix("grpc://")
    if "://" in target:
        raise ValueError(f"{url!r}: only grpc:// endpoints are supported (Triton gRPC port {GRPC_PORT})")
    target = target.rstrip("/")
    if not target:
        raise ValueError("empty endpoint")
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():  # no port given (or an IPv6 literal without one)
        return f"{target}:{GRPC_PORT}"
    return target


@dataclass(frozen=True)
class RequestOptions:
    max_tokens: int
    greedy: bool = True  # top_k = 1 (what validation compares)
    fixed_length: bool = True  # min_tokens = max_tokens: every request generates exactly max_tokens
    want_perf: bool = True  # return_perf_metrics (acceptance)
    timeout_s: float = 300.0
    protocol: WireProtocol = "grpc"  # grpc: the entry model; openai: the OpenAI-compatible API (.channel)
    api_key: str | None = field(default=None, repr=False)  # openai: the pods' API key, when they require one


@dataclass
class RequestResult:
    """What one request measured; times in seconds, relative to ``start`` (a monotonic clock)."""

    prompt_index: int
    start: float
    end: float = 0.0
    error: str | None = None
    text: str = ""
    output_tokens: int = 0
    chunk_times: list[float] = field(default_factory=list)  # arrival of each chunk carrying tokens
    chunk_tokens: list[int] = field(default_factory=list)  # tokens in that chunk (>= 1)
    acceptance_rate: float | None = None
    accepted_draft_tokens: int | None = None
    draft_tokens: int | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def e2e_s(self) -> float:
        return self.end - self.start

    @property
    def ttft_s(self) -> float | None:
        return self.chunk_times[0] if self.chunk_times else None


def build_inputs(text: str, opts: RequestOptions, max_tokens: int | None = None) -> list[grpcclient.InferInput]:
    n = max_tokens or opts.max_tokens

    def tensor(name: str, value: Any, dtype: str, np_dtype: Any) -> grpcclient.InferInput:
        arr = np.array([[value]], dtype=np_dtype)
        t = grpcclient.InferInput(name, list(arr.shape), dtype)
        t.set_data_from_numpy(arr)
        return t

    inputs = [
        tensor("text_input", text.encode("utf-8"), "BYTES", np.object_),
        tensor("max_tokens", n, "INT32", np.int32),
        tensor("stream", True, "BOOL", np.bool_),
        tensor("return_perf_metrics", opts.want_perf, "BOOL", np.bool_),
    ]
    if opts.greedy:
        inputs.append(tensor("top_k", 1, "INT32", np.int32))
    if opts.fixed_length:
        inputs.append(tensor("min_tokens", n, "INT32", np.int32))
    return inputs


async def stream_request(
    client: grpcaio.InferenceServerClient,
    text: str,
    opts: RequestOptions,
    counter: TokenCounter,
    *,
    prompt_index: int = 0,
    max_tokens: int | None = None,
    on_first_token: Callable[[], None] | None = None,
) -> RequestResult:
    """Send one streaming request and time every chunk (:func:`add_text`); errors are recorded, never raised."""
    result = RequestResult(prompt_index=prompt_index, start=time.monotonic())
    inputs = build_inputs(text, opts, max_tokens)

    async def requests() -> AsyncIterator[dict[str, Any]]:
        yield {"model_name": ENTRY_MODEL, "inputs": inputs, "request_id": str(prompt_index)}

    responses = None
    counted = 0
    try:
        responses = client.stream_infer(requests(), stream_timeout=opts.timeout_s)
        async for res, err in responses:
            now = time.monotonic() - result.start
            if err is not None:
                result.error = describe_error(err)
                break
            chunk = res.as_numpy("text_output")
            if chunk is not None and chunk.size:
                piece = chunk.reshape(-1)[0]
                text = piece.decode("utf-8", "replace") if isinstance(piece, bytes) else str(piece)
                counted = add_text(result, text, counter, counted, now, on_first_token)
            _read_perf(res, result)
            params = res.get_response().parameters
            if "triton_final_response" in params and params["triton_final_response"].bool_param:
                break
    except Exception as exc:  # gRPC errors, timeouts, a server going away
        result.error = describe_error(exc)
    finally:
        if responses is not None:
            responses.cancel()
    result.end = time.monotonic()
    result.output_tokens = counted
    if result.error is None and counted == 0:
        result.error = "empty generation: no output tokens"
    return result


def add_text(
    result: RequestResult,
    piece: str,
    counter: TokenCounter,
    counted: int,
    now: float,
    on_first_token: Callable[[], None] | None = None,
) -> int:
    """Append one chunk's text and time the tokens it completed; the new token count.

    Tokens are counted on the cumulative text (a chunk may end inside a multi-token word); a chunk
    adding no token is merged into the next one.
    """
    result.text += piece
    total = counter.count(result.text)
    if total > counted:
        result.chunk_times.append(now)
        result.chunk_tokens.append(total - counted)
        if counted == 0 and on_first_token is not None:
            on_first_token()
    return max(total, counted)


def _read_perf(res: Any, result: RequestResult) -> None:
    for name in PERF_OUTPUTS:
        arr = res.as_numpy(name)
        if arr is None or not arr.size:
            continue
        value = arr.reshape(-1)[0].item()
        if name == "acceptance_rate":
            result.acceptance_rate = float(value)
        elif name == "total_accepted_draft_tokens":
            result.accepted_draft_tokens = int(value)
        else:
            result.draft_tokens = int(value)


def to_sample(r: RequestResult) -> Sample:
    """The statistics' view of a result (see :class:`.stats.Sample`)."""
    from .stats import Sample

    return Sample(
        start=r.start,
        end=r.end,
        ok=r.ok,
        output_tokens=r.output_tokens,
        chunk_times=tuple(r.chunk_times),
        chunk_tokens=tuple(r.chunk_tokens),
        acceptance_rate=r.acceptance_rate,
        accepted_draft_tokens=r.accepted_draft_tokens,
        draft_tokens=r.draft_tokens,
    )
