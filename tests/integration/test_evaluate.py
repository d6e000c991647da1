"""Evaluation and pre-promotion validation against real tritonservers on the CPU (simulated engine).

Two servers (ReDrafter and base variants of the generated repository, the simulated engine in place
of tensorrt_llm) start once for the module. The simulated engine's step latency is
``step_ms * (1 + load_factor * (n - 1))`` for a batch of ``n``, plus ``draft_ms_per_token`` per drafted
token of every generating request for ReDrafter, which emits ``1 + acceptance * draft_len`` tokens a
step: ReDrafter wins at low concurrency and loses at high concurrency, crossing over where
:func:`sim_crossover` puts it. Figures from these tests come from the simulator, not from a GPU.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from triton_servers import restart_after_grpc_abort, start_servers, stop_servers  # noqa: I001 (same dir)

from engine_jobs.contract import ServingConfig
from redrafter_operator.cli import main
from redrafter_operator.evaluate import outcome as oc
from redrafter_operator.evaluate.loadgen import Bounds, LoadGenerator
from redrafter_operator.evaluate.prompts import DEFAULT_PROMPTS
from redrafter_operator.evaluate.report import FIGURES, REPORT_KIND
from redrafter_operator.evaluate.stream import RequestOptions
from redrafter_sim.checkpoint import write_tokenizer
from redrafter_sim.engine import SimControl, SimEngineSettings, write_control
from redrafter_sim.triton import TritonServer, build_sim_repository, free_ports

pytestmark = [pytest.mark.triton, pytest.mark.timeout(240)]

MAX_BATCH = 8
ACCEPTANCE = 0.7
SIM = dict(
    step_ms=25.0,
    load_factor=0.05,
    draft_ms_per_token=3.25,
    num_beams=2,
    draft_len_per_beam=4,
    acceptance_rate=ACCEPTANCE,
)
LABEL = "simulated engine on CPU (not a GPU measurement)"


def sim_crossover(
    step_ms: float,
    load_factor: float,
    draft_ms_per_token: float,
    num_beams: int,
    draft_len_per_beam: int,
    acceptance_rate: float,
) -> float:
    """Batch size where the simulated ReDrafter's throughput equals base's (all requests generating).

    base: L(n) = s (1 + f (n - 1)) per 1 token; ReDrafter: L(n) + d B D n per (1 + a D) tokens.
    Equal when a D L(n) = d B D n, i.e. n = a s (1 - f) / (d B - a s f).
    """
    s, f, d, b, a = step_ms, load_factor, draft_ms_per_token, num_beams, acceptance_rate
    return a * s * (1 - f) / (d * b - a * s * f)


EXPECTED_CROSSOVER = sim_crossover(**SIM)  # ≈ 2.96 with the settings above


class Served:
    def __init__(self, root: Path, variant: str, tokenizer: Path):
        self.variant = variant
        self.control = root / f"{variant}-control.json"
        self.set()
        redrafter = variant == "redrafter"
        cfg = ServingConfig(
            deployment="llm",
            variant=variant,
            engine_key=f"key-{variant}",
            artifact_dir="/cache/x",
            max_batch_size=MAX_BATCH,
            draft_len_per_beam=SIM["draft_len_per_beam"] if redrafter else 0,
            num_beams=SIM["num_beams"] if redrafter else 0,
        )
        sim = SimEngineSettings(variant=variant, control_file=str(self.control), **SIM)
        repo = build_sim_repository(root / f"{variant}-repo", cfg, str(tokenizer), sim)
        self.server = TritonServer(repo, workdir=root / f"{variant}-work")

    def set(self, **controls) -> None:
        """Replace the run-time controls (a control file overrides every start-up value, step_ms too)."""
        write_control(self.control, SimControl(acceptance_rate=ACCEPTANCE, step_ms=SIM["step_ms"], **controls))


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    root = tmp_path_factory.mktemp("evaluate")
    tokenizer = write_tokenizer(root / "tokenizer")
    started = start_servers(lambda variant: Served(root, variant, tokenizer))
    yield started
    stop_servers(started)


@pytest.fixture
def healthy(servers):
    """Both engines healthy before and after the test (controls are reset even when it fails; a server the
    previous test's cancelled streams crashed in tritonserver's gRPC frontend runs again)."""
    restart_after_grpc_abort(servers)
    for s in servers.values():
        s.set()
    yield servers
    for s in servers.values():
        s.set()


def validate_argv(servers, log: Path, *extra: str) -> list[str]:
    return [
        "evaluate",
        "validate",
        "--redrafter",
        servers["redrafter"].server.grpc_url,
        "--base",
        servers["base"].server.grpc_url,
        "--max-tokens",
        "16",
        "--long-max-tokens",
        "48",
        "--batch-size",
        "4",
        "--single-requests",
        "2",
        "--max-input-len",
        "64",
        "--max-seq-len",
        "96",
        "--ready-timeout",
        "10",
        "--termination-log",
        str(log),
        "--out",
        str(log.with_suffix(".json")),
        *extra,
    ]


def test_sweep_report_and_crossover(healthy, tmp_path, capsys):
    out = tmp_path / "report"
    rc = main(
        [
            "evaluate",
            "--redrafter",
            healthy["redrafter"].server.grpc_url,
            "--base",
            healthy["base"].server.grpc_url,
            "--concurrency",
            "1,2,4,8",
            "--max-tokens",
            "24",
            "--requests-per-worker",
            "2",
            "--label",
            LABEL,
            "--out",
            str(out),
        ]
    )
    assert rc == 0, capsys.readouterr().err
    report = json.loads((out / "report.json").read_text())
    assert report["kind"] == REPORT_KIND and report["label"] == LABEL
    assert report["config"]["token_counting"] == "words" and report["config"]["concurrencies"] == [1, 2, 4, 8]
    for variant in ("redrafter", "base"):
        levels = report["levels"][variant]
        assert [lv["concurrency"] for lv in levels] == [1, 2, 4, 8]
        for lv in levels:
            assert lv["errors"] == 0 and lv["requests"] == 2 * lv["concurrency"]
            assert lv["output_tokens"] == 24 * lv["requests"]  # fixed output length
            for key in ("ttft", "itl", "e2e", "generation"):
                assert 0 < lv[key]["p50"] <= lv[key]["p99"]
        assert all((lv["acceptance"] is None) == (variant == "base") for lv in levels)
    # acceptance as the simulator draws it (Binomial(4, 0.7) per step)
    assert 0.55 < report["acceptance"]["pooled"] < 0.85
    assert sum(b["count"] for b in report["acceptance"]["histogram"]) == 2 * (1 + 2 + 4 + 8)
    # ReDrafter returns several tokens per chunk: its per-token latency at batch 1 is well below base's
    r1, b1 = report["levels"]["redrafter"][0], report["levels"]["base"][0]
    assert r1["itl"]["p50"] < 0.75 * b1["itl"]["p50"]
    speedup = {p["concurrency"]: p["speedup"] for p in report["speedup"]}
    assert speedup[1] > 1.3 and speedup[8] < 0.9
    # the crossover lies between the two sweep points that bracket the simulator's analytic one
    assert 2 < EXPECTED_CROSSOVER < 4
    cross = report["crossover"]
    assert cross["status"] == "crossed", report["speedup"]
    assert 2 < cross["concurrency"] < 4, (cross, EXPECTED_CROSSOVER)
    for name in FIGURES:
        assert (out / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == len(FIGURES) and LABEL in page
    assert LABEL in (out / "report.md").read_text()


def test_validation_passes_on_a_healthy_pair_and_measures_crossover(healthy, tmp_path):
    log = tmp_path / "termination-log"
    # 1 and 8 bracket the analytic crossover (~2.96) by a wide margin (speedup ~1.9 and ~0.5), so CPU
    # noise on a busy box cannot move the measured crossover out of the bracket
    rc = main(validate_argv(healthy, log, "--sweep-concurrency", "1,8"))
    verdict = oc.parse_termination_message(log.read_text())
    assert rc == 0, log.read_text()
    assert verdict.passed
    assert "greedy outputs identical" in verdict.message
    assert verdict.crossover_concurrency is not None, verdict.message
    assert 1 < verdict.crossover_concurrency < 8
    details = json.loads(log.with_suffix(".json").read_text())
    assert details["scenarios"] == ["single", "context_only", "generation_only", "mixed", "max_length"]
    assert details["requests"] == {"redrafter": 17, "base": 17} and not details["divergences"]


def test_validation_fails_when_the_redrafter_engine_diverges(healthy, tmp_path):
    healthy["redrafter"].set(diverge=True)
    log = tmp_path / "termination-log"
    assert main(validate_argv(healthy, log)) == 1
    line = log.read_text().strip()
    assert line.startswith("Diverged: 17 of 17 greedy outputs differ between redrafter and base")
    assert "first: single#0 prompt 'Explain speculative decoding" in line
    assert "(token 1)" in line  # the simulator diverges from the second token on
    details = json.loads(log.with_suffix(".json").read_text())
    assert {d["token"] for d in details["divergences"]} == {1}


def test_validation_fails_on_an_empty_generation_batch(healthy, tmp_path):
    healthy["redrafter"].set(fail_on_empty_batch=True)
    log = tmp_path / "termination-log"
    assert main(validate_argv(healthy, log)) == 1
    verdict = oc.parse_termination_message(log.read_text())
    assert verdict.reason == oc.REQUEST_FAILED
    assert verdict.message.startswith("redrafter engine failed request single#0")
    assert "empty generation batch" in verdict.message
    failed = json.loads(log.with_suffix(".json").read_text())["failures"]
    assert failed and {f["variant"] for f in failed} == {"redrafter"}


def test_validation_reports_an_unavailable_endpoint(healthy, tmp_path):
    (port,) = free_ports(count=1)
    log = tmp_path / "termination-log"
    argv = validate_argv(healthy, log)
    argv[argv.index("--base") + 1] = f"127.0.0.1:{port}"
    argv[argv.index("--ready-timeout") + 1] = "1"
    assert main(argv) == 3
    assert log.read_text().startswith(f"EndpointUnavailable: base endpoint 127.0.0.1:{port} not ready after 1s")


async def test_load_generator_follows_concurrency_changes_and_stops(healthy):
    gen = LoadGenerator(
        healthy["base"].server.grpc_url,
        DEFAULT_PROMPTS,
        RequestOptions(max_tokens=12),
        concurrency=1,
        bounds=Bounds(duration_s=30),
        keep_results=4,
    )
    task = asyncio.create_task(gen.run())

    async def until(cond, timeout=10.0):
        deadline = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < deadline, gen.snapshot()
            await asyncio.sleep(0.02)

    await until(lambda: gen.snapshot()["finished"] >= 2)
    assert gen.snapshot()["in_flight"] <= 1
    gen.set_concurrency(4)
    await until(lambda: gen.snapshot()["in_flight"] == 4)
    gen.set_concurrency(2)
    await until(lambda: gen.snapshot()["in_flight"] <= 2)
    snap = gen.snapshot()
    assert snap["concurrency"] == 2 and snap["recent_tokens_per_s"] > 0 and snap["errors"] == 0
    gen.stop()
    results = await asyncio.wait_for(task, 10)
    assert results and all(r.ok and r.output_tokens == 12 for r in results)
    assert len(results) <= 4 < gen.snapshot()["finished"]  # bounded memory, exact totals

    # a long run stopped with cancel_in_flight ends at once, without waiting for its requests
    long_run = LoadGenerator(
        healthy["base"].server.grpc_url, DEFAULT_PROMPTS, RequestOptions(max_tokens=120), concurrency=2
    )
    task = asyncio.create_task(long_run.run())
    await asyncio.sleep(0.5)
    t0 = time.monotonic()
    long_run.stop(cancel_in_flight=True)
    await asyncio.wait_for(task, 5)
    assert time.monotonic() - t0 < 2 and long_run.results == []
