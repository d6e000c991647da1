"""The launcher's argv: one tritonserver for TP=1, an MPMD mpirun with one rank per GPU for TP>1."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine_jobs import contract
from engine_jobs.contract import ServingConfig
from engine_jobs.serve import LaunchSettings, launch_argv, load_serving_config, prepare, rank_argv

S = LaunchSettings(tritonserver="/opt/tritonserver/bin/tritonserver", mpirun="/usr/local/mpi/bin/mpirun")


def test_tp1_is_one_tritonserver_serving_all_endpoints():
    argv = launch_argv(S, "/tmp/repo", 1)
    assert argv[0] == "/opt/tritonserver/bin/tritonserver"
    assert "--model-repository=/tmp/repo" in argv
    assert {
        "--http-port=8000",
        "--grpc-port=8001",
        "--metrics-port=8002",
        "--allow-metrics=true",
        "--metrics-config=histogram_latencies=true",
    } <= set(argv)
    assert "--model-control-mode=explicit" not in argv
    assert all(isinstance(a, str) for a in argv)


def test_tp8_runs_one_rank_per_gpu_and_only_rank0_serves():
    argv = launch_argv(S, "/tmp/repo", 8)
    assert argv[:2] == ["/usr/local/mpi/bin/mpirun", "--allow-run-as-root"]
    ranks, current = [], []
    for arg in argv[2:]:
        if arg == ":":
            ranks.append(current)
            current = []
        else:
            current.append(arg)
    ranks.append(current)
    assert len(ranks) == 8
    for i, rank in enumerate(ranks):
        assert rank[:3] == ["-n", "1", S.tritonserver]
        assert f"--backend-config=python,shm-region-prefix-name=prefix{i}_" in rank
        if i == 0:
            assert "--http-port=8000" in rank and "--allow-http=false" not in rank
        else:
            assert {
                "--allow-http=false",
                "--allow-grpc=false",
                "--allow-metrics=false",
                "--model-control-mode=explicit",
                f"--load-model={contract.ENGINE_MODEL}",
            } <= set(rank)


def test_rank_argv_honours_settings():
    s = LaunchSettings(
        tritonserver="ts",
        host="127.0.0.5",
        http_port=9000,
        grpc_port=9001,
        metrics_port=9002,
        backend_dir="/b",
        exit_timeout_secs=3,
        log_verbose=1,
    )
    argv = rank_argv(s, "/r", 0, shm_prefix="x")
    assert {
        "--http-address=127.0.0.5",
        "--grpc-address=127.0.0.5",
        "--metrics-address=127.0.0.5",
        "--http-port=9000",
        "--backend-directory=/b",
        "--exit-timeout-secs=3",
        "--log-verbose=1",
        "--backend-config=python,shm-region-prefix-name=x0_",
    } <= set(argv)


def test_invalid_tp_rejected():
    with pytest.raises(ValueError):
        launch_argv(S, "/r", 0)


def test_settings_from_env():
    s = LaunchSettings.from_env(
        {"REDRAFTER_TRITONSERVER": "/x/ts", "REDRAFTER_MODEL_REPO_DIR": "/w/repo", "REDRAFTER_EXIT_TIMEOUT_SECS": "45"}
    )
    assert (s.tritonserver, s.model_repo_dir, s.exit_timeout_secs) == ("/x/ts", "/w/repo", 45)
    assert LaunchSettings.from_env({}) == LaunchSettings()


def test_prepare_writes_repository_from_serving_json(tmp_path: Path):
    cfg = ServingConfig(
        deployment="chat", variant="base", engine_key="k", artifact_dir="/cache/k/", tensor_parallel=2, max_batch_size=8
    )
    path = tmp_path / "serving.json"
    path.write_text(cfg.model_dump_json())
    loaded = load_serving_config(path)
    argv = prepare(loaded, LaunchSettings(model_repo_dir=str(tmp_path / "repo")))
    assert argv[0] == "mpirun" and argv.count(":") == 1
    engine_cfg = (tmp_path / "repo" / contract.ENGINE_MODEL / "config.pbtxt").read_text()
    assert '"/cache/k/engine"' in engine_cfg
    pre_cfg = (tmp_path / "repo" / contract.PREPROCESSING_MODEL / "config.pbtxt").read_text()
    assert '"/cache/k/tokenizer"' in pre_cfg
    with pytest.raises(SystemExit, match="not found"):
        load_serving_config(tmp_path / "missing.json")


def test_cli_serve_dry_run(tmp_path: Path, monkeypatch, capsys):
    import json

    from engine_jobs.__main__ import main

    cfg = ServingConfig(
        deployment="chat",
        variant="redrafter",
        engine_key="k",
        artifact_dir="/cache/k",
        max_batch_size=8,
        draft_len_per_beam=4,
        num_beams=2,
    )
    path = tmp_path / "serving.json"
    path.write_text(cfg.model_dump_json())
    monkeypatch.setenv("REDRAFTER_MODEL_REPO_DIR", str(tmp_path / "repo"))
    monkeypatch.setenv("REDRAFTER_TRITONSERVER", "/x/tritonserver")
    assert main(["serve", "--config", str(path), "--dry-run"]) == 0
    argv = json.loads(capsys.readouterr().out)
    assert argv[0] == "/x/tritonserver" and f"--model-repository={tmp_path / 'repo'}" in argv
    assert (tmp_path / "repo" / contract.ENTRY_MODEL / "1" / "model.py").is_file()


def test_api_keys_keep_tritons_own_ports_inside_the_pod(tmp_path: Path):
    """With API keys, Triton's unauthenticated HTTP and gRPC listen on loopback only (the front reaches gRPC
    there); metrics stay on every address for scrapers. Without keys nothing changes."""
    from engine_jobs.serve import front_argv

    def served(keys: str | None, tp: int = 1) -> list[str]:
        cfg = ServingConfig(
            deployment="chat",
            variant="base",
            engine_key="k",
            artifact_dir="/cache/k",
            tensor_parallel=tp,
            max_batch_size=8,
            api_keys_dir=keys,
        )
        return prepare(cfg, LaunchSettings(model_repo_dir=str(tmp_path / "repo")))

    private = served(contract.API_KEYS_MOUNT)
    assert {"--http-address=127.0.0.1", "--grpc-address=127.0.0.1", "--metrics-address=0.0.0.0"} <= set(private)
    assert "--http-address=0.0.0.0" not in private and "--grpc-address=0.0.0.0" not in private
    rank0 = served(contract.API_KEYS_MOUNT, tp=2)
    assert rank0.count("--http-address=127.0.0.1") == 1 and rank0.count("--grpc-address=127.0.0.1") == 1
    assert {"--http-address=0.0.0.0", "--grpc-address=0.0.0.0"} <= set(served(None))
    front = front_argv(LaunchSettings(), "/etc/redrafter/serving.json")
    assert front[front.index("--grpc-url") + 1] == "127.0.0.1:8001"
