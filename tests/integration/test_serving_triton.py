"""Real tritonserver on the CPU: the generated repository with the simulated engine as tensorrt_llm.

Two servers (ReDrafter and base variants) start once for the module. The simulated engine appends
every request it finishes to a ledger; the counters the metering model exports must equal it.
"""

from __future__ import annotations

import asyncio
import json
import queue
import re
import uuid
from pathlib import Path

import aiohttp
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
from triton_servers import TOKENIZER_VOCAB, make_tokenizer, start_servers, stop_servers  # noqa: I001 (same dir)
from tritonclient.utils import InferenceServerException

from engine_jobs.contract import (
    ENTRY_MODEL,
    METRIC_ACCEPTANCE_HISTOGRAM,
    METRIC_ACCEPTED_DRAFT_TOKENS,
    METRIC_DRAFT_TOKENS,
    METRIC_OUTPUT_TOKENS,
    METRIC_REQUESTS,
    METRIC_STEPS,
    ServingConfig,
)
from redrafter_sim.engine import SimEngineSettings, write_control
from redrafter_sim.triton import TritonServer, build_sim_repository

pytestmark = [pytest.mark.triton, pytest.mark.timeout(240)]

VOCAB = TOKENIZER_VOCAB
DRAFT_LEN = 4
PERF = ("acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens")


class Served:
    """One running server plus its simulator's control file and ledger."""

    def __init__(self, root: Path, variant: str, tokenizer: Path):
        self.variant = variant
        self.control = root / f"{variant}-control.json"
        self.ledger = root / f"{variant}-ledger.jsonl"
        write_control(self.control, acceptance_rate=0.7, step_ms=2.0)
        cfg = ServingConfig(
            deployment="llm",
            variant=variant,
            engine_key=f"key-{variant}",
            artifact_dir="/cache/x",
            max_batch_size=16,
            draft_len_per_beam=DRAFT_LEN if variant == "redrafter" else 0,
            num_beams=2 if variant == "redrafter" else 0,
        )
        sim = SimEngineSettings(
            variant=variant,
            draft_len_per_beam=DRAFT_LEN,
            num_beams=2,
            vocab_size=VOCAB,
            control_file=str(self.control),
            ledger_file=str(self.ledger),
        )
        repo = build_sim_repository(root / f"{variant}-repo", cfg, str(tokenizer), sim)
        self.server = TritonServer(repo, workdir=root / f"{variant}-work", exit_timeout_secs=3)

    def ledger_totals(self) -> dict[str, int]:
        rows = [json.loads(x) for x in self.ledger.read_text().splitlines()] if self.ledger.exists() else []
        ok = [r for r in rows if r["error"] is None]
        return {
            "requests": len(ok),
            "output": sum(r["output_tokens"] for r in ok),
            "draft": sum(r["draft_tokens"] for r in ok),
            "accepted": sum(r["accepted_draft_tokens"] for r in ok),
            # a step whose only token was end_id emits nothing: output - accepted counts emitting steps
            "steps": sum(r["emitting_steps"] for r in ok),
            "drafting_requests": sum(1 for r in ok if r["draft_tokens"] > 0),
        }

    def metric_totals(self) -> dict[str, float]:
        text = self.server.scrape()
        labels = f'{{model="llm",variant="{self.variant}"}}'

        def value(name: str) -> float:
            m = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, re.M)
            return float(m.group(1)) if m else 0.0

        return {
            "requests": value(METRIC_REQUESTS),
            "output": value(METRIC_OUTPUT_TOKENS),
            "draft": value(METRIC_DRAFT_TOKENS),
            "accepted": value(METRIC_ACCEPTED_DRAFT_TOKENS),
            "steps": value(METRIC_STEPS),
            "drafting_requests": value(METRIC_ACCEPTANCE_HISTOGRAM + "_count"),
        }

    def settle(self, timeout: float = 20.0) -> tuple[dict, dict]:
        """Ledger and metrics once they agree (requests drain in the background after a cancel)."""
        import time

        deadline = time.monotonic() + timeout
        while True:
            ledger, metrics = self.ledger_totals(), self.metric_totals()
            if ledger == {k: int(v) for k, v in metrics.items()} or time.monotonic() > deadline:
                return ledger, metrics
            time.sleep(0.2)


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    root = tmp_path_factory.mktemp("triton")
    tokenizer = make_tokenizer(root / "tokenizer")
    started = start_servers(lambda variant: Served(root, variant, tokenizer))
    yield started
    # Stop both (in parallel), then check: SIGTERM drains and exits 0 within the exit timeout.
    codes = stop_servers(started)
    for s in started.values():
        log = s.server.log_path.read_text(errors="replace")
        # Drained: no inference was in flight when Triton began unloading. Exit code 1 only when the
        # exit timeout expired while unloading: after a client cancelled a gRPC stream, Triton 2.51's
        # Python backend sometimes keeps the decoupled entry model loaded until that timeout.
        assert "Found 0 model versions that have in-flight inferences" in log, s.server.log_tail()
        assert codes[s.variant] == 0 or (codes[s.variant] == 1 and "Exit timeout expired" in log), (
            f"{s.variant} server exited with {codes[s.variant]}:\n{s.server.log_tail()}"
        )
        assert "Segmentation fault" not in log and "core dumped" not in log
        assert not list(Path("/dev/shm").glob(f"{s.server.shm_prefix}*")), "shared memory regions left behind"


