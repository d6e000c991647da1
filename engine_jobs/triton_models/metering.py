"""Triton Python model (BLS, decoupled): the entry point clients call, metering speculation on live traffic.

It keeps the interface of TensorRT-LLM's ensemble (``text_input``, ``max_tokens``, ``stream``, sampling
inputs -> ``text_output``) and runs preprocessing -> tensorrt_llm -> postprocessing itself, always
asking the engine for ``return_perf_metrics`` so that every finished request contributes its
cumulative ``total_draft_tokens`` / ``total_accepted_draft_tokens`` (read from the last response that
carries them) to counters exported on Triton's metrics port. Clients get the perf outputs, and the
number of tokens the engine generated, only when they asked for them. Engine steps are not a perf output of the TensorRT-LLM backend; with speculative
decoding every step emits exactly one verified token plus the draft tokens it accepted, so
``steps = output tokens - accepted draft tokens`` (tokens per step = 1 + accepted / steps).

With ``engine_api`` "llmapi" (the PyTorch path) the engine model is Triton's llmapi model: text in, text
out. The prompt, ``max_tokens``, the stop words and the sampling inputs the llmapi model takes go to it as
``sampling_param_*`` inputs (always with ``sampling_param_return_perf_metrics`` and
``sampling_param_exclude_input_from_output``); entry inputs it has no counterpart for (end_id, pad_id,
bad_words, length/repetition penalty, min_tokens, return_log_probs) are refused, not ignored. Its
responses carry the cumulative text (the client gets deltas when streaming) and the perf outputs, as
strings, which are read from the last response carrying them. That model reports no token counts, so
the output tokens (``num_output_tokens`` and the counters) are counted by tokenizing the generated text
with the preprocessing model, without special tokens: exact where the tokenizer round-trips the text,
an estimate otherwise (a detokenized text can re-tokenize differently). Steps are derived as above.

Cancellation is read from the request (``request.is_cancelled()``): with tritonserver 2.51 calling
``is_cancelled()`` on the response sender of a gRPC stream leaves the model unable to unload.
Each request is served on a worker thread (execute() returns at once), so one instance streams many
requests concurrently. Every metric call holds one lock: concurrent updates crash the Python backend.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

# client input -> tensorrt_llm input (same dtype)
_SAMPLING = {
    "top_k": "runtime_top_k",
    "top_p": "runtime_top_p",
    "temperature": "temperature",
    "length_penalty": "len_penalty",
    "repetition_penalty": "repetition_penalty",
    "min_tokens": "min_length",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "seed": "random_seed",
    "return_log_probs": "return_log_probs",
}
_PERF = ("acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens")
_PERF_DTYPES = {"acceptance_rate": np.float32, "total_accepted_draft_tokens": np.int32, "total_draft_tokens": np.int32}
_FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
# client input -> llmapi model input (same dtype)
_LLMAPI_SAMPLING = {
    "temperature": "sampling_param_temperature",
    "top_k": "sampling_param_top_k",
    "top_p": "sampling_param_top_p",
    "presence_penalty": "sampling_param_presence_penalty",
    "frequency_penalty": "sampling_param_frequency_penalty",
    "seed": "sampling_param_seed",
}
#: client inputs the llmapi model has no input for
_LLMAPI_UNSUPPORTED = (
    "end_id",
    "pad_id",
    "bad_words",
    "length_penalty",
    "repetition_penalty",
    "min_tokens",
    "return_log_probs",
)


class ClientError(Exception):
    """A request the model refuses (reported to that client only)."""


def _tensor(request: Any, name: str) -> Any:
    t = pb_utils.get_input_tensor_by_name(request, name)
    return None if t is None else t.as_numpy()


def _flag(request: Any, name: str) -> bool:
    v = _tensor(request, name)
    return bool(v.reshape(-1)[0]) if v is not None and v.size else False


def _read_perf(resp: Any, perf: dict[str, float]) -> None:
    """The speculation figures a response carries (the final one has them), into ``perf``."""
    for name in _PERF:
        t = pb_utils.get_output_tensor_by_name(resp, name)
        if t is not None and t.as_numpy().size:
            perf[name] = _number(t.as_numpy())


def _number(arr: Any) -> float:
    """A perf output's value: a number (the tensorrt_llm backend), or its text (the llmapi model sends strings)."""
    v = arr.reshape(-1)[0]
    if isinstance(v, (bytes, np.bytes_)):
        v = v.decode("utf-8")
    return float(v)


