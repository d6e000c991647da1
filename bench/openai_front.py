"""What the OpenAI front costs over Triton's gRPC API, and what it holds in memory under load.

One CPU tritonserver serves the simulated ReDrafter engine (as tests/integration/test_openai_api.py runs it);
the front runs as the pod runs it (``python -m engine_jobs openai``) in its own process. Prints:

- requests/s and p50/p99 latency of streaming requests (16 tokens each) at 1, 16 and 64 concurrent streams,
  directly over gRPC (the front's own bridge code, in this process) and through the front (raw HTTP/SSE), and
  the latency the front adds (p50/p99 difference);
- the front's RSS idle and with its back-pressure limits full (max_in_flight running + max_queued waiting),
  per request, and that one more request gets 429;
- the front's peak RSS (VmHWM) with 200 slow clients: streams whose readers never read.

Figures only; nothing is asserted. ``--quick`` runs fewer requests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import aiohttp
import tritonclient.grpc.aio as grpcaio

from engine_jobs.contract import ServingConfig
from engine_jobs.triton_bridge import Outcome, Sampling, generate
from redrafter_sim.checkpoint import write_tokenizer
from redrafter_sim.engine import SimEngineSettings, write_control
from redrafter_sim.triton import TritonServer, build_sim_repository, free_ports

MODEL = "bench/chat"
VOCAB = 1000
MAX_TOKENS = 16
MAX_BATCH = 32  # the front's limits follow: max_in_flight 64, max_queued 256


def prompt(i: int) -> str:
    return " ".join(f"w{3 + (i * 11 + j * 17) % (VOCAB - 3)}" for j in range(8))


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return -1


class Stack:
    def __init__(self, root: Path):
        tokenizer = write_tokenizer(root / "tokenizer", VOCAB)
        self.control = root / "control.json"
        write_control(self.control, acceptance_rate=0.7, step_ms=2.0)
        self.cfg = ServingConfig(
            deployment="bench",
            variant="redrafter",
            engine_key="k",
            artifact_dir=str(root / "artifact"),
            max_batch_size=MAX_BATCH,
            draft_len_per_beam=4,
            num_beams=2,
            model_name=MODEL,
            max_input_len=64,
            max_seq_len=1024,
        )
        sim = SimEngineSettings(
            variant="redrafter",
            draft_len_per_beam=4,
            num_beams=2,
            vocab_size=VOCAB,
            control_file=str(self.control),
            ledger_file=str(root / "ledger.jsonl"),
        )
        repo = build_sim_repository(root / "repo", self.cfg, str(tokenizer), sim)
        self.triton = TritonServer(repo, workdir=root / "work", exit_timeout_secs=3)
        self.triton.start(timeout=120)
        config = root / "serving.json"
        config.write_text(self.cfg.model_dump_json())
        self.port = free_ports(count=1)[0]
        self.log = open(root / "front.log", "wb")
        argv = [sys.executable, "-m", "engine_jobs", "openai", "--config", str(config), "--host", "127.0.0.1"]
        argv += ["--port", str(self.port), "--grpc-url", self.triton.grpc_url, "--tokenizer-dir", str(tokenizer)]
        self.front = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.url + "/health/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("the front did not become ready")

    def close(self) -> None:
        if self.front.poll() is None:
            self.front.send_signal(signal.SIGTERM)
            try:
                self.front.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.front.pid, signal.SIGKILL)
        self.log.close()
        self.triton.stop()


async def direct(stack: Stack, concurrency: int, requests: int) -> list[float]:
    async with grpcaio.InferenceServerClient(stack.triton.grpc_url) as client:
        return await _run(concurrency, requests, lambda i: _direct_one(client, i))


async def _direct_one(client, i: int) -> None:
    s = Sampling(max_tokens=MAX_TOKENS, min_tokens=MAX_TOKENS, temperature=0)
    async for _ in generate(client, prompt(i), s, Outcome(), len):
        pass


async def through_front(stack: Stack, concurrency: int, requests: int) -> list[float]:
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=120)) as session:
        return await _run(concurrency, requests, lambda i: _front_one(session, stack.url, i))


async def _front_one(session: aiohttp.ClientSession, url: str, i: int) -> None:
    body = {"model": MODEL, "prompt": prompt(i), "max_tokens": MAX_TOKENS, "min_tokens": MAX_TOKENS}
    async with session.post(url + "/v1/completions", json={**body, "temperature": 0, "stream": True}) as r:
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {await r.text()}")
        async for _ in r.content:
            pass


async def _run(concurrency: int, requests: int, one) -> list[float]:
    latencies: list[float] = []
    next_i = 0

    async def worker() -> None:
        nonlocal next_i
        while next_i < requests:
            i, next_i = next_i, next_i + 1
            t = time.perf_counter()
            await one(i)
            latencies.append(time.perf_counter() - t)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies


async def saturate(stack: Stack, clients: int, extra: bool) -> dict:
    """``clients`` streams that are never read, held open while RSS is read; with ``extra`` one more
    request checks the back-pressure answer."""
    write_control(stack.control, acceptance_rate=0.7, step_ms=200.0)  # long generations: they stay in flight
    body = json.dumps(
        {"model": MODEL, "prompt": prompt(1), "max_tokens": 500, "min_tokens": 500, "stream": True}
    ).encode()
    request = (
        f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    socks = []
    idle = rss_kib(stack.front.pid)
    try:
        for _ in range(clients):
            s = socket.create_connection(("127.0.0.1", stack.port))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.sendall(request)
            socks.append(s)
        await asyncio.sleep(5)  # let them be admitted or queued and stream a little
        out = {"idle_kib": idle, "loaded_kib": rss_kib(stack.front.pid), "peak_kib": rss_kib(stack.front.pid, "VmHWM")}
        metrics = urllib.request.urlopen(stack.url + "/metrics", timeout=5).read().decode()
        out["metrics"] = {
            line.split()[0]: float(line.split()[1])
            for line in metrics.splitlines()
            if line.startswith("redrafter_openai_requests_") and "rejected" not in line
        }
        if extra:
            req = urllib.request.Request(stack.url + "/v1/completions", data=body, method="POST")
            try:
                urllib.request.urlopen(req, timeout=10)
                out["extra"] = "200"
            except urllib.error.HTTPError as exc:
                out["extra"] = f"{exc.code} Retry-After={exc.headers.get('Retry-After')}"
        return out
    finally:
        for s in socks:
            s.close()
        write_control(stack.control, acceptance_rate=0.7, step_ms=2.0)


async def main_async(stack: Stack, quick: bool) -> None:
    print(f"streaming /v1/completions, {MAX_TOKENS} tokens each, simulated ReDrafter engine on CPU Triton")
    print(f"{'streams':>8} {'path':>7} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'added p50':>10} {'added p99':>10}")
    for c in (1, 16, 64):
        n = {1: 10 if quick else 30, 16: 32 if quick else 96, 64: 64 if quick else 256}[c]
        await direct(stack, c, min(n, c * 2))  # warm-up
        t = time.perf_counter()
        d = await direct(stack, c, n)
        d_rps = n / (time.perf_counter() - t)
        t = time.perf_counter()
        f = await through_front(stack, c, n)
        f_rps = n / (time.perf_counter() - t)
        d50, d99, f50, f99 = pct(d, 0.5), pct(d, 0.99), pct(f, 0.5), pct(f, 0.99)
        print(f"{c:>8} {'grpc':>7} {d_rps:>8.1f} {d50 * 1e3:>8.1f} {d99 * 1e3:>8.1f}")
        print(
            f"{c:>8} {'front':>7} {f_rps:>8.1f} {f50 * 1e3:>8.1f} {f99 * 1e3:>8.1f} "
            f"{(f50 - d50) * 1e3:>+10.1f} {(f99 - d99) * 1e3:>+10.1f}"
        )
    limit = 2 * MAX_BATCH + 4 * 2 * MAX_BATCH
    full = await saturate(stack, limit, extra=True)
    per = (full["loaded_kib"] - full["idle_kib"]) / limit
    print(
        f"back-pressure limits full ({2 * MAX_BATCH} in flight + {4 * 2 * MAX_BATCH} queued): front RSS "
        f"{full['idle_kib'] / 1024:.1f} MiB idle -> {full['loaded_kib'] / 1024:.1f} MiB "
        f"({per:.1f} KiB per request); gauges {full['metrics']}; one more request: {full['extra']}"
    )
    slow = await saturate(stack, 200, extra=False)
    print(f"200 slow clients (streams never read): front peak RSS (VmHWM) {slow['peak_kib'] / 1024:.1f} MiB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer requests per level")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-openai-") as tmp:
        stack = Stack(Path(tmp))
        try:
            asyncio.run(main_async(stack, args.quick))
        finally:
            stack.close()


if __name__ == "__main__":
    main()
