"""The llmapi (PyTorch backend) contract: pinned upstream key lists, and check_model_yaml in upstream's words."""

from __future__ import annotations

import copy

import pytest

from engine_jobs import llmapi_backend as lb

# NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py, release-1.2 era version (DecodingBaseConfig).
BASE = {
    "decoding_type",
    "max_draft_len",
    "max_total_draft_tokens",
    "speculative_model",
    "speculative_model_dir",
    "max_concurrency",
    "draft_len_schedule",
    "load_format",
    "acceptance_window",
    "acceptance_length_threshold",
    "allow_advanced_sampling",
}
# Same file: EagleDecodingConfig (Eagle3DecodingConfig adds only its tag), MTP, NGram, DraftTarget.
EAGLE3 = {
    "eagle_choices",
    "greedy_sampling",
    "posterior_threshold",
    "use_dynamic_tree",
    "dynamic_tree_max_topK",
    "num_eagle_layers",
    "max_non_leaves_per_layer",
    "eagle3_one_model",
    "eagle3_layers_to_capture",
    "eagle3_model_arch",
}
MTP = {
    "num_nextn_predict_layers",
    "use_relaxed_acceptance_for_thinking",
    "relaxed_topk",
    "relaxed_delta",
    "use_mtp_vanilla",
    "mtp_eagle_one_model",
    "begin_thinking_phase_token",
    "end_thinking_phase_token",
}
NGRAM = {"max_matching_ngram_size", "is_keep_all", "is_use_oldest", "is_public_pool"}
# triton_backend/all_models/llmapi/tensorrt_llm/1/model.py (commit 044a90d2): triton_config reads.
TRITON_REQUIRED = {"decoupled", "max_batch_size"}
# tensorrtllm_backend docs/llmapi.md (commit 0b9d7d5), sample response with perf metrics.
SPEC_PERF = ("acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens")


def _doc(spec: dict | None = None) -> dict:
    doc: dict = {
        "model": "/models/target",
        "backend": "pytorch",
        "tensor_parallel_size": 1,
        "max_batch_size": 64,
        "max_num_tokens": 8192,
        "max_seq_len": 4096,
        "kv_cache_config": {"free_gpu_memory_fraction": 0.85},
        "triton_config": {"max_batch_size": 0, "decoupled": True},
    }
    if spec is not None:
        doc["speculative_config"] = spec
    return doc


GOOD = {
    "Eagle3": {
        "decoding_type": "Eagle3",
        "max_draft_len": 3,
        "speculative_model_dir": "/models/eagle3",
        "eagle3_one_model": True,
    },
    "MTP": {"decoding_type": "MTP", "num_nextn_predict_layers": 3},
    "NGram": {
        "decoding_type": "NGram",
        "max_draft_len": 4,
        "max_matching_ngram_size": 2,
        "is_public_pool": False,
    },
    "DraftTarget": {
        "decoding_type": "DraftTarget",
        "max_draft_len": 4,
        "speculative_model": "/models/draft",
        "max_concurrency": 16,
    },
}


def test_pinned_key_lists_match_what_was_read():
    assert lb.BASE_SPEC_KEYS == BASE
    assert lb.METHOD_SPEC_KEYS == {
        "Eagle3": EAGLE3,
        "MTP": MTP,
        "NGram": NGRAM,
        "Draft_Target": set(),
    }
    assert lb.TRITON_CONFIG_REQUIRED == TRITON_REQUIRED
    assert lb.SPEC_PERF_OUTPUTS == SPEC_PERF
    assert set(SPEC_PERF) <= set(lb.PERF_OUTPUTS)
    assert lb.PERF_REQUEST_INPUT == "sampling_param_return_perf_metrics"
    assert lb.MODEL_FILES[1] == "tensorrt_llm/1/model.py"
    assert "1.2.1" in lb.BACKEND_RELEASE


def test_the_draft_target_tag_is_upstreams_literal():
    assert lb.canonical_decoding_type("DraftTarget") == "Draft_Target"
    assert lb.canonical_decoding_type("Draft_Target") == "Draft_Target"
    assert lb.canonical_decoding_type("Redrafter") is None
    assert lb.canonical_decoding_type(3) is None


@pytest.mark.parametrize("method", sorted(GOOD))
def test_good_documents_pass(method: str):
    assert lb.check_model_yaml(_doc(GOOD[method])) == []


def test_a_document_without_speculation_passes():
    assert lb.check_model_yaml(_doc()) == []


@pytest.mark.parametrize("method", sorted(GOOD))
def test_an_unknown_speculative_key_is_extra_forbidden(method: str):
    spec = copy.deepcopy(GOOD[method])
    spec["num_speculative_tokens"] = 3  # vLLM's name, not TensorRT-LLM's
    tag = lb.canonical_decoding_type(spec["decoding_type"])
    assert lb.check_model_yaml(_doc(spec)) == [
        f"speculative_config.{tag}.num_speculative_tokens: Extra inputs are not permitted"
    ]


def test_a_key_of_another_method_is_extra_forbidden():
    spec = dict(GOOD["NGram"], eagle3_one_model=True)
    assert lb.check_model_yaml(_doc(spec)) == [
        "speculative_config.NGram.eagle3_one_model: Extra inputs are not permitted"
    ]


def test_the_renamed_acceptance_keys_of_later_releases_are_refused():
    spec = dict(GOOD["Eagle3"], acceptance_rate_threshold=0.3)
    assert lb.check_model_yaml(_doc(spec)) == [
        "speculative_config.Eagle3.acceptance_rate_threshold: Extra inputs are not permitted"
    ]
    assert lb.check_model_yaml(_doc(dict(GOOD["Eagle3"], acceptance_length_threshold=1.5))) == []


