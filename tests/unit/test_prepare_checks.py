"""The PyTorch path's checks and layout, one function at a time (engine_jobs.validate, .plan, .prepare)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from engine_jobs.contract import BuildSpec
from engine_jobs.errors import BuildError, ExitCode
from engine_jobs.plan import estimate_prepared_bytes
from engine_jobs.prepare import move_tree, validate_prepare_spec
from engine_jobs.validate import (
    Vocabulary,
    eagle3_hidden_size,
    model_architecture,
    mtp_layers,
    same_vocabulary,
    validate_weights,
    vocabularies,
)


def refused(fn, *args) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(BuildError) as err:
        fn(*args)
    assert err.value.code == ExitCode.BAD_INPUT
    return err.value.reason


def spec(**changes) -> BuildSpec:  # type: ignore[no-untyped-def]
    data = {
        "variant": "base",
        "key": "abc123",
        "inputs": {},
        "base": {"uri": "hf://org/base"},
        "tokenizer": {"uri": "hf://org/base"},
        "dtype": "bfloat16",
        "limits": {"max_batch_size": 8, "max_input_len": 512, "max_seq_len": 1024, "max_num_tokens": 2048},
        "cache_dir": "/cache",
        "backend": "pytorch",
        "speculative": {"method": "ngram", "max_draft_len": 4},
        **changes,
    }
    return BuildSpec.model_validate(data)


def test_prepare_spec_rules():
    assert validate_prepare_spec(spec()) == "ngram"
    eagle = {"method": "eagle3", "max_draft_len": 3}
    assert "method eagle3 needs a drafter" in refused(validate_prepare_spec, spec(speculative=eagle))
    assert validate_prepare_spec(spec(speculative=eagle, drafter={"uri": "hf://org/head"})) == "eagle3"
    assert "drafts without a drafter" in refused(validate_prepare_spec, spec(drafter={"uri": "hf://org/head"}))
    assert "needs speculative" in refused(validate_prepare_spec, spec(speculative=None))
    assert "not a plain directory name" in refused(validate_prepare_spec, spec(key="../x"))


def test_mtp_layers_must_be_declared_and_enough():
    assert mtp_layers({"num_nextn_predict_layers": 2}, 1) == 2
    for declared in (None, 0, True, "1"):
        reason = refused(mtp_layers, {"num_nextn_predict_layers": declared}, 1)
        assert reason.startswith("spec.mtp.numNextnPredictLayers is 1 but the base config.json declares no MTP")
    assert "declares only 1 MTP layer (" in refused(mtp_layers, {"num_nextn_predict_layers": 1}, 2)


def test_architecture_is_required():
    assert model_architecture({"architectures": ["DeepseekV3ForCausalLM"]}, "base") == "DeepseekV3ForCausalLM"
    for bad in ({}, {"architectures": []}, {"architectures": [""]}):
        assert refused(model_architecture, bad, "draft model").startswith("draft model config.json names no arch")


def test_weights_single_file_index_and_shards(tmp_path: Path):
    assert "has no weights" in refused(validate_weights, tmp_path, "base")
    (tmp_path / "pytorch_model.bin").write_bytes(b"x")
    assert validate_weights(tmp_path, "base")["files"] == ["pytorch_model.bin"]
    (tmp_path / "model.safetensors").write_bytes(b"x")
    assert validate_weights(tmp_path, "base")["files"] == ["model.safetensors"]  # preferred, as upstream does
    index = {"weight_map": {"a": "s-1.safetensors", "b": "s-2.safetensors", "c": "s-1.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    (tmp_path / "s-1.safetensors").write_bytes(b"x")
    reason = refused(validate_weights, tmp_path, "base")
    assert (
        reason == "base checkpoint is missing shard s-2.safetensors, named in model.safetensors.index.json's weight_map"
    )
    (tmp_path / "s-2.safetensors").write_bytes(b"x")
    assert validate_weights(tmp_path, "base") == {
        "index": "model.safetensors.index.json",
        "files": ["s-1.safetensors", "s-2.safetensors"],
        "tensors": 3,
    }
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "../elsewhere"}}))
    assert "outside the checkpoint directory" in refused(validate_weights, tmp_path, "base")


def test_eagle3_head_must_fit_the_target():
    assert eagle3_hidden_size({"hidden_size": 64}, {"hidden_size": 64}) == 64
    assert eagle3_hidden_size({"target_hidden_size": 64, "hidden_size": 32}, {"hidden_size": 64}) == 64
    assert "expects a target hidden size of 32" in refused(eagle3_hidden_size, {"hidden_size": 32}, {"hidden_size": 64})


def _tokenizer(d: Path, words: list[str], added: list[str] = ()) -> Path:  # type: ignore[assignment]
    d.mkdir(parents=True, exist_ok=True)
    doc = {
        "model": {"type": "WordLevel", "vocab": {w: i for i, w in enumerate(words)}},
        "added_tokens": [{"id": len(words) + i, "content": a} for i, a in enumerate(added)],
    }
    (d / "tokenizer.json").write_text(json.dumps(doc))
    return d


def test_vocabularies_compare_on_the_best_common_source(tmp_path: Path):
    a = vocabularies(_tokenizer(tmp_path / "a", ["x", "y"], ["<s>"]), {"vocab_size": 4})
    b = vocabularies(_tokenizer(tmp_path / "b", ["x", "y"], ["<s>"]), {"vocab_size": 8})  # padded embeddings
    assert a["tokenizer.json"].size == 3
    assert same_vocabulary(a, b, "draft", "target").source == "tokenizer.json"  # not config.json's vocab_size
    c = vocabularies(_tokenizer(tmp_path / "c", ["x", "z"], ["<s>"]), None)
    reason = refused(same_vocabulary, c, a, "draft model d", "tokenizer t")
    assert reason.startswith("the draft model's tokenizer does not match the target's: draft model d has a 3-token")
    assert "tokenizer t has a 3-token vocabulary (tokenizer.json, sha256:" in reason
    sizes_only = {"config.json vocab_size": Vocabulary("config.json vocab_size", 4, None)}
    assert same_vocabulary(sizes_only, a, "d", "t").source == "config.json vocab_size"
    assert "cannot compare" in refused(same_vocabulary, {}, a, "d", "t")


def test_estimate_counts_only_copies():
    assert estimate_prepared_bytes(100, 10, 1, frozenset()) == 111
    assert estimate_prepared_bytes(100, 10, 1, frozenset({"base"})) == 11
    assert estimate_prepared_bytes(100, 10, 1, frozenset({"base", "drafter"})) == 1


def test_move_tree_takes_hugging_face_blobs_and_leaves_no_dangling_links(tmp_path: Path):
    repo = tmp_path / "hub" / "models--org--m"
    blobs, snapshot = repo / "blobs", repo / "snapshots" / "c0ffee"
    blobs.mkdir(parents=True)
    (snapshot / "sub").mkdir(parents=True)
    (blobs / "b1").write_text("config")
    (blobs / "b2").write_text("same bytes")
    os.symlink("../../blobs/b1", snapshot / "config.json")
    os.symlink("../../blobs/b2", snapshot / "a.json")
    os.symlink("../../../blobs/b2", snapshot / "sub" / "b.json")  # two names, one blob
    inode = (blobs / "b1").stat().st_ino
    dest = tmp_path / "artifact" / "checkpoint"
    assert move_tree(snapshot, dest) == len("config") + 2 * len("same bytes")
    assert (dest / "config.json").stat().st_ino == inode, "renamed, not copied"
    assert (dest / "sub" / "b.json").read_text() == (dest / "a.json").read_text() == "same bytes"
    assert not snapshot.exists() and list(blobs.iterdir()) == []


def test_move_tree_reports_a_vanished_download_as_retryable(tmp_path: Path):
    snapshot = tmp_path / "snap"
    snapshot.mkdir()
    os.symlink(tmp_path / "gone", snapshot / "model.safetensors")
    with pytest.raises(BuildError) as err:
        move_tree(snapshot, tmp_path / "dest")
    assert err.value.code == ExitCode.TOOL_FAILURE and "vanished" in err.value.reason
