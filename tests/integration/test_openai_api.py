"""The OpenAI-compatible front, called with the official ``openai`` client as users call it.

One real CPU tritonserver (ReDrafter variant, simulated engine) serves the generated repository; the
front runs as the pod runs it (``python -m engine_jobs openai``) in its own process over Triton's gRPC
port. References come from Triton's own ``generate`` endpoint on the entry model, token counts from
the same tokenizer the preprocessing model loads.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI
from tokenizers import Tokenizer
from triton_servers import TOKENIZER_VOCAB, make_tokenizer, start_servers, stop_servers  # noqa: I001 (same dir)

from engine_jobs.contract import ACCEPTANCE_HEADER, ENTRY_MODEL, METRIC_OUTPUT_TOKENS, METRIC_REQUESTS, ServingConfig
from redrafter_sim.checkpoint import write_tokenizer
from redrafter_sim.engine import SimEngineSettings, write_control
from redrafter_sim.triton import TritonServer, build_sim_repository, free_ports

pytestmark = [pytest.mark.triton, pytest.mark.timeout(240)]

MODEL = "acme/chat-7b"
MAX_INPUT_LEN = 64
MAX_SEQ_LEN = 320


def render(messages: list[dict]) -> str:
    """What the fake checkpoint's CHAT_TEMPLATE renders (written out by hand: the test must not reuse the
    code under test). Any other role is refused through raise_exception, as real templates refuse."""
    parts = []
    for m in messages:
        marker = {"system": "w10", "user": "w11", "assistant": "w12"}[m["role"]]
        parts.append(f"{marker} {m['content']}{'</s>' if m['role'] == 'assistant' else ''} ")
    return "".join(parts) + "w12"


def prompt(i: int) -> str:
    return " ".join(f"w{3 + (i * 11 + j * 17) % (TOKENIZER_VOCAB - 3)}" for j in range(4 + i % 5))


class Front:
    """``python -m engine_jobs openai`` in its own process, logging to a file."""

    def __init__(self, workdir: Path, cfg: ServingConfig, grpc_url: str, tokenizer: Path, name: str):
        self.port = free_ports(count=1)[0]
        self.config = workdir / f"{name}-serving.json"
        self.config.write_text(cfg.model_dump_json())
        self.log_path = workdir / f"{name}-front.log"
        argv = [
            sys.executable,
            "-m",
            "engine_jobs",
            "openai",
            "--config",
            str(self.config),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--grpc-url",
            grpc_url,
            "--tokenizer-dir",
            str(tokenizer),
            "--shutdown-timeout",
            "20",
        ]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def status(self, path: str) -> int | None:
        try:
            with urllib.request.urlopen(self.url + path, timeout=2) as r:
                return r.status
        except urllib.error.HTTPError as exc:
            return exc.code
        except (urllib.error.URLError, OSError):
            return None

    def wait_listening(self, ready: bool, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        want = 200 if ready else 503
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log()
            if self.status("/health/ready") == want:
                return
            time.sleep(0.2)
        raise AssertionError(f"front not {'ready' if ready else 'up'} in {timeout}s:\n{self.log()}")

    def client(self) -> AsyncOpenAI:
        return AsyncOpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=60)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        return self.proc.wait()


class Served:
    def __init__(self, root: Path, tokenizer: Path):
        self.root = root
        self.control = root / "control.json"
        self.ledger = root / "ledger.jsonl"
        write_control(self.control, acceptance_rate=0.7, step_ms=2.0)
        self.cfg = ServingConfig(
            deployment="chat",
            variant="redrafter",
            engine_key="key-r",
            artifact_dir=str(root / "artifact"),
            max_batch_size=32,
            draft_len_per_beam=4,
            num_beams=2,
            model_name=MODEL,
            max_input_len=MAX_INPUT_LEN,
            max_seq_len=MAX_SEQ_LEN,
        )
        sim = SimEngineSettings(
            variant="redrafter",
            draft_len_per_beam=4,
            num_beams=2,
            vocab_size=TOKENIZER_VOCAB,
            control_file=str(self.control),
            ledger_file=str(self.ledger),
        )
        repo = build_sim_repository(root / "repo", self.cfg, str(tokenizer), sim)
        self.server = TritonServer(repo, workdir=root / "work", exit_timeout_secs=3)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    root = tmp_path_factory.mktemp("openai")
    tokenizer = write_tokenizer(root / "tokenizer", TOKENIZER_VOCAB)  # the fake checkpoint's, chat template included
    bare = make_tokenizer(root / "bare-tokenizer")  # no tokenizer_config.json: no chat template
    served = start_servers(lambda _variant: Served(root, tokenizer), variants=("redrafter",))["redrafter"]
    fronts = []
    try:
        front = Front(root, served.cfg, served.server.grpc_url, tokenizer, "main")
        fronts.append(front)
        no_template = Front(root, served.cfg, served.server.grpc_url, bare, "bare")
        fronts.append(no_template)
        dead_port = free_ports(count=1)[0]
        no_triton = Front(root, served.cfg, f"127.0.0.1:{dead_port}", tokenizer, "no-triton")
        fronts.append(no_triton)
        front.wait_listening(ready=True)
        no_template.wait_listening(ready=True)
        no_triton.wait_listening(ready=False)
        yield {
            "served": served,
            "front": front,
            "bare": no_template,
            "no_triton": no_triton,
            "tokenizer": Tokenizer.from_file(str(tokenizer / "tokenizer.json")),
            "root": root,
        }
    finally:
        codes = {f.log_path.name: f.stop() for f in fronts}
        stop_servers({"redrafter": served})
    assert all(c == 0 for c in codes.values()), codes


@pytest.fixture
async def clients():
    """``clients(front)``: an official client for ``front``, closed when the test ends."""
    made: list[AsyncOpenAI] = []

    def make(front: Front) -> AsyncOpenAI:
        made.append(front.client())
        return made[-1]

    yield make
    for c in made:
        await c.close()


def tokens(stack, text: str) -> int:
    return len(stack["tokenizer"].encode(text).ids)


async def reference(stack, text: str, max_tokens: int) -> str:
    """The entry model's own answer (Triton's generate endpoint), as the front must reproduce it."""
    server = stack["served"].server
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"http://{server.http_url}/v2/models/{ENTRY_MODEL}/generate",
            json={"text_input": text, "max_tokens": max_tokens},
        ) as r:
            assert r.status == 200, await r.text()
            return (await r.json())["text_output"]


def metric(stack, name: str) -> float:
    for line in stack["served"].server.scrape().splitlines():
        if line.startswith(name + "{") and 'model="chat"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


# ---- models --------------------------------------------------------------------------------------
async def test_models_lists_the_deployment_model(stack, clients):
    client = clients(stack["front"])
    listed = await client.models.list()
    assert [m.id for m in listed.data] == [MODEL]
    card = listed.data[0]
    assert card.owned_by and card.created > 0 and card.object == "model"
    assert (await client.models.retrieve(MODEL)).id == MODEL
    with pytest.raises(openai.NotFoundError):
        await client.models.retrieve("other")


# ---- completions ---------------------------------------------------------------------------------
async def test_completion_matches_triton_counts_usage_and_is_metered(stack, clients):
    client = clients(stack["front"])
    text = prompt(1)
    expected = await reference(stack, text, 24)
    requests_before, output_before = metric(stack, METRIC_REQUESTS), metric(stack, METRIC_OUTPUT_TOKENS)
    raw = await client.completions.with_raw_response.create(model=MODEL, prompt=text, max_tokens=24)
    done = raw.parse()
    assert done.object == "text_completion" and done.model == MODEL
    assert done.choices[0].text == expected
    assert done.choices[0].finish_reason == "length"
    assert done.usage.prompt_tokens == tokens(stack, text)
    assert done.usage.completion_tokens == 24 == tokens(stack, expected)
    assert done.usage.total_tokens == done.usage.prompt_tokens + 24
    rate = float(raw.headers[ACCEPTANCE_HEADER])
    assert 0.0 < rate <= 1.0
    assert metric(stack, METRIC_REQUESTS) == requests_before + 1, "the request was not metered"
    assert metric(stack, METRIC_OUTPUT_TOKENS) == output_before + 24


async def test_completion_default_max_tokens_is_openais_16(stack, clients):
    done = await clients(stack["front"]).completions.create(model=MODEL, prompt=prompt(2))
    assert done.usage.completion_tokens == 16 and done.choices[0].finish_reason == "length"


async def test_streamed_completion_joins_to_the_full_text_and_reports_usage_last(stack, clients):
    client = clients(stack["front"])
    text = prompt(3)
    full = await client.completions.create(model=MODEL, prompt=text, max_tokens=30)
    chunks = [
        c
        async for c in await client.completions.create(
            model=MODEL, prompt=text, max_tokens=30, stream=True, stream_options={"include_usage": True}
        )
    ]
    assert len({c.id for c in chunks}) == 1
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full.choices[0].text
    assert len([c for c in chunks if c.choices]) > 2, "the completion did not stream"
    finished = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finished == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 30
    assert chunks[-1].usage.prompt_tokens == tokens(stack, text)
    assert all(c.usage is None for c in chunks[:-1])
    plain = [c async for c in await client.completions.create(model=MODEL, prompt=text, max_tokens=30, stream=True)]
    assert all(c.usage is None and c.choices for c in plain), "usage sent although not asked for"
    # on the wire: one JSON object per `data:` event, LF-separated, ending with data: [DONE]
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"{stack['front'].url}/v1/completions",
            json={"model": MODEL, "prompt": text, "max_tokens": 5, "stream": True},
        ) as r:
            assert r.status == 200 and r.headers["content-type"].startswith("text/event-stream")
            body = (await r.read()).decode()
    events = body.split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""] and "\r" not in body
    assert all(json.loads(e.removeprefix("data: "))["object"] == "text_completion" for e in events[:-2])


async def test_stop_sequences_cut_text_and_finish_with_stop(stack, clients):
    client = clients(stack["front"])
    text = prompt(4)
    ref = await reference(stack, text, 20)
    words = ref.split()
    # a whole word whose first appearance in the text is where that word starts (OpenAI matches text)
    stop = next(w for i, w in enumerate(words[3:], 3) if ref.find(w) == len(" ".join(words[:i])) + 1)
    cut = ref[: ref.find(stop)]
    for stops in (stop, ["w1x", stop]):
        done = await client.completions.create(model=MODEL, prompt=text, max_tokens=20, stop=stops)
        assert done.choices[0].text == cut and done.choices[0].finish_reason == "stop"
        assert done.usage.completion_tokens == tokens(stack, cut + stop)  # the engine stopped on the stop word
        streamed = [
            c
            async for c in await client.completions.create(
                model=MODEL, prompt=text, max_tokens=20, stop=stops, stream=True
            )
        ]
        assert "".join(c.choices[0].text for c in streamed) == cut
        assert streamed[-1].choices[0].finish_reason == "stop"
    # no stop: the same request runs to max_tokens
    assert (await client.completions.create(model=MODEL, prompt=text, max_tokens=20)).choices[0].text == ref


# ---- chat ----------------------------------------------------------------------------------------
async def test_chat_uses_the_tokenizer_chat_template(stack, clients):
    client = clients(stack["front"])
    messages = [
        {"role": "system", "content": "w20 w21"},
        {"role": "user", "content": prompt(5)},
        {"role": "assistant", "content": "w30"},
        {"role": "user", "content": "w31 w32"},
    ]
    rendered = render(messages)
    expected = await reference(stack, rendered, 12)
    raw = await client.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, max_completion_tokens=12, temperature=0, top_p=1.0, seed=7
    )
    done = raw.parse()
    assert done.object == "chat.completion"
    assert done.choices[0].message.role == "assistant" and done.choices[0].message.content == expected
    assert done.choices[0].finish_reason == "length"
    assert done.usage.prompt_tokens == tokens(stack, rendered)
    assert done.usage.completion_tokens == 12
    assert float(raw.headers[ACCEPTANCE_HEADER]) > 0
    legacy = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12)
    assert legacy.choices[0].message.content == expected

    chunks = [
        c
        async for c in await client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=12, stream=True, stream_options={"include_usage": True}
        )
    ]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    assert chunks[-1].usage.completion_tokens == 12 and chunks[-1].usage.prompt_tokens == tokens(stack, rendered)
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    speculation = finals[0].model_extra["redrafter"]
    assert speculation["acceptance_rate"] == pytest.approx(
        speculation["accepted_draft_tokens"] / speculation["draft_tokens"]
    )


async def test_chat_without_max_tokens_runs_to_the_end_of_the_context(stack, clients):
    messages = [{"role": "user", "content": prompt(6)}]
    done = await clients(stack["front"]).chat.completions.create(model=MODEL, messages=messages)
    assert done.usage.completion_tokens == MAX_SEQ_LEN - tokens(stack, render(messages))
    assert done.choices[0].finish_reason == "length"


# ---- errors --------------------------------------------------------------------------------------
def error_of(exc: openai.APIStatusError) -> dict:
    body = exc.response.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"n": 2}, "n"),
        ({"temperature": 3}, "temperature"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"logprobs": 2}, "logprobs"),
        ({"max_tokens": MAX_SEQ_LEN}, "max_tokens"),  # prompt + output beyond max_seq_len
    ],
)
async def test_invalid_parameters_are_400(stack, clients, kwargs, param):
    with pytest.raises(openai.BadRequestError) as exc:
        await clients(stack["front"]).completions.create(model=MODEL, prompt=prompt(1), **kwargs)
    err = error_of(exc.value)
    assert exc.value.status_code == 400 and err["param"] == param and err["type"] == "invalid_request_error"


async def test_prompt_longer_than_max_input_len_is_400_counted_in_tokens(stack, clients):
    client = clients(stack["front"])
    fits = " ".join(["w5"] * MAX_INPUT_LEN)  # exactly MAX_INPUT_LEN tokens (no special tokens added)
    assert tokens(stack, fits) == MAX_INPUT_LEN
    assert (
        await client.completions.create(model=MODEL, prompt=fits, max_tokens=2)
    ).usage.prompt_tokens == MAX_INPUT_LEN
    with pytest.raises(openai.BadRequestError) as exc:
        await client.completions.create(model=MODEL, prompt=fits + " w6", max_tokens=2)
    err = error_of(exc.value)
    assert err["code"] == "context_length_exceeded" and err["param"] == "prompt"
    assert str(MAX_INPUT_LEN + 1) in err["message"]
    with pytest.raises(openai.BadRequestError) as exc:
        await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": fits}])
    assert error_of(exc.value)["param"] == "messages"


async def test_unknown_model_is_404(stack, clients):
    client = clients(stack["front"])
    with pytest.raises(openai.NotFoundError) as exc:
        await client.completions.create(model="gpt-4o", prompt=prompt(1))
    assert error_of(exc.value)["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        await client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "w5"}])


async def test_chat_errors_from_the_template(stack, clients):
    with pytest.raises(openai.BadRequestError) as exc:
        await clients(stack["bare"]).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "w5"}])
    err = error_of(exc.value)
    assert err["code"] == "chat_template_missing" and "chat template" in err["message"]
    # completions still work without a template
    assert (await clients(stack["bare"]).completions.create(model=MODEL, prompt="w5", max_tokens=3)).usage
    with pytest.raises(openai.BadRequestError) as exc:
        await clients(stack["front"]).chat.completions.create(
            model=MODEL, messages=[{"role": "tool", "content": "w5", "tool_call_id": "x"}]
        )
    assert "Only system, user and assistant roles are supported" in error_of(exc.value)["message"]


async def test_503_while_triton_is_not_ready(stack, clients):
    front = stack["no_triton"]
    assert front.status("/health/ready") == 503 and front.status("/health/live") == 200
    with pytest.raises(openai.InternalServerError) as exc:
        await clients(front).completions.create(model=MODEL, prompt=prompt(1))
    assert exc.value.status_code == 503 and error_of(exc.value)["code"] == "service_unavailable"
    # the model id is still checked first
    with pytest.raises(openai.NotFoundError):
        await clients(front).completions.create(model="x", prompt=prompt(1))


async def test_engine_failure_is_a_500(stack, clients):
    served, client = stack["served"], clients(stack["front"])
    write_control(served.control, error="injected engine failure")
    try:
        with pytest.raises(openai.InternalServerError) as exc:
            await client.completions.create(model=MODEL, prompt=prompt(2), max_tokens=8)
        err = error_of(exc.value)
        assert exc.value.status_code == 500 and "injected engine failure" in err["message"]
        assert err["type"] == "server_error"
        # a stream that fails before its first token still gets its HTTP status
        with pytest.raises(openai.InternalServerError, match="injected engine failure"):
            await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "w5"}], max_tokens=8, stream=True
            )
    finally:
        write_control(served.control, error=None, step_ms=2.0)
    assert (await client.completions.create(model=MODEL, prompt=prompt(2), max_tokens=8)).usage.completion_tokens == 8


# ---- concurrency, cancellation, drain ------------------------------------------------------------
async def test_20_concurrent_streams_are_not_mixed_up(stack, clients):
    client = clients(stack["front"])
    n = 20
    refs = await asyncio.gather(*(reference(stack, prompt(100 + i), 16 + i % 9) for i in range(n)))

    async def one(i: int) -> tuple[str, set[str], int]:
        chunks = (
            [
                c
                async for c in await client.chat.completions.create(
                    model=MODEL,
                    messages=[{"role": "user", "content": prompt(100 + i)}],
                    max_tokens=16 + i % 9,
                    stream=True,
                    stream_options={"include_usage": True},
                )
            ]
            if i % 2
            else [
                c
                async for c in await client.completions.create(
                    model=MODEL,
                    prompt=prompt(100 + i),
                    max_tokens=16 + i % 9,
                    stream=True,
                    stream_options={"include_usage": True},
                )
            ]
        )
        text = "".join((c.choices[0].delta.content or "") if i % 2 else c.choices[0].text for c in chunks if c.choices)
        return text, {c.id for c in chunks}, chunks[-1].usage.completion_tokens

    results = await asyncio.gather(*(one(i) for i in range(n)))
    chat_refs = await asyncio.gather(
        *(reference(stack, render([{"role": "user", "content": prompt(100 + i)}]), 16 + i % 9) for i in range(1, n, 2))
    )
    for i, (text, ids, used) in enumerate(results):
        want = chat_refs[i // 2] if i % 2 else refs[i]
        assert text == want, f"stream {i} got another request's text"
        assert len(ids) == 1 and used == 16 + i % 9
    assert len({ids.pop() for _, ids, _ in results}) == n


async def wait_log(front: Front, text: str, count: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while front.log().count(text) < count and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert front.log().count(text) == count, front.log()


async def test_client_disconnect_cancels_the_triton_request(stack, clients):
    served, front = stack["served"], stack["front"]
    write_control(served.control, step_ms=40.0)  # 250 tokens take ~3 s: both clients leave long before
    before = front.log().count("cancelled: its client went away or its time limit passed")
    try:
        client = clients(front)
        stream = await client.completions.create(model=MODEL, prompt=prompt(9), max_tokens=250, stream=True)
        got = 0
        async for _chunk in stream:
            got += 1
            if got == 3:
                break
        await stream.close()
        await wait_log(front, "cancelled: its client went away or its time limit passed", count=before + 1)
        # a non-streaming request whose client gives up is cancelled too
        async with aiohttp.ClientSession() as session:
            with pytest.raises(asyncio.TimeoutError):
                await session.post(
                    f"{front.url}/v1/completions",
                    timeout=aiohttp.ClientTimeout(total=1),
                    json={"model": MODEL, "prompt": prompt(10), "max_tokens": 250},
                )
        await wait_log(front, "cancelled: its client went away or its time limit passed", count=before + 2)
    finally:
        write_control(served.control, step_ms=2.0)
    done = await clients(front).completions.create(model=MODEL, prompt=prompt(9), max_tokens=5)
    assert done.usage.completion_tokens == 5


async def test_sigterm_drains_in_flight_streams(stack, clients):
    served = stack["served"]
    front = Front(stack["root"], served.cfg, served.server.grpc_url, stack["root"] / "tokenizer", "drain")
    try:
        front.wait_listening(ready=True)
        write_control(served.control, step_ms=10.0)
        stream = await clients(front).completions.create(
            model=MODEL, prompt=prompt(12), max_tokens=60, stream=True, stream_options={"include_usage": True}
        )
        chunks = [await stream.__anext__()]
        front.proc.send_signal(signal.SIGTERM)
        chunks += [c async for c in stream]
        code = front.proc.wait(timeout=30)  # exits by itself once the stream is done
    finally:
        write_control(served.control, step_ms=2.0)
        front.stop()
    assert chunks[-1].usage.completion_tokens == 60, "the in-flight stream was cut by SIGTERM"
    assert code == 0, front.log()
    assert front.status("/health/ready") is None, "the front still listens after SIGTERM"


def test_metered_requests_match_the_engine_ledger(stack):
    served = stack["served"]
    ledger = [json.loads(x) for x in served.ledger.read_text().splitlines()]
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        ledger = [json.loads(x) for x in served.ledger.read_text().splitlines()]
        if metric(stack, METRIC_REQUESTS) == sum(1 for r in ledger if r["error"] is None):
            break
        time.sleep(0.2)
    ok = [r for r in ledger if r["error"] is None]
    assert metric(stack, METRIC_REQUESTS) == len(ok)
    assert metric(stack, METRIC_OUTPUT_TOKENS) == sum(r["output_tokens"] for r in ok)


# ---- evaluate --protocol openai ------------------------------------------------------------------
def test_evaluate_validate_and_sweep_over_the_openai_protocol(stack, tmp_path):
    from redrafter_operator.cli import main

    url = stack["front"].url  # both "engines" are the one front: validation must find identical outputs
    log = tmp_path / "termination-log"
    rc = main(
        [
            "evaluate",
            "validate",
            "--protocol",
            "openai",
            "--redrafter",
            url,
            "--base",
            url,
            "--max-tokens",
            "8",
            "--long-max-tokens",
            "16",
            "--batch-size",
            "4",
            "--single-requests",
            "2",
            "--ready-timeout",
            "10",
            "--termination-log",
            str(log),
            "--out",
            str(log.with_suffix(".json")),
        ]
    )
    assert rc == 0, log.read_text()
    details = json.loads(log.with_suffix(".json").read_text())
    assert details["requests"]["redrafter"] == details["requests"]["base"] > 0 and not details["failures"]
    out = tmp_path / "report"
    rc = main(
        [
            "evaluate",
            "--protocol",
            "openai",
            "--redrafter",
            url,
            "--concurrency",
            "1,4",
            "--max-tokens",
            "12",
            "--requests-per-worker",
            "2",
            "--warmup",
            "1",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    levels = json.loads((out / "report.json").read_text())["levels"]["redrafter"]
    assert [lv["concurrency"] for lv in levels] == [1, 4]
    for lv in levels:
        assert lv["errors"] == 0 and lv["output_tokens"] == 12 * lv["requests"]
        assert lv["acceptance"] is not None and 0 < lv["ttft"]["p50"] <= lv["e2e"]["p50"]


def test_evaluate_rejects_a_bad_openai_endpoint(stack, tmp_path):
    from redrafter_operator.cli import main

    log = tmp_path / "termination-log"
    dead = f"http://127.0.0.1:{free_ports(count=1)[0]}"
    rc = main(
        [
            "evaluate",
            "validate",
            "--protocol",
            "openai",
            "--redrafter",
            stack["front"].url,
            "--base",
            dead,
            "--ready-timeout",
            "1",
            "--termination-log",
            str(log),
        ]
    )
    assert rc == 3 and log.read_text().startswith(f"EndpointUnavailable: base endpoint {dead}/v1 not ready")
