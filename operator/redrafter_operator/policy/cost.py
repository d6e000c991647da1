"""Cost model: ReDrafter's throughput relative to the base engine at a given batch size.

Decode steps of an LLM are memory-bound at small batch (each step streams the weights once) and turn
compute-bound as the tokens processed per step grow. We model one step processing ``T`` tokens as

    L(T) = 1 + k * T                      (unit: the fixed, weight-streaming cost of a step)

* base engine, batch b: T = b, each request gains 1 token per step;
* ReDrafter, batch b: T = b * V where V = 1 + numBeams x draftLenPerBeam tokens are verified per
  request (the beams' candidates plus the last accepted token), the RNN drafter adds a fraction ``o``
  of step time, and each request gains ``tps`` tokens per step (tokens per step = 1 + acceptance x
  draftLenPerBeam; measured directly as output tokens / engine steps when available).

    speedup(b) = tps * L(b) / ((1 + o) * L(b * V))

Speedup is highest at batch 1 and falls as the batch grows; it crosses 1 at
``b* = (tps - (1+o)) / (k * ((1+o) V - tps))``.

Calibration of the defaults (k = 0.0072, o = 0.10, V = 26 for 5 beams x 5 tokens):
* Apple ML Research, "Accelerating LLM Inference on NVIDIA GPUs with ReDrafter" (Dec 2024) and the
  NVIDIA TensorRT-LLM ReDrafter blog: up to 2.7x tokens/s over auto-regression (TensorRT-LLM, H100,
  TP8, greedy, low batch); the ReDrafter paper (Cheng et al., arXiv:2403.09919): up to 3.5 tokens per
  generation step. With tps = 3.5 at b = 1 the model gives 3.5 x 1.0072 / (1.1 x 1.187) = 2.70x.
* "Gains shrink as batch grows" (same sources; TensorRT-LLM cannot turn speculation off at run time):
  with these parameters the crossover is ~13 concurrent requests per replica at 3.5 tokens/step and
  ~9 at the default minimum acceptance (0.35 -> 2.75 tokens/step). Deployments whose measured
  crossover differs set ``spec.speculation.costModel``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from ..api.spec import ReDrafterDeploymentSpec
from ..metrics.drafting import drafting

DEFAULT_TOKEN_COST = 0.0072
DEFAULT_DRAFTER_OVERHEAD = 0.10


@dataclass(frozen=True)
class CostParams:
    """Everything the cost model needs; build it with :meth:`from_spec`."""

    token_cost: float = DEFAULT_TOKEN_COST
    drafter_overhead: float = DEFAULT_DRAFTER_OVERHEAD
    verified_tokens: int = 26  # per request per step
    draft_len: int = 5  # draftLenPerBeam: the most a step can accept beyond the first token
    #: the speculative engine drafts only while at most this many requests are batched (None: always)
    draft_limit: int | None = None

    @classmethod
    def from_spec(cls, spec: ReDrafterDeploymentSpec, measured_crossover: float | None = None) -> "CostParams":
        """From a ReDrafterDeploymentSpec: spec.speculation.costModel over the method's draft geometry. An
        engine that stops drafting by itself does so above the measured crossover (render/serving.py gives
        it that as max_concurrency)."""
        cm, geometry = spec.speculation.cost_model, drafting(spec)
        limit = None
        if geometry.stops_at_load and measured_crossover is not None and math.isfinite(measured_crossover):
            limit = int(measured_crossover) if measured_crossover >= 1 else None
        return cls(
            token_cost=cm.token_cost,
            drafter_overhead=cm.drafter_overhead,
            verified_tokens=cm.verified_tokens_per_request or geometry.verified_tokens,
            draft_len=geometry.draft_len,
            draft_limit=limit,
        )


def tokens_per_step(acceptance: float, draft_len: int) -> float:
    """Expected tokens per drafting step from an acceptance rate (accepted / drafted; draft_len from
    metrics/drafting.py)."""
    return 1.0 + max(0.0, min(1.0, acceptance)) * draft_len


def step_latency(tokens: float, p: CostParams) -> float:
    return 1.0 + p.token_cost * tokens


def throughput(engine: str, batch: float, tps: float, p: CostParams) -> float:
    """Output tokens per unit time of one replica running ``engine`` at ``batch`` concurrent requests."""
    b = max(batch, 0.0)
    if engine == "base" or (p.draft_limit is not None and b > p.draft_limit):
        return b / step_latency(b, p)
    return b * tps / ((1.0 + p.drafter_overhead) * step_latency(b * p.verified_tokens, p))


def speedup(batch: float, tps: float, p: CostParams) -> float:
    """ReDrafter / base throughput at ``batch`` (an idle replica is judged at batch 1)."""
    b = max(batch, 1.0)
    return throughput("redrafter", b, tps, p) / throughput("base", b, tps, p)


def calibrated(p: CostParams, measured_crossover: float | None, tps: float) -> CostParams:
    """``p`` with ``token_cost`` solved so that :func:`crossover` at ``tps`` equals the measured one.

    The validation Job measures where ReDrafter stops beating base on the real engines; that
    beats any published calibration. token_cost is the model's one free batch-scaling parameter, so
    anchoring it keeps the model's shape (and its dependence on live tokens per step) while moving the
    crossover to the measured point. Unusable measurements leave ``p`` as it is.
    """
    slow = 1.0 + p.drafter_overhead
    if measured_crossover is None or not math.isfinite(measured_crossover) or measured_crossover <= 0:
        return p
    if tps <= slow or slow * p.verified_tokens <= tps:
        return p
    token_cost = (tps - slow) / (measured_crossover * (slow * p.verified_tokens - tps))
    return dataclasses.replace(p, token_cost=token_cost)


def crossover(tps: float, p: CostParams) -> float:
    """Batch size where ReDrafter stops beating base (0: never faster; inf: always faster)."""
    slow = 1.0 + p.drafter_overhead
    if tps <= slow:
        return 0.0
    denom = p.token_cost * (slow * p.verified_tokens - tps)
    return math.inf if denom <= 0 else (tps - slow) / denom
