"""Triton Python model standing in for TensorRT-LLM's llmapi model (the PyTorch backend) without a GPU.

It takes the place of upstream's ``tensorrt_llm/1/model.py`` next to the generated ``model.yaml``: text in,
text out, with the llmapi model's inputs (``text_input``, ``streaming``, ``sampling_param_*``,
``return_finish_reason``) and outputs (``text_output``, ``finish_reason`` and, when the request sets
``sampling_param_return_perf_metrics``, the perf outputs; as upstream does, these travel as strings).

At load it reads ``1/model.yaml`` and refuses what upstream refuses, in upstream's words
(_llmapi_backend.py, a copy of ``engine_jobs/llmapi_backend.py``), then loads the tokenizer at the file's
``tokenizer`` (else ``model``) path. Requests run in the batching loop both simulators share
(_sim_batching.py: ``max_batch_size`` from model.yaml, controls from _sim_control.py, the ledger, plus
``method``). The first step of a request is its context phase (one token); then, per
``speculative_config.decoding_type``:

- Eagle3, Draft_Target, MTP: a chain of ``max_draft_len`` (MTP: ``num_nextn_predict_layers``) drafted
  tokens, accepted as a prefix (each next one with the control's acceptance_rate until the first rejection);
- NGram: real prompt-lookup drafting (_sim_speculation.ngram_propose over prompt + generated tokens,
  ``max_matching_ngram_size``), accepted as the prefix that matches the greedy continuation;
- no speculative_config: one token per step.

A step whose batch holds more than ``max_concurrency`` requests drafts nothing; with a ``draft_len_schedule`` a
step drafts the length of the largest key <= its batch (the pinned release's lower-bound keys). As at the pinned
release, only a method with a separate drafter (NGram, Draft_Target) reads either; the one-model Eagle3 and MTP
ignore both and draft at every batch. The greedy text is
_sim_speculation.greedy_next's (it copies on repetitive prompts), the same with or without speculation
unless the ``diverge`` control is set. Stop strings end generation and are left out of the text, as the
LLM API does by default.
"""

from __future__ import annotations

import json
import os
import random
import time
import zlib

import numpy as np
import triton_python_backend_utils as pb_utils  # type: ignore[import-not-found]
import yaml
from _llmapi_backend import (
    DRAFTER_DECODING_TYPES,
    TRITON_CONFIG_KEY,
    canonical_decoding_type,
    check_model_yaml,
    draft_len_for_batch,
)
from _sim_batching import FINAL, BatchingEngine, SimRequest
from _sim_control import SimControl
from _sim_speculation import accept_prefix, chain_accepted, greedy_next, ngram_propose
from _tokenizer import Tokenizer

SIM_PREFIX = "sim_"  # the simulator's own parameters (redrafter_sim.engine.SIM_PARAMETER_PREFIX)
CONFIG_FILE = "model.yaml"
#: decoding_type -> the API's method name (the ledger's ``method``)
METHODS = {"Eagle3": "eagle3", "MTP": "mtp", "NGram": "ngram", "Draft_Target": "draftModel"}
DEFAULT_MAX_TOKENS = 32  # SamplingParams' default
DEFAULT_NGRAM_SIZE = 4  # NGramDecodingConfig's default max_matching_ngram_size


class ModelYamlError(RuntimeError):
    """model.yaml is one upstream's llmapi model would refuse (the model fails to load)."""


def _scalar(request, name: str, default=None):
    t = pb_utils.get_input_tensor_by_name(request, name)
    if t is None or t.as_numpy().size == 0:
        return default
    if t.as_numpy().size != 1:
        raise ValueError(f"Expected a scalar tensor for tensor {name}")
    return t.as_numpy().reshape(-1)[0].item()


def _strings(request, name: str) -> list[str]:
    t = pb_utils.get_input_tensor_by_name(request, name)
    if t is None:
        return []
    return [x.decode("utf-8") if isinstance(x, bytes) else str(x) for x in t.as_numpy().reshape(-1)]


