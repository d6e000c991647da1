"""Real tritonserver on the CPU serving the PyTorch path: the generated repository (entry model in llmapi
mode, model.yaml) with the simulated llmapi engine in place of upstream's.

One module-scoped server holds the generated repository of each method (eagle3, draftModel, mtp,
ngram) and of the base variant, all on one artifact laid out as the prepare Job writes it (checkpoint/,
draft/, tokenizer/, manifest.json): each repository's entry and engine models under the method's name,
its preprocessing and postprocessing shared (one server starts in a fifth of the time of five). The
simulated engines append every request to a ledger each; the metering models' counters must equal it.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import time
from pathlib import Path

import aiohttp
import pytest
import yaml
from google.protobuf import text_format
from triton_servers import start_servers, stop_servers  # noqa: I001 (same dir)
from tritonclient.grpc import model_config_pb2

from engine_jobs.contract import (
    CHECKPOINT_DIR,
    DRAFT_DIR,
    ENGINE_MODEL,
    ENTRY_MODEL,
    MANIFEST_FILE,
    METRIC_ACCEPTED_DRAFT_TOKENS,
    METRIC_DRAFT_TOKENS,
    METRIC_OUTPUT_TOKENS,
    METRIC_REQUESTS,
    METRIC_STEPS,
    METRIC_TRTLLM_REQUESTS,
    OUTPUT_TOKEN_COUNT,
    POSTPROCESSING_MODEL,
    PREPROCESSING_MODEL,
    TOKENIZER_DIR,
    ServingConfig,
    SpeculativeParams,
)
from engine_jobs.model_repo import LLMAPI_CONFIG_FILE, write_model_repository
from redrafter_sim.checkpoint import write_tokenizer
from redrafter_sim.engine import SimEngineSettings, add_load_gauges, install_sim_llmapi_engine, write_control
from redrafter_sim.triton import TritonServer, TritonStartError, build_sim_repository

pytestmark = [pytest.mark.triton, pytest.mark.timeout(240)]

DRAFT_LEN = 3
MAX_CONCURRENCY = 2  # on the draftModel server
PERF = ("acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens")
SERVERS = ("eagle3", "draftModel", "mtp", "ngram", "base")


def make_artifact(root: Path) -> Path:
    """A PyTorch-path artifact: checkpoint/, draft/, tokenizer/ (the sim's tiny tokenizer), manifest.json."""
    for sub in (CHECKPOINT_DIR, DRAFT_DIR):
        (root / sub).mkdir(parents=True, exist_ok=True)
        (root / sub / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    write_tokenizer(root / TOKENIZER_DIR)
    (root / MANIFEST_FILE).write_text('{"backend": "pytorch"}')
    return root


def serving_config(artifact: Path, name: str) -> ServingConfig:
    spec = None
    if name != "base":
        spec = SpeculativeParams(
            method=name, max_draft_len=DRAFT_LEN, max_matching_ngram_size=3 if name == "ngram" else None
        )
    return ServingConfig(
        deployment=f"llm-{name}",
        variant="base" if name == "base" else "redrafter",
        engine_key=f"key-{name}",
        artifact_dir=str(artifact),
        max_batch_size=16,
        backend="pytorch",
        speculative=spec,
        max_concurrency=MAX_CONCURRENCY if name == "draftModel" else None,
    )


def renamed(src: Path, dest: Path, name: str, **params: str) -> None:
    """Copy model ``src`` to ``dest`` as ``name``, with ``params`` replacing its parameters' values."""
    shutil.copytree(src, dest)
    mc = model_config_pb2.ModelConfig()
    text_format.Parse((dest / "config.pbtxt").read_text(encoding="utf-8"), mc)
    mc.name = name
    for key, value in params.items():
        mc.parameters[key].string_value = value
    (dest / "config.pbtxt").write_text(text_format.MessageToString(mc), encoding="utf-8")


class Served:
    """One method's entry and engine models in the shared server, with the engine's control file and ledger."""

    def __init__(self, root: Path, artifact: Path, name: str, repo: Path):
        self.name = name
        self.variant = "base" if name == "base" else "redrafter"
        self.entry = f"{ENTRY_MODEL}_{name}"
        self.control = root / f"{name}-control.json"
        self.ledger = root / f"{name}-ledger.jsonl"
        write_control(self.control, acceptance_rate=0.7, step_ms=2.0)
        sim = SimEngineSettings(variant=self.variant, control_file=str(self.control), ledger_file=str(self.ledger))
        cfg = serving_config(artifact, name)
        built = build_sim_repository(root / f"{name}-repo", cfg, str(artifact / TOKENIZER_DIR), sim)
        for model in (PREPROCESSING_MODEL, POSTPROCESSING_MODEL):
            if not (repo / model).exists():
                shutil.copytree(built / model, repo / model)
        engine = f"{ENGINE_MODEL}_{name}"
        if name == "eagle3":  # as the emulated serving pods run it: with the backend's load gauges
            add_load_gauges(built / ENGINE_MODEL)
        renamed(built / ENGINE_MODEL, repo / engine, engine)
        renamed(built / ENTRY_MODEL, repo / self.entry, self.entry, engine_model=engine)
        self.server: TritonServer | None = None

    def rows(self) -> list[dict]:
        return [json.loads(x) for x in self.ledger.read_text().splitlines()] if self.ledger.exists() else []

    def ledger_totals(self) -> dict[str, int]:
        ok = [r for r in self.rows() if r["error"] is None]
        return {
            "requests": len(ok),
            "output": sum(r["output_tokens"] for r in ok),
            "draft": sum(r["draft_tokens"] for r in ok),
            "accepted": sum(r["accepted_draft_tokens"] for r in ok),
            "steps": sum(r["emitting_steps"] for r in ok),
        }

    def metric_totals(self) -> dict[str, int]:
        text = self.server.scrape()
        labels = f'{{model="llm-{self.name}",variant="{self.variant}"}}'

        def value(name: str) -> int:
            m = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, re.M)
            return int(float(m.group(1))) if m else 0

        return {
            "requests": value(METRIC_REQUESTS),
            "output": value(METRIC_OUTPUT_TOKENS),
            "draft": value(METRIC_DRAFT_TOKENS),
            "accepted": value(METRIC_ACCEPTED_DRAFT_TOKENS),
            "steps": value(METRIC_STEPS),
        }

    def settle(self, timeout: float = 20.0) -> tuple[dict, dict]:
        deadline = time.monotonic() + timeout
        while True:
            ledger, metrics = self.ledger_totals(), self.metric_totals()
            if ledger == metrics or time.monotonic() > deadline:
                return ledger, metrics
            time.sleep(0.2)


class Shared:
    def __init__(self, root: Path, artifact: Path):
        repo = root / "repo"
        repo.mkdir()
        self.methods = {name: Served(root, artifact, name, repo) for name in SERVERS}
        self.server = TritonServer(repo, workdir=root / "work", exit_timeout_secs=3)
        for served in self.methods.values():
            served.server = self.server


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    root = tmp_path_factory.mktemp("llmapi")
    artifact = make_artifact(root / "artifact")
    started = start_servers(lambda _: Shared(root, artifact), variants=("all",))
    yield started["all"].methods
    codes = stop_servers(started)
    log = started["all"].server.log_path.read_text(errors="replace")
    assert codes["all"] == 0 or (codes["all"] == 1 and "Exit timeout expired" in log), log[-3000:]
    assert "Segmentation fault" not in log


async def generate(served: Served, body: dict) -> tuple[int, dict]:
    assert served.server is not None
    async with aiohttp.ClientSession() as session:
        async with session.post(f"http://{served.server.http_url}/v2/models/{served.entry}/generate", json=body) as r:
            return r.status, await r.json()


async def generate_stream(served: Served, body: dict) -> list[dict]:
    assert served.server is not None
    events = []
    async with aiohttp.ClientSession() as session:
        url = f"http://{served.server.http_url}/v2/models/{served.entry}/generate_stream"
        async with session.post(url, json={**body, "stream": True}) as r:
            assert r.status == 200, await r.text()
            async for raw in r.content:
                line = raw.decode().strip()
                if line.startswith("data:"):
                    events.append(json.loads(line[5:]))
    return events


def novel(i: int) -> str:
    return " ".join(f"w{20 + (i * 37 + j * 131) % 900}" for j in range(8))


REPETITIVE = " ".join(f"w{40 + j % 7}" for j in range(28))


# ---- tests ---------------------------------------------------------------------------------------
async def test_every_method_serves_the_base_greedy_text_with_perf_outputs(servers):
    body = {"text_input": novel(1), "max_tokens": 16, "return_perf_metrics": True}
    results = await asyncio.gather(*(generate(servers[n], body) for n in SERVERS))
    texts = {}
    for name, (status, out) in zip(SERVERS, results, strict=True):
        assert status == 200, (name, out)
        assert set(PERF) | {OUTPUT_TOKEN_COUNT, "text_output"} <= set(out), (name, out)
        assert out[OUTPUT_TOKEN_COUNT] == len(out["text_output"].split()) == 16
        texts[name] = out["text_output"]
        if name == "base":
            assert out["total_draft_tokens"] == 0
        elif name != "ngram":
            assert out["total_draft_tokens"] > 0
            assert out["acceptance_rate"] == pytest.approx(
                out["total_accepted_draft_tokens"] / out["total_draft_tokens"], rel=1e-5
            )
    assert len(set(texts.values())) == 1, f"speculative greedy output differs from the base's: {texts}"
    # streamed deltas join to the same text; the perf outputs come once, with the final response
    events = await generate_stream(servers["eagle3"], body)
    assert "".join(e.get("text_output", "") for e in events).strip() == texts["base"]
    assert "total_draft_tokens" in events[-1] and all("total_draft_tokens" not in e for e in events[:-1])
    _, plain = await generate(servers["mtp"], {"text_input": novel(1), "max_tokens": 16})
    assert plain["text_output"] == texts["base"] and not set(PERF) & set(plain)


@pytest.mark.parametrize("name", ["eagle3", "draftModel", "mtp"])
async def test_chain_methods_accept_a_prefix_per_step(servers, name):
    served = servers[name]
    before = len(served.rows())
    for group in range(4):  # two at a time: within the draftModel server's max_concurrency; seeded
        await asyncio.gather(
            *(
                generate(served, {"text_input": novel(10 + 2 * group + k), "max_tokens": 64, "seed": 2 * group + k})
                for k in range(2)
            )
        )
    rows = served.rows()[before:]
    drafting_steps = sum(r["draft_tokens"] for r in rows) / DRAFT_LEN
    per_step = sum(r["accepted_draft_tokens"] for r in rows) / drafting_steps
    expected = 0.7 + 0.7**2 + 0.7**3
    assert per_step == pytest.approx(expected, rel=0.2), (per_step, expected)
    assert {r["method"] for r in rows} == {name}
    ledger, metrics = served.settle()
    assert metrics == ledger
    assert metrics["output"] / metrics["steps"] > 1.8
    if name == "eagle3":
        assert re.search(
            rf'^{METRIC_TRTLLM_REQUESTS}{{.*request_type="max".*}} 16$', served.server.scrape(), re.M
        )  # tokens per step ~ 1 + accepted


async def test_ngram_pays_on_repetitive_prompts_only(servers):
    ngram, base = servers["ngram"], servers["base"]
    rep_body = {"text_input": REPETITIVE, "max_tokens": 32, "return_perf_metrics": True}
    (_, rep), (_, rep_base) = await asyncio.gather(generate(ngram, rep_body), generate(base, rep_body))
    assert rep["text_output"] == rep_base["text_output"]
    assert rep["text_output"].split()[:7] == REPETITIVE.split()[:7]  # the greedy model continues the pattern
    assert rep["total_draft_tokens"] >= 20 and rep["acceptance_rate"] > 0.9, rep
    outs = await asyncio.gather(
        *(generate(ngram, {"text_input": novel(i), "max_tokens": 32, "return_perf_metrics": True}) for i in range(4))
    )
    drafted = sum(o["total_draft_tokens"] for _, o in outs)
    accepted = sum(o["total_accepted_draft_tokens"] for _, o in outs)
    assert accepted <= 0.1 * max(drafted, 1), (accepted, drafted)
    ledger, metrics = servers["ngram"].settle()
    assert metrics == ledger


async def test_max_concurrency_stops_drafting_in_a_larger_batch(servers):
    served = servers["draftModel"]
    _, solo = await generate(served, {"text_input": novel(30), "max_tokens": 24, "return_perf_metrics": True})
    assert solo["total_draft_tokens"] > 0
    write_control(served.control, step_ms=20.0)  # slow steps: the eight requests share every step
    try:
        outs = await asyncio.gather(
            *(
                generate(served, {"text_input": novel(40 + i), "max_tokens": 24, "return_perf_metrics": True})
                for i in range(8)
            )
        )
    finally:
        write_control(served.control, step_ms=2.0)
    drafted = sum(o["total_draft_tokens"] for _, o in outs)
    assert drafted <= 0.2 * 8 * solo["total_draft_tokens"], (drafted, solo["total_draft_tokens"])
    assert all(len(o["text_output"].split()) == 24 for _, o in outs)


async def test_engine_errors_and_client_errors_reach_the_client(servers):
    served = servers["eagle3"]
    write_control(served.control, error="injected engine failure")
    try:
        status, body = await generate(served, {"text_input": novel(2), "max_tokens": 8})
    finally:
        write_control(served.control, error=None)
    assert status >= 400 and "injected engine failure" in json.dumps(body)
    for bad, word in (
        ({"text_input": novel(2), "max_tokens": 4, "beam_width": 2}, "beam_width"),
        ({"text_input": "  ", "max_tokens": 4}, "prompt"),
        ({"text_input": novel(2), "max_tokens": 4, "min_tokens": 2}, "min_tokens"),
    ):
        status, body = await generate(served, bad)
        assert status >= 400 and word in json.dumps(body), body
    status, body = await generate(served, {"text_input": novel(2), "max_tokens": 8})
    assert status == 200 and len(body["text_output"].split()) == 8


def test_model_yaml_upstream_refuses_does_not_load(tmp_path: Path):
    """Two engine models in one repository, each with a model.yaml upstream refuses: neither loads."""
    artifact = make_artifact(tmp_path / "artifact")
    repo = tmp_path / "repo"
    write_model_repository(repo, serving_config(artifact, "eagle3"), "/nonexistent", str(artifact / TOKENIZER_DIR))
    for model in list(repo.iterdir()):
        if model.name != ENGINE_MODEL:
            shutil.rmtree(model)
    install_sim_llmapi_engine(repo / ENGINE_MODEL, SimEngineSettings())
    second = repo / "tensorrt_llm_no_draft"
    shutil.copytree(repo / ENGINE_MODEL, second)
    config = second / "config.pbtxt"
    config.write_text(config.read_text().replace(f'name: "{ENGINE_MODEL}"', f'name: "{second.name}"'))

    def edit(model_dir: Path, change) -> None:
        path = model_dir / "1" / LLMAPI_CONFIG_FILE
        doc = yaml.safe_load(path.read_text())
        change(doc)
        path.write_text(yaml.safe_dump(doc))

    edit(repo / ENGINE_MODEL, lambda d: d.update(max_batch_sise=8))
    edit(second, lambda d: d["speculative_config"].pop("speculative_model_dir"))
    server = TritonServer(repo, workdir=tmp_path / "work")
    with pytest.raises(TritonStartError):
        server.start()
    server.stop()
    log = server.log_path.read_text(errors="replace")
    assert "max_batch_sise: Extra inputs are not permitted" in log, server.log_tail()
    assert "Draft model must be provided for EAGLE" in log, server.log_tail()
