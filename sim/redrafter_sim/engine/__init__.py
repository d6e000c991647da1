"""The simulated TensorRT-LLM engine: a Triton Python model with the tensorrt_llm model's I/O.

:func:`sim_engine_config` turns the generated tensorrt_llm config.pbtxt into the simulator's (same
inputs, outputs, batching and transaction policy; python backend; the real parameters kept and the
simulator's added under ``sim_``), and :func:`install_sim_engine` puts it into a generated repository in
place of the real engine. The simulated model checks the real parameters at load as TensorRT-LLM's
backend does (backend.py), so a config the real backend refuses does not load here either.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from engine_jobs import trtllm_backend

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
    (version / "_sim_control.py").write_text(pkg.joinpath("control.py").read_text(encoding="utf-8"), encoding="utf-8")
    (version / "_sim_backend.py").write_text(pkg.joinpath("backend.py").read_text(encoding="utf-8"), encoding="utf-8")
    facts = Path(trtllm_backend.__file__).read_text(encoding="utf-8")
    (version / "_trtllm_backend.py").write_text(facts, encoding="utf-8")
    config.write_text(text, encoding="utf-8")