# ---- clients -----------------------------------------------------------------------------------
def prompt(i: int) -> str:
    return " ".join(f"w{3 + (i * 7 + j * 13) % (VOCAB - 3)}" for j in range(5 + i % 4))


async def http_generate(server: TritonServer, body: dict) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as session:
        async with session.post(f"http://{server.http_url}/v2/models/{ENTRY_MODEL}/generate", json=body) as r:
            return r.status, await r.json()


async def http_generate_stream(server: TritonServer, body: dict) -> list[dict]:
    events = []
    async with aiohttp.ClientSession() as session:
        async with session.post(f"http://{server.http_url}/v2/models/{ENTRY_MODEL}/generate_stream", json=body) as r:
            assert r.status == 200, await r.text()
            async for raw in r.content:
                line = raw.decode().strip()
                if line.startswith("data:"):
                    events.append(json.loads(line[5:]))
    return events


def grpc_inputs(text: str, max_tokens: int, *, stream: bool, perf: bool | None = None, **extra) -> list:
    def tensor(name, arr, dtype):
        t = grpcclient.InferInput(name, list(arr.shape), dtype)
        t.set_data_from_numpy(arr)
        return t

    inputs = [
        tensor("text_input", np.array([[text.encode()]], dtype=np.object_), "BYTES"),
        tensor("max_tokens", np.array([[max_tokens]], dtype=np.int32), "INT32"),
        tensor("stream", np.array([[stream]], dtype=bool), "BOOL"),
    ]
    if perf is not None:
        inputs.append(tensor("return_perf_metrics", np.array([[perf]], dtype=bool), "BOOL"))
    for name, value in extra.items():
        if isinstance(value, int):
            inputs.append(tensor(name, np.array([[value]], dtype=np.int32), "INT32"))
    return inputs


async def grpc_stream(server: TritonServer, text: str, max_tokens: int, perf: bool | None = None) -> dict:
    """One streaming request over gRPC: the text deltas and the outputs of the final response."""
    async with grpcaio.InferenceServerClient(server.grpc_url) as client:

        async def requests():
            yield {
                "model_name": ENTRY_MODEL,
                "inputs": grpc_inputs(text, max_tokens, stream=True, perf=perf),
                "request_id": uuid.uuid4().hex,
                "enable_empty_final_response": True,
            }

        deltas, final_outputs, failure = [], {}, None
        async for result, error in client.stream_infer(requests()):
            if error is not None:
                failure = error  # keep reading to the final flag, as a well-behaved stream client does
                continue
            resp = result.get_response()
            names = {o.name for o in resp.outputs}
            if "text_output" in names:
                deltas.append(result.as_numpy("text_output").reshape(-1)[0].decode())
            for name in PERF:
                if name in names:
                    final_outputs[name] = result.as_numpy(name).reshape(-1)[0].item()
            if resp.parameters["triton_final_response"].bool_param:
                break
    if failure is not None:
        raise failure
    return {"deltas": deltas, "text": "".join(deltas), "perf": final_outputs}


