"""engine_jobs planning and its pure helpers: argv per variant/architecture/precision/TP, flags checked
against TensorRT-LLM's documented flag sets, architecture detection, disk estimate, termination
messages, settings, source parsing, the cache lock and the s3 fetch (with a client test double)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import pytest

from engine_jobs.cache import CachePaths, KeyLock, acquire_or_wait, read_manifest
from engine_jobs.contract import BuildSpec
from engine_jobs.errors import BuildError, ExitCode, format_termination_message
from engine_jobs.fetch import fetch_s3, parse_uri
from engine_jobs.plan import Layout, detect_architecture, estimate_required_bytes, plan_steps, resolve_architecture
from engine_jobs.progress import Log
from engine_jobs.settings import Settings
from engine_jobs.validate import validate_drafter, validate_tokenizer

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "build_specs"
FAKES = Path(__file__).resolve().parents[2] / "sim" / "redrafter_sim" / "toolchain"
sys.path.insert(0, str(FAKES))
import fakelib  # noqa: E402  (the transcribed TensorRT-LLM flag sets)

SETTINGS = Settings.from_env({"REDRAFTER_TRTLLM_EXAMPLES": "/ex", "REDRAFTER_PYTHON": "py"})
LAYOUT = Layout(base_model_dir="/m/base", drafter_model_dir="/m/drafter", work_dir="/w", engine_dir="/out/engine")


def spec(name: str, **changes) -> BuildSpec:
    data = json.loads((FIXTURES / f"{name}.json").read_text())
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return BuildSpec.model_validate(data)


def plan(s: BuildSpec, arch: str = "llama") -> list:
    return plan_steps(s, SETTINGS, arch, LAYOUT)


def flags(argv: tuple[str, ...]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    tokens = list(argv)
    for i, tok in enumerate(tokens):
        if tok.startswith("--"):
            nxt = tokens[i + 1] if i + 1 < len(tokens) else None
            out[tok] = None if nxt is None or nxt.startswith("--") else nxt
    return out


TOOL_FLAGS = {
    "/ex/models/core/llama/convert_checkpoint.py": fakelib.LLAMA,
    "/ex/models/core/qwen/convert_checkpoint.py": fakelib.QWEN,
    "/ex/quantization/quantize.py": fakelib.QUANTIZE,
    "/ex/redrafter/convert_checkpoint.py": fakelib.REDRAFTER,
}


def assert_tool_accepts(argv: tuple[str, ...]) -> argparse.Namespace:
    """Parse with the real tool's flag set: an unknown flag or value fails like TensorRT-LLM would."""
    table = fakelib.TRTLLM_BUILD if argv[0] == "trtllm-build" else TOOL_FLAGS[argv[1]]
    args = list(argv[1:] if argv[0] == "trtllm-build" else argv[2:])
    parser = argparse.ArgumentParser(exit_on_error=False)
    fakelib._add(parser, table)
    ns, unknown = parser.parse_known_args(args)
    assert not unknown, f"flags TensorRT-LLM does not have: {unknown}"
    return ns


# ---- the README procedure, flag for flag ----------------------------------------------------------


def test_llama_bf16_tp1_redrafter_matches_readme_exactly():
    steps = plan(spec("llama3-8b-redrafter"))
    assert [s.name for s in steps] == ["convert-base", "convert-redrafter", "trtllm-build"]
    assert steps[0].argv == (
        "py",
        "/ex/models/core/llama/convert_checkpoint.py",
        "--model_dir",
        "/m/base",
        "--output_dir",
        "/w/base_ckpt",
        "--dtype",
        "bfloat16",
        "--tp_size",
        "1",
    )
    assert steps[1].argv == (
        "py",
        "/ex/redrafter/convert_checkpoint.py",
        "--base_model_checkpoint_dir",
        "/w/base_ckpt",
        "--drafter_model_dir",
        "/m/drafter",
        "--output_dir",
        "/w/redrafter_ckpt",
        "--dtype",
        "bfloat16",
        "--tp_size",
        "1",
        "--redrafter_num_beams",
        "5",
        "--redrafter_draft_len_per_beam",
        "5",
    )
    assert steps[2].argv == (
        "trtllm-build",
        "--checkpoint_dir",
        "/w/redrafter_ckpt",
        "--output_dir",
        "/out/engine",
        "--gemm_plugin",
        "bfloat16",
        "--speculative_decoding_mode",
        "explicit_draft_tokens",
        "--max_beam_width",
        "1",
        "--kv_cache_type",
        "paged",
        "--max_batch_size",
        "8",
        "--max_input_len",
        "2048",
        "--max_seq_len",
        "4096",
        "--max_num_tokens",
        "8192",
        "--use_paged_context_fmha",
        "enable",
        "--workers",
        "1",
    )


