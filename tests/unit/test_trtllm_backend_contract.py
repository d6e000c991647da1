"""The generated tensorrt_llm config defines every parameter the pinned TensorRT-LLM backend requires,
and the simulated engine refuses a config without one, as the real backend does."""

from __future__ import annotations

import argparse
import itertools
import re
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from engine_jobs import contract, trtllm_backend
from engine_jobs.contract import ServingConfig
from engine_jobs.model_repo import engine_parameters, model_configs
from redrafter_sim.engine import BackendLoadError, SimEngineSettings, check_parameters, sim_engine_config
from redrafter_sim.toolchain import fakelib

ROOT = Path(__file__).resolve().parents[2]

# Read for TensorRT-LLM 1.2.1 (images/versions.env): NVIDIA/TensorRT-LLM
# triton_backend/inflight_batcher_llm/src/model_instance_state.cc at c8c6df08bd0ead54cd47f7973e1e425c28a174cd,
# the GetParameter<std::string> calls outside any try/catch. Pinned here so the list cannot shrink unnoticed.
UPSTREAM_REQUIRED = ("gpt_model_type", "tokenizer_dir", "xgrammar_tokenizer_info_path", "guided_decoding_backend")
# Same file, getExecutorConfigFromParams: the decoding_mode strings it maps; triton-inference-server/
# tensorrtllm_backend branch r26.07 (3bc115373ce1fde1d94891964b492449402e3a68) docs/model_config.md lists the same.
UPSTREAM_DECODING_MODES = ("top_k", "top_p", "top_k_top_p", "beam_search", "medusa", "redrafter", "lookahead", "eagle")
# tensorrt_llm/commands/build.py at 65f1d1536e18aea3380e6e270e00895a709333eb: --speculative_decoding_mode choices.
UPSTREAM_SPECULATIVE_MODES = ("draft_tokens_external", "lookahead_decoding", "medusa", "explicit_draft_tokens", "eagle")
# Flags build.py defined at 1.0.0 and no longer defines (the auto-parallel group): the stand-in refuses them.
DROPPED_BUILD_FLAGS = ("--auto_parallel", "--gpus_per_node", "--cluster_key")
COMMIT = re.compile(r"^[0-9a-f]{40}$")


def serving(variant: str, tp: int, paged_context_fmha: bool = True) -> ServingConfig:
    red = variant == "redrafter"
    return ServingConfig(
        deployment="chat",
        variant=variant,
        engine_key="k",
        artifact_dir="/cache/k",
        tensor_parallel=tp,
        max_batch_size=16,
        paged_context_fmha=paged_context_fmha,
        draft_len_per_beam=4 if red else 0,
        num_beams=2 if red else 0,
    )


def engine_params(cfg: ServingConfig) -> dict[str, str]:
    mc = model_config_pb2.ModelConfig()
    text_format.Parse(model_configs(cfg, "/cache/k/engine", "/cache/k/tokenizer")[contract.ENGINE_MODEL], mc)
    assert mc.backend == "tensorrtllm"
    return {k: v.string_value for k, v in mc.parameters.items()}


