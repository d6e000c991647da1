"""``python -m engine_jobs build`` end to end, as the Job runs it, with TensorRT-LLM test doubles.

The stand-in converters and ``trtllm-build`` (sim/redrafter_sim/toolchain) parse argv with TensorRT-LLM's real
flag sets, check the inputs the real tools read and write outputs of the same shape. Model sources
are pvc:// directories and a pre-populated Hugging Face cache used with HF_HUB_OFFLINE=1.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from engine_jobs.contract import MANIFEST_FILE, MODEL_REPO_DIR, BuildResult
from redrafter_sim.checkpoint import write_drafter

REPO = Path(__file__).resolve().parents[2]
FAKES = REPO / "sim" / "redrafter_sim" / "toolchain"
FIXTURES = REPO / "tests" / "fixtures" / "build_specs"
HF_COMMIT = "0123456789abcdef0123456789abcdef01234567"
HF_TOKEN = "hf_TESTtokenValueThatMustNeverAppear"

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64}
QWEN2 = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 64}
DRAFTER = {"hidden_size": 64, "exit_dim": 128, "num_draft_layers": 2, "rnn": True}


def write_model(d: Path, config: dict, weights: str = "model.safetensors", tokenizer: bool = True) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(config))
    (d / weights).write_bytes(b"\0" * 20000)
    if tokenizer:
        (d / "tokenizer.json").write_text('{"model": {"type": "BPE"}}')
        (d / "tokenizer_config.json").write_text('{"eos_token": "</s>"}')
    return d


class Env:
    """A scratch cache volume, mounted sources, a Hugging Face cache and the Job's environment."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.cache = root / "cache"
        self.sources = root / "sources"
        self.hf_home = root / "hf-home"
        self.termination = root / "termination-log"
        self.tool_log = root / "tools.jsonl"
        self.secrets = root / "secrets"
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("REDRAFTER_", "FAKE_TRTLLM_", "HF_"))},
            "PATH": f"{FAKES / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
            "REDRAFTER_TRTLLM_EXAMPLES": str(FAKES / "examples"),
            "REDRAFTER_PYTHON": sys.executable,
            "REDRAFTER_SOURCES_MOUNT": str(self.sources),
            "REDRAFTER_TERMINATION_LOG": str(self.termination),
            "REDRAFTER_NVIDIA_SMI": "nvidia-smi-absent-in-tests",
            "REDRAFTER_LOCK_POLL_SECONDS": "0.1",
            "REDRAFTER_LOCK_HEARTBEAT_SECONDS": "0.2",
            "FAKE_TRTLLM_LOG": str(self.tool_log),
            "HF_HOME": str(self.hf_home),
            "HF_HUB_OFFLINE": "1",
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "POD_NAME": "build-pod-0",
        }

    def spec(self, fixture: str, **changes) -> Path:
        data = json.loads((FIXTURES / f"{fixture}.json").read_text())
        data.update(changes, cache_dir=str(self.cache))
        path = self.root / f"{fixture}-{len(list(self.root.glob('*.spec.json')))}.spec.json"
        path.write_text(json.dumps(data))
        return path

    def hf_repo(self, repo: str, config: dict) -> None:
        """A Hugging Face cache entry as snapshot_download leaves it (refs/main -> snapshot)."""
        base = self.hf_home / "hub" / f"models--{repo.replace('/', '--')}"
        write_model(base / "snapshots" / HF_COMMIT, config)
        (base / "refs").mkdir(parents=True, exist_ok=True)
        (base / "refs" / "main").write_text(HF_COMMIT)

    def secret(self, name: str, **keys: str) -> str:
        d = self.secrets / name
        d.mkdir(parents=True, exist_ok=True)
        for key, value in keys.items():
            (d / key).write_text(value)
        return str(d)

    def build_argv(self, spec: Path) -> list[str]:
        return [sys.executable, "-m", "engine_jobs", "build", "--spec", str(spec)]

    def run(self, spec: Path, **extra_env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.build_argv(spec), cwd=REPO, env={**self.env, **extra_env}, capture_output=True, text=True, timeout=120
        )

    def start(self, spec: Path, **extra_env: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.build_argv(spec),
            cwd=REPO,
            env={**self.env, **extra_env},
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )

    def tool_calls(self) -> list[dict]:
        if not self.tool_log.exists():
            return []
        return [json.loads(line) for line in self.tool_log.read_text().splitlines()]

    def leftovers(self) -> list[str]:
        return sorted(p.name for p in self.cache.iterdir() if p.name.startswith(".tmp-") or p.name.endswith(".lock"))