def test_qwen_fp8_tp2_quantizes_the_base_and_builds_with_fp8_gemm():
    steps = plan(spec("qwen2.5-7b-fp8-tp2-redrafter"), "qwen")
    assert [s.name for s in steps] == ["quantize-base", "convert-redrafter", "trtllm-build"]
    q = flags(steps[0].argv)
    assert steps[0].argv[1] == "/ex/quantization/quantize.py"
    assert q == {
        "--model_dir": "/m/base",
        "--dtype": "float16",
        "--qformat": "fp8",
        "--output_dir": "/w/base_ckpt",
        "--tp_size": "2",
        "--calib_size": "512",
    }
    r = flags(steps[1].argv)
    assert (r["--tp_size"], r["--dtype"], r["--redrafter_num_beams"], r["--redrafter_draft_len_per_beam"]) == (
        "2",
        "float16",
        "4",
        "4",
    )  # the drafter stays in dtype: only the base is FP8
    b = flags(steps[2].argv)
    assert (b["--gemm_plugin"], b["--workers"], b["--speculative_decoding_mode"]) == (
        "fp8",
        "2",
        "explicit_draft_tokens",
    )


def test_qwen_bf16_uses_the_qwen_converter():
    s = spec("llama3-8b-redrafter", architecture="qwen")
    assert plan(s, "qwen")[0].argv[1] == "/ex/models/core/qwen/convert_checkpoint.py"


def test_base_variant_is_the_same_conversion_and_a_plain_build_with_the_same_limits():
    red, base = plan(spec("llama3-8b-redrafter")), plan(spec("llama3-8b-base"))
    assert [s.name for s in base] == ["convert-base", "trtllm-build"]
    assert base[0].argv == red[0].argv
    bf, rf = flags(base[1].argv), flags(red[2].argv)
    assert "--speculative_decoding_mode" not in bf
    assert bf["--checkpoint_dir"] == "/w/base_ckpt"
    for flag in (
        "--max_batch_size",
        "--max_input_len",
        "--max_seq_len",
        "--max_num_tokens",
        "--kv_cache_type",
        "--gemm_plugin",
        "--use_paged_context_fmha",
        "--max_beam_width",
    ):
        assert bf[flag] == rf[flag], flag


def test_70b_tp8_shards_every_step_eight_ways():
    steps = plan(spec("llama3-70b-tp8-redrafter"))
    assert [flags(s.argv).get("--tp_size") for s in steps[:2]] == ["8", "8"]
    assert flags(steps[2].argv)["--workers"] == "8"


def test_non_greedy_and_no_paged_context_fmha():
    s = spec("llama3-8b-redrafter", redrafter={"greedy_search": False}, limits={"paged_context_fmha": False})
    steps = plan(s)
    assert steps[1].argv[-1] == "--redrafter_no_greedy_search"
    assert flags(steps[2].argv)["--use_paged_context_fmha"] == "disable"
    ns = assert_tool_accepts(steps[1].argv)
    assert ns.redrafter_greedy_search is False


def test_calibration_dataset_setting_reaches_quantize():
    settings = Settings.from_env(
        {
            "REDRAFTER_TRTLLM_EXAMPLES": "/ex",
            "REDRAFTER_PYTHON": "py",
            "REDRAFTER_FP8_CALIB_DATASET": "/data/calib",
            "REDRAFTER_FP8_CALIB_SIZE": "64",
        }
    )
    step = plan_steps(spec("qwen2.5-7b-fp8-tp2-base"), settings, "qwen", LAYOUT)[0]
    assert flags(step.argv)["--calib_dataset"] == "/data/calib"
    assert flags(step.argv)["--calib_size"] == "64"


