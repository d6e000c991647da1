"""A real tritonserver refuses to load the simulated engine from a config the real TensorRT-LLM backend
would refuse: the double is as strict as the backend about its required parameters."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from engine_jobs.contract import ENGINE_MODEL, ServingConfig
from redrafter_sim.engine import SimEngineSettings
from redrafter_sim.triton import TritonServer, TritonStartError, build_sim_repository

pytestmark = [pytest.mark.triton, pytest.mark.timeout(240)]


def drop_parameter(config: Path, name: str) -> None:
    mc = model_config_pb2.ModelConfig()
    text_format.Parse(config.read_text(encoding="utf-8"), mc)
    del mc.parameters[name]
    config.write_text(text_format.MessageToString(mc), encoding="utf-8")


def test_engine_config_without_tokenizer_dir_does_not_load(tmp_path: Path):
    cfg = ServingConfig(deployment="llm", variant="base", engine_key="k", artifact_dir="/cache/k", max_batch_size=4)
    tokenizer = tmp_path / "tokenizer"
    tokenizer.mkdir()
    repo = build_sim_repository(tmp_path / "repo", cfg, str(tokenizer), SimEngineSettings(variant="base"))
    drop_parameter(repo / ENGINE_MODEL / "config.pbtxt", "tokenizer_dir")
    server = TritonServer(repo, workdir=tmp_path / "work")
    with pytest.raises(TritonStartError):
        server.start()
    server.stop()
    log = server.log_path.read_text(errors="replace")
    assert "Cannot find parameter with name: tokenizer_dir" in log, server.log_tail()
