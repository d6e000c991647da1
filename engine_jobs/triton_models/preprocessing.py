"""Triton Python model: text -> token ids (+ stop/bad words, end/pad ids) for the tensorrt_llm model.

With ``ADD_SPECIAL_TOKENS`` false it tokenizes text as it stands (no BOS, empty text gives no ids): the
metering model counts the tokens of generated text that way on the PyTorch path.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils
from _tokenizer import Tokenizer, word_list


def _strings(request: Any, name: str) -> list[str]:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return []
    out = []
    for item in tensor.as_numpy().reshape(-1):
        text = item.decode("utf-8") if isinstance(item, bytes) else str(item)
        if text:
            out.append(text)
    return out


def _bool(request: Any, name: str, default: bool) -> bool:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return default if tensor is None else bool(tensor.as_numpy().reshape(-1)[0])


def _int(request: Any, name: str) -> int | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else int(tensor.as_numpy().reshape(-1)[0])


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        params = json.loads(args["model_config"])["parameters"]
        self.tokenizer = Tokenizer(params["tokenizer_dir"]["string_value"])

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            try:
                special = _bool(request, "ADD_SPECIAL_TOKENS", True)
                query = _strings(request, "QUERY")
                if not special and not query:
                    query = [""]
                if len(query) != 1:
                    raise ValueError("QUERY must hold exactly one non-empty prompt")
                ids = self.tokenizer.encode(query[0], add_special_tokens=special)
                if not ids and special:
                    raise ValueError("prompt encodes to zero tokens")
                end_id = _int(request, "END_ID")
                pad_id = _int(request, "PAD_ID")
                stop = word_list(self.tokenizer, _strings(request, "STOP_WORDS_DICT"))
                bad = word_list(self.tokenizer, _strings(request, "BAD_WORDS_DICT"))
                responses.append(
                    pb_utils.InferenceResponse(
                        output_tensors=[
                            pb_utils.Tensor("INPUT_ID", np.array(ids, dtype=np.int32)),
                            pb_utils.Tensor("REQUEST_INPUT_LEN", np.array([len(ids)], dtype=np.int32)),
                            pb_utils.Tensor("STOP_WORDS_IDS", np.array(stop, dtype=np.int32)),
                            pb_utils.Tensor("BAD_WORDS_IDS", np.array(bad, dtype=np.int32)),
                            pb_utils.Tensor(
                                "OUT_END_ID",
                                np.array([self.tokenizer.eos_id if end_id is None else end_id], dtype=np.int32),
                            ),
                            pb_utils.Tensor(
                                "OUT_PAD_ID",
                                np.array([self.tokenizer.pad_id if pad_id is None else pad_id], dtype=np.int32),
                            ),
                        ]
                    )
                )
            except Exception as exc:  # one bad request must not fail the others in the batch
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"preprocessing: {exc}")))
        return responses
