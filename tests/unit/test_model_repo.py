"""Generated Triton repository: every config parses as a ModelConfig; parameters follow ServingConfig."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from engine_jobs import contract
from engine_jobs.contract import ServingConfig, TritonParams
from engine_jobs.model_repo import MODEL_SOURCES, PERF_OUTPUTS, model_configs, write_model_repository
from redrafter_sim.engine import SimEngineSettings, install_sim_engine, sim_engine_config
from redrafter_sim.engine.control import ControlWatcher, SimControl, read_control, write_control


def cfg(variant: str = "redrafter", **kw) -> ServingConfig:
    base = dict(
        deployment="chat",
        variant=variant,
        engine_key="abc123",
        artifact_dir="/cache/abc123",
        max_batch_size=32,
        draft_len_per_beam=5 if variant == "redrafter" else 0,
        num_beams=4 if variant == "redrafter" else 0,
    )
    return ServingConfig(**(base | kw))


def parse(text: str) -> model_config_pb2.ModelConfig:
    out = model_config_pb2.ModelConfig()
    text_format.Parse(text, out)
    return out


def params(mc: model_config_pb2.ModelConfig) -> dict[str, str]:
    return {k: v.string_value for k, v in mc.parameters.items()}


def io(mc: model_config_pb2.ModelConfig) -> tuple:
    return ([text_format.MessageToString(t) for t in mc.input], [text_format.MessageToString(t) for t in mc.output])


@pytest.mark.parametrize("variant", contract.VARIANTS)
def test_every_config_parses_and_is_named_for_its_model(variant):
    configs = model_configs(cfg(variant), "/cache/abc123/engine", "/cache/abc123/tokenizer")
    assert set(configs) == {
        contract.ENTRY_MODEL,
        contract.PREPROCESSING_MODEL,
        contract.ENGINE_MODEL,
        contract.POSTPROCESSING_MODEL,
    }
    for name, text in configs.items():
        mc = parse(text)
        assert mc.name == name


def test_engine_parameters_follow_variant_and_serving_config():
    red = parse(model_configs(cfg("redrafter"), "/e", "/t")[contract.ENGINE_MODEL])
    base = parse(model_configs(cfg("base"), "/e", "/t")[contract.ENGINE_MODEL])
    assert red.backend == "tensorrtllm" and red.max_batch_size == 32
    assert red.model_transaction_policy.decoupled is True
    p = params(red)
    assert p["decoding_mode"] == "redrafter" and "decoding_mode" not in params(base)
    assert p["gpt_model_type"] == "inflight_fused_batching"
    assert p["gpt_model_path"] == p["engine_dir"] == "/e"
    assert p["max_beam_width"] == "1"
    assert p["kv_cache_free_gpu_mem_fraction"] == "0.9"
    assert p["enable_kv_cache_reuse"] == "true"
    assert p["enable_chunked_context"] == "true"
    no_fmha = parse(model_configs(cfg(paged_context_fmha=False), "/e", "/t")[contract.ENGINE_MODEL])
    assert "enable_chunked_context" not in params(no_fmha)
    tuned = cfg(
        triton=TritonParams(
            max_queue_delay_microseconds=250, kv_cache_free_gpu_mem_fraction=0.55, enable_kv_cache_reuse=False
        )
    )
    t = parse(model_configs(tuned, "/e", "/t")[contract.ENGINE_MODEL])
    assert params(t)["gpt_model_type"] == "inflight_fused_batching"
    assert params(t)["kv_cache_free_gpu_mem_fraction"] == "0.55"
    assert params(t)["enable_kv_cache_reuse"] == "false"
    assert t.dynamic_batching.max_queue_delay_microseconds == 250


def test_engine_io_has_perf_metrics_like_trtllm():
    mc = parse(model_configs(cfg(), "/e", "/t")[contract.ENGINE_MODEL])
    inputs = {t.name: t for t in mc.input}
    outputs = {t.name: t for t in mc.output}
    assert {
        "input_ids",
        "input_lengths",
        "request_output_len",
        "end_id",
        "pad_id",
        "streaming",
        "stop_words_list",
        "bad_words_list",
        "return_perf_metrics",
    } <= set(inputs)
    assert (
        inputs["return_perf_metrics"].optional and inputs["return_perf_metrics"].data_type == model_config_pb2.TYPE_BOOL
    )
    assert set(PERF_OUTPUTS) <= set(outputs)
    assert outputs["acceptance_rate"].data_type == model_config_pb2.TYPE_FP32
    assert outputs["total_draft_tokens"].data_type == model_config_pb2.TYPE_INT32


def test_entry_model_keeps_ensemble_interface_and_carries_metric_names():
    mc = parse(model_configs(cfg(), "/e", "/t")[contract.ENTRY_MODEL])
    assert mc.backend == "python" and mc.model_transaction_policy.decoupled
    assert {
        "text_input",
        "max_tokens",
        "stream",
        "temperature",
        "end_id",
        "pad_id",
        "stop_words",
        "bad_words",
        "top_k",
        "top_p",
        "return_perf_metrics",
    } <= {t.name for t in mc.input}
    assert {t.name for t in mc.output} == {"text_output", *PERF_OUTPUTS, contract.OUTPUT_TOKEN_COUNT}
    p = params(mc)
    assert p["output_token_count"] == contract.OUTPUT_TOKEN_COUNT
    assert p["metric_requests"] == contract.METRIC_REQUESTS
    assert p["metric_steps"] == contract.METRIC_STEPS
    assert p["label_variant"] == contract.METRIC_LABEL_VARIANT
    assert (p["deployment"], p["variant"]) == ("chat", "redrafter")


def test_sim_engine_declares_the_same_io_as_the_real_engine():
    real_text = model_configs(cfg(), "/e", "/t")[contract.ENGINE_MODEL]
    sim = parse(sim_engine_config(real_text, SimEngineSettings(control_file="/tmp/c.json")))
    real = parse(real_text)
    assert io(sim) == io(real)
    assert sim.max_batch_size == real.max_batch_size
    assert sim.model_transaction_policy.decoupled == real.model_transaction_policy.decoupled
    assert sim.backend == "python" and params(sim)["sim_control_file"] == "/tmp/c.json"
    assert {k: v for k, v in params(sim).items() if not k.startswith("sim_")} == params(real), (
        "the simulated engine sees exactly the parameters the real backend would"
    )


def test_write_model_repository_lays_out_models_and_replaces_old(tmp_path: Path):
    out = tmp_path / "repo"
    (out / "stale").mkdir(parents=True)
    write_model_repository(out, cfg(), "/e", "/t")
    assert not (out / "stale").exists()
    for name in (
        contract.ENTRY_MODEL,
        contract.PREPROCESSING_MODEL,
        contract.ENGINE_MODEL,
        contract.POSTPROCESSING_MODEL,
    ):
        parse((out / name / "config.pbtxt").read_text())
        assert (out / name / "1").is_dir()
        for dest in MODEL_SOURCES.get(name, {}):
            ast.parse((out / name / "1" / dest).read_text())  # valid Python shipped as package data
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".repo.")], "temp dir left behind"
    install_sim_engine(out / contract.ENGINE_MODEL, SimEngineSettings())
    assert parse((out / contract.ENGINE_MODEL / "config.pbtxt").read_text()).backend == "python"
    assert {p.name for p in (out / contract.ENGINE_MODEL / "1").iterdir()} == {
        "model.py",
        "_sim_control.py",
        "_sim_batching.py",
        "_sim_speculation.py",
        "_sim_backend.py",
        "_trtllm_backend.py",
    }


def test_sim_control_file_roundtrip_and_watcher(tmp_path: Path):
    path = tmp_path / "ctl.json"
    watcher = ControlWatcher(str(path), SimControl(acceptance_rate=0.5))
    assert watcher.get().acceptance_rate == 0.5  # no file: defaults
    write_control(path, acceptance_rate=0.2, diverge=True)
    assert read_control(path) == SimControl(acceptance_rate=0.2, diverge=True)
    assert watcher.get().acceptance_rate == 0.2 and watcher.get().diverge
    write_control(path, error="boom")
    assert watcher.get().error == "boom" and watcher.get().acceptance_rate == 0.2
    path.write_text('{"acceptance_rate": 7}')
    assert watcher.get().error == "boom", "a bad file keeps the last good controls"
    assert "acceptance_rate" in watcher.last_error
    with pytest.raises(ValueError):
        write_control(path, SimControl(), acceptance_rate=1.5)
    with pytest.raises(ValueError, match="unknown"):
        SimControl.from_dict({"acceptance": 0.3})