def _strings(arr: Any) -> list[str]:
    if arr is None:
        return []
    return [x.decode("utf-8") if isinstance(x, bytes) else str(x) for x in arr.reshape(-1)]


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        p = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.pre_model = p["preprocessing_model"]
        self.engine_model = p["engine_model"]
        self.post_model = p["postprocessing_model"]
        self.count_output = p["output_token_count"]
        self.engine_api = p.get("engine_api", "tensorrt")
        labels = {p["label_model"]: p["deployment"], p["label_variant"]: p["variant"]}
        buckets = [float(b) for b in p["acceptance_buckets"].split(",")]
        self.lock = threading.Lock()
        with self.lock:
            self.families: list[Any] = []

            def counter(name: str, help_text: str) -> Any:
                fam = pb_utils.MetricFamily(name=name, description=help_text, kind=pb_utils.MetricFamily.COUNTER)
                self.families.append(fam)
                return fam.Metric(labels=labels)

            self.m_requests = counter(p["metric_requests"], "Requests the engine finished")
            self.m_output = counter(p["metric_output_tokens"], "Output tokens generated")
            self.m_draft = counter(p["metric_draft_tokens"], "Draft tokens proposed (from return_perf_metrics)")
            self.m_accepted = counter(
                p["metric_accepted_draft_tokens"], "Draft tokens accepted (from return_perf_metrics)"
            )
            self.m_steps = counter(p["metric_steps"], "Engine generation steps (output tokens - accepted draft tokens)")
            hist = pb_utils.MetricFamily(
                name=p["metric_acceptance_histogram"],
                description="Per-request acceptance rate of requests that proposed draft tokens",
                kind=pb_utils.MetricFamily.HISTOGRAM,
            )
            self.families.append(hist)
            self.m_hist = hist.Metric(labels=labels, buckets=buckets)
        self.pool = ThreadPoolExecutor(max_workers=int(p.get("max_inflight", "512")), thread_name_prefix="meter")

    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            self.pool.submit(self._serve, request, request.get_response_sender())
        return None

    def finalize(self) -> None:
        self.pool.shutdown(wait=True)

    # ---- one request ----------------------------------------------------------------------------
    def _serve(self, request: Any, sender: Any) -> None:
        final_sent = False
        try:
            final_sent = self._generate(request, sender)
        except ClientError as exc:
            self._send_error(sender, str(exc))
            final_sent = True
        except Exception as exc:  # inner-model errors reach the client as errors, never as empty success
            self._send_error(sender, f"{type(exc).__name__}: {exc}")
            final_sent = True
        finally:
            if not final_sent:
                self._send_error(sender, "request ended without a final response")

    @staticmethod
    def _send_error(sender: Any, message: str) -> None:
        try:
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(message)))
            sender.send(flags=_FINAL)
        except Exception:
            pass  # the client is gone; nothing else can be told

    def _preprocess(self, request: Any) -> dict[str, Any]:
        text = _tensor(request, "text_input")
        if text is None or text.size != 1:
            raise ClientError("text_input must hold exactly one prompt (batch size 1 per request)")
        inputs = [pb_utils.Tensor("QUERY", np.array([text.reshape(-1)[0]], dtype=np.object_))]
        for src, dst in (("end_id", "END_ID"), ("pad_id", "PAD_ID")):
            v = _tensor(request, src)
            if v is not None:
                inputs.append(pb_utils.Tensor(dst, v.reshape(-1)[:1].astype(np.int32)))
        for src, dst in (("stop_words", "STOP_WORDS_DICT"), ("bad_words", "BAD_WORDS_DICT")):
            words = [w for w in _strings(_tensor(request, src)) if w]
            if words:
                inputs.append(pb_utils.Tensor(dst, np.array([w.encode() for w in words], dtype=np.object_)))
        outputs = ["INPUT_ID", "REQUEST_INPUT_LEN", "STOP_WORDS_IDS", "BAD_WORDS_IDS", "OUT_END_ID", "OUT_PAD_ID"]
        resp = pb_utils.InferenceRequest(
            model_name=self.pre_model, requested_output_names=outputs, inputs=inputs
        ).exec()
        if resp.has_error():
            raise RuntimeError(resp.error().message())
        return {n: pb_utils.get_output_tensor_by_name(resp, n).as_numpy() for n in outputs}

    def _engine_request(self, request: Any, pre: dict[str, Any], stream: bool) -> Any:
        max_tokens = _tensor(request, "max_tokens")
        if max_tokens is None or max_tokens.size != 1 or int(max_tokens.reshape(-1)[0]) < 1:
            raise ClientError("max_tokens must be one integer >= 1")
        beam = _tensor(request, "beam_width")
        if beam is not None and int(beam.reshape(-1)[0]) != 1:
            raise ClientError("beam_width must be 1 (speculative decoding engines are built with max_beam_width 1)")

        def col(v: Any, dtype: Any) -> Any:
            return np.array(v, dtype=dtype).reshape(1, -1)

        ids = pre["INPUT_ID"].reshape(-1).astype(np.int32)
        inputs = [
            pb_utils.Tensor("input_ids", ids.reshape(1, -1)),
            pb_utils.Tensor("input_lengths", col([ids.size], np.int32)),
            pb_utils.Tensor("request_output_len", col([int(max_tokens.reshape(-1)[0])], np.int32)),
            pb_utils.Tensor("end_id", col(pre["OUT_END_ID"].reshape(-1)[:1], np.int32)),
            pb_utils.Tensor("pad_id", col(pre["OUT_PAD_ID"].reshape(-1)[:1], np.int32)),
            pb_utils.Tensor("streaming", col([stream], np.bool_)),
            pb_utils.Tensor("return_perf_metrics", col([True], np.bool_)),
        ]
        for key, name in (("STOP_WORDS_IDS", "stop_words_list"), ("BAD_WORDS_IDS", "bad_words_list")):
            words = pre[key]
            if words.size and int(words.reshape(2, -1)[1][0]) != -1:
                inputs.append(pb_utils.Tensor(name, words.reshape(1, 2, -1).astype(np.int32)))
        for src, dst in _SAMPLING.items():
            v = _tensor(request, src)
            if v is not None and v.size:
                inputs.append(pb_utils.Tensor(dst, v.reshape(1, -1)[:, :1]))
        outputs = ["output_ids", "sequence_length", *_PERF]
        return pb_utils.InferenceRequest(model_name=self.engine_model, requested_output_names=outputs, inputs=inputs)

    def _detokenize(self, tokens: list[int]) -> str:
        if not tokens:
            return ""
        req = pb_utils.InferenceRequest(
            model_name=self.post_model,
            requested_output_names=["OUTPUT"],
            inputs=[pb_utils.Tensor("TOKENS_BATCH", np.array(tokens, dtype=np.int32))],
        )
        resp = req.exec()
        if resp.has_error():
            raise RuntimeError(resp.error().message())
        out = pb_utils.get_output_tensor_by_name(resp, "OUTPUT").as_numpy().reshape(-1)[0]
        return out.decode("utf-8") if isinstance(out, bytes) else str(out)

    @staticmethod
    def _text(text: str) -> Any:
        return pb_utils.Tensor("text_output", np.array([[text.encode("utf-8")]], dtype=np.object_))

    def _generate(self, request: Any, sender: Any) -> bool:
        """Serve one request; True once the final response was sent."""
        if self.engine_api == "llmapi":
            return self._generate_llmapi(request, sender)
        stream = _flag(request, "stream")
        want_perf = _flag(request, "return_perf_metrics")
        pre = self._preprocess(request)
        engine_req = self._engine_request(request, pre, stream)
        tokens: list[int] = []
        perf: dict[str, float] = {}
        sent_text = ""
        cancelled = False
        engine_error = None
        # Drain the engine stream even after a client cancels: the engine finishes the request anyway
        # (this Python backend cannot cancel a BLS child), and its figures still count.
        for resp in engine_req.exec(decoupled=True):
            if resp.has_error():
                engine_error = resp.error().message()
                continue
            out = pb_utils.get_output_tensor_by_name(resp, "output_ids")
            if out is None:
                continue  # empty final-flag response
            ids = out.as_numpy()
            seq = pb_utils.get_output_tensor_by_name(resp, "sequence_length")
            n = int(seq.as_numpy().reshape(-1)[0]) if seq is not None else ids.shape[-1]
            new = [int(t) for t in ids.reshape(-1)[:n]]
            tokens = tokens + new if stream else new
            _read_perf(resp, perf)
            if stream and new and not cancelled and engine_error is None:
                cancelled, sent_text = self._send_delta(request, sender, lambda: self._detokenize(tokens), sent_text)
        if engine_error is not None:
            raise RuntimeError(f"{self.engine_model}: {engine_error}")
        self._record(len(tokens), perf)
        return self._finish(request, sender, cancelled, None if stream else tokens, want_perf, perf, len(tokens))

    def _send_delta(self, request: Any, sender: Any, full_text: Callable[[], str], sent_text: str) -> tuple[bool, str]:
        """Stream what ``full_text()`` (the output so far) adds to ``sent_text``: (cancelled, text now sent).
        A cancelled request gets nothing more (the stream is drained on regardless)."""
        if request.is_cancelled():
            return True, sent_text
        full = full_text()
        delta = full[len(sent_text) :] if full.startswith(sent_text) else full
        sender.send(pb_utils.InferenceResponse(output_tensors=[self._text(delta)]))
        return False, full

    def _finish(
        self,
        request: Any,
        sender: Any,
        cancelled: bool,
        full: str | list[int] | None,
        want_perf: bool,
        perf: dict[str, float],
        count: int,
    ) -> bool:
        """The last data response (``full``: the whole output, token ids or text, when not streaming) and
        the final flag; True."""
        if cancelled or request.is_cancelled():
            # only close the stream: a response sent to a cancelled request keeps the model from unloading
            sender.send(flags=_FINAL)
            return True
        final = []
        if full is not None:
            final.append(self._text(full if isinstance(full, str) else self._detokenize(full)))
        if want_perf:
            for name in _PERF:
                final.append(pb_utils.Tensor(name, np.array([[perf.get(name, 0)]], dtype=_PERF_DTYPES[name])))
            final.append(pb_utils.Tensor(self.count_output, np.array([[count]], dtype=np.int32)))
        # The last data response and the final flag travel separately: tensors sent together with
        # the final flag on a gRPC stream intermittently keep this model from unloading in 2.51.
        if final:
            sender.send(pb_utils.InferenceResponse(output_tensors=final))
        sender.send(flags=_FINAL)
        return True

    # ---- the PyTorch path: Triton's llmapi model -----------------------------------------------------------
    def _llmapi_request(self, request: Any, stream: bool) -> Any:
        text = _tensor(request, "text_input")
        if text is None or text.size != 1:
            raise ClientError("text_input must hold exactly one prompt (batch size 1 per request)")
        prompt = _strings(text)[0]
        if not prompt.strip():
            raise ClientError("text_input: the prompt is empty")
        max_tokens = _tensor(request, "max_tokens")
        if max_tokens is None or max_tokens.size != 1 or int(max_tokens.reshape(-1)[0]) < 1:
            raise ClientError("max_tokens must be one integer >= 1")
        beam = _tensor(request, "beam_width")
        if beam is not None and int(beam.reshape(-1)[0]) != 1:
            raise ClientError("beam_width must be 1 (speculative decoding engines are built with max_beam_width 1)")
        given = [name for name in _LLMAPI_UNSUPPORTED if _tensor(request, name) is not None]
        if given:
            raise ClientError(f"{', '.join(given)}: not supported by the PyTorch backend's llmapi engine model")
        inputs = [
            pb_utils.Tensor("text_input", np.array([prompt.encode("utf-8")], dtype=np.object_)),
            pb_utils.Tensor("streaming", np.array([stream], dtype=np.bool_)),
            pb_utils.Tensor("sampling_param_max_tokens", np.array([int(max_tokens.reshape(-1)[0])], dtype=np.int32)),
            pb_utils.Tensor("sampling_param_return_perf_metrics", np.array([True], dtype=np.bool_)),
            pb_utils.Tensor("sampling_param_exclude_input_from_output", np.array([True], dtype=np.bool_)),
        ]
        stop = [w for w in _strings(_tensor(request, "stop_words")) if w]
        if stop:
            inputs.append(
                pb_utils.Tensor("sampling_param_stop", np.array([w.encode("utf-8") for w in stop], dtype=np.object_))
            )
        for src, dst in _LLMAPI_SAMPLING.items():
            v = _tensor(request, src)
            if v is not None and v.size:
                # a copy: a view of the request's input memory must not back the child request's tensor
                inputs.append(pb_utils.Tensor(dst, v.reshape(-1)[:1].copy()))
        outputs = ["text_output", *_PERF]
        return pb_utils.InferenceRequest(model_name=self.engine_model, requested_output_names=outputs, inputs=inputs)

    def _count_tokens(self, text: str) -> int:
        """Tokens of generated text, by the preprocessing model (no special tokens added)."""
        if not text:
            return 0
        resp = pb_utils.InferenceRequest(
            model_name=self.pre_model,
            requested_output_names=["INPUT_ID"],
            inputs=[
                pb_utils.Tensor("QUERY", np.array([text.encode("utf-8")], dtype=np.object_)),
                pb_utils.Tensor("ADD_SPECIAL_TOKENS", np.array([False], dtype=np.bool_)),
            ],
        ).exec()
        if resp.has_error():
            raise RuntimeError(resp.error().message())
        return int(pb_utils.get_output_tensor_by_name(resp, "INPUT_ID").as_numpy().size)

    def _generate_llmapi(self, request: Any, sender: Any) -> bool:
        stream = _flag(request, "stream")
        want_perf = _flag(request, "return_perf_metrics")
        engine_req = self._llmapi_request(request, stream)
        text = ""
        perf: dict[str, float] = {}
        sent_text = ""
        cancelled = False
        engine_error = None
        # Drained to the end as in the tensorrt mode (a BLS child cannot be cancelled from here).
        for resp in engine_req.exec(decoupled=True):
            if resp.has_error():
                engine_error = resp.error().message()
                continue
            out = pb_utils.get_output_tensor_by_name(resp, "text_output")
            if out is None or not out.as_numpy().size:
                continue  # empty final-flag response
            text = _strings(out.as_numpy())[0]  # the llmapi model sends the text so far
            _read_perf(resp, perf)
            if stream and text != sent_text and not cancelled and engine_error is None:
                cancelled, sent_text = self._send_delta(request, sender, lambda: text, sent_text)
        if engine_error is not None:
            raise RuntimeError(f"{self.engine_model}: {engine_error}")
        count = self._count_tokens(text)
        self._record(count, perf)
        return self._finish(request, sender, cancelled, None if stream else text, want_perf, perf, count)

    def _record(self, output_tokens: int, perf: dict[str, float]) -> None:
        drafted = int(perf.get("total_draft_tokens", 0))
        accepted = int(perf.get("total_accepted_draft_tokens", 0))
        steps = max(output_tokens - accepted, 0)
        with self.lock:
            self.m_requests.increment(1)
            for metric, value in (
                (self.m_output, output_tokens),
                (self.m_draft, drafted),
                (self.m_accepted, accepted),
                (self.m_steps, steps),
            ):
                if value > 0:
                    metric.increment(value)
            if drafted > 0:
                self.m_hist.observe(accepted / drafted)
