"""Triton Python model: token ids -> text."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils
from _tokenizer import Tokenizer


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        params = json.loads(args["model_config"])["parameters"]
        self.tokenizer = Tokenizer(params["tokenizer_dir"]["string_value"])
        self.skip_special = params.get("skip_special_tokens", {}).get("string_value", "true") == "true"

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            try:
                ids = pb_utils.get_input_tensor_by_name(request, "TOKENS_BATCH").as_numpy().reshape(-1)
                text = self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=self.skip_special)
                responses.append(
                    pb_utils.InferenceResponse(
                        output_tensors=[pb_utils.Tensor("OUTPUT", np.array([text.encode("utf-8")], dtype=np.object_))]
                    )
                )
            except Exception as exc:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"postprocessing: {exc}")))
        return responses
