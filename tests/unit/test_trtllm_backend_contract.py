"""The generated tensorrt_llm config defines every parameter the pinned TensorRT-LLM backend requires,
and the simulated engine refuses a config without one, as the real backend does."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from engine_jobs import contract, trtllm_backend
from engine_jobs.contract import ServingConfig
from engine_jobs.model_repo import engine_parameters, model_configs
from redrafter_sim.engine import BackendLoadError, SimEngineSettings, check_parameters, sim_engine_config

# Read at TensorRT-LLM 1.0.0 (triton_backend/inflight_batcher_llm/src/model_instance_state.cc): the
# GetParameter<std::string> calls outside any try/catch. Pinned here so the list cannot shrink unnoticed.
UPSTREAM_REQUIRED = ("gpt_model_type", "tokenizer_dir", "xgrammar_tokenizer_info_path", "guided_decoding_backend")


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


def test_contract_lists_the_upstream_parameters_with_their_source():
    assert trtllm_backend.REQUIRED_PARAMETER_NAMES == UPSTREAM_REQUIRED
    for p in trtllm_backend.REQUIRED_PARAMETERS:
        assert p.source == "model_instance_state.cc" and p.function
        assert "TensorRT-LLM 1.0.0" in p.release and "25.09" in p.release


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
