"""One generation through Triton's gRPC streaming API: the entry model, OpenAI's stop semantics, usage.

The entry model (``contract.ENTRY_MODEL``) is always called with ``stream`` and ``return_perf_metrics``:
its text deltas feed streaming and non-streaming clients alike, and its final response carries the
engine's own token count and acceptance figures (the request is metered like any other). Stop
sequences go to the engine as ``stop_words`` (it stops on their tokens) and are also matched on the
text, as OpenAI does: the text ends before the stop sequence, and text that might begin one is held
back until it is known not to. Closing the generator (a client that went away) cancels the gRPC
stream, which cancels the Triton request.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio

from .contract import ENTRY_MODEL, OUTPUT_TOKEN_COUNT

log = logging.getLogger("redrafter.openai")


class UpstreamError(RuntimeError):
    """Triton or the engine failed the request (``unavailable``: Triton could not be reached)."""

    def __init__(self, message: str, *, unavailable: bool = False):
        super().__init__(message)
        self.unavailable = unavailable


def is_unavailable(exc: BaseException) -> bool:
    """gRPC UNAVAILABLE, as tritonclient (``status()``) or grpc (``code()``) reports it."""
    for attr in ("status", "code"):
        fn = getattr(exc, attr, None)
        if callable(fn) and "UNAVAILABLE" in str(fn()):
            return True
    return False


@dataclass(frozen=True)
class Sampling:
    """What one request asks of the engine (already validated)."""

    max_tokens: int
    stop: tuple[str, ...] = ()
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    min_tokens: int | None = None


@dataclass
class Outcome:
    """Filled in while a generation runs; complete once its generator is exhausted."""

    finish_reason: str = "length"
    completion_tokens: int = 0
    accepted_draft_tokens: int | None = None
    draft_tokens: int | None = None

    @property
    def acceptance_rate(self) -> float | None:
        """accepted / drafted; None where nothing was drafted (the base engine)."""
        if not self.draft_tokens or self.accepted_draft_tokens is None:
            return None
        return self.accepted_draft_tokens / self.draft_tokens


class StopMatcher:
    """OpenAI stop sequences on streamed text: emits what can no longer become part of a stop."""

    def __init__(self, stops: tuple[str, ...]):
        self.stops = stops
        self.text = ""
        self.sent = 0
        self.hit = False

    def feed(self, piece: str) -> str:
        self.text += piece
        # no stop can begin before `sent`: any text that could start one was held back
        cuts = [i for s in self.stops if (i := self.text.find(s, self.sent)) >= 0]
        if cuts:
            self.hit = True
            return self._emit(min(cuts))
        rest = self.text[self.sent :]
        hold = next(
            (
                k
                for k in range(min(len(rest), max(map(len, self.stops), default=1) - 1), 0, -1)
                if any(s.startswith(rest[-k:]) for s in self.stops)
            ),
            0,
        )
        return self._emit(len(self.text) - hold)

    def flush(self) -> str:
        return self._emit(len(self.text))

    def _emit(self, upto: int) -> str:
        out, self.sent = self.text[self.sent : upto], upto
        return out


def _tensor(name: str, value: Any, dtype: str, np_dtype: Any) -> grpcclient.InferInput:
    arr = np.array(value, dtype=np_dtype).reshape(1, -1)
    t = grpcclient.InferInput(name, list(arr.shape), dtype)
    t.set_data_from_numpy(arr)
    return t


def entry_inputs(prompt: str, s: Sampling) -> list[grpcclient.InferInput]:
    """The entry model's tensors for one request (its interface: model_repo.ENTRY_INPUTS)."""
    inputs = [
        _tensor("text_input", [prompt.encode("utf-8")], "BYTES", np.object_),
        _tensor("max_tokens", [s.max_tokens], "INT32", np.int32),
        _tensor("stream", [True], "BOOL", np.bool_),
        _tensor("return_perf_metrics", [True], "BOOL", np.bool_),
    ]
    if s.stop:
        inputs.append(_tensor("stop_words", [w.encode("utf-8") for w in s.stop], "BYTES", np.object_))
    if s.temperature == 0:  # OpenAI's temperature 0 is greedy decoding: top_k 1, no temperature scaling
        inputs.append(_tensor("top_k", [1], "INT32", np.int32))
    elif s.temperature is not None:
        inputs.append(_tensor("temperature", [s.temperature], "FP32", np.float32))
    for name, value in (
        ("top_p", s.top_p),
        ("presence_penalty", s.presence_penalty),
        ("frequency_penalty", s.frequency_penalty),
    ):
        if value is not None:
            inputs.append(_tensor(name, [value], "FP32", np.float32))
    if s.min_tokens:
        inputs.append(_tensor("min_tokens", [s.min_tokens], "INT32", np.int32))
    if s.seed is not None:
        inputs.append(_tensor("seed", [s.seed], "UINT64", np.uint64))
    return inputs


