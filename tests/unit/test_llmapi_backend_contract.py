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
        # the in-engine limit goes only where a drafter reads it (one-model Eagle3 and MTP would ignore it)
        assert spec.get("max_concurrency") == (6 if decoding in lb.DRAFTER_DECODING_TYPES else None)
        assert not {"acceptance_window", "acceptance_length_threshold"} & set(spec)


def test_draft_len_schedule_keys_are_lower_bounds_at_the_pin():
    """Which reading of ``draft_len_schedule`` TensorRT-LLM 1.2.1 has: lower-bound keys, "from this batch on".

    Read in NVIDIA/TensorRT-LLM ``tensorrt_llm/llmapi/llm_args.py``. The v1.2.1 tag's own commit is not in the
    search index (it stores main-branch versions of that file and forks' copies), so the 1.2 line was read in a
    stored release-1.2 era copy (the one with ``acceptance_window``/``acceptance_length_threshold`` and
    ``eagle3_model_arch``): its DecodingBaseConfig documents ``{1: 4, 4: 2, 8: 0}`` as batch >= 1 drafts 4, >= 4
    drafts 2, >= 8 drafts 0, and its validator requires the key 1 mapped to max_draft_len. The consumer,
    ``tensorrt_llm/_torch/speculative/drafter.py`` ``Drafter.get_draft_len_for_batch_size``, takes the largest
    key <= the batch (``bisect_right``). Main at commit 0004396720054fd8e205cbf616f21f0b57c6b412 reads the
    same field as upper bounds (``{4: 4, 8: 2, 32: 1}``: batches 1-4 draft 4, 33+ draft 0), exclusive with
    max_concurrency: PR #10860 (opened 2026-01-20 on main, approved 2026-03-03; main was already 1.3.0rc by
    2026-01-30) made that change, and 1.2.1 (version bump PR #12755, 2026-04-03) was cut from release/1.2
    (tensorrtllm_backend PR #853 moves from release/1.2 / 1.2.0rc8 to the release/1.2.1 tag), so it keeps the
    lower bounds. That is the reading best supported by the dates, not one read at the tag itself.
    """
    assert lb.DRAFT_LEN_SCHEDULE_KEYS == "lower_bound"
    upstream_example = {1: 4, 4: 2, 8: 0}
    assert [lb.draft_len_for_batch(upstream_example, b) for b in range(1, 10)] == [4, 4, 4, 2, 2, 2, 2, 0, 0]
    # the same keys under main's (upper-bound) reading would give 4 at batch 1, 2 at 2-4, 0 at 5-8: not this pin
    assert lb.draft_len_for_batch(upstream_example, 3) == 4
    # a schedule written for main's reading has no key 1 and is refused by the pinned validator, in its words
    assert lb.check_draft_len_schedule({4: 4, 8: 2, 32: 1}, 4) == [
        "draft_len_schedule must include batch_size=1. All systems can have batch_size=1. "
        "Add {1: <max_draft_len>} to your schedule."
    ]


def test_max_concurrency_as_a_lower_bound_schedule_drafts_at_the_same_batches():
    """max_concurrency N drafts while the batch is <= N (Drafter.should_use_spec_decode); under lower-bound keys
    that is {1: K, N + 1: 0} (main's translation {N: K} is the upper-bound spelling of the same cut)."""
    assert lb.schedule_for_max_concurrency(8, 3) == {1: 3, 9: 0}
    schedule = lb.schedule_for_max_concurrency(8, 3)
    assert [lb.draft_len_for_batch(schedule, b) > 0 for b in range(1, 21)] == [b <= 8 for b in range(1, 21)]


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        ({1: 4, 0: 2}, "draft_len_schedule: batch size threshold must be >= 1, got 0"),
        ({1: 4, 4: -1}, "draft_len_schedule: draft length must be >= 0, got -1"),
        (
            {1: 3, 4: 2},
            "draft_len_schedule[1] must equal max_draft_len for consistency. Got schedule[1]=3, but "
            "max_draft_len=4. batch_size=1 should use maximum draft length.",
        ),
        (
            {1: 4, 4: 5},
            "draft_len_schedule: all draft lengths must be <= max_draft_len. Got draft_len=5 for batch_size=4, "
            "but max_draft_len=4.",
        ),
    ],
)
def test_a_bad_schedule_is_refused_in_the_pinned_validators_words(schedule: dict, message: str):
    spec = dict(GOOD["NGram"], draft_len_schedule=schedule)
    assert lb.check_model_yaml(_doc(spec)) == [f"speculative_config.NGram: {message}"]
    assert lb.check_model_yaml(_doc(dict(GOOD["NGram"], draft_len_schedule={1: 4, 6: 2, 9: 0}))) == []


def test_only_the_two_model_drafters_read_the_schedule_at_the_pin():
    """Stage 1 (PR #8194) wired the schedule into NGramDrafter and ModelDrafter; upstream's
    tests/unittest/_torch/speculative/test_draft_len_schedule.py runs NGram and DraftTarget and lists
    "ChainDrafter/Eagle3 static loops" as not covered. The one-model path came with PR #10860, after 1.2.1."""
    assert lb.DRAFTER_DECODING_TYPES == {"NGram", "Draft_Target"}


@pytest.mark.parametrize(
    ("example", "scheduled"),
    [("qwen2.5-coder-7b-ngram", True), ("draft", True), ("llama3.1-8b-eagle3", False), ("deepseek-v3-mtp", False)],
)
def test_a_measured_schedule_replaces_max_concurrency_where_the_pin_reads_it(example: str, scheduled: bool):
    """With a promoted pair whose sweep found a shorter draft paying, NGram and draft-model engines get the
    schedule (and no max_concurrency); Eagle3 and MTP (one-model: no drafter reads either) get neither; the
    document passes."""
    from engine_jobs.llmapi_config import model_yaml
    from redrafter_operator.render.common import Owner
    from redrafter_operator.render.serving import serving_config

    body = _example(example)
    cfg0 = serving_config(Owner.from_body(body), "redrafter", "k")
    assert cfg0.speculative is not None
    k = cfg0.speculative.max_draft_len
    body["status"] = {
        "validation": {
            "promoted": {
                "redrafterKey": "k",
                "baseKey": "k",
                "crossoverConcurrency": 9.4,
                "draftLenSchedule": {"1": k, "6": 1, "10": 0},
            }
        }
    }
    cfg = serving_config(Owner.from_body(body), "redrafter", "k")
    spec = model_yaml(cfg)["speculative_config"]
    assert lb.check_model_yaml(model_yaml(cfg)) == []
    if scheduled:
        assert spec["draft_len_schedule"] == {1: k, 6: 1, 10: 0} and "max_concurrency" not in spec
    else:
        assert "max_concurrency" not in spec and "draft_len_schedule" not in spec
    assert "draft_len_schedule" not in model_yaml(serving_config(Owner.from_body(body), "base", "k"))


def _example(example: str) -> dict:
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[2] / "examples"
    if example == "draft":
        body = yaml.safe_load((root / "llama3.1-8b-eagle3.yaml").read_text())
        body["spec"]["method"] = "draftModel"
        body["spec"].pop("eagle3")
        body["spec"]["model"]["drafter"] = {"source": "hf://meta-llama/Llama-3.2-1B-Instruct"}
        return body
    return yaml.safe_load((root / f"{example}.yaml").read_text())