@pytest.fixture
def env(tmp_path: Path) -> Env:
    e = Env(tmp_path)
    write_model(e.sources / "models" / "llama3-8b", LLAMA)
    write_model(e.sources / "models" / "qwen25-7b", QWEN2)
    write_drafter(e.sources / "drafters" / "llama3-8b-redrafter")  # the converter's tensor names and shapes
    write_model(e.sources / "drafters" / "qwen-redrafter", DRAFTER, weights="model.pt", tokenizer=False)
    return e


def pvc(path: str) -> dict:
    return {"uri": f"pvc://{path}"}


def llama_pvc(**changes) -> dict:
    return {
        "base": pvc("models/llama3-8b"),
        "tokenizer": pvc("models/llama3-8b"),
        "drafter": pvc("drafters/llama3-8b-redrafter"),
        **changes,
    }


def assert_published(env: Env, spec_path: Path, tp: int) -> dict:
    key = json.loads(spec_path.read_text())["key"]
    artifact = env.cache / key
    manifest = json.loads((artifact / MANIFEST_FILE).read_text())
    assert manifest["key"] == key
    assert sorted(p.name for p in (artifact / "engine").iterdir()) == sorted(
        ["config.json", *(f"rank{r}.engine" for r in range(tp))]
    )
    assert (artifact / "tokenizer" / "tokenizer.json").is_file()
    assert not (artifact / "work").exists(), "intermediate checkpoints must not be published"
    assert env.leftovers() == [], "no temp dir or lock may survive a finished build"
    pbtxts = sorted((artifact / MODEL_REPO_DIR).glob("*/config.pbtxt"))
    assert len(pbtxts) >= 4
    configs = {}
    for pbtxt in pbtxts:
        config = text_format.Parse(pbtxt.read_text(), model_config_pb2.ModelConfig())
        assert config.name == pbtxt.parent.name
        configs[config.name] = config
    engine = configs["tensorrt_llm"].parameters
    assert engine["engine_dir"].string_value == str(artifact / "engine"), "must point at the published path"
    assert (engine["decoding_mode"].string_value == "redrafter") == (manifest["variant"] == "redrafter")
    return manifest


# ---- every variant / architecture / precision / TP ----------------------------------------------

