"""An in-process stand-in for Triton behind the OpenAI front, and a way to serve the front on a test server.

The fake bridge answers every generation with the prompt's first words (or whatever ``script`` does),
records what it was asked, and notices when a generation is cancelled or closed (the front's way of
cancelling the Triton request).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import ClientTimeout
from aiohttp.test_utils import TestClient, TestServer

from engine_jobs.openai_api import SERVER_OPTIONS, make_app
from engine_jobs.openai_front import Front
from engine_jobs.openai_settings import FrontSettings
from engine_jobs.triton_bridge import Outcome, Sampling, UpstreamError
from redrafter_sim.checkpoint import write_tokenizer

MODEL = "m"
MAX_INPUT_LEN = 64
MAX_SEQ_LEN = 128

Script = Callable[["FakeBridge", str, Sampling, Outcome], AsyncIterator[str]]


async def echo(bridge: "FakeBridge", prompt: str, s: Sampling, outcome: Outcome) -> AsyncIterator[str]:
    words = prompt.split()[: s.max_tokens]
    for w in words:
        yield w + " "
    outcome.completion_tokens = len(words)
    outcome.finish_reason = "length" if len(words) == s.max_tokens else "stop"


async def hang(bridge: "FakeBridge", prompt: str, s: Sampling, outcome: Outcome) -> AsyncIterator[str]:
    """One token, then nothing ever again (an engine stuck inside Triton's Python backend)."""
    yield "first "
    await asyncio.Event().wait()


async def hang_at_once(bridge: "FakeBridge", prompt: str, s: Sampling, outcome: Outcome) -> AsyncIterator[str]:
    await asyncio.Event().wait()
    yield ""


async def wait_for_release(bridge: "FakeBridge", prompt: str, s: Sampling, outcome: Outcome) -> AsyncIterator[str]:
    """One token, then the rest once the test sets ``bridge.release``."""
    yield "first "
    await bridge.release.wait()
    yield "last"
    outcome.completion_tokens = 2
    outcome.finish_reason = "stop"


async def dies(bridge: "FakeBridge", prompt: str, s: Sampling, outcome: Outcome) -> AsyncIterator[str]:
    """One token, then Triton goes away (gRPC UNAVAILABLE, as the bridge reports it)."""
    yield "first "
    raise UpstreamError("Socket closed", unavailable=True)


class FakeBridge:
    def __init__(self, script: Script = echo):
        self.script = script
        self.is_ready = True
        self.prompts: list[str] = []
        self.started = 0  # generations begun
        self.ended = 0  # generations that ran to their end
        self.cancelled = 0  # generations cancelled or closed before their end
        self.release = asyncio.Event()

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def ready(self) -> bool:
        return self.is_ready

    def generate(
        self, prompt: str, s: Sampling, outcome: Outcome, count_tokens: Callable[[str], int]
    ) -> AsyncIterator[str]:
        return self._run(prompt, s, outcome)

    async def _run(self, prompt: str, s: Sampling, outcome: Outcome) -> AsyncIterator[str]:
        self.prompts.append(prompt)
        self.started += 1
        try:
            async for delta in self.script(self, prompt, s, outcome):
                yield delta
        except (asyncio.CancelledError, GeneratorExit):
            self.cancelled += 1
            raise
        self.ended += 1


async def start_front(
    tmp_path: Path, bridge: FakeBridge | None = None, **settings: Any
) -> tuple[Front, FakeBridge, TestClient]:
    """The front over a fake bridge on a local test server; the caller closes the client."""
    bridge = bridge or FakeBridge()
    tok = tmp_path / "tokenizer"
    if not tok.exists():
        write_tokenizer(tok)
    front = Front(FrontSettings(MODEL, MAX_INPUT_LEN, MAX_SEQ_LEN, 0, **settings), tok, bridge)
    client = TestClient(TestServer(make_app(front), **SERVER_OPTIONS), timeout=ClientTimeout(total=20))
    await client.start_server()
    return front, bridge, client


async def until(condition: Callable[[], bool | Awaitable[bool]], timeout: float = 10.0, what: str = "") -> None:
    """Polls ``condition`` until it holds; fails after ``timeout`` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        result = condition()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not within {timeout}s: {what or condition}")
        await asyncio.sleep(0.01)


def is_openai_error(body: Any) -> bool:
    """OpenAI's error body: exactly message, type, param, code under ``error``."""
    return (
        isinstance(body, dict)
        and set(body) == {"error"}
        and isinstance(body["error"], dict)
        and set(body["error"]) == {"message", "type", "param", "code"}
        and isinstance(body["error"]["message"], str)
        and isinstance(body["error"]["type"], str)
    )


def sse_events(text: str) -> list[str]:
    """The ``data:`` payloads of a Server-Sent Events body, in order."""
    return [line[len("data: ") :] for line in text.splitlines() if line.startswith("data: ")]
