"""Property-based tests of the OpenAI front: whatever the body, the answer is OpenAI's success or error body,
never a 5xx and never a hang. Hypothesis draws hostile bodies; schemathesis draws requests from the
front's own ``/openapi.json`` and checks the answers against it.

One front (real aiohttp app, fake Triton bridge) serves every example from a background thread on a
free local port; every request has a client timeout, so a hang fails the example instead of the suite.
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai_fake import MAX_INPUT_LEN, MAX_SEQ_LEN, MODEL, FakeBridge, is_openai_error, sse_events  # noqa: I001
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from engine_jobs.openai_api import SERVER_OPTIONS, make_app
from engine_jobs.openai_front import Front
from engine_jobs.openai_schema import openapi_document
from engine_jobs.openai_settings import FrontSettings
from redrafter_sim.checkpoint import write_tokenizer

pytestmark = pytest.mark.timeout(120)

REQUEST_TIMEOUT = 10  # seconds; the fake engine answers in milliseconds
FUZZ = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    database=None,
)


class ServedFront:
    """The front on 127.0.0.1:<free port>, run by an event loop in a daemon thread."""

    def __init__(self, tokenizer: Path):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.bridge = FakeBridge()
        settings = FrontSettings(MODEL, MAX_INPUT_LEN, MAX_SEQ_LEN, 0, max_body_bytes=64 * 1024, request_timeout=5)
        self.front = Front(settings, tokenizer, self.bridge)
        self.runner = web.AppRunner(make_app(self.front), **SERVER_OPTIONS)
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(30)
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        self.session = requests.Session()

    async def _start(self) -> None:
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()

    def close(self) -> None:
        self.session.close()
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    front = ServedFront(write_tokenizer(tmp_path_factory.mktemp("tokenizer")))
    yield front
    front.close()


def assert_openai_answer(resp: requests.Response) -> None:
    """A success in OpenAI's shape, or an error in OpenAI's error body with a 4xx status."""
    assert resp.status_code < 500, (resp.status_code, resp.text[:500])
    if resp.status_code != 200:
        assert is_openai_error(resp.json()), resp.text[:500]
        return
    if resp.headers["Content-Type"].startswith("text/event-stream"):
        events = sse_events(resp.text)
        assert events[-1] == "[DONE]", events
        chunks = [json.loads(e) for e in events[:-1]]
        assert all("choices" in c or "usage" in c for c in chunks), chunks
        return
    body = resp.json()
    assert body["object"] in ("text_completion", "chat.completion") and len(body["choices"]) == 1, body
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"]


# ---- hypothesis: bodies of every shape ---------------------------------------------------------------
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
words = st.lists(st.sampled_from(["w5", "w6", "w7", "w42", "é", "😀", "</s>", "\u0000", "x" * 40]), max_size=80).map(
    " ".join
)
plausible: dict[str, Any] = {
    "max_tokens": st.integers(min_value=-5, max_value=300) | st.just(2**70) | json_values,
    "max_completion_tokens": st.integers(min_value=-5, max_value=300) | json_values,
    "temperature": st.floats(min_value=-1, max_value=3, allow_nan=False) | json_values,
    "top_p": st.floats(min_value=-1, max_value=2, allow_nan=False) | json_values,
    "stop": st.lists(st.text(max_size=300), max_size=6) | st.text(max_size=5) | json_values,
    "seed": st.integers(min_value=-1, max_value=2**65) | json_values,
    "stream": st.booleans() | json_values,
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}) | json_values,
    "n": st.integers(min_value=0, max_value=3) | json_values,
    "min_tokens": st.integers(min_value=-1, max_value=300) | json_values,
    "presence_penalty": st.floats(min_value=-3, max_value=3, allow_nan=False) | json_values,
    "user": st.text(max_size=30) | json_values,
}
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "tool", "robot"]) | json_values},
    optional={
        "content": words
        | st.lists(st.fixed_dictionaries({"type": st.just("text") | json_values, "text": words}), max_size=3)
        | json_values,
        "name": json_values,
    },
)
completion_bodies = st.fixed_dictionaries(
    {},
    optional={"model": st.just(MODEL) | json_values, "prompt": words | st.lists(words, max_size=2) | json_values}
    | plausible,
)
chat_bodies = st.fixed_dictionaries(
    {},
    optional={"model": st.just(MODEL) | json_values, "messages": st.lists(message, max_size=4) | json_values}
    | plausible,
)
# a body string with escapes hypothesis' text strategy never yields: lone surrogates, huge exponents, NaN
raw_bodies = st.one_of(
    st.binary(max_size=300),
    st.builds(
        lambda prefix, junk: f'{{"model": "{MODEL}", "prompt": "w5", "{prefix}": {junk}}}'.encode(),
        st.sampled_from(["max_tokens", "temperature", "stop", "user"]),
        st.sampled_from(['"\\ud800"', "1e999", "-1e999", "NaN", "Infinity", "9" * 5000, "[" * 50 + "]" * 50, "{"]),
    ),
)


@FUZZ
@given(path=st.sampled_from(["/v1/completions", "/v1/chat/completions"]), data=st.data())
def test_any_body_gets_an_openai_answer(served, path, data):
    body = data.draw(completion_bodies if path == "/v1/completions" else chat_bodies | json_values)
    resp = served.session.post(
        served.url + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        timeout=REQUEST_TIMEOUT,
    )
    assert_openai_answer(resp)


@FUZZ
@given(path=st.sampled_from(["/v1/completions", "/v1/chat/completions"]), body=raw_bodies)
def test_any_bytes_get_an_openai_answer(served, path, body):
    resp = served.session.post(served.url + path, data=body, timeout=REQUEST_TIMEOUT)
    assert_openai_answer(resp)


def test_the_fuzzers_reach_the_engine(served):
    """The strategies are not all rejected up front: valid requests are among them and are served."""
    resp = served.session.post(
        served.url + "/v1/completions", json={"model": MODEL, "prompt": "w5 w6"}, timeout=REQUEST_TIMEOUT
    )
    assert resp.status_code == 200 and resp.json()["choices"][0]["text"] == "w5 w6 "


# ---- schemathesis: the front against its own OpenAPI document ----------------------------------------
schema = schemathesis.openapi.from_dict(openapi_document())


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
def test_the_front_conforms_to_its_openapi_document(served, case):
    case.call_and_validate(
        base_url=served.url,
        session=served.session,
        timeout=REQUEST_TIMEOUT,
        checks=[not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance],
    )
