"""The OpenAI front against hostile input, overload and failing engines, over a fake Triton bridge.

Every test runs the real aiohttp application on a local test server; only Triton is faked
(tests/unit/openai_fake.py). Each is bounded by pytest-timeout and by the client's own timeout.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
from openai_fake import (  # noqa: I001 (same dir)
    MODEL,
    FakeBridge,
    dies,
    hang,
    hang_at_once,
    is_openai_error,
    sse_events,
    start_front,
    until,
    wait_for_release,
)

pytestmark = pytest.mark.timeout(60)

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


def chat(**extra) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "w5 w6"}], **extra}


def completion(**extra) -> dict:
    return {"model": MODEL, "prompt": "w5 w6 w7", **extra}


def nested(depth: int) -> bytes:
    return b'{"model": "m", "prompt": "w5", "user": ' + b"[" * depth + b"]" * depth + b"}"


HOSTILE: list[tuple[str, str, bytes, int, str]] = [
    # (case, path, body, status, a word the message must hold)
    ("10000 nested arrays", COMPLETIONS, b"[" * 10000 + b"]" * 10000, 400, "max_json_depth"),
    ("40 nested arrays in a field", COMPLETIONS, nested(40), 400, "max_json_depth"),
    ("not JSON", CHAT, b"{'model': 1}", 400, "not valid JSON"),
    ("NaN", COMPLETIONS, b'{"model": "m", "prompt": "w5", "temperature": NaN}', 400, "NaN"),
    (
        "a 5000-digit integer",
        COMPLETIONS,
        b'{"model": "m", "prompt": "w5", "max_tokens": ' + b"9" * 5000 + b"}",
        400,
        "",
    ),
    ("1e999", COMPLETIONS, b'{"model": "m", "prompt": "w5", "temperature": 1e999}', 400, "out of range"),
    ("not UTF-8", CHAT, b'{"model": "\xff\xfe"}', 400, "UTF-8"),
    ("a lone surrogate", COMPLETIONS, b'{"model": "m", "prompt": "\\ud800"}', 400, "surrogate"),
    ("an array body", CHAT, b"[]", 400, "JSON object"),
    ("a string body", CHAT, b'"x"', 400, "JSON object"),
    ("empty", CHAT, b"", 400, "not valid JSON"),
    ("a prompt of wrong type", COMPLETIONS, json.dumps(completion(prompt={"a": 1})).encode(), 400, "prompt"),
    ("5 stops", COMPLETIONS, json.dumps(completion(stop=["a"] * 5)).encode(), 400, "at most 4"),
    ("a long stop", COMPLETIONS, json.dumps(completion(stop=["x" * 257])).encode(), 400, "max_stop_chars"),
    (
        "too many messages",
        CHAT,
        json.dumps(chat(messages=[{"role": "user", "content": "w5"}] * 9)).encode(),
        400,
        "max_messages",
    ),
    ("a prompt past maxInputLen", COMPLETIONS, json.dumps(completion(prompt="w5 " * 65)).encode(), 400, "64 tokens"),
    ("max_tokens past maxSeqLen", COMPLETIONS, json.dumps(completion(max_tokens=126)).encode(), 400, "128"),
    ("a body over max_body_bytes", COMPLETIONS, json.dumps(completion(user="x" * 40000)).encode(), 413, "32768 bytes"),
]


@pytest.mark.parametrize(("case", "path", "body", "status", "word"), HOSTILE, ids=[h[0] for h in HOSTILE])
async def test_hostile_bodies_get_a_4xx_in_openai_shape(tmp_path, case, path, body, status, word):
    _front, bridge, client = await start_front(tmp_path, max_body_bytes=32768, max_messages=8)
    try:
        resp = await client.post(path, data=body, headers={"Content-Type": "application/json"})
        payload = await resp.json()
        assert resp.status == status, payload
        assert is_openai_error(payload) and payload["error"]["type"] == "invalid_request_error", payload
        assert word in payload["error"]["message"], payload
        assert bridge.started == 0  # nothing reached the engine
    finally:
        await client.close()


async def test_a_chunked_body_over_the_limit_gets_413(tmp_path):
    """No Content-Length to refuse up front: the body is cut off while it is read."""
    _front, _bridge, client = await start_front(tmp_path, max_body_bytes=4096)

    async def chunks():
        for _ in range(10):
            yield b" " * 1024

    try:
        resp = await client.post(COMPLETIONS, data=chunks())
        assert resp.status == 413 and "max_body_bytes" in (await resp.json())["error"]["message"]
    finally:
        await client.close()


async def test_a_body_that_does_not_arrive_gets_408(tmp_path):
    _front, _bridge, client = await start_front(tmp_path, body_timeout=0.3)
    try:
        reader, writer = await asyncio.open_connection(client.host, client.port)
        writer.write(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"model": '
        )
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert head.startswith(b"HTTP/1.1 408"), head
        writer.close()
    finally:
        await client.close()


async def test_back_pressure_queues_then_refuses_with_retry_after(tmp_path):
    front, bridge, client = await start_front(
        tmp_path, FakeBridge(wait_for_release), max_in_flight=1, max_queued=1, queue_timeout=30
    )
    try:
        running = asyncio.create_task(client.post(COMPLETIONS, json=completion()))
        await until(lambda: bridge.started == 1, what="first request running")
        queued = asyncio.create_task(client.post(COMPLETIONS, json=completion()))
        await until(lambda: front.admission.queued == 1, what="second request queued")
        refused = await client.post(COMPLETIONS, json=completion())
        body = await refused.json()
        assert refused.status == 429 and refused.headers["Retry-After"] == "1", body
        assert is_openai_error(body) and body["error"]["code"] == "queue_full"
        assert "max_in_flight" in body["error"]["message"]
        metrics = await (await client.get("/metrics")).text()
        assert "redrafter_openai_requests_in_flight 1" in metrics
        assert "redrafter_openai_requests_queued 1" in metrics
        assert 'redrafter_openai_requests_rejected_total{reason="queue_full"} 1' in metrics
        bridge.release.set()
        for task in (running, queued):
            resp = await asyncio.wait_for(task, 10)
            assert resp.status == 200 and (await resp.json())["choices"][0]["text"] == "first last"
        assert (front.admission.in_flight, front.admission.queued) == (0, 0)
    finally:
        await client.close()


async def test_a_request_that_waits_too_long_for_a_slot_gets_429(tmp_path):
    front, bridge, client = await start_front(
        tmp_path, FakeBridge(wait_for_release), max_in_flight=1, max_queued=4, queue_timeout=0.2
    )
    try:
        running = asyncio.create_task(client.post(COMPLETIONS, json=completion()))
        await until(lambda: bridge.started == 1, what="first request running")
        resp = await client.post(CHAT, json=chat())
        body = await resp.json()
        assert resp.status == 429 and body["error"]["code"] == "queue_timeout" and "Retry-After" in resp.headers
        bridge.release.set()
        assert (await asyncio.wait_for(running, 10)).status == 200
    finally:
        await client.close()


async def test_a_generation_past_the_time_limit_gets_504(tmp_path):
    _front, bridge, client = await start_front(tmp_path, FakeBridge(hang_at_once), request_timeout=0.3)
    try:
        for stream in (False, True):  # a stream that never produced a token still has its status to give
            resp = await client.post(COMPLETIONS, json=completion(stream=stream))
            body = await resp.json()
            assert resp.status == 504 and is_openai_error(body) and body["error"]["code"] == "timeout", body
        assert bridge.cancelled == 2
    finally:
        await client.close()


@pytest.mark.parametrize(
    ("script", "code"),
    [(hang, "timeout"), (dies, "service_unavailable")],
    ids=["engine hangs after a token", "triton dies mid-stream"],
)
async def test_a_stream_that_fails_after_its_first_token_ends_with_an_error_event(tmp_path, script, code):
    front, bridge, client = await start_front(tmp_path, FakeBridge(script), request_timeout=0.5)
    try:
        resp = await client.post(CHAT, json=chat(stream=True))
        assert resp.status == 200
        events = sse_events(await asyncio.wait_for(resp.text(), 10))
        assert events[-1] == "[DONE]", events
        error = json.loads(events[-2])
        assert is_openai_error(error) and error["error"]["code"] == code, events
        assert json.loads(events[1])["choices"][0]["delta"]["content"] == "first "
        if script is hang:
            assert bridge.cancelled == 1  # the Triton request is cancelled, not left running
        else:
            assert not front.ready  # Triton is gone: new requests get 503 until it is back
    finally:
        await client.close()


async def test_a_client_that_goes_away_cancels_its_generation(tmp_path):
    front, bridge, client = await start_front(tmp_path, FakeBridge(hang))
    try:
        resp = await client.post(COMPLETIONS, json=completion(stream=True))
        assert resp.status == 200
        assert b"first" in await asyncio.wait_for(resp.content.readuntil(b"\n\n"), 10)
        resp.close()  # drops the connection mid-stream
        await until(lambda: bridge.cancelled == 1, what="the generation cancelled")
        await until(lambda: front.admission.in_flight == 0, what="its slot released")
    finally:
        await client.close()


def _kubelet_secret(root: Path, keys: dict[str, str], generation: int) -> None:
    """A Secret volume as the kubelet writes it: files behind the ``..data`` symlink, swapped atomically."""
    data = root / f"..2024_01_01_00_00_0{generation}.{generation}"
    data.mkdir()
    for name, key in keys.items():
        (data / name).write_text(key + "\n")
        if not (root / name).is_symlink():
            (root / name).symlink_to(f"..data/{name}")
    tmp = root / "..data_tmp"
    tmp.symlink_to(data.name)
    os.replace(tmp, root / "..data")


async def test_api_keys_guard_every_api_path_and_rotate_without_a_restart(tmp_path, caplog):
    secret = tmp_path / "api-keys"
    secret.mkdir()
    _kubelet_secret(secret, {"team-a": "sk-alpha", "team-b": "sk-beta"}, 1)
    front, _bridge, client = await start_front(tmp_path, api_keys_dir=str(secret))

    async def status(path: str, key: str | None, method: str = "GET") -> int:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        body = completion() if method == "POST" else None
        resp = await client.request(method, path, headers=headers, json=body)
        payload = await resp.json() if resp.content_type == "application/json" else None
        if resp.status == 401:
            assert is_openai_error(payload) and payload["error"]["code"] == "invalid_api_key", payload
        return resp.status

    try:
        assert await status("/v1/models", None) == 401
        assert await status("/v1/models", "sk-wrong") == 401
        assert await status(COMPLETIONS, "sk-alph", "POST") == 401  # a prefix is not the key
        assert await status("/v1/models", "sk-alpha") == 200
        assert await status(COMPLETIONS, "sk-beta", "POST") == 200
        assert await status("/nowhere", None) == 401  # unknown paths tell nothing without a key
        for open_path in ("/health/ready", "/health/live", "/metrics", "/openapi.json"):
            assert await status(open_path, None) == 200, open_path
        _kubelet_secret(secret, {"team-a": "sk-gamma", "team-b": "sk-beta"}, 2)  # sk-alpha rotated out
        assert await status("/v1/models", "sk-alpha") == 401
        assert await status("/v1/models", "sk-gamma") == 200
        reloads = front.api_keys.reloads
        for _ in range(5):
            await status("/v1/models", "sk-gamma")
        assert front.api_keys.reloads == reloads  # unchanged files are not read again
        assert not any(k in caplog.text for k in ("sk-alpha", "sk-beta", "sk-gamma"))
    finally:
        await client.close()


async def test_an_empty_or_missing_key_directory_refuses_everything(tmp_path):
    _front, _bridge, client = await start_front(tmp_path, api_keys_dir=str(tmp_path / "missing"))
    try:
        resp = await client.get("/v1/models", headers={"Authorization": "Bearer "})
        assert resp.status == 401
        resp = await client.get("/v1/models", headers={"Authorization": "Bearer anything"})
        assert resp.status == 401
    finally:
        await client.close()


async def test_the_openapi_document_lists_every_route_of_the_app(tmp_path):
    _front, _bridge, client = await start_front(tmp_path)
    try:
        doc = await (await client.get("/openapi.json")).json()
        routes = {
            (r.method.lower(), r.resource.canonical.replace("{model:.+}", "{model}"))
            for r in client.app.router.routes()
            if r.method != "HEAD"
        }
        documented = {(m, p) for p, ops in doc["paths"].items() for m in ops}
        assert documented == routes - {("get", "/openapi.json")}
        schemas = doc["components"]["schemas"]
        assert {"CompletionRequest", "ChatCompletionRequest", "ErrorBody", "Completion"} <= set(schemas)
        assert "max_tokens" in schemas["CompletionRequest"]["properties"]
    finally:
        await client.close()


async def test_a_stuck_triton_turns_readiness_false_within_the_timeout(tmp_path):
    class Stuck(FakeBridge):
        async def ready(self) -> bool:
            if self.is_ready:
                return True
            await asyncio.Event().wait()  # accepts the call, never answers
            return True

    bridge = Stuck()
    _front, _, client = await start_front(tmp_path, bridge, ready_timeout=0.3)
    try:
        assert (await client.get("/health/ready")).status == 200
        bridge.is_ready = False
        started = asyncio.get_running_loop().time()
        resp = await client.get("/health/ready")
        assert resp.status == 503 and await resp.json() == {"ready": False}
        assert asyncio.get_running_loop().time() - started < 2.0  # bounded by ready_timeout, not by the probe
        resp = await client.post(COMPLETIONS, json=completion())
        body = await resp.json()
        assert resp.status == 503 and is_openai_error(body), body
        assert bridge.started == 0  # nothing reached the stuck server
    finally:
        await client.close()


async def test_a_slow_upload_holds_no_generation_slot(tmp_path):
    """The body is received before a slot is taken: with one slot, a client still sending its body does not
    keep a ready request waiting (it holds a place only), and its own body is bounded by body_timeout."""
    front, bridge, client = await start_front(tmp_path, max_in_flight=1, max_queued=1, queue_timeout=2, body_timeout=20)
    try:
        reader, writer = await asyncio.open_connection(client.host, client.port)
        writer.write(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"model": '
        )
        await writer.drain()
        await until(lambda: front.admission.receiving == 1, what="the slow upload holding a place")
        resp = await asyncio.wait_for(client.post(COMPLETIONS, json=completion()), 10)
        assert resp.status == 200, await resp.text()
        assert bridge.started == 1 and front.admission.receiving == 1  # the upload is still arriving
        assert (front.admission.in_flight, front.admission.queued) == (0, 0)
        writer.close()
        await until(lambda: front.admission.receiving == 0, what="the dropped upload's place released")
    finally:
        await client.close()
