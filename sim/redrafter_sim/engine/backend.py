"""The load-time parameter checks of TensorRT-LLM's Triton backend, for the simulated engine.

The simulated engine replaces the C++ backend, so without these checks a config the real backend
refuses to load would serve happily here. :func:`check_parameters` raises what the real backend
raises for the checks in ``engine_jobs/trtllm_backend.py`` (required parameters, gpt_model_type,
lookahead, guided decoding, model path), in the order it reads them. It is copied next to the simulated model as
``_sim_backend.py``; the facts come from ``_trtllm_backend.py`` (a copy of the contract module).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

STATIC_BATCHING_ERROR = (
    "gpt_model_type {value!r} selects static batching, which the TensorRT-LLM 1.0 executor does not run; "
    "use inflight_fused_batching"
)


class BackendLoadError(RuntimeError):
    """The model would fail to load in the real backend (Triton reports the message and skips the model)."""


def check_parameters(params: Mapping[str, str] | None, facts) -> None:
    """Raise :class:`BackendLoadError` as the real backend's model-instance creation would.

    ``params`` are the config's parameters (key -> string_value, None when the config has no
    ``parameters`` section); ``facts`` is the ``engine_jobs.trtllm_backend`` module (or its copy).
    """

    def fail(message: str) -> BackendLoadError:
        return BackendLoadError(facts.LOAD_ERROR_PREFIX + message)

    if params is None:
        raise fail(facts.NO_PARAMETERS_ERROR)
    required: Sequence[str] = facts.REQUIRED_PARAMETER_NAMES
    for name in required:
        if name not in params:
            raise fail(facts.MISSING_PARAMETER_ERROR.format(name=name))
    model_type = params["gpt_model_type"]
    if model_type in ("v1", "V1"):
        raise fail(STATIC_BATCHING_ERROR.format(value=model_type))
    if model_type not in facts.GPT_MODEL_TYPES:
        raise fail(facts.INVALID_GPT_MODEL_TYPE_ERROR)
    if params.get("decoding_mode") == "lookahead" and any(n not in params for n in facts.LOOKAHEAD_PARAMETER_NAMES):
        raise fail(facts.LOOKAHEAD_ERROR)
    backend, info_path = params["guided_decoding_backend"], params["xgrammar_tokenizer_info_path"]
    # upstream treats an empty value and its unfilled template placeholder alike: guided decoding off
    if backend not in ("", "${guided_decoding_backend}") and info_path not in ("", "${xgrammar_tokenizer_info_path}"):
        if not os.path.exists(info_path):
            raise fail(f"Xgrammar's tokenizer info path at {info_path} does not exist.")
        if backend not in facts.GUIDED_DECODING_BACKENDS:
            raise fail(
                "Guided decoding is currently supported with 'xgrammar' backend. "
                "Invalid guided_decoding_backend parameter provided."
            )
    # Upstream also treats a path that does not exist as unset; the simulator has no engine files, so
    # only presence is checked here.
    if not params.get("gpt_model_path") and not params.get("encoder_model_path"):
        raise fail(facts.NO_MODEL_PATH_ERROR)
