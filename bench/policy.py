"""Trace-driven simulation of the speculation policy against baselines and an oracle.

Each trace gives, every 30 s evaluation interval, the true acceptance rate and the concurrency per
replica (closed-loop clients), plus metric outages and pod restarts. Simulated Triton pods turn that
into cumulative counters and load gauges (with sampling noise, counter resets on restarts, new pod
identities after a switch); the operator's own code reads them through ``policy.loop.step`` — the
entry point the controller calls — with its state round-tripped through JSON as status would.

Throughput of a pod comes from the cost model (policy/cost.py) at the true acceptance, so the bench
measures decision quality, not the cost model's accuracy. A switch is blue/green: the old engine
serves until the new one is Ready (READY_DELAY). While on base, our policy runs the ReDrafter canary
replicas its plan asks for (``ServingPlan.canary``: CANARY, none after a load-caused fallback) in the
base pool (they serve real traffic, at ReDrafter speed, out of the same GPU budget).

Policies: ours (defaults); ours with minAcceptanceRate 0.1 (the cost model decides); always-ReDrafter;
always-base; naive threshold (switch on the latest window's acceptance vs minAcceptanceRate 0.35, no
counts/cooldown/cost model; recovers through the same canary).
Oracle: all replicas on whichever engine is faster at each instant, switching for free.

Run: ``python bench/policy.py`` (prints the tables; nothing is asserted); ``--bounds`` prints the limits of
any causal policy on the flapping trace, from clairvoyant schedules; ``--in-engine`` prints only the table of
the PyTorch backend's in-engine controls (max_concurrency, and the draft_len_schedule a per-draft-length sweep
gives) against, and with, the fleet switch.
"""

from __future__ import annotations

import dataclasses
import math
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "operator"), str(ROOT)]

from engine_jobs.llmapi_backend import draft_len_for_batch  # noqa: E402
from redrafter_operator.api.spec import ReDrafterDeploymentSpec  # noqa: E402
from redrafter_operator.evaluate.schedule import draft_len_schedule  # noqa: E402
from redrafter_operator.metrics.samples import PodError, PodSample, Reading  # noqa: E402
from redrafter_operator.metrics.window import WindowState, advance  # noqa: E402
from redrafter_operator.policy import cost  # noqa: E402
from redrafter_operator.policy.loop import PolicyState, step  # noqa: E402

DT = 30.0  # evaluation interval (s)
HOURS = 6
STEPS = int(HOURS * 3600 / DT)
REPLICAS = 8  # GPU budget in replicas (TP GPUs each), constant for every policy
CANARY = 1
READY_DELAY = 60.0  # target engine loading + readiness before the Service moves
STEP_SECONDS = 0.02  # fixed cost of one decode step: base at batch 1 = 50 tokens/s per request
OUTPUT_LEN = 300  # tokens per request
SEED = 7

SPEC = ReDrafterDeploymentSpec.model_validate(
    {
        "model": {"base": {"source": "hf://org/base"}, "drafter": {"source": "hf://org/drafter"}},
        "engine": {"maxBatchSize": 64},
        "autoscaling": {"mode": "Disabled"},  # a fixed GPU budget, the same for every policy
        "speculation": {"interval": f"{int(DT)}s"},  # every other speculation field at its default
    }
)
PARAMS = cost.CostParams.from_spec(SPEC)
# The default minAcceptanceRate (0.35) is a user floor stricter than the cost model's break-even at
# low load (~0.17 at 4 requests per replica); this variant leaves the decision to the cost model.
SPEC_LOW_FLOOR = SPEC.model_copy(
    update={"speculation": SPEC.speculation.model_copy(update={"min_acceptance_rate": 0.1})}
)


# ---- traces ----------------------------------------------------------------------------------
@dataclass
class Trace:
    name: str
    acceptance: list[float]
    concurrency: list[float]
    outage: list[str | None] = field(default_factory=lambda: [None] * STEPS)  # "pods" | "source"
    restart: list[int] = field(default_factory=lambda: [0] * STEPS)  # pods restarting this step
    flap_episodes: list[tuple[int, int]] = field(default_factory=list)  # [start, end) steps