@pytest.mark.parametrize("name", sorted(p.stem for p in FIXTURES.glob("*.json")))
@pytest.mark.parametrize("arch", ["llama", "qwen"])
def test_every_planned_flag_exists_in_tensorrt_llm(name, arch):
    for step in plan(spec(name), arch):
        assert_tool_accepts(step.argv)


def test_a_made_up_flag_would_be_caught():
    with pytest.raises(AssertionError, match="--redrafter_temperature"):
        assert_tool_accepts(("trtllm-build", "--checkpoint_dir", "/c", "--redrafter_temperature", "1"))


def test_redrafter_variant_without_drafter_is_bad_input():
    s = spec("llama3-8b-redrafter", drafter=None)
    with pytest.raises(BuildError) as err:
        plan(s)
    assert err.value.code == ExitCode.BAD_INPUT


# ---- architecture -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "config,arch",
    [
        ({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}, "llama"),
        ({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"}, "qwen"),
        ({"model_type": "qwen2"}, "qwen"),
    ],
)
def test_detect_supported_architectures(config, arch):
    assert detect_architecture(config) == arch


@pytest.mark.parametrize("config", [{"architectures": ["MistralForCausalLM"]}, {"model_type": "gpt2"}, {}])
def test_unsupported_architecture_is_bad_input(config):
    with pytest.raises(BuildError) as err:
        detect_architecture(config)
    assert err.value.code == ExitCode.BAD_INPUT and "unsupported base architecture" in err.value.reason


@pytest.mark.parametrize(
    "config", [{"architectures": ["QWenLMHeadModel"], "model_type": "qwen"}, {"model_type": "qwen"}]
)
def test_qwen_v1_is_refused_because_its_tokenizer_is_remote_code(config):
    for requested in ("auto", "qwen"):
        with pytest.raises(BuildError) as err:
            resolve_architecture(requested, config)
        assert err.value.code == ExitCode.BAD_INPUT
        assert err.value.reason.startswith(
            "Qwen v1 (QWenLMHeadModel) needs trust_remote_code tokenizers, which "
            "this operator does not run; use Qwen2/Qwen2.5"
        )


def test_remote_code_tokenizer_is_bad_input(tmp_path: Path):
    (tmp_path / "tokenizer.json").write_text("{}")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    assert "tokenizer.json" in validate_tokenizer(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"auto_map": {"AutoTokenizer": ["tokenization_qwen.QWenTokenizer", None]}})
    )
    with pytest.raises(BuildError) as err:
        validate_tokenizer(tmp_path)
    assert err.value.code == ExitCode.BAD_INPUT
    assert "remote code (tokenization_qwen.QWenTokenizer)" in err.value.reason


def test_explicit_architecture_must_agree_with_config():
    assert resolve_architecture("qwen", None) == "qwen"
    with pytest.raises(BuildError, match="spec says architecture qwen"):
        resolve_architecture("qwen", {"architectures": ["LlamaForCausalLM"]})
    with pytest.raises(BuildError, match="no readable config.json"):
        resolve_architecture("auto", None)


# ---- estimates, messages, settings, sources -----------------------------------------------------


def test_disk_estimate_counts_checkpoints_engine_and_drafter():
    gib = 1 << 30
    assert estimate_required_bytes(spec("llama3-8b-base"), 16 * gib, 0, 1) == 32 * gib + 1
    assert estimate_required_bytes(spec("llama3-8b-redrafter"), 16 * gib, gib, 0) == 16 * gib + 2 * 17 * gib
    assert estimate_required_bytes(spec("qwen2.5-7b-fp8-tp2-redrafter"), 16 * gib, gib, 0) == 8 * gib + 2 * 9 * gib