CASES = {
    "llama-bf16-tp1-redrafter": (
        "llama3-8b-redrafter",
        llama_pvc(),
        1,
        ["llama/convert_checkpoint.py", "redrafter/convert_checkpoint.py", "trtllm-build"],
    ),
    "llama-bf16-tp1-base": (
        "llama3-8b-base",
        llama_pvc(drafter=None),
        1,
        ["llama/convert_checkpoint.py", "trtllm-build"],
    ),
    "qwen-fp8-tp2-redrafter": (
        "qwen2.5-7b-fp8-tp2-redrafter",
        {
            "base": pvc("models/qwen25-7b"),
            "tokenizer": pvc("models/qwen25-7b"),
            "drafter": pvc("drafters/qwen-redrafter"),
            "architecture": "auto",
        },
        2,
        ["quantization/quantize.py", "redrafter/convert_checkpoint.py", "trtllm-build"],
    ),
    "qwen-fp8-tp2-base": (
        "qwen2.5-7b-fp8-tp2-base",
        {"base": pvc("models/qwen25-7b"), "tokenizer": pvc("models/qwen25-7b")},
        2,
        ["quantization/quantize.py", "trtllm-build"],
    ),
    "llama-tp8-redrafter": (
        "llama3-70b-tp8-redrafter",
        llama_pvc(),
        8,
        ["llama/convert_checkpoint.py", "redrafter/convert_checkpoint.py", "trtllm-build"],
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_build_publishes_a_complete_artifact(env: Env, case: str):
    fixture, changes, tp, tools = CASES[case]
    spec_path = env.spec(fixture, **changes)
    result = env.run(spec_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert [c["tool"] for c in env.tool_calls()] == tools
    manifest = assert_published(env, spec_path, tp)
    assert [s["name"] for s in manifest["steps"]][-1] == "model-repository"
    assert manifest["tensorrt_llm_version"] == "unknown"  # not installed here; recorded honestly
    assert manifest["gpu"]["product"] == "unknown"
    assert manifest["sizes"]["engine_bytes"] > 0 and manifest["inputs"]["tensorParallel"] == tp
    assert all(s["seconds"] >= 0 for s in manifest["steps"])
    assert "step 1/" in result.stdout and "published" in result.stdout
    assert env.termination.read_text().startswith(f"OK: engine {manifest['key']} ")
    result = BuildResult.from_message(env.termination.read_text())  # what status.engines.* reports
    assert result is not None and result.size_bytes == manifest["sizes"]["artifact_bytes"] > 0
    assert result.built_at == manifest["builder"]["built_at"]
    engine_cfg = json.loads((env.cache / manifest["key"] / "engine" / "config.json").read_text())
    if fixture.endswith("-redrafter"):
        assert engine_cfg["build_config"]["speculative_decoding_mode"] == "explicit_draft_tokens"
        r = manifest["redrafter"]
        assert engine_cfg["build_config"]["max_draft_len"] == r["num_beams"] * r["draft_len_per_beam"]
    else:
        assert engine_cfg["build_config"]["speculative_decoding_mode"] is None


def test_second_run_is_a_cache_hit(env: Env):
    spec_path = env.spec("llama3-8b-redrafter", **llama_pvc())
    assert env.run(spec_path).returncode == 0
    calls = len(env.tool_calls())
    again = env.run(spec_path)
    assert again.returncode == 0
    assert "cache hit" in again.stdout
    assert env.termination.read_text().startswith("OK: engine ")
    assert len(env.tool_calls()) == calls, "a cache hit must not run any tool"


def test_hf_source_resolves_the_revision_to_a_commit_and_keeps_the_token_secret(env: Env):
    env.hf_repo("acme/tiny-llama", LLAMA)
    creds = env.secret("hf-token", token=HF_TOKEN)
    hf = {"uri": "hf://acme/tiny-llama", "revision": "main", "credentials_dir": creds}
    spec_path = env.spec("llama3-8b-redrafter", base=hf, tokenizer=hf, drafter=pvc("drafters/llama3-8b-redrafter"))
    result = env.run(spec_path)
    assert result.returncode == 0, result.stdout + result.stderr
    manifest = assert_published(env, spec_path, 1)
    assert manifest["sources"]["base"] == {
        "uri": "hf://acme/tiny-llama",
        "revision": "main",
        "resolved": HF_COMMIT,
        "bytes": manifest["sources"]["base"]["bytes"],
    }
    everything = result.stdout + result.stderr + json.dumps(manifest) + env.tool_log.read_text()
    assert HF_TOKEN not in everything, "the token leaked into logs, manifest, argv or a tool's environment"


# ---- concurrency and crash recovery -------------------------------------------------------------


def test_two_builders_on_one_key_build_once(env: Env):
    spec_path = env.spec("llama3-8b-redrafter", **llama_pvc())
    started = env.root / "trtllm-started"
    first = env.start(spec_path, FAKE_TRTLLM_SLEEP="4", FAKE_TRTLLM_STARTED=str(started))
    deadline = time.monotonic() + 30  # start the second only while the first holds the lock (a busy box
    while not started.exists():  # could otherwise finish the first before the second even starts)
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()
        time.sleep(0.05)
    second = env.start(spec_path, FAKE_TRTLLM_SLEEP="4")
    outs = [p.communicate(timeout=60) for p in (first, second)]
    assert [first.returncode, second.returncode] == [0, 0], outs
    assert [c["tool"] for c in env.tool_calls()].count("trtllm-build") == 1
    logs = [o[0] for o in outs]
    waiter = next(log for log in logs if "cache hit" in log)
    assert "is being built by build-pod-0" in waiter
    assert_published(env, spec_path, 1)


def test_kill_9_mid_build_then_rerun_takes_over_the_stale_lock(env: Env):
    spec_path = env.spec("llama3-8b-redrafter", **llama_pvc())
    key = json.loads(spec_path.read_text())["key"]
    started = env.root / "trtllm-started"
    proc = env.start(spec_path, FAKE_TRTLLM_SLEEP="60", FAKE_TRTLLM_STARTED=str(started))
    deadline = time.monotonic() + 30
    while not started.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the builder and its trtllm-build, like a node loss
    proc.communicate()
    assert (env.cache / f"{key}.lock").exists()
    assert any(p.name.startswith(f".tmp-{key}-") for p in env.cache.iterdir())
    assert not (env.cache / key).exists()

    result = env.run(spec_path, REDRAFTER_LOCK_STALE_SECONDS="1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "is stale" in result.stdout and "taking over" in result.stdout
    assert "removing partial output" in result.stdout
    assert_published(env, spec_path, 1)


def test_a_live_owner_makes_a_waiter_time_out(env: Env):
    spec_path = env.spec("llama3-8b-redrafter", **llama_pvc())
    key = json.loads(spec_path.read_text())["key"]
    env.cache.mkdir(parents=True)
    proc = env.start(spec_path, FAKE_TRTLLM_SLEEP="30", FAKE_TRTLLM_STARTED=str(env.root / "started"))
    try:
        deadline = time.monotonic() + 30
        while not (env.root / "started").exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        result = env.run(spec_path, REDRAFTER_LOCK_WAIT_SECONDS="1", REDRAFTER_LOCK_STALE_SECONDS="20")
        assert result.returncode == 5, result.stdout + result.stderr
        assert env.termination.read_text().startswith(f"LOCK_TIMEOUT: engine {key} is still being built by build-pod-0")
    finally:
        proc.send_signal(signal.SIGTERM)  # the Job deadline: the builder must stop its tool and release the lock
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 143, out + err
    assert env.leftovers() == []


# ---- failures: termination message and exit code ------------------------------------------------


def _missing_drafter_config(env: Env) -> dict:
    (env.sources / "drafters" / "llama3-8b-redrafter" / "config.json").unlink()
    return llama_pvc()


def _drafter_with_other_names(env: Env) -> dict:
    from safetensors.numpy import load_file, save_file

    weights = env.sources / "drafters" / "llama3-8b-redrafter" / "model.safetensors"
    tensors = load_file(str(weights))
    tensors["lm_heads.2.weight"] = tensors.pop("lm_head.2.weight")  # a name the converter does not read
    save_file(tensors, str(weights))
    return llama_pvc()


def _unsupported_architecture(env: Env) -> dict:
    write_model(env.sources / "models" / "gpt2", {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"})
    return llama_pvc(base=pvc("models/gpt2"), architecture="auto")


def _qwen_v1(env: Env) -> dict:
    write_model(env.sources / "models" / "qwen-7b", {"architectures": ["QWenLMHeadModel"], "model_type": "qwen"})
    return llama_pvc(base=pvc("models/qwen-7b"), tokenizer=pvc("models/qwen-7b"), architecture="qwen")


def _missing_pvc_path(env: Env) -> dict:
    return llama_pvc(drafter=pvc("drafters/not-there"))


def _hf_offline(env: Env) -> dict:
    creds = env.secret("hf-token", token=HF_TOKEN)
    return llama_pvc(base={"uri": "hf://acme/not-cached", "revision": "main", "credentials_dir": creds})


def _no_tokenizer(env: Env) -> dict:
    write_model(env.sources / "models" / "bare", LLAMA, tokenizer=False)
    return llama_pvc(tokenizer=pvc("models/bare"))


BAD_INPUTS = {
    "missing-drafter-config": (_missing_drafter_config, 2, "BAD_INPUT: drafter model has no config.json"),
    "drafter-tensor-names": (
        _drafter_with_other_names,
        2,
        "BAD_INPUT: drafter model.safetensors lacks lm_head.2.weight (convert_checkpoint.py reads it)",
    ),
    "unsupported-architecture": (
        _unsupported_architecture,
        2,
        "BAD_INPUT: unsupported base architecture in base config.json: GPT2LMHeadModel",
    ),
    "pvc-path-missing": (
        _missing_pvc_path,
        6,
        "SOURCE_UNAVAILABLE: drafter source pvc://drafters/not-there: path not-there does not exist",
    ),
    "hf-offline": (_hf_offline, 6, "SOURCE_UNAVAILABLE: base source hf://acme/not-cached@main is unreachable"),
    "no-tokenizer-files": (_no_tokenizer, 2, "BAD_INPUT: tokenizer files missing"),
    "qwen-v1": (
        _qwen_v1,
        2,
        "BAD_INPUT: Qwen v1 (QWenLMHeadModel) needs trust_remote_code tokenizers, which "
        "this operator does not run; use Qwen2/Qwen2.5",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_inputs_fail_before_any_tool_with_a_clear_message(env: Env, case: str):
    make, code, message = BAD_INPUTS[case]
    spec_path = env.spec("llama3-8b-redrafter", **make(env))
    result = env.run(spec_path)
    assert result.returncode == code, result.stdout + result.stderr
    termination = env.termination.read_text()
    assert termination.startswith(message), termination
    assert env.tool_calls() == [], "no GPU tool may run on bad input"
    assert env.leftovers() == []
    assert HF_TOKEN not in result.stdout + result.stderr + termination


def test_tool_failure_reports_the_step_and_its_stderr_tail(env: Env):
    spec_path = env.spec("llama3-8b-redrafter", **llama_pvc())
    result = env.run(spec_path, FAKE_TRTLLM_FAIL="redrafter/convert_checkpoint.py")
    assert result.returncode == 3
    lines = env.termination.read_text().splitlines()
    # (the duration is wall time: a busy machine may take a second or more)
    assert re.fullmatch(r"TOOL_FAILURE: step convert-redrafter failed \(exit code 1\) after \d+s", lines[0]), lines[0]
    assert lines[-1].startswith("RuntimeError: [TensorRT-LLM][ERROR] CUDA out of memory")
    assert env.leftovers() == [] and not (env.cache / json.loads(spec_path.read_text())["key"]).exists()


def test_clearly_insufficient_disk_is_refused_before_converting(env: Env):
    spec_path = env.spec("llama3-8b-redrafter", **llama_pvc())
    result = env.run(spec_path, REDRAFTER_DISK_RESERVE_BYTES=str(1 << 60))
    assert result.returncode == 4
    assert env.termination.read_text().startswith("OUT_OF_DISK: not enough free space on the cache volume")
    assert env.tool_calls() == []


def test_invalid_spec_file_is_bad_input(env: Env):
    path = env.root / "broken.json"
    path.write_text('{"variant": "redrafter"}')
    result = env.run(path)
    assert result.returncode == 2
    assert env.termination.read_text().startswith(f"BAD_INPUT: build spec {path} is invalid")


def test_plan_command_prints_the_steps_without_running_them(env: Env):
    spec_path = env.spec("qwen2.5-7b-fp8-tp2-redrafter", **CASES["qwen-fp8-tp2-redrafter"][1])
    result = subprocess.run(
        [sys.executable, "-m", "engine_jobs", "plan", str(spec_path), "--json"],
        cwd=REPO,
        env=env.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["architecture"] == "qwen"  # auto, read from the mounted config.json
    assert [s["name"] for s in doc["steps"]] == ["quantize-base", "convert-redrafter", "trtllm-build"]
    assert env.tool_calls() == [] and not env.cache.exists()


def test_plan_needs_an_architecture_for_auto_with_a_remote_base(env: Env):
    spec_path = env.spec("llama3-70b-tp8-redrafter")  # architecture auto, base on hf://
    argv = [sys.executable, "-m", "engine_jobs", "plan", "--spec", str(spec_path)]
    refused = subprocess.run(argv, cwd=REPO, env=env.env, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "pass --architecture" in refused.stderr
    shown = subprocess.run(
        [*argv, "--architecture", "llama"], cwd=REPO, env=env.env, capture_output=True, text=True, timeout=60
    )
    assert shown.returncode == 0, shown.stderr
    assert "--tp_size 8" in shown.stdout and "--speculative_decoding_mode explicit_draft_tokens" in shown.stdout
