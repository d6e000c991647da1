"""The simulated TensorRT-LLM engines: Triton Python models with the tensorrt_llm model's I/O.

:func:`sim_engine_config` turns the generated tensorrt_llm config.pbtxt into the simulator's (same
inputs, outputs, batching and transaction policy; python backend; the real parameters kept and the
simulator's added under ``sim_``), and :func:`install_sim_engine` puts it into a generated repository in
place of the real engine. The simulated model checks the real parameters at load as TensorRT-LLM's
backend does (backend.py), so a config the real backend refuses does not load here either.

The PyTorch path's engine model is Triton's llmapi model: :func:`install_sim_llmapi_engine` puts the
simulated one (llmapi_model.py) next to the generated ``model.yaml``, and it refuses at load what upstream
refuses (``engine_jobs/llmapi_backend.py``). :func:`install_sim_engine_for` picks by the ServingConfig's
backend. Both share the batching loop (batching.py), the controls (control.py) and the greedy model and
drafting (speculation.py).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from engine_jobs import llmapi_backend, trtllm_backend
from engine_jobs.contract import ServingConfig
from engine_jobs.model_repo import LLMAPI_CONFIG_FILE

from .backend import BackendLoadError, check_parameters
from .control import ENV_CONTROL, SimControl, read_control, write_control
from .load import add_load_gauges

__all__ = [
    "ENV_CONTROL",
    "SIM_PARAMETER_PREFIX",
    "BackendLoadError",
    "SimControl",
    "SimEngineSettings",
    "add_load_gauges",
    "check_parameters",
    "install_sim_engine",
    "install_sim_engine_for",
    "install_sim_llmapi_engine",
    "read_control",
    "sim_engine_config",
    "write_control",
]


#: the simulator's own parameters sit beside the real backend's under this prefix (no name clash)
SIM_PARAMETER_PREFIX = "sim_"


@dataclass(frozen=True)
class SimEngineSettings:
    """Start-up parameters of the simulator (run-time changes go through the control file)."""

    variant: str = "redrafter"
    draft_len_per_beam: int = 4
    num_beams: int = 2
    acceptance_rate: float = 0.7
    step_ms: float = 2.0
    load_factor: float = 0.05  # step latency grows by this fraction per extra request in the batch
    draft_ms_per_token: float = 0.02  # extra latency per drafted token per generating request
    vocab_size: int = 1000
    first_token_id: int = 3  # ids below are special tokens (pad/eos/unk), never generated
    control_file: str = ""
    ledger_file: str = ""

    def parameters(self) -> dict[str, str]:
        return {SIM_PARAMETER_PREFIX + k: str(v) for k, v in self.__dict__.items() if str(v) != ""}


def sim_engine_config(engine_config_text: str, settings: SimEngineSettings) -> str:
    """The simulator's config.pbtxt: the real engine's I/O, batching and parameters, python backend, sim params."""
    cfg = model_config_pb2.ModelConfig()
    text_format.Parse(engine_config_text, cfg)
    cfg.backend = "python"
    for key, value in settings.parameters().items():
        cfg.parameters[key].string_value = value
    return text_format.MessageToString(cfg)


#: modules either simulated model imports: source in this package -> name next to the model
SHARED_MODULES = {
    "control.py": "_sim_control.py",
    "batching.py": "_sim_batching.py",
    "speculation.py": "_sim_speculation.py",
}


def _copy_shared(version: Path) -> None:
    pkg = resources.files(__name__)
    for src, dest in SHARED_MODULES.items():
        (version / dest).write_text(pkg.joinpath(src).read_text(encoding="utf-8"), encoding="utf-8")


def install_sim_engine(model_dir: Path, settings: SimEngineSettings) -> None:
    """Replace the tensorrt_llm model at ``model_dir`` (config.pbtxt kept for its I/O) by the simulator."""
    model_dir = Path(model_dir)
    config = model_dir / "config.pbtxt"
    text = sim_engine_config(config.read_text(encoding="utf-8"), settings)
    version = model_dir / "1"
    if version.exists():
        shutil.rmtree(version)
    version.mkdir(parents=True)
    pkg = resources.files(__name__)
    (version / "model.py").write_text(pkg.joinpath("model.py").read_text(encoding="utf-8"), encoding="utf-8")
    (version / "_sim_backend.py").write_text(pkg.joinpath("backend.py").read_text(encoding="utf-8"), encoding="utf-8")
    _copy_shared(version)
    facts = Path(trtllm_backend.__file__).read_text(encoding="utf-8")
    (version / "_trtllm_backend.py").write_text(facts, encoding="utf-8")
    config.write_text(text, encoding="utf-8")


def install_sim_llmapi_engine(model_dir: Path, settings: SimEngineSettings) -> None:
    """Put the simulated llmapi model next to the generated ``model_dir/1/model.yaml`` (kept as written).

    Upstream's model code, if the writer copied it, is replaced; the config.pbtxt keeps its I/O and gets
    the simulator's ``sim_`` parameters (upstream's model ignores parameters it does not know).
    """
    model_dir = Path(model_dir)
    config = model_dir / "config.pbtxt"
    text = sim_engine_config(config.read_text(encoding="utf-8"), settings)
    version = model_dir / "1"
    if not (version / LLMAPI_CONFIG_FILE).is_file():
        raise FileNotFoundError(f"{version} has no model.yaml: not a PyTorch-path (llmapi) repository")
    for name in ("model.py", "helpers.py"):
        (version / name).unlink(missing_ok=True)
    pkg = resources.files(__name__)
    (version / "model.py").write_text(pkg.joinpath("llmapi_model.py").read_text(encoding="utf-8"), encoding="utf-8")
    _copy_shared(version)
    (version / "_llmapi_backend.py").write_text(
        Path(llmapi_backend.__file__).read_text(encoding="utf-8"), encoding="utf-8"
    )
    tokenizer = resources.files("engine_jobs.triton_models").joinpath("_tokenizer.py")
    (version / "_tokenizer.py").write_text(tokenizer.read_text(encoding="utf-8"), encoding="utf-8")
    config.write_text(text, encoding="utf-8")


def install_sim_engine_for(cfg: ServingConfig, model_dir: Path, settings: SimEngineSettings) -> None:
    """The simulated engine that stands in for ``cfg``'s: the llmapi one on the PyTorch path."""
    if cfg.backend == "pytorch":
        install_sim_llmapi_engine(model_dir, settings)
    else:
        install_sim_engine(model_dir, settings)
