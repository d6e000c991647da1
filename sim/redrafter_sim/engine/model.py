"""Triton Python model standing in for TensorRT-LLM's tensorrt_llm model on machines without a GPU.

Same inputs and outputs as the generated tensorrt_llm config. An in-flight batching loop runs engine
steps over the active requests (at most max_batch_size; the rest wait): each step sleeps a latency
that grows with the batch and, for the ReDrafter variant, with the draft work; the first step of a
request is its context phase (one token). In the generation phase a ReDrafter step proposes
``draft_len_per_beam`` tokens of the best beam and accepts Binomial(draft_len, acceptance_rate) of
them, so it emits 1 + accepted tokens; the base variant emits one token per step. Tokens are the
greedy output: a deterministic function of the prompt (the same for both variants unless the
``diverge`` control is set). Honours streaming, end_id, stop words, max tokens, return_perf_metrics
(perf outputs on the final response) and client cancellation. Controls: see _sim_control.py. At load
it refuses the config the real backend refuses (_sim_backend.py; the simulator's own parameters are
the ``sim_`` ones).

The batching loop, the controls it handles and the ledger are _sim_batching.py's (shared with the
PyTorch-path simulator): every finished request is appended to a ledger (JSON lines; parameter
``ledger_file`` or env ``REDRAFTER_SIM_LEDGER``), the ground truth tests compare exported metrics with.
"""

from __future__ import annotations

import json
import random
import time
import zlib

import _trtllm_backend
import numpy as np
import triton_python_backend_utils as pb_utils  # type: ignore[import-not-found]
from _sim_backend import check_parameters
from _sim_batching import FINAL, BatchingEngine, SimRequest
from _sim_control import SimControl
from _sim_speculation import greedy_token

SIM_PREFIX = "sim_"  # the simulator's own parameters (redrafter_sim.engine.SIM_PARAMETER_PREFIX)
_FINAL = FINAL


def _scalar(request, name: str, default=None):
    t = pb_utils.get_input_tensor_by_name(request, name)
    if t is None or t.as_numpy().size == 0:
        return default
    return t.as_numpy().reshape(-1)[0].item()


def _stop_sequences(request) -> list[list[int]]:
    t = pb_utils.get_input_tensor_by_name(request, "stop_words_list")
    if t is None:
        return []
    flat, offsets = t.as_numpy().reshape(2, -1)
    out, start = [], 0
    for end in offsets:
        if end < 0:
            break
        out.append([int(x) for x in flat[start:end]])
        start = int(end)
    return [s for s in out if s]


class TritonPythonModel(BatchingEngine):
    def initialize(self, args):
        cfg = json.loads(args["model_config"])
        given = {k: v["string_value"] for k, v in cfg.get("parameters", {}).items()}
        real = {k: v for k, v in given.items() if not k.startswith(SIM_PREFIX)}
        # what TensorRT-LLM's backend would refuse must not load here either
        check_parameters(real or None, _trtllm_backend)
        p = {k[len(SIM_PREFIX) :]: v for k, v in given.items() if k.startswith(SIM_PREFIX)}
        self.variant = p.get("variant", "redrafter")
        self.draft_len = int(p.get("draft_len_per_beam", "0")) if self.variant == "redrafter" else 0
        self.num_beams = int(p.get("num_beams", "1"))
        self.max_batch = max(int(cfg.get("max_batch_size", 8)), 1)
        self._start(p)

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                ids = pb_utils.get_input_tensor_by_name(request, "input_ids").as_numpy().reshape(-1)
                max_tokens = int(_scalar(request, "request_output_len"))
                if max_tokens < 1:
                    raise ValueError("request_output_len must be >= 1")
                seed = _scalar(request, "random_seed")
                self.incoming.put(
                    SimRequest(
                        request=request,
                        sender=sender,
                        prompt_crc=zlib.crc32(ids.astype(np.int32).tobytes()),
                        max_tokens=max_tokens,
                        end_id=int(_scalar(request, "end_id", -1)),
                        stop=_stop_sequences(request),
                        streaming=bool(_scalar(request, "streaming", False)),
                        want_perf=bool(_scalar(request, "return_perf_metrics", False)),
                        rng=random.Random(seed),
                        arrival_ns=time.time_ns(),
                    )
                )
            except Exception as exc:
                sender.send(
                    pb_utils.InferenceResponse(error=pb_utils.TritonError(f"tensorrt_llm: {exc}")), flags=_FINAL
                )
        return None

    def _draft_tokens(self, active: list[SimRequest]) -> float:
        drafting = sum(1 for r in active if r.steps > 0) if self.draft_len else 0
        return self.num_beams * self.draft_len * drafting

    def _step(self, r: SimRequest, ctl: SimControl, batch: int) -> None:
        if r.request.is_cancelled():  # not sender.is_cancelled(): it blocks unloading in 2.51
            r.done = True
            self._ledger(r, cancelled=True)
            r.sender.send(flags=_FINAL)
            return
        remaining = r.max_tokens - len(r.tokens)
        accept = 0
        if r.steps > 0 and self.draft_len:
            r.drafted += self.draft_len
            accept = sum(1 for _ in range(self.draft_len) if r.rng.random() < ctl.acceptance_rate)
        r.steps += 1
        want = min(1 + accept, remaining)
        new: list[int] = []
        finished = False
        for _ in range(want):
            tok = greedy_token(r.prompt_crc, len(r.tokens) + len(new), ctl.diverge, self.first_id, self.vocab)
            if tok == r.end_id:
                finished = True
                break
            new.append(tok)
            seq = r.tokens + new
            if any(seq[-len(s) :] == s for s in r.stop):
                finished = True
                break
        r.accepted += max(len(new) - 1, 0)
        r.emitting_steps += 1 if new else 0
        r.tokens += new
        if new and not r.first_token_ns:
            r.first_token_ns = time.time_ns()
        finished = finished or len(r.tokens) >= r.max_tokens
        if finished:
            r.done = True
            self._ledger(r)
            out = new if r.streaming else r.tokens
            r.sender.send(pb_utils.InferenceResponse(output_tensors=self._outputs(out, r, final=True)), flags=_FINAL)
        elif r.streaming and new:
            r.sender.send(pb_utils.InferenceResponse(output_tensors=self._outputs(new, r, final=False)))

    def _outputs(self, tokens: list[int], r: SimRequest, final: bool) -> list:
        out = [
            pb_utils.Tensor("output_ids", np.array(tokens, dtype=np.int32).reshape(1, 1, -1)),
            pb_utils.Tensor("sequence_length", np.array([[len(tokens)]], dtype=np.int32)),
        ]
        if final and r.want_perf:
            rate = r.accepted / r.drafted if r.drafted else 0.0
            now = time.time_ns()
            out += [
                pb_utils.Tensor("acceptance_rate", np.array([[rate]], dtype=np.float32)),
                pb_utils.Tensor("total_accepted_draft_tokens", np.array([[r.accepted]], dtype=np.int32)),
                pb_utils.Tensor("total_draft_tokens", np.array([[r.drafted]], dtype=np.int32)),
                pb_utils.Tensor("arrival_time_ns", np.array([[r.arrival_ns]], dtype=np.int64)),
                pb_utils.Tensor("first_token_time_ns", np.array([[r.first_token_ns or now]], dtype=np.int64)),
                pb_utils.Tensor("last_token_time_ns", np.array([[now]], dtype=np.int64)),
            ]
        return out