@pytest.mark.parametrize(
    ("method", "drop", "message"),
    [
        ("Eagle3", "speculative_model_dir", "speculative_config.Eagle3: Draft model must be provided for EAGLE"),
        ("Eagle3", "max_draft_len", "speculative_config.Eagle3: max_draft_len must be > 0 for Eagle"),
        ("NGram", "max_draft_len", "speculative_config.NGram: max_draft_len must be > 0 for NGram"),
        (
            "DraftTarget",
            "speculative_model",
            "speculative_config.Draft_Target: speculative_model must be specified for DraftTarget",
        ),
        (
            "DraftTarget",
            "max_draft_len",
            "speculative_config.Draft_Target: max_draft_len must be > 0 for DraftTarget",
        ),
    ],
)
def test_a_missing_required_key_is_refused_in_upstreams_words(method: str, drop: str, message: str):
    spec = copy.deepcopy(GOOD[method])
    del spec[drop]
    assert lb.check_model_yaml(_doc(spec)) == [message]


def test_zero_draft_length_is_refused_like_a_missing_one():
    spec = dict(GOOD["NGram"], max_draft_len=0)
    assert lb.check_model_yaml(_doc(spec)) == ["speculative_config.NGram: max_draft_len must be > 0 for NGram"]


def test_mtp_needs_no_draft_length():
    assert lb.check_model_yaml(_doc({"decoding_type": "MTP"})) == []


def test_a_bad_decoding_type_names_upstreams_tags():
    (error,) = lb.check_model_yaml(_doc({"decoding_type": "ReDrafter", "max_draft_len": 4}))
    assert error.startswith(
        "speculative_config: Input tag 'ReDrafter' found using 'decoding_type' does not match any of the expected tags: "
    )
    assert "'Draft_Target'" in error and "'Eagle3'" in error and "'MTP'" in error


def test_a_missing_decoding_type_is_refused():
    assert lb.check_model_yaml(_doc({"max_draft_len": 4})) == [
        "speculative_config: Unable to extract tag using discriminator 'decoding_type'"
    ]


def test_an_upstream_method_the_operator_does_not_serve_is_refused():
    (error,) = lb.check_model_yaml(_doc({"decoding_type": "Medusa", "max_draft_len": 4}))
    assert "Medusa" in error


def test_triton_config_and_model_are_required():
    doc = _doc()
    del doc["triton_config"]["decoupled"]
    del doc["model"]
    assert lb.check_model_yaml(doc) == [
        "triton_config.decoupled: Field required",
        "model: Field required",
    ]
    assert lb.check_model_yaml({"model": "m"}) == ["triton_config: Field required"]


def test_an_unknown_top_level_key_is_extra_forbidden():
    doc = dict(_doc(), max_batch_sise=8)
    assert lb.check_model_yaml(doc) == ["max_batch_sise: Extra inputs are not permitted"]


def test_the_module_is_standard_library_only():
    import ast
    from pathlib import Path

    tree = ast.parse(Path(lb.__file__).read_text())
    roots = {
        (n.module or "").split(".")[0] if isinstance(n, ast.ImportFrom) else a.name.split(".")[0]
        for n in ast.walk(tree)
        if isinstance(n, ast.Import | ast.ImportFrom)
        for a in (n.names if isinstance(n, ast.Import) else [n])
    }
    assert roots <= {"__future__", "collections", "typing"}


@pytest.mark.parametrize("example", ["llama3.1-8b-eagle3", "deepseek-v3-mtp", "qwen2.5-coder-7b-ngram", "draft"])
@pytest.mark.parametrize("variant", ["redrafter", "base"])
def test_every_key_the_operator_writes_is_one_upstream_reads(example: str, variant: str):
    """The model.yaml a serving pod writes, for each method and both variants, passes the pinned contract:
    every top-level key is an LLM-API field (or model.py's triton_config), every speculative_config key one
    its decoding_type's config class declares; the one-way acceptance switch is never written."""
    from pathlib import Path

    import yaml

    from engine_jobs.llmapi_config import model_yaml
    from redrafter_operator.render.common import Owner
    from redrafter_operator.render.serving import serving_config

    root = Path(__file__).resolve().parents[2] / "examples"
    if example == "draft":
        body = yaml.safe_load((root / "llama3.1-8b-eagle3.yaml").read_text())
        body["spec"]["method"] = "draftModel"
        body["spec"].pop("eagle3")
        body["spec"]["model"]["drafter"] = {"source": "hf://meta-llama/Llama-3.2-1B-Instruct"}
    else:
        body = yaml.safe_load((root / f"{example}.yaml").read_text())
    body["status"] = {"validation": {"promoted": {"redrafterKey": "k", "baseKey": "k", "crossoverConcurrency": 6.0}}}
    doc = model_yaml(serving_config(Owner.from_body(body), variant, "k"))  # type: ignore[arg-type]
    assert lb.check_model_yaml(doc) == []
    assert set(doc) <= lb.MODEL_YAML_KEYS
    spec = doc.get("speculative_config")
    assert (spec is not None) == (variant == "redrafter")
    if spec is not None:
        decoding = lb.canonical_decoding_type(spec["decoding_type"])
        assert decoding is not None
        assert set(spec) <= lb.BASE_SPEC_KEYS | lb.METHOD_SPEC_KEYS[decoding]
        assert spec["max_concurrency"] == 6
        assert not {"acceptance_window", "acceptance_length_threshold"} & set(spec)
