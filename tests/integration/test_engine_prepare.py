"""``python -m engine_jobs build`` for the PyTorch path, as its Job runs it: fetch, verify, lay out, publish.

Build specs are the operator's own rendering of a resource per method; sources are the simulated cluster's
fixtures (``redrafter_sim.checkpoint``) in a Hugging Face cache used offline, or pvc:// directories.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_engine_build import REPO, Env  # noqa: I001 (same dir)

from engine_jobs.contract import MANIFEST_FILE, MODEL_REPO_DIR, BuildResult
from redrafter_operator.render.build import build_spec
from redrafter_operator.render.common import Owner
from redrafter_sim.checkpoint import FIXTURES, fixture_commit, write_hf_fixture

ORG = "redrafter-sim"
#: the resource per method (sources name the sim's fixtures; see FIXTURES)
METHODS: dict[str, dict[str, Any]] = {
    "eagle3": {"model": {"drafter": {"source": f"hf://{ORG}/tiny-llama-eagle3"}}, "eagle3": {"maxDraftLen": 3}},
    "mtp": {"model": {"base": {"source": f"hf://{ORG}/tiny-deepseek-mtp"}}, "mtp": {"numNextnPredictLayers": 1}},
    "ngram": {"ngram": {"maxDraftLen": 4, "maxMatchingNgramSize": 2}},
    "draftModel": {"model": {"drafter": {"source": f"hf://{ORG}/tiny-llama-draft"}}, "draftModel": {"maxDraftLen": 4}},
}


def owner(method: str, **changes: Any) -> Owner:
    body = yaml.safe_load((REPO / "examples" / "demo-tiny.yaml").read_text())
    spec = body["spec"]
    del spec["redrafter"], spec["model"]["architecture"]
    spec["model"] = {"base": {"source": f"hf://{ORG}/tiny-llama"}}
    spec["method"] = method
    for block, value in {**METHODS[method], **changes}.items():
        spec[block] = {**spec.get(block, {}), **value} if isinstance(value, dict) else value
    return Owner.from_body(body)


def prepare_spec(env: Env, own: Owner, variant: str = "redrafter") -> Path:
    """The build.json the operator renders for ``variant``, its sources in the offline Hugging Face cache."""
    bs = build_spec(own.spec, variant)  # type: ignore[arg-type]
    data = json.loads(bs.wire_json())
    data["cache_dir"] = str(env.cache)
    for ref in (bs.base, bs.tokenizer, bs.drafter):
        if ref is not None and ref.uri.startswith("hf://"):
            write_hf_fixture(env.hf_home / "hub", ref.uri[len("hf://") :], ref.revision or "main")
    path = env.root / f"{bs.key}-{variant}.spec.json"
    path.write_text(json.dumps(data))
    return path


@pytest.fixture
def env(tmp_path: Path) -> Env:
    return Env(tmp_path)


def published(env: Env, spec_path: Path) -> tuple[Path, dict]:
    key = json.loads(spec_path.read_text())["key"]
    artifact = env.cache / key
    return artifact, json.loads((artifact / MANIFEST_FILE).read_text())


@pytest.mark.parametrize("method", sorted(METHODS))
def test_prepare_publishes_the_checkpoints_for_both_variants(env: Env, method: str):
    spec_path = prepare_spec(env, owner(method))
    result = env.run(spec_path)
    assert result.returncode == 0, result.stdout + result.stderr
    artifact, manifest = published(env, spec_path)
    assert manifest["backend"] == "pytorch" and manifest["method"] == method
    assert manifest["variants"] == ["redrafter", "base"] and manifest["prepared_by"] == "redrafter"
    assert (artifact / "checkpoint" / "config.json").is_file()
    assert (artifact / "tokenizer" / "tokenizer.json").is_file()
    assert (artifact / "draft").is_dir() == (method in ("eagle3", "draftModel"))
    assert env.tool_calls() == [], "no TensorRT-LLM tool runs on the PyTorch path"
    assert env.leftovers() == []
    # the downloads were renamed into the artifact, not copied: the Hugging Face snapshot gave its files up
    base_repo = json.loads(spec_path.read_text())["base"]["uri"][len("hf://") :]
    snapshot = env.hf_home / "hub" / f"models--{base_repo.replace('/', '--')}" / "snapshots" / fixture_commit(base_repo)
    assert not (snapshot / "config.json").exists()
    assert manifest["sizes"]["moved"] == sorted(["base", *(["drafter"] if (artifact / "draft").is_dir() else [])])
    assert manifest["sources"]["base"]["resolved"] == fixture_commit(base_repo)
    verified = manifest["verified"]
    assert verified["method"] == method
    if method == "mtp":
        assert verified["mtp_layers_declared"] == 1 and verified["mtp_layers_requested"] == 1
        assert verified["weights"]["checkpoint"]["index"] == "model.safetensors.index.json"
        assert len(verified["weights"]["checkpoint"]["files"]) == 2
    if method == "draftModel":
        assert verified["tokenizer_match"]["compared"] == "tokenizer.json"
    # a servable repository: the llmapi model reads the published checkpoint with the method's config
    model_yaml = yaml.safe_load((artifact / MODEL_REPO_DIR / "tensorrt_llm" / "1" / "model.yaml").read_text())
    assert model_yaml["model"] == str(artifact / "checkpoint")
    assert model_yaml["tokenizer"] == str(artifact / "tokenizer")
    decoding = {"eagle3": "Eagle3", "mtp": "MTP", "ngram": "NGram", "draftModel": "Draft_Target"}[method]
    assert model_yaml["speculative_config"]["decoding_type"] == decoding
    if method in ("eagle3", "draftModel"):
        assert model_yaml["speculative_config"]["speculative_model_dir"] == str(artifact / "draft")
    message = env.termination.read_text()
    assert message.startswith(f"OK: engine {manifest['key']} (redrafter) is complete")
    reported = BuildResult.from_message(message)
    assert reported is not None and reported.size_bytes == manifest["sizes"]["artifact_bytes"] > 0


def test_the_other_variant_finds_the_artifact_in_the_cache(env: Env):
    own = owner("eagle3")
    first = prepare_spec(env, own, "redrafter")
    second = prepare_spec(env, own, "base")
    assert json.loads(first.read_text())["key"] == json.loads(second.read_text())["key"]
    assert env.run(first).returncode == 0
    built = published(env, first)[1]["builder"]["built_at"]
    again = env.run(second)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "cache hit" in again.stdout
    assert env.termination.read_text().startswith(f"OK: engine {json.loads(second.read_text())['key']} (base) ")
    assert published(env, second)[1]["builder"]["built_at"] == built


def test_pvc_sources_are_copied_and_left_in_place(env: Env):
    for name in ("tiny-llama", "tiny-llama-draft"):
        FIXTURES[name](env.sources / "models" / name)
    (env.sources / "models" / "tiny-llama" / "original").mkdir()
    (env.sources / "models" / "tiny-llama" / "original" / "consolidated.00.pth").write_bytes(b"\0" * 100)
    own = owner(
        "draftModel",
        model={"base": {"source": "pvc://models/tiny-llama"}, "drafter": {"source": "pvc://models/tiny-llama-draft"}},
    )
    spec_path = prepare_spec(env, own)
    result = env.run(spec_path)
    assert result.returncode == 0, result.stdout + result.stderr
    artifact, manifest = published(env, spec_path)
    assert manifest["sizes"]["moved"] == []
    assert (env.sources / "models" / "tiny-llama" / "model.safetensors").is_file(), "a claim is read, not emptied"
    assert (artifact / "checkpoint" / "model.safetensors").is_file()
    assert not (artifact / "checkpoint" / "original").exists(), "what serving never reads is not copied"
    assert (artifact / "draft" / "tokenizer.json").is_file()


# ---- bad input: non-retryable, named ---------------------------------------------------------------


def _hub_snapshot(env: Env, name: str) -> Path:
    repo = f"{ORG}/{name}"
    snapshot = write_hf_fixture(env.hf_home / "hub", repo)
    assert snapshot is not None
    return snapshot


def _mtp_undeclared(env: Env) -> Owner:
    snapshot = _hub_snapshot(env, "tiny-deepseek-mtp")
    config = json.loads((snapshot / "config.json").read_text())
    del config["num_nextn_predict_layers"]
    (snapshot / "config.json").write_text(json.dumps(config))
    return owner("mtp")


def _mtp_too_few(env: Env) -> Owner:
    return owner("mtp", mtp={"numNextnPredictLayers": 3})


def _draft_other_tokenizer(env: Env) -> Owner:
    return owner("draftModel", model={"drafter": {"source": f"hf://{ORG}/tiny-llama-draft-other-tokenizer"}})


def _missing_shard(env: Env) -> Owner:
    (_hub_snapshot(env, "tiny-deepseek-mtp") / "model-00002-of-00002.safetensors").unlink()
    return owner("mtp")


def _no_architecture(env: Env) -> Owner:
    snapshot = _hub_snapshot(env, "tiny-llama")
    config = json.loads((snapshot / "config.json").read_text())
    del config["architectures"]
    (snapshot / "config.json").write_text(json.dumps(config))
    return owner("ngram")


def _eagle3_head_without_weights(env: Env) -> Owner:
    (_hub_snapshot(env, "tiny-llama-eagle3") / "model.safetensors").unlink()
    return owner("eagle3")


BAD_INPUTS = {
    "mtp-undeclared": (
        _mtp_undeclared,
        "BAD_INPUT: spec.mtp.numNextnPredictLayers is 1 but the base config.json declares no MTP layers "
        "(num_nextn_predict_layers: null)",
    ),
    "mtp-too-few": (
        _mtp_too_few,
        "BAD_INPUT: spec.mtp.numNextnPredictLayers is 3 but the base config.json declares only 1 MTP layer "
        "(num_nextn_predict_layers: 1)",
    ),
    "draft-tokenizer-mismatch": (
        _draft_other_tokenizer,
        f"BAD_INPUT: the draft model's tokenizer does not match the target's: draft model hf://{ORG}/"
        f"tiny-llama-draft-other-tokenizer has a 1000-token vocabulary (tokenizer.json, sha256:",
    ),
    "missing-shard": (
        _missing_shard,
        "BAD_INPUT: base checkpoint is missing shard model-00002-of-00002.safetensors, named in "
        "model.safetensors.index.json's weight_map",
    ),
    "no-architecture": (_no_architecture, "BAD_INPUT: base config.json names no architecture"),
    "eagle3-head-without-weights": (_eagle3_head_without_weights, "BAD_INPUT: EAGLE-3 head checkpoint has no weights"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_checkpoints_are_refused_before_anything_is_published(env: Env, case: str):
    make, message = BAD_INPUTS[case]
    spec_path = prepare_spec(env, make(env))
    result = env.run(spec_path)
    assert result.returncode == 2, result.stdout + result.stderr  # BAD_INPUT: non-retryable
    termination = env.termination.read_text()
    assert termination.startswith(message), termination
    if case == "draft-tokenizer-mismatch":  # names both sides
        assert f"tokenizer hf://{ORG}/tiny-llama has a 1000-token vocabulary" in termination
    assert env.leftovers() == []
    assert not (env.cache / json.loads(spec_path.read_text())["key"]).exists()


def test_insufficient_disk_is_refused_before_anything_moves(env: Env):
    spec_path = prepare_spec(env, owner("ngram"))
    result = env.run(spec_path, REDRAFTER_DISK_RESERVE_BYTES=str(1 << 60))
    assert result.returncode == 4
    assert env.termination.read_text().startswith("OUT_OF_DISK: not enough free space on the cache volume")
    snapshot = env.hf_home / "hub" / f"models--{ORG}--tiny-llama" / "snapshots" / fixture_commit(f"{ORG}/tiny-llama")
    assert (snapshot / "model.safetensors").is_file(), "the download stays where it was"
    shutil.rmtree(env.cache, ignore_errors=True)