def h(x: float) -> int:
    return int(x * 3600 / DT)


def breakeven_acceptance(c: float) -> float:
    """True acceptance at which ReDrafter and base are equally fast at concurrency c."""
    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        if cost.speedup(c, cost.tokens_per_step(mid, PARAMS.draft_len), PARAMS) < 1:
            lo = mid
        else:
            hi = mid
    return lo


def traces() -> list[Trace]:
    rnd = random.Random(SEED)
    n = range(STEPS)
    out = [
        Trace("steady high acceptance", [0.62] * STEPS, [4.0] * STEPS),
        Trace("slow drift", [0.65 - 0.6 * i / STEPS for i in n], [4.0] * STEPS),
        Trace("sudden collapse", [0.04 if h(2) <= i < h(4) else 0.6 for i in n], [4.0] * STEPS),
    ]
    be = breakeven_acceptance(4.0)
    osc = [0.6] * STEPS
    for i in range(h(1), h(5)):  # 4 h oscillating around the break-even, period 6 min, plus noise
        osc[i] = min(1.0, max(0.0, be + (0.13 if (i // 6) % 2 else -0.12) + rnd.gauss(0, 0.04)))
    out.append(Trace("noisy/oscillating", osc, [4.0] * STEPS, flap_episodes=[(h(1), h(5))]))
    ramp = [2 + 28 * (1 - abs(2 * i / STEPS - 1)) for i in n]  # 2 -> 30 -> 2 per replica
    out.append(Trace("load ramp across crossover", [0.55] * STEPS, ramp))
    outage: list[str | None] = [None] * STEPS
    for i in range(h(1), h(1.5)):
        outage[i] = "pods"
    for i in range(h(3), h(3.5)):
        outage[i] = "source"
    out.append(Trace("metric outage", [0.6] * STEPS, [4.0] * STEPS, outage=outage))
    restarts = [0] * STEPS
    for i in range(0, STEPS, 40):
        restarts[i] = 1
    for i in range(h(3), h(3) + 8):
        restarts[i] = 1  # rolling restart of every pod
    out.append(
        Trace(
            "pod restarts (counter resets)",
            [0.04 if h(4.5) <= i < h(5.5) else 0.6 for i in n],
            [4.0] * STEPS,
            restart=restarts,
        )
    )
    bursty = [3.0] * STEPS
    i = 0
    while i < STEPS:
        if rnd.random() < 0.04:  # 1-3 interval bursts to 25 concurrent requests
            for j in range(i, min(STEPS, i + rnd.randint(1, 3))):
                bursty[j] = 25.0
            i += 4
        i += 1
    for j in range(h(3), h(4)):
        bursty[j] = 24.0  # a sustained peak where base wins
    out.append(Trace("bursty traffic", [0.5] * STEPS, bursty))
    return out


# ---- simulated pods --------------------------------------------------------------------------
@dataclass
class Pod:
    name: str
    uid: str
    variant: str
    pool: str
    started: float
    restarts: int = 0
    params: cost.CostParams = PARAMS
    #: the engine's draft_len_schedule (lower-bound keys, as TensorRT-LLM 1.2.1 reads them); None: none set
    schedule: dict[int, int] | None = None
    c: dict[str, float] = field(
        default_factory=lambda: dict.fromkeys(
            ("requests", "output_tokens", "draft_tokens", "accepted_draft_tokens", "steps", "queue_us"), 0.0
        )
    )

    def serve(self, rnd: random.Random, acceptance: float, conc: float) -> float:
        """Advance counters by one interval at the true acceptance; returns tokens delivered."""
        p = self.params
        batch = min(conc, SPEC.engine.max_batch_size)
        # an engine with an in-engine limit (max_concurrency) drafts only at a batch up to it
        drafting = self.variant == "redrafter" and (p.draft_limit is None or batch <= p.draft_limit)
        if drafting and self.schedule is not None:  # a scheduled engine drafts the length its batch maps to
            k = draft_len_for_batch(self.schedule, math.ceil(batch))
            drafting, p = k > 0, at_draft_len(p, k) if k > 0 else p
        tps = cost.tokens_per_step(acceptance, p.draft_len) if drafting else 1.0
        tokens = cost.throughput(self.variant if drafting else "base", batch, tps, p) / STEP_SECONDS * DT
        requests = tokens / OUTPUT_LEN
        self.c["requests"] += requests
        self.c["output_tokens"] += tokens
        if drafting:
            # observed acceptance: per-request spread (sd 0.15) averaged over the window's requests
            seen = min(1.0, max(0.0, rnd.gauss(acceptance, 0.15 / math.sqrt(max(requests, 1.0)))))
            steps = tokens / cost.tokens_per_step(seen, p.draft_len)
            self.c["draft_tokens"] += steps * p.draft_len
            self.c["accepted_draft_tokens"] += steps * p.draft_len * seen
        else:
            steps = tokens
        self.c["steps"] += steps
        return tokens

    def sample(self, now: float, rnd: random.Random, conc: float) -> PodSample:
        active = min(_poisson(rnd, conc), SPEC.engine.max_batch_size)
        return PodSample(
            self.name,
            f"{self.uid}/{self.restarts}",
            self.variant,
            self.pool,
            now,  # type: ignore[arg-type]
            dict(self.c),
            {"active": float(active), "waiting": 0.0, "max": 64.0},
            self.started,
        )

    def restart(self, now: float) -> None:
        self.restarts += 1
        self.started = now
        self.c = dict.fromkeys(self.c, 0.0)


def _poisson(rnd: random.Random, lam: float) -> int:
    if lam > 30:
        return max(0, round(rnd.gauss(lam, math.sqrt(lam))))
    k, p, limit = 0, 1.0, math.exp(-lam)
    while True:
        p *= rnd.random()
        if p <= limit:
            return k
        k += 1


class Fleet:
    """The pods serving one engine choice; new pods (new identities) whenever the choice changes."""

    def __init__(self, params: cost.CostParams = PARAMS, schedule: dict[int, int] | None = None) -> None:
        self.serial = 0
        self.pods: list[Pod] = []
        self.engine: str | None = None
        self.params, self.schedule = params, schedule

    def set(self, engine: str, canary: int, now: float) -> None:
        if self.engine == engine:
            return
        keep = [p for p in self.pods if p.pool == engine and p.variant == engine]
        if engine == "base":
            layout = [("base", "base")] * (REPLICAS - canary) + [("redrafter", "base")] * canary
        else:
            layout = [("redrafter", "redrafter")] * REPLICAS
        pods = keep[: len(layout)]
        for variant, pool in layout[len(pods) :]:
            self.serial += 1
            pods.append(
                Pod(
                    f"{variant}-{pool}-{self.serial}",
                    f"uid{self.serial}",
                    variant,
                    pool,
                    now,
                    params=self.params,
                    schedule=self.schedule,
                )
            )
        self.pods, self.engine = pods, engine


# ---- policies --------------------------------------------------------------------------------
class Ours:
    """The operator's evaluation entry point (policy.loop.step), state carried as the controller does."""

    def __init__(
        self,
        spec: ReDrafterDeploymentSpec = SPEC,
        name: str = "ours",
        crossover: float | None = None,
        params: cost.CostParams | None = None,
        schedule: dict[int, int] | None = None,
    ) -> None:
        self.spec, self.name, self.crossover = spec, name, crossover
        self.params = params or PARAMS  # the simulated pods' physics
        self.schedule = schedule  # the pods' draft_len_schedule (None: none)
        self.state = PolicyState.new(spec, 0.0)
        self.engine = self.state.speculation.engine
        self.canary = 0  # what the last evaluation's plan asks of the base pool

    def decide(self, reading: Reading | None, error: str | None, now: float) -> str:
        ev, state = step(
            self.spec,
            self.state,
            reading,
            now,
            current_replicas=REPLICAS,
            error=error,
            measured_crossover=self.crossover,
        )
        self.state = PolicyState.model_validate_json(state.model_dump_json())  # as if stored in status
        self.engine = ev.speculation.engine
        self.canary = ev.plan(self.spec, REPLICAS).canary
        assert self.canary <= CANARY == self.spec.speculation.canary_replicas
        return self.engine


class Fixed:
    canary = 0

    def __init__(
        self,
        engine: str,
        params: cost.CostParams = PARAMS,
        name: str | None = None,
        schedule: dict[int, int] | None = None,
    ) -> None:
        self.engine, self.name, self.params = engine, name or f"always-{engine}", params
        self.schedule = schedule

    def decide(self, reading, error, now) -> str:
        return self.engine


class Naive:
    """Latest window's acceptance against minAcceptanceRate; no data leaves it where it is."""

    name, canary = "naive threshold", CANARY

    def __init__(self) -> None:
        self.engine = "redrafter"
        self.window: WindowState | None = None

    def decide(self, reading: Reading | None, error, now) -> str:
        if reading is None:
            return self.engine
        windows, self.window = advance(self.window, reading)
        red = windows.variants.get("redrafter")
        acc = red.acceptance_rate if red else None
        if acc is not None:
            self.engine = "base" if acc < SPEC.speculation.min_acceptance_rate else "redrafter"
        return self.engine


class Scripted:
    """Serves a given schedule (one engine per interval), deciding READY_DELAY ahead: a clairvoyant
    reference for the limits of causal policies (``--bounds``), never a baseline."""

    def __init__(self, serve: list[str], canary: int, name: str) -> None:
        lead = int(READY_DELAY / DT)
        self.plan = serve[lead:] + [serve[-1]] * lead
        self.engine, self.canary, self.name = self.plan[0], canary, name

    def decide(self, reading, error, now) -> str:
        self.engine = self.plan[min(int(round(now / DT)), len(self.plan) - 1)]
        return self.engine


POLICIES: list[Callable[[], object]] = [
    Ours,
    lambda: Ours(SPEC_LOW_FLOOR, "ours, floor 0.1"),
    lambda: Fixed("redrafter"),
    lambda: Fixed("base"),
    Naive,
]


# ---- simulation ------------------------------------------------------------------------------
@dataclass
class Result:
    tokens: float
    switches: int
    serving: list[str]
    flap_switches: list[int]


def simulate(trace: Trace, policy) -> Result:
    rnd = random.Random(SEED)
    fleet = Fleet(getattr(policy, "params", PARAMS), getattr(policy, "schedule", None))
    fleet.set(policy.engine, policy.canary, 0.0)
    pending: tuple[str, float] | None = None
    tokens, switches, serving, switch_steps = 0.0, 0, [], []
    desired = fleet.engine
    for i in range(STEPS):
        now = (i + 1) * DT
        a, conc = trace.acceptance[i], trace.concurrency[i]
        for _ in range(trace.restart[i]):
            rnd.choice(fleet.pods).restart(now - DT / 2)
        tokens += sum(p.serve(rnd, a, conc) for p in fleet.pods)
        serving.append(fleet.engine or "")
        reading: Reading | None
        error = None
        if trace.outage[i] == "source":
            reading, error = None, "Prometheus unreachable"
        elif trace.outage[i] == "pods":
            reading = Reading(
                now,
                errors=tuple(
                    PodError(p.name, p.variant, p.pool, "timeout")  # type: ignore[arg-type]
                    for p in fleet.pods
                ),
            )
        else:
            reading = Reading(now, samples=tuple(p.sample(now, rnd, conc) for p in fleet.pods))
        want = policy.decide(reading, error, now)
        if want != desired:
            desired, pending = want, (want, now + READY_DELAY)
            switches += 1
            switch_steps.append(i)
        if pending and now >= pending[1] - 1e-9:
            fleet.set(pending[0], policy.canary, now)
            pending = None
    flap = [sum(s <= x < e for x in switch_steps) for s, e in trace.flap_episodes]
    return Result(tokens, switches, serving, flap)


def oracle(trace: Trace, params: cost.CostParams = PARAMS) -> tuple[float, list[str]]:
    total, best = 0.0, []
    for a, conc in zip(trace.acceptance, trace.concurrency):
        b = min(conc, SPEC.engine.max_batch_size)
        per = {
            e: cost.throughput(e, b, cost.tokens_per_step(a, params.draft_len) if e == "redrafter" else 1.0, params)
            for e in ("redrafter", "base")
        }
        e = max(per, key=per.get)
        best.append(e)
        total += per[e] * REPLICAS / STEP_SECONDS * DT
    return total, best


def detection_delays(best: list[str], serving: list[str], hold: int = 20) -> tuple[list[float], int]:
    """Minutes from each sustained change of the oracle's engine until the policy serves it."""
    delays, missed = [], 0
    i = 1
    while i < len(best):
        if best[i] != best[i - 1] and all(b == best[i] for b in best[i : i + hold]):
            j = i
            end = next((k for k in range(i, len(best)) if best[k] != best[i]), len(best))
            while j < end and serving[j] != best[i]:
                j += 1
            if j < end:
                delays.append((j - i) * DT / 60)
            else:
                missed += 1
            i = end
        else:
            i += 1
    return delays, missed


def bounds() -> None:
    """Limits of any causal policy on the flapping traces, from clairvoyant schedules (``--bounds``).

    An oscillation's first low half-period looks exactly like a collapse: a policy that keeps the sudden-
    collapse trace near the best baseline leaves ReDrafter within it, and with at most one switch per
    flapping episode it then serves base until the episode ends. The best such schedule leaves at the
    drop and returns at the episode's end, clairvoyantly; the alternative stays on ReDrafter through the
    first half-period, which on the collapse trace costs that much detection delay."""
    by_name = {t.name: t for t in traces()}
    collapse = by_name["sudden collapse"]
    c_oracle, c_best = oracle(collapse)
    naive_collapse = simulate(collapse, Naive()).tokens / c_oracle
    for tr in traces():
        if not tr.flap_episodes:
            continue
        o_tokens, best = oracle(tr)
        start, end = tr.flap_episodes[0]
        first_base = next((i for i in range(start, end) if best[i] == "base"), end)
        serve = ["base" if first_base <= i < end else "redrafter" for i in range(STEPS)]
        once = simulate(tr, Scripted(serve, CANARY, "one switch per episode")).tokens / o_tokens
        stay = simulate(tr, Fixed("redrafter")).tokens / o_tokens
        half = next((i for i in range(first_base, end) if best[i] != "base"), end) - first_base
        print(
            f"{tr.name}: always-redrafter {100 * stay:.2f}%; leaving ReDrafter at the drop (clairvoyant) and "
            f"returning exactly at the episode's end, {CANARY} canary: {100 * once:.2f}%"
        )
        drop = next(i for i in range(STEPS) if c_best[i] == "base")
        late = [
            "base"
            if drop + half + 1 <= i < next(j for j in range(drop, STEPS) if c_best[j] == "redrafter")
            else "redrafter"
            for i in range(STEPS)
        ]
        waited = simulate(collapse, Scripted(late, CANARY, "waits a half-period"))
        delays, _ = detection_delays(c_best, waited.serving)
        print(
            f"  staying on ReDrafter through the first low half-period ({half * DT / 60:.1f} min) instead: "
            f"sudden collapse {100 * waited.tokens / c_oracle:.2f}% (naive threshold {100 * naive_collapse:.2f}%) "
            f"even if clairvoyant otherwise, detecting the collapse after {delays[0]:.1f} min (the suite's mean "
            f"detection delay is in the table); and such a wait only helps oscillations whose low half is shorter"
        )


def main() -> None:
    start = time.perf_counter()
    names = [p().name for p in POLICIES]
    suite = {n: [0.0, 0, [], 0, []] for n in names}
    oracle_total = 0.0
    print(
        f"{REPLICAS} replicas, canary {CANARY}, interval {DT:.0f}s, {HOURS} h per trace, ready delay "
        f"{READY_DELAY:.0f}s; spec: minAcceptanceRate {SPEC.speculation.min_acceptance_rate}, failureLimit "
        f"{SPEC.speculation.failure_limit}, successLimit {SPEC.speculation.success_limit}, cooldown "
        f"{SPEC.speculation.cooldown}, minDwell {SPEC.speculation.min_dwell}, margin {SPEC.speculation.margin}\n"
    )
    header = f"{'trace':32}" + "".join(f"{n:>22}" for n in names)
    print(header + "\n" + f"{'':32}" + "".join(f"{'% oracle / switches':>22}" for _ in names))
    print("-" * len(header))
    for tr in traces():
        o_tokens, best = oracle(tr)
        oracle_total += o_tokens
        row = f"{tr.name:32}"
        for make in POLICIES:
            pol = make()
            r = simulate(tr, pol)
            d, missed = detection_delays(best, r.serving)
            agg = suite[pol.name]
            agg[0] += r.tokens
            agg[1] += r.switches
            agg[2].extend(d)
            agg[3] += missed
            agg[4].extend(r.flap_switches)
            row += f"{100 * r.tokens / o_tokens:>15.1f}% / {r.switches:>3}"
        print(row)
    print("-" * len(header))
    print(
        f"{'suite (tokens vs oracle)':32}"
        + "".join(f"{100 * suite[n][0] / oracle_total:>15.1f}% / {suite[n][1]:>3}" for n in names)
    )
    print(
        f"{'detection delay (mean min)':32}"
        + "".join(
            f"{(sum(suite[n][2]) / len(suite[n][2]) if suite[n][2] else float('nan')):>15.1f} m"
            + f" {suite[n][3]:>2}miss"
            for n in names
        )
    )
    print(f"{'switches per flapping episode':32}" + "".join(f"{str(suite[n][4]):>22}" for n in names))
    print(f"\n(ran in {time.perf_counter() - start:.1f}s)")


# ---- in-engine and fleet together (the PyTorch backend's methods) ------------------------------
EAGLE3 = ReDrafterDeploymentSpec.model_validate(
    {
        "method": "eagle3",
        "model": {"base": {"source": "hf://org/base"}, "drafter": {"source": "hf://org/eagle3-head"}},
        "eagle3": {"maxDraftLen": 3},
        "engine": {"maxBatchSize": 64},
        "autoscaling": {"mode": "Disabled"},
        "speculation": {"interval": f"{int(DT)}s"},
    }
)


#: the crossover validation measures for an EAGLE-3 pair (llm-d's EAGLE-3 guide sees the plain model win
#: beyond ~4-8 QPS); every pod's cost model is calibrated to it, as the operator calibrates its own
EAGLE3_CROSSOVER = 8.0
EAGLE3_ACCEPTANCE = 0.55  # at which validation measured it
# The same draft geometry without an in-engine limit (the policy then knows of none): the fleet switch alone.
FLEET_ONLY = SPEC.model_copy(
    update={"redrafter": SPEC.redrafter.model_copy(update={"num_beams": 1, "draft_len_per_beam": 3})}
)


def at_draft_len(p: cost.CostParams, k: int) -> cost.CostParams:
    """The physics of the same chain drafter drafting ``k`` tokens: it verifies 1 + k per request and runs its
    head once per draft token, so its share of step time scales with k."""
    if k == p.draft_len:
        return p
    return dataclasses.replace(
        p,
        draft_len=k,
        verified_tokens=p.verified_tokens - p.draft_len + k,
        drafter_overhead=p.drafter_overhead * k / p.draft_len,
        draft_limit=None,
    )


def measured_sweep(p: cost.CostParams, acceptance: float, max_batch: int) -> dict[int, list[tuple[float, float]]]:
    """What the validation sweep (concurrency 1, 2, 4, ..., maxBatchSize) measures per draft length, 0 = base."""
    levels = [2**i for i in range(max_batch.bit_length()) if 2**i <= max_batch]
    sweep = {0: [(float(c), cost.throughput("base", c, 1.0, p)) for c in levels]}
    for k in range(1, p.draft_len + 1):
        q = at_draft_len(p, k)
        sweep[k] = [(float(c), cost.throughput("redrafter", c, cost.tokens_per_step(acceptance, k), q)) for c in levels]
    return sweep


def in_engine() -> None:
    """An EAGLE-3 fleet three ways: the fleet switch alone (drafting at every batch), the engine's own
    max_concurrency alone (set to the crossover validation measured; no fleet switch, so an acceptance
    collapse is never left), and both (the operator's setting: the engine stops drafting above the
    crossover at once, step by step, and the fleet switch handles acceptance collapse and the return)."""
    plain = cost.CostParams.from_spec(EAGLE3)
    physics = cost.calibrated(plain, EAGLE3_CROSSOVER, cost.tokens_per_step(EAGLE3_ACCEPTANCE, plain.draft_len))
    limited = dataclasses.replace(physics, draft_limit=int(EAGLE3_CROSSOVER))
    schedule = draft_len_schedule(
        measured_sweep(physics, EAGLE3_ACCEPTANCE, EAGLE3.engine.max_batch_size), physics.draft_len
    )
    policies: list[Callable[[], object]] = [
        lambda: Ours(FLEET_ONLY, "fleet switch only", EAGLE3_CROSSOVER, physics),
        lambda: Fixed("redrafter", limited, "max_concurrency only"),
        lambda: Ours(EAGLE3, "both (the operator)", EAGLE3_CROSSOVER, limited),
        lambda: Ours(EAGLE3, "schedule + fleet", EAGLE3_CROSSOVER, physics, schedule),
        lambda: Fixed("base", physics),
    ]
    names = [p().name for p in policies]  # type: ignore[attr-defined]
    print(
        f"\nIn-engine and fleet together: eagle3 maxDraftLen {plain.draft_len}, measured crossover "
        f"{EAGLE3_CROSSOVER:g} (max_concurrency {limited.draft_limit}); % of an oracle that picks the faster "
        "engine per interval, with drafting stopped above the crossover / switches"
    )
    print(
        f"schedule + fleet: draft_len_schedule {schedule} (lower-bound keys, TensorRT-LLM 1.2.1) from the sweep "
        "(1, 2, 4, ..., maxBatchSize) per draft length, a chain drafter's head costing per draft token; at 1.2.1 "
        "only NGram and draft-model engines read it (Eagle3 one-model, MTP: max_concurrency)"
    )
    header = f"{'trace':32}" + "".join(f"{n:>22}" for n in names)
    print(header + "\n" + "-" * len(header))
    totals = dict.fromkeys(names, 0.0)
    oracle_total = 0.0
    for tr in traces():
        o_tokens, _ = oracle(tr, limited)
        oracle_total += o_tokens
        row = f"{tr.name:32}"
        for make in policies:
            pol = make()
            r = simulate(tr, pol)
            totals[pol.name] += r.tokens  # type: ignore[attr-defined]
            row += f"{100 * r.tokens / o_tokens:>15.1f}% / {r.switches:>3}"
        print(row)
    print("-" * len(header))
    print(f"{'suite (tokens vs oracle)':32}" + "".join(f"{100 * totals[n] / oracle_total:>21.1f}%" for n in names))


if __name__ == "__main__":
    if "--bounds" in sys.argv[1:]:
        bounds()
    elif "--in-engine" in sys.argv[1:]:
        in_engine()
    else:
        main()
        in_engine()