def _pinned() -> dict[str, str]:
    lines = (ROOT / "images/versions.env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))


def test_contract_lists_the_upstream_parameters_with_their_source():
    assert trtllm_backend.REQUIRED_PARAMETER_NAMES == UPSTREAM_REQUIRED
    pinned = _pinned()
    for p in trtllm_backend.REQUIRED_PARAMETERS:
        assert p.source == "model_instance_state.cc" and p.function
        assert f"TensorRT-LLM {pinned['TRTLLM_VERSION']}" in p.release
        assert f"Triton {pinned['TRITON_RELEASE']}" in p.release


def test_contract_cites_the_commit_each_fact_was_read_at():
    read_at = trtllm_backend.READ_AT
    assert all(COMMIT.match(commit) for commit in read_at.values())
    assert read_at[f"{trtllm_backend.SOURCE_DIR}/model_instance_state.cc"] == "c8c6df08bd0ead54cd47f7973e1e425c28a174cd"
    assert read_at["examples/redrafter/convert_checkpoint.py"] == "31a9cd42fb507b50df39df4e03066fa370e4683c"
    assert read_at["tensorrt_llm/commands/build.py"] == "65f1d1536e18aea3380e6e270e00895a709333eb"
    assert read_at["tensorrtllm_backend"] == "3bc115373ce1fde1d94891964b492449402e3a68"
    # the images' README names the same commits, so the pin and its evidence travel together
    readme = (ROOT / "images/README.md").read_text()
    assert all(commit in readme for commit in read_at.values())


def test_the_pinned_backend_still_maps_redrafter():
    """A decoding_mode 1.2.1 dropped or renamed would only warn and fall back to top_k_top_p: fail here."""
    assert trtllm_backend.DECODING_MODES == UPSTREAM_DECODING_MODES
    assert engine_params(serving("redrafter", 1))["decoding_mode"] in UPSTREAM_DECODING_MODES
    assert "decoding_mode" not in engine_params(serving("base", 1))


def test_trtllm_build_takes_the_speculative_mode_the_plan_passes():
    assert trtllm_backend.SPECULATIVE_DECODING_MODES == UPSTREAM_SPECULATIVE_MODES
    (choices,) = [rest[0] for flag, _kind, *rest in fakelib.TRTLLM_BUILD if flag == "--speculative_decoding_mode"]
    assert tuple(choices) == UPSTREAM_SPECULATIVE_MODES
    assert "explicit_draft_tokens" in choices


@pytest.mark.parametrize("flag", DROPPED_BUILD_FLAGS)
def test_the_stand_in_trtllm_build_refuses_flags_the_pin_dropped(flag: str):
    parser = argparse.ArgumentParser(exit_on_error=False)
    fakelib._add(parser, fakelib.TRTLLM_BUILD)
    _ns, unknown = parser.parse_known_args(["--checkpoint_dir", "/c", flag, "1"])
    assert flag in unknown


@pytest.mark.parametrize(
    ("variant", "tp", "fmha"), list(itertools.product(contract.VARIANTS, (1, 2, 8), (True, False)))
)
def test_generated_config_defines_every_required_parameter(variant, tp, fmha):
    p = engine_params(serving(variant, tp, fmha))
    missing = [name for name in trtllm_backend.REQUIRED_PARAMETER_NAMES if name not in p]
    assert not missing, f"config.pbtxt lacks {missing}: the real backend would not load it"
    # guided decoding off, as upstream's template leaves it
    assert p["guided_decoding_backend"] == p["xgrammar_tokenizer_info_path"] == ""
    assert p["gpt_model_type"] in trtllm_backend.GPT_MODEL_TYPES
    check_parameters(p, trtllm_backend)  # the double accepts what the real backend accepts


#: keys the generated config sets that the C++ backend does not read, and why they are there anyway
NOT_READ_BY_THE_BACKEND = {
    "FORCE_CPU_ONLY_INPUT_TENSORS": "in upstream's tensorrt_llm config.pbtxt too (Triton-level input placement)",
    "engine_dir": "names the published engine directory; the backend reads the same path as gpt_model_path",
}


@pytest.mark.parametrize("variant", contract.VARIANTS)
def test_every_generated_parameter_is_one_the_backend_reads(variant):
    """A misspelt key would be ignored silently by the real backend (its default applies instead)."""
    known = (
        set(trtllm_backend.REQUIRED_PARAMETER_NAMES)
        | set(trtllm_backend.OPTIONAL_PARAMETER_NAMES)
        | set(trtllm_backend.LOOKAHEAD_PARAMETER_NAMES)
    )
    unknown = set(engine_params(serving(variant, 2))) - known - set(NOT_READ_BY_THE_BACKEND)
    assert not unknown, f"{sorted(unknown)}: not read by the TensorRT-LLM backend"
    assert not known & set(NOT_READ_BY_THE_BACKEND)


def test_double_requires_lookahead_parameters_only_for_lookahead():
    p = engine_parameters(serving("base", 1), "/e") | {"decoding_mode": "lookahead"}
    with pytest.raises(BackendLoadError, match="lookahead parameters are not specified"):
        check_parameters(p, trtllm_backend)
    check_parameters(p | {n: "4" for n in trtllm_backend.LOOKAHEAD_PARAMETER_NAMES}, trtllm_backend)
    check_parameters(engine_parameters(serving("base", 1), "/e") | {"decoding_mode": "top_k"}, trtllm_backend)


@pytest.mark.parametrize("name", UPSTREAM_REQUIRED)
def test_double_rejects_a_config_missing_a_required_parameter(name):
    p = engine_parameters(serving("redrafter", 1), "/e")
    del p[name]
    with pytest.raises(BackendLoadError) as err:
        check_parameters(p, trtllm_backend)
    assert str(err.value) == (
        f"unexpected error when creating modelInstanceState: Cannot find parameter with name: {name}"
    )


def test_double_reports_the_first_missing_parameter_in_upstream_read_order():
    p = engine_parameters(serving("base", 1), "/e")
    for name in ("guided_decoding_backend", "tokenizer_dir"):
        del p[name]
    with pytest.raises(BackendLoadError, match="name: tokenizer_dir$"):
        check_parameters(p, trtllm_backend)
    with pytest.raises(BackendLoadError, match="doesn't have a parameters section"):
        check_parameters(None, trtllm_backend)


@pytest.mark.parametrize(
    ("value", "match"), [("v1", "static batching"), ("V1", "static batching"), ("dynamic", "Invalid gpt_model_type")]
)
def test_double_rejects_batching_the_pinned_backend_does_not_run(value, match):
    p = engine_parameters(serving("base", 1), "/e") | {"gpt_model_type": value}
    with pytest.raises(BackendLoadError, match=match):
        check_parameters(p, trtllm_backend)


def test_double_checks_guided_decoding_and_model_path(tmp_path: Path):
    p = engine_parameters(serving("base", 1), "/e")
    missing = str(tmp_path / "absent.json")
    with pytest.raises(BackendLoadError, match="tokenizer info path at .*absent.json does not exist"):
        check_parameters(
            p | {"guided_decoding_backend": "xgrammar", "xgrammar_tokenizer_info_path": missing}, trtllm_backend
        )
    info = tmp_path / "info.json"
    info.write_text("{}")
    with pytest.raises(BackendLoadError, match="Invalid guided_decoding_backend"):
        check_parameters(
            p | {"guided_decoding_backend": "outlines", "xgrammar_tokenizer_info_path": str(info)}, trtllm_backend
        )
    check_parameters(
        p | {"guided_decoding_backend": "xgrammar", "xgrammar_tokenizer_info_path": str(info)}, trtllm_backend
    )
    # an empty info path (or the unfilled template placeholder) turns guided decoding off
    check_parameters(p | {"guided_decoding_backend": "xgrammar"}, trtllm_backend)
    check_parameters(
        p | {"xgrammar_tokenizer_info_path": "${xgrammar_tokenizer_info_path}", "guided_decoding_backend": "xgrammar"},
        trtllm_backend,
    )
    no_path = {k: v for k, v in p.items() if k != "gpt_model_path"}
    with pytest.raises(BackendLoadError, match="Both encoder and decoder model paths are empty"):
        check_parameters(no_path, trtllm_backend)


def test_sim_engine_config_hands_the_real_parameters_to_the_double():
    real_text = model_configs(serving("redrafter", 2), "/e", "/t")[contract.ENGINE_MODEL]
    mc = model_config_pb2.ModelConfig()
    text_format.Parse(sim_engine_config(real_text, SimEngineSettings()), mc)
    given = {k: v.string_value for k, v in mc.parameters.items()}
    real = {k: v for k, v in given.items() if not k.startswith("sim_")}
    assert set(trtllm_backend.REQUIRED_PARAMETER_NAMES) <= set(real)
    assert given["sim_variant"] == "redrafter"