# ---- tests ---------------------------------------------------------------------------------------
async def test_http_generate_same_greedy_output_and_perf_only_when_asked(servers):
    red, base = servers["redrafter"].server, servers["base"].server
    body = {"text_input": prompt(1), "max_tokens": 24}
    (s1, r1), (s2, r2) = await asyncio.gather(http_generate(red, body), http_generate(base, body))
    assert s1 == s2 == 200, (r1, r2)
    assert len(r1["text_output"].split()) == 24
    assert r1["text_output"] == r2["text_output"], "ReDrafter greedy output must equal the base engine's"
    assert not set(PERF) & set(r1), "perf outputs returned although the client did not ask"
    _, with_perf = await http_generate(red, {**body, "return_perf_metrics": True})
    assert with_perf["text_output"] == r1["text_output"]
    assert with_perf["total_draft_tokens"] > 0
    assert 0 <= with_perf["total_accepted_draft_tokens"] <= with_perf["total_draft_tokens"]
    assert with_perf["acceptance_rate"] == pytest.approx(
        with_perf["total_accepted_draft_tokens"] / with_perf["total_draft_tokens"], rel=1e-6
    )
    _, base_perf = await http_generate(base, {**body, "return_perf_metrics": True})
    assert base_perf["total_draft_tokens"] == 0 and base_perf["total_accepted_draft_tokens"] == 0


@pytest.mark.parametrize("variant", ["redrafter", "base"])
async def test_grpc_streaming_under_concurrency_matches_ledger(servers, variant):
    served = servers[variant]
    n = 40
    results = await asyncio.gather(
        *(grpc_stream(served.server, prompt(i), 20 + i % 13, perf=(i % 2 == 0)) for i in range(n))
    )
    _, reference = await http_generate(served.server, {"text_input": prompt(3), "max_tokens": 20 + 3 % 13})
    assert results[3]["text"].strip() == reference["text_output"], "streamed deltas must join to the full text"
    for i, res in enumerate(results):
        assert len(res["text"].split()) == 20 + i % 13
        if i % 2 == 0:
            assert set(res["perf"]) == set(PERF)
        else:
            assert res["perf"] == {}, "perf outputs returned although the client did not ask"
    if variant == "redrafter":
        assert any(len(r["deltas"]) < len(r["text"].split()) for r in results), "no step accepted a draft token"
    ledger, metrics = served.settle()
    assert ledger["requests"] > 0
    assert {k: int(v) for k, v in metrics.items()} == ledger
    assert metrics["steps"] == metrics["output"] - metrics["accepted"]
    if variant == "base":
        assert metrics["draft"] == 0 and metrics["steps"] == metrics["output"]


async def test_http_generate_stream_joins_to_generate_output(servers):
    server = servers["redrafter"].server
    body = {"text_input": prompt(7), "max_tokens": 30, "stream": True}
    events = await http_generate_stream(server, {**body, "return_perf_metrics": True})
    text = "".join(e.get("text_output", "") for e in events)
    _, full = await http_generate(server, {"text_input": prompt(7), "max_tokens": 30})
    assert text.strip() == full["text_output"]
    assert "total_draft_tokens" in events[-1]
    assert all("total_draft_tokens" not in e for e in events[:-1])