def test_termination_message_is_bounded_and_keeps_the_end_of_the_output():
    detail = "\n".join(f"line {i} " + "x" * 100 for i in range(200)) + "\nRuntimeError: the real cause"
    msg = format_termination_message(ExitCode.TOOL_FAILURE, "step trtllm-build failed (exit code 1)", detail)
    assert len(msg.encode()) <= 4096
    assert msg.startswith("TOOL_FAILURE: step trtllm-build failed (exit code 1)\n...\n")
    assert msg.endswith("RuntimeError: the real cause")
    assert format_termination_message(ExitCode.BAD_INPUT, "x" * 5000).encode().__len__() <= 4096


def test_settings_defaults_and_validation():
    s = Settings.from_env({})
    assert s.examples_root == "/app/tensorrt_llm/examples" and s.trtllm_build == "trtllm-build"
    assert s.termination_log == "/dev/termination-log" and s.sources_mount == "/sources"
    with pytest.raises(ValueError, match="REDRAFTER_LOCK_STALE_SECONDS"):
        Settings.from_env({"REDRAFTER_LOCK_STALE_SECONDS": "soon"})


@pytest.mark.parametrize("uri", ["ftp://x/y", "pvc://claim/../etc", "hf://org//name", "s3:///abs"])
def test_unsafe_or_unknown_sources_are_bad_input(uri):
    with pytest.raises(BuildError) as err:
        parse_uri(uri)
    assert err.value.code == ExitCode.BAD_INPUT


def test_drafter_config_must_have_the_converter_keys(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8, "exit_dim": 16, "rnn": True}))
    (tmp_path / "model.safetensors").write_bytes(b"0")
    with pytest.raises(BuildError, match="lacks num_draft_layers"):
        validate_drafter(tmp_path)


# ---- lock ---------------------------------------------------------------------------------------


def make_lock(tmp_path: Path, stale: float = 60) -> KeyLock:
    return KeyLock(tmp_path / "k.lock", stale_seconds=stale, heartbeat_seconds=0.05, log=Log(open(os.devnull, "w")))


def test_lock_is_exclusive_and_released(tmp_path):
    a, b = make_lock(tmp_path), make_lock(tmp_path)
    assert a.try_acquire() and not b.try_acquire()
    assert b.holder()["token"] == a.token and b.holder()["pid"] == os.getpid()
    a.release()
    assert not (tmp_path / "k.lock").exists() and b.try_acquire()


def test_heartbeat_keeps_a_live_lock_fresh_and_a_dead_one_goes_stale(tmp_path):
    live = make_lock(tmp_path, stale=0.3)
    assert live.try_acquire()
    live.start_heartbeat()
    time.sleep(0.5)
    other = make_lock(tmp_path, stale=0.3)
    assert not other.is_stale(other.holder())
    live.release()
    dead = make_lock(tmp_path, stale=0.3)
    assert dead.try_acquire()  # never beats: like a kill -9'd owner
    time.sleep(0.4)
    taker = make_lock(tmp_path, stale=0.3)
    record = taker.holder()
    assert taker.is_stale(record) and taker.take_over(record)
    assert taker.holder()["token"] == taker.token


def test_take_over_does_not_steal_a_lock_renewed_meanwhile(tmp_path):
    first = make_lock(tmp_path)
    assert first.try_acquire()
    observed = {**first.holder(), "token": "someone-before"}
    assert not make_lock(tmp_path).take_over(observed)
    assert first.holder()["token"] == first.token


def test_waiting_builder_times_out_on_a_live_owner_and_hits_a_finished_one(tmp_path):
    paths = CachePaths(tmp_path, "k")
    owner = KeyLock(paths.lock, stale_seconds=60, heartbeat_seconds=0.05, log=Log(open(os.devnull, "w")))
    assert owner.try_acquire()
    waiter = KeyLock(paths.lock, stale_seconds=60, heartbeat_seconds=0.05, log=Log(open(os.devnull, "w")))
    with pytest.raises(BuildError) as err:
        acquire_or_wait(paths, waiter, wait_seconds=0.2, poll_seconds=0.05, log=Log(open(os.devnull, "w")))
    assert err.value.code == ExitCode.LOCK_TIMEOUT
    paths.final.mkdir()
    (paths.final / "manifest.json").write_text(json.dumps({"key": "k"}))
    assert acquire_or_wait(paths, waiter, wait_seconds=0.2, poll_seconds=0.05, log=Log(open(os.devnull, "w"))) == {
        "key": "k"
    }
    (paths.final / "manifest.json").write_text(json.dumps({"key": "other"}))
    assert read_manifest(paths) is None