def load_model_yaml(model_dir: str) -> dict:
    """model.yaml as upstream reads it, refused in upstream's words where upstream refuses it."""
    path = os.path.join(model_dir, CONFIG_FILE)
    if not os.path.isfile(path):
        raise ModelYamlError(f"'{CONFIG_FILE}' containing TRT-LLM engine args not found in '{model_dir}'")
    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
    except Exception as exc:
        raise ModelYamlError(f"Failed to parse YAML engine config: {exc}") from exc
    if not isinstance(doc, dict):
        raise ModelYamlError(f"Failed to parse YAML engine config: {path} is not a mapping")
    errors = check_model_yaml(doc)
    if errors:
        raise ModelYamlError(
            f"{len(errors)} validation error{'s' if len(errors) > 1 else ''} for TorchLlmArgs: " + "; ".join(errors)
        )
    return doc


class TritonPythonModel(BatchingEngine):
    def initialize(self, args):
        cfg = json.loads(args["model_config"])
        given = {k: v["string_value"] for k, v in cfg.get("parameters", {}).items()}
        p = {k[len(SIM_PREFIX) :]: v for k, v in given.items() if k.startswith(SIM_PREFIX)}
        doc = load_model_yaml(os.path.join(args["model_repository"], args["model_version"]))
        self.decoupled = bool(doc[TRITON_CONFIG_KEY]["decoupled"])
        self.tokenizer = Tokenizer(str(doc.get("tokenizer") or doc["model"]))
        spec = doc.get("speculative_config") or {}
        tag = canonical_decoding_type(spec.get("decoding_type")) if spec else None
        self.method = METHODS.get(tag) if tag else None
        self.draft_len = int(spec.get("num_nextn_predict_layers" if tag == "MTP" else "max_draft_len") or 0)
        self.ngram_size = int(spec.get("max_matching_ngram_size") or DEFAULT_NGRAM_SIZE)
        drafter = tag in DRAFTER_DECODING_TYPES  # the limits are the drafter's: a one-model method has none
        self.max_concurrency = spec.get("max_concurrency") if drafter else None
        limits = spec.get("draft_len_schedule") if drafter else None
        self.schedule = {int(k): int(v) for k, v in (limits or {}).items()} or None
        self.variant = p.get("variant", "redrafter" if self.method else "base")
        self.max_batch = max(int(doc.get("max_batch_size") or 8), 1)
        self._start(p)

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                prompt = _strings(request, "text_input")
                if len(prompt) != 1:
                    raise ValueError("The current implementation only supports text_input being a 1D tensor.")
                ids = self.tokenizer.encode(prompt[0])
                if not ids:
                    raise ValueError("the prompt encodes to zero tokens")
                max_tokens = int(_scalar(request, "sampling_param_max_tokens", DEFAULT_MAX_TOKENS))
                if max_tokens < 1:
                    raise ValueError("max_tokens must be >= 1")
                streaming = bool(_scalar(request, "streaming", False))
                if streaming and not self.decoupled:
                    raise ValueError("Streaming is only supported in decoupled mode.")
                stop = [
                    self.tokenizer.encode(s, add_special_tokens=False) for s in _strings(request, "sampling_param_stop")
                ]
                r = SimRequest(
                    request=request,
                    sender=sender,
                    prompt_crc=zlib.crc32(np.array(ids, dtype=np.int32).tobytes()),
                    max_tokens=max_tokens,
                    end_id=int(self.tokenizer.eos_id),
                    stop=[s for s in stop if s],
                    streaming=streaming,
                    want_perf=bool(_scalar(request, "sampling_param_return_perf_metrics", False)),
                    rng=random.Random(_scalar(request, "sampling_param_seed")),
                    arrival_ns=time.time_ns(),
                    prompt=[int(i) for i in ids],
                    want_finish_reason=bool(_scalar(request, "return_finish_reason", False)),
                )
                self.incoming.put(r)
            except Exception as exc:
                sender.send(
                    pb_utils.InferenceResponse(
                        output_tensors=[pb_utils.Tensor("text_output", np.asarray(["N/A"], dtype=np.object_))],
                        error=pb_utils.TritonError(f"Error generating request: {exc}"),
                    ),
                    flags=FINAL,
                )
        return None

    # ---- one engine step of one request ---------------------------------------------------------------
    def _greedy(self, r: SimRequest, generated: list[int], ctl: SimControl) -> int:
        return greedy_next(r.prompt, generated, r.prompt_crc, ctl.diverge, self.first_id, self.vocab)

    def _draft_len(self, batch: int) -> int:
        """This step's draft length: the schedule's (lower-bound keys, as the pinned release reads them), else
        the full draft up to max_concurrency and none above."""
        if self.schedule is not None:
            return min(self.draft_len, draft_len_for_batch(self.schedule, batch))
        return self.draft_len if self.max_concurrency is None or batch <= int(self.max_concurrency) else 0

    def _draft_tokens(self, active: list[SimRequest]) -> float:
        return self._draft_len(len(active)) * sum(1 for r in active if r.steps > 0)

    def _step(self, r: SimRequest, ctl: SimControl, batch: int) -> None:
        if r.request.is_cancelled():  # not sender.is_cancelled(): it blocks unloading in 2.51
            r.done = True
            self._ledger(r, cancelled=True)
            r.sender.send(flags=FINAL)
            return
        remaining = r.max_tokens - len(r.tokens)
        accept = 0
        draft_len = self._draft_len(batch)
        if r.steps > 0 and draft_len > 0:
            if self.method == "ngram":
                draft = ngram_propose(r.prompt + r.tokens, draft_len, self.ngram_size)
                accept = accept_prefix(draft, lambda j: self._greedy(r, r.tokens + draft[:j], ctl))
                r.drafted += len(draft)
            else:
                accept = chain_accepted(draft_len, ctl.acceptance_rate, r.rng)
                r.drafted += draft_len
        r.steps += 1
        new: list[int] = []
        stop_hit: list[int] = []
        for _ in range(min(1 + accept, remaining)):
            tok = self._greedy(r, r.tokens + new, ctl)
            if tok == r.end_id:
                r.finish_reason = "stop"
                break
            new.append(tok)
            seq = r.tokens + new
            stop_hit = next((s for s in r.stop if seq[-len(s) :] == s), [])
            if stop_hit:
                r.finish_reason = "stop"
                break
        r.accepted += max(len(new) - 1, 0)
        r.emitting_steps += 1 if new else 0
        r.tokens += new
        if new and not r.first_token_ns:
            r.first_token_ns = time.time_ns()
        if not r.finish_reason and len(r.tokens) >= r.max_tokens:
            r.finish_reason = "length"
        if r.finish_reason:
            if stop_hit:  # the LLM API leaves the stop string out of the text by default
                r.tokens = r.tokens[: -len(stop_hit)]
            r.done = True
            self._ledger(r)
            r.sender.send(self._response(r), flags=FINAL)
        elif r.streaming and new:
            r.sender.send(self._response(r))

    def _response(self, r: SimRequest):
        """Upstream's _create_response: cumulative text; extra outputs as strings (text_output's dtype)."""

        def text(values: list) -> np.ndarray:
            return np.asarray([str(v).encode("utf-8") for v in values], dtype=np.object_)

        out = [pb_utils.Tensor("text_output", text([self.tokenizer.decode(r.tokens)]))]
        if r.want_finish_reason:
            out.append(pb_utils.Tensor("finish_reason", text([r.finish_reason or None])))
        if r.want_perf:
            now = time.time_ns()
            figures = {
                "arrival_time_ns": r.arrival_ns,
                "first_token_time_ns": r.first_token_ns or now,
                "last_token_time_ns": now,
                "acceptance_rate": r.accepted / r.drafted if r.drafted else 0.0,
                "total_accepted_draft_tokens": r.accepted,
                "total_draft_tokens": r.drafted,
            }
            out += [pb_utils.Tensor(name, text([value])) for name, value in figures.items()]
        return pb_utils.InferenceResponse(output_tensors=out)

    def _ledger_extra(self) -> dict:
        return {"method": self.method}