def test_cancellation_mid_stream_keeps_server_healthy(servers):
    served = servers["redrafter"]
    write_control(served.control, step_ms=10.0)
    try:
        got: queue.Queue = queue.Queue()
        client = grpcclient.InferenceServerClient(served.server.grpc_url)
        client.start_stream(callback=lambda result, error: got.put((result, error)))
        client.async_stream_infer(ENTRY_MODEL, grpc_inputs(prompt(11), 400, stream=True), request_id="cancel-me")
        for _ in range(3):
            result, error = got.get(timeout=30)
            assert error is None, error
        client.stop_stream(cancel_requests=True)
        client.close()
        received = 3 + got.qsize()
        assert received < 100, "the stream was not cut short by the cancellation"
    finally:
        write_control(served.control, step_ms=2.0)
    assert served.server.alive() and served.server.ready()
    ledger, metrics = served.settle(timeout=30)
    assert {k: int(v) for k, v in metrics.items()} == ledger


async def test_inner_model_error_reaches_client_as_error(servers):
    served = servers["redrafter"]
    write_control(served.control, error="injected engine failure")
    try:
        status, body = await http_generate(served.server, {"text_input": prompt(2), "max_tokens": 8})
        assert status >= 400 and "injected engine failure" in json.dumps(body)
        with pytest.raises(InferenceServerException, match="injected engine failure"):
            await grpc_stream(served.server, prompt(2), 8)
    finally:
        write_control(served.control, error=None)
    status, body = await http_generate(served.server, {"text_input": prompt(2), "max_tokens": 8})
    assert status == 200 and len(body["text_output"].split()) == 8


async def test_client_errors_are_reported(servers):
    server = servers["base"].server
    status, body = await http_generate(server, {"text_input": prompt(2), "max_tokens": 4, "beam_width": 2})
    assert status >= 400 and "beam_width" in json.dumps(body)
    status, body = await http_generate(server, {"text_input": "", "max_tokens": 4})
    assert status >= 400 and "prompt" in json.dumps(body)


async def test_acceptance_rate_follows_control_file(servers):
    served = servers["redrafter"]

    async def measured() -> float:
        outs = await asyncio.gather(
            *(
                http_generate(served.server, {"text_input": prompt(i), "max_tokens": 64, "return_perf_metrics": True})
                for i in range(12)
            )
        )
        acc = sum(b["total_accepted_draft_tokens"] for _, b in outs)
        return acc / sum(b["total_draft_tokens"] for _, b in outs)

    try:
        write_control(served.control, acceptance_rate=0.1)
        low = await measured()
        write_control(served.control, acceptance_rate=0.95)
        high = await measured()
    finally:
        write_control(served.control, acceptance_rate=0.7)
    assert low < 0.35 < 0.6 < high, (low, high)


async def test_end_id_stop_words_and_divergence(servers):
    red, base = servers["redrafter"], servers["base"]
    _, ref = await http_generate(base.server, {"text_input": prompt(5), "max_tokens": 12})
    words = ref["text_output"].split()
    end_id = int(words[4][1:])
    if end_id not in {int(w[1:]) for w in words[:4]}:
        _, cut = await http_generate(red.server, {"text_input": prompt(5), "max_tokens": 12, "end_id": end_id})
        assert cut["text_output"].split() == words[:4]
    _, stopped = await http_generate(red.server, {"text_input": prompt(5), "max_tokens": 12, "stop_words": [words[6]]})
    assert stopped["text_output"].split() == words[: words.index(words[6]) + 1]
    write_control(red.control, diverge=True)
    try:
        _, div = await http_generate(red.server, {"text_input": prompt(5), "max_tokens": 12})
    finally:
        write_control(red.control, diverge=False)
    assert div["text_output"] != ref["text_output"]
    assert div["text_output"].split()[0] == words[0]


async def test_fail_on_empty_generation_batch(servers):
    served = servers["base"]
    write_control(served.control, fail_on_empty_batch=True)
    try:
        status, body = await http_generate(served.server, {"text_input": prompt(4), "max_tokens": 8})
    finally:
        write_control(served.control, fail_on_empty_batch=False)
    assert status >= 400 and "empty generation batch" in json.dumps(body)


def test_servers_survived_everything(servers):
    for s in servers.values():
        assert s.server.alive(), s.server.log_tail()
        ledger, metrics = s.settle()
        assert {k: int(v) for k, v in metrics.items()} == ledger