def describe(exc: BaseException) -> str:
    """One line for an error from tritonclient (``message()``), grpc (``details()``) or anything else."""
    for attr in ("message", "details"):
        fn = getattr(exc, attr, None)
        if callable(fn) and (text := fn()):
            return " ".join(str(text).split())
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


async def generate(
    client: grpcaio.InferenceServerClient,
    prompt: str,
    s: Sampling,
    outcome: Outcome,
    count_tokens: Callable[[str], int],
) -> AsyncGenerator[str, None]:
    """Text deltas of one generation; ``outcome`` is complete when the iterator ends.

    ``count_tokens(text)`` counts generated text where the engine's own count did not arrive (the
    stream was cut after a stop sequence the engine did not stop on).
    """
    matcher = StopMatcher(s.stop)
    inputs = entry_inputs(prompt, s)

    request_id = uuid.uuid4().hex

    async def requests() -> AsyncGenerator[dict[str, Any], None]:
        yield {
            "model_name": ENTRY_MODEL,
            "inputs": inputs,
            "request_id": request_id,
            "enable_empty_final_response": True,
        }

    responses = client.stream_infer(requests())
    engine_count: int | None = None
    try:
        async for result, error in responses:
            if error is not None:
                raise UpstreamError(describe(error))
            resp = result.get_response()
            names = {o.name for o in resp.outputs}
            if "text_output" in names:
                if matcher.hit:  # the engine went on past a stop sequence: cut it off here
                    break
                piece = result.as_numpy("text_output").reshape(-1)[0]
                delta = matcher.feed(piece.decode("utf-8", "replace") if isinstance(piece, bytes) else str(piece))
                if delta:
                    yield delta
            if OUTPUT_TOKEN_COUNT in names:
                engine_count = int(result.as_numpy(OUTPUT_TOKEN_COUNT).reshape(-1)[0])
            if "total_draft_tokens" in names:
                outcome.draft_tokens = int(result.as_numpy("total_draft_tokens").reshape(-1)[0])
            if "total_accepted_draft_tokens" in names:
                outcome.accepted_draft_tokens = int(result.as_numpy("total_accepted_draft_tokens").reshape(-1)[0])
            final = resp.parameters.get("triton_final_response")
            if final is not None and final.bool_param:
                break
    except (asyncio.CancelledError, GeneratorExit):  # the client went away, or the front's time limit passed
        log.info("Triton request %s cancelled: its client went away or its time limit passed", request_id)
        raise
    except UpstreamError:
        raise
    except Exception as exc:  # gRPC errors: Triton unreachable, stream reset
        raise UpstreamError(describe(exc), unavailable=is_unavailable(exc)) from exc
    finally:
        responses.cancel()
    if not matcher.hit:
        tail = matcher.flush()
        if tail:
            yield tail
    outcome.completion_tokens = engine_count if engine_count is not None else count_tokens(matcher.text)
    if matcher.hit or outcome.completion_tokens < s.max_tokens:
        outcome.finish_reason = "stop"
    else:
        outcome.finish_reason = "length"


class TritonBridge:
    """The front's way to Triton: one gRPC channel, readiness of the server and its entry model, generations.

    The front talks to anything with this interface (tests use an in-process fake)."""

    def __init__(self, url: str):
        self.url = url
        self.client: grpcaio.InferenceServerClient | None = None

    async def start(self) -> None:
        self.client = grpcaio.InferenceServerClient(self.url)

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()

    async def ready(self) -> bool:
        assert self.client is not None
        return bool(await self.client.is_server_ready() and await self.client.is_model_ready(ENTRY_MODEL))

    def generate(
        self, prompt: str, s: Sampling, outcome: Outcome, count_tokens: Callable[[str], int]
    ) -> AsyncGenerator[str, None]:
        assert self.client is not None
        return generate(self.client, prompt, s, outcome, count_tokens)