# ---- s3 -----------------------------------------------------------------------------------------


class FakeS3Client:
    """TEST DOUBLE for the two boto3 S3 client calls fetch_s3 makes."""

    def __init__(self, objects: dict[str, bytes], **kwargs):
        self.objects, self.kwargs = objects, kwargs

    def get_paginator(self, name):
        assert name == "list_objects_v2"
        client = self

        class Paginator:
            def paginate(self, Bucket, Prefix):
                keys = sorted(k for k in client.objects if k.startswith(Prefix))
                yield {
                    "Contents": [
                        {"Key": k, "ETag": f'"{len(client.objects[k])}"', "Size": len(client.objects[k])}
                        for k in keys[:1]
                    ]
                }
                yield {
                    "Contents": [
                        {"Key": k, "ETag": f'"{len(client.objects[k])}"', "Size": len(client.objects[k])}
                        for k in keys[1:]
                    ]
                }

        return Paginator()

    def download_file(self, bucket, key, filename):
        Path(filename).write_bytes(self.objects[key])


def test_s3_fetch_uses_secret_files_downloads_atomically_and_records_a_digest(tmp_path, capsys):
    from engine_jobs.contract import SourceRef

    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "AWS_ACCESS_KEY_ID").write_text("AKIAEXAMPLEKEYID\n")
    (creds / "AWS_SECRET_ACCESS_KEY").write_text("s3cr3t-value-never-logged")
    (creds / "AWS_ENDPOINT_URL").write_text("http://127.0.0.1:9000")
    objects = {"models/q/config.json": b"{}", "models/q/model.safetensors": b"w" * 100, "other/x": b"no"}
    made: list[FakeS3Client] = []

    def factory(**kwargs):
        made.append(FakeS3Client(objects, **kwargs))
        return made[-1]

    ref = SourceRef(uri="s3://bucket/models/q", credentials_dir=str(creds))
    log = Log()
    got = fetch_s3("base", ref, parse_uri(ref.uri), str(tmp_path / "dl"), log, client_factory=factory)
    assert made[0].kwargs == {
        "aws_access_key_id": "AKIAEXAMPLEKEYID",
        "aws_secret_access_key": "s3cr3t-value-never-logged",
        "endpoint_url": "http://127.0.0.1:9000",
    }
    assert sorted(p.name for p in got.local_dir.iterdir()) == ["config.json", "model.safetensors"]
    assert got.bytes == 102 and got.resolved.startswith("sha256:")
    again = fetch_s3("base", ref, parse_uri(ref.uri), str(tmp_path / "dl"), log, client_factory=factory)
    assert again.resolved == got.resolved
    out = capsys.readouterr().out
    assert "s3cr3t-value-never-logged" not in out and "AKIAEXAMPLEKEYID" not in out
    assert log.redact("key s3cr3t-value-never-logged") == "key ***"


def test_s3_empty_prefix_is_source_unavailable(tmp_path):
    from engine_jobs.contract import SourceRef

    ref = SourceRef(uri="s3://bucket/missing")
    with pytest.raises(BuildError) as err:
        fetch_s3(
            "drafter",
            ref,
            parse_uri(ref.uri),
            str(tmp_path),
            Log(open(os.devnull, "w")),
            client_factory=lambda **kw: FakeS3Client({}, **kw),
        )
    assert err.value.code == ExitCode.SOURCE_UNAVAILABLE and "no objects" in err.value.reason


@pytest.mark.parametrize("change", [{"key": "../etc"}, {"key": ".hidden"}, {"cache_dir": "relative/cache"}])
def test_key_and_cache_dir_must_be_safe_paths(change):
    with pytest.raises(BuildError) as err:
        plan(spec("llama3-8b-base", **change))
    assert err.value.code == ExitCode.BAD_INPUT
