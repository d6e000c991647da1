"""The speculation state machine: serve with ReDrafter while it pays, fall back to base when not.

Pure and deterministic: time is passed in; the only state is :class:`SpeculationState`, a small
JSON-able model the controller stores in status and hands back on the next evaluation.

Measurement semantics follow Argo Rollouts' analysis: every evaluation (one ``interval``) yields one
measurement that is Successful, Failed, Inconclusive or Error.

* Inconclusive — no pod answered, fewer than ``minSamples`` finished requests (even pooling the
  last ACCUMULATE_MAX intervals), nothing drafted — is never a failure: it neither adds to nor
  clears the consecutive counts (Argo pauses on it).
* Error — the source failed entirely — is counted apart; ``consecutiveErrorLimit`` errors in a row
  make the SpeculationHealthy condition Unknown and never cause a switch.
* ``failureLimit`` consecutive failures while on ReDrafter switch to base; ``successLimit``
  consecutive successes while on base switch back. Counting *consecutive* results (Argo counts
  failures over the run, which never ends here) lets an old failure expire with the next success.
* A switch also needs ``minDwell`` on the current engine and ``cooldown`` since the previous switch;
  until then the decision is Hold and the counts are kept, so the switch happens as soon as the gate
  opens if the evidence still holds. ``Always``/``Never`` pin the engine and switch at once.

Flapping (after Nagios' flap detection): the last ``FLAP_HISTORY`` conclusive outcomes are kept; when
they change between Successful and Failed ``FLAP_ENTER`` times or more, the input is flapping and the
consecutive rule is suspended (a run of failures inside an oscillation is not a collapse): the
engine stays put, unless the mean predicted speedup measured since flapping began (at least
``FLAP_MIN`` values) clearly favours the other engine, beyond ``FLAP_MARGIN_FACTOR`` margins. A
collapse and its recovery are 2 changes, never flapping. Flapping ends at ``FLAP_EXIT`` changes, or
once a run of successes of at least ``FLAP_SETTLE`` is twice as long as every earlier run in the
history: the input left the regime it alternated in (a slow load crossing that noise made look like
flapping; waiting for the 40-outcome history to flush kept the pool on base ~20 minutes after the
load had fallen), which an oscillation does not do as its runs keep their length (any half-period
up to half the history, 10 minutes at the default interval; slower ones are bounded by the cooldown);
the older outcomes are then dropped. A run of failures does not end it: while flapping,
only the cost model's mean moves the engine away.
Detection needs two half-periods of an oscillation; the cooldown after the first switch (default 10m)
is what gives it that time, so a cooldown much shorter than the oscillation period allows more switches.

What is measured, and how recovery is observed, is documented in :mod:`.measure`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..api.spec import ReDrafterDeploymentSpec, Speculation
from ..api.status import SpeculationStatus
from ..api.types import parse_duration
from .measure import Measurement, Observation, measure, recent_rows
from .state import Engine, SpeculationState

__all__ = ["Decision", "Measurement", "Observation", "SpeculationState", "due", "evaluate", "initial_state", "measure"]

Action = Literal["Stay", "Hold", "SwitchToBase", "SwitchToRedrafter"]

FLAP_HISTORY = 40  # conclusive outcomes remembered (20 minutes at the default 30s interval)
FLAP_ENTER = 4  # changes between Successful and Failed within the history that mean flapping
FLAP_EXIT = 1  # ... at or below which it no longer is (hysteresis)
FLAP_SETTLE = 10  # ... or once this many successes in a row, twice any earlier run, say it settled
FLAP_MIN = 8  # speedups measured while flapping before their mean may move the engine
FLAP_MARGIN_FACTOR = 4  # ... beyond this many margins (default +-20%): a switch mid-flap is costly


@dataclass(frozen=True)
class Decision:
    """One evaluation's result; ``engine`` is what the Service should select from now on."""

    action: Action
    engine: Engine
    reason: str
    message: str
    measurement: Measurement
    healthy: Literal["True", "False", "Unknown"]  # SpeculationHealthy condition status

    @property
    def switched(self) -> bool:
        return self.action in ("SwitchToBase", "SwitchToRedrafter")

    def status(self, now_rfc3339: str) -> SpeculationStatus:
        """The fields of status.speculation this evaluation measured (an unmeasured one stays unset)."""
        m = self.measurement
        return SpeculationStatus(
            samples=m.samples,
            last_evaluated=now_rfc3339,
            decision=self.action,
            reason=f"{self.reason}: {self.message}",
            acceptance_rate=_round(m.acceptance_rate),
            tokens_per_step=_round(m.tokens_per_step),
            predicted_speedup=_round(m.predicted_speedup),
            crossover_concurrency=None if m.crossover in (None, float("inf")) else _round(m.crossover),
        )


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def pinned_engine(spec: ReDrafterDeploymentSpec) -> Engine | None:
    """The engine ``speculation.mode`` pins (Always: redrafter, Never: base), None in Auto."""
    return {"Always": "redrafter", "Never": "base"}.get(spec.speculation.mode)  # type: ignore[return-value]


def initial_state(spec: ReDrafterDeploymentSpec, now: float, serving: str | None = None) -> SpeculationState:
    """State of a new resource: ReDrafter unless the mode pins base. ``serving``: the engine the Service
    already selects when the policy has no state yet (an operator that took over before the first
    evaluation was stored): a pin of the other engine is then a switch, recorded like any other."""
    pin = pinned_engine(spec)
    if pin is not None and serving in ("redrafter", "base") and serving != pin:
        return SpeculationState(engine=serving, since=now)  # type: ignore[arg-type]
    engine: Engine = "base" if pin == "base" else "redrafter"
    return SpeculationState(engine=engine, since=now)


def due(spec: ReDrafterDeploymentSpec, state: SpeculationState, now: float) -> bool:
    """True when an interval has passed since the last evaluation (guards against extra calls)."""
    interval = parse_duration(spec.speculation.interval)
    return state.last_evaluated is None or now - state.last_evaluated >= 0.9 * interval


def evaluate(
    spec: ReDrafterDeploymentSpec, state: SpeculationState, obs: Observation, now: float
) -> tuple[Decision, SpeculationState]:
    """One evaluation: measure, update the counts, decide. Returns the decision and the new state.

    The controller must persist the new state with the decision (status), move the Service to
    ``decision.engine`` (blue/green) and emit an Event when ``decision.switched``.
    """
    sp = spec.speculation
    m = measure(spec, state, obs)
    s = state.model_copy(update={"last_evaluated": now, "recent": recent_rows(state, obs)})
    if m.batch is not None:
        s.batch = round(m.batch, 3)
    if m.outcome == "Error":
        s.errors += 1
    else:
        s.errors = 0
    if m.outcome == "Successful":
        s.successes, s.failures = s.successes + 1, 0
    elif m.outcome == "Failed":
        s.failures, s.successes = s.failures + 1, 0
    if state.engine == "redrafter" and m.outcome in ("Successful", "Failed") and m.acceptance_rate is not None:
        s.last_acceptance, s.last_tokens_per_step = m.acceptance_rate, m.tokens_per_step
    if m.outcome in ("Successful", "Failed") and m.samples:
        s.recent = []  # consumed: each window counts in exactly one measurement
    if m.outcome in ("Successful", "Failed"):
        s.outcomes = (s.outcomes + m.outcome[0])[-FLAP_HISTORY:]
        was, s.flapping = s.flapping, _flapping(s.outcomes, s.flapping)
        if was and not s.flapping:
            s.outcomes = _runs(s.outcomes)[-1]  # the episode is over: only the settled run counts on
        if s.flapping and not was:
            s.speedups = []  # the mean that decides covers the flapping episode only
        if s.flapping and m.predicted_speedup is not None:
            s.speedups = (s.speedups + [round(m.predicted_speedup, 3)])[-FLAP_HISTORY:]
        elif not s.flapping:
            s.speedups = []

    healthy = _health(sp, s, m)
    s.health = healthy
    target = pinned_engine(spec)
    if target is not None:
        if s.engine == target:
            return Decision("Stay", target, "Pinned", f"mode {sp.mode} pins {target}", m, healthy), s
        return _switch(s, target, "Pinned", f"mode {sp.mode} pins {target}", m, healthy, now)

    if s.flapping:
        flap = _flap_target(sp, s)
        if flap is None:
            return Decision("Stay", s.engine, "Flapping", _flap_message(sp, s), m, healthy), s
        target, why, msg = flap, "FlappingMean", _flap_message(sp, s)
    elif s.engine == "redrafter" and s.failures >= sp.failure_limit:
        target, why = "base", m.reason
        msg = f"{s.failures} consecutive failed measurements (failureLimit {sp.failure_limit}); last: {m.message}"
    elif s.engine == "base" and s.successes >= sp.success_limit:
        target, why = "redrafter", m.reason
        msg = f"{s.successes} consecutive successful measurements (successLimit {sp.success_limit}); last: {m.message}"
    else:
        return Decision("Stay", s.engine, m.reason, _stay_message(sp, s, m), m, healthy), s

    blocked = _gate(spec, s, target, obs, now)
    if blocked:
        return Decision("Hold", s.engine, blocked[0], f"{blocked[1]}; wanted {target}: {msg}", m, healthy), s
    return _switch(s, target, why, msg, m, healthy, now)


def _changes(outcomes: str) -> int:
    return sum(a != b for a, b in zip(outcomes, outcomes[1:]))


def _runs(outcomes: str) -> list[str]:
    """The outcomes cut into runs of the same letter, oldest first."""
    runs: list[str] = []
    for x in outcomes:
        if runs and runs[-1][0] == x:
            runs[-1] += x
        else:
            runs.append(x)
    return runs


def _settled(outcomes: str) -> bool:
    """The last run is at least FLAP_SETTLE successes and twice as long as every earlier run in the history:
    the input left the regime it alternated in (an oscillation's runs keep their length)."""
    runs = _runs(outcomes)
    if not runs or runs[-1][0] != "S" or len(runs[-1]) < FLAP_SETTLE:
        return False
    return all(len(runs[-1]) >= 2 * len(r) for r in runs[:-1])


def _flapping(outcomes: str, was: bool) -> bool:
    n = _changes(outcomes)
    if was:
        return n > FLAP_EXIT and not _settled(outcomes)
    return n >= FLAP_ENTER


def _flap_target(sp: Speculation, s: SpeculationState) -> Engine | None:
    """While flapping: the engine the mean predicted speedup favours beyond the margin, if any."""
    if len(s.speedups) < FLAP_MIN or not sp.load_aware:
        return None  # too early, or no cost model: stay put (flap suppression)
    mean = sum(s.speedups) / len(s.speedups)
    margin = FLAP_MARGIN_FACTOR * sp.margin
    if s.engine == "redrafter" and mean < 1 - margin:
        return "base"
    if s.engine == "base" and mean > 1 + margin:
        return "redrafter"
    return None


def _flap_message(sp: Speculation, s: SpeculationState) -> str:
    mean = sum(s.speedups) / len(s.speedups) if s.speedups else None
    shown = f"{mean:.2f}" if mean is not None else "unknown"
    return (
        f"flapping: {_changes(s.outcomes)} changes in the last {len(s.outcomes)} outcomes; mean "
        f"predicted speedup while flapping {shown} over {len(s.speedups)} measurements "
        f"(moves only beyond 1 +/- {FLAP_MARGIN_FACTOR * sp.margin:.2f})"
    )


def _stay_message(sp: Speculation, s: SpeculationState, m: Measurement) -> str:
    limit, count = (sp.failure_limit, s.failures) if s.engine == "redrafter" else (sp.success_limit, s.successes)
    kind = "failures" if s.engine == "redrafter" else "successes"
    return f"{m.outcome}: {m.message} ({count}/{limit} consecutive {kind})"


def _gate(
    spec: ReDrafterDeploymentSpec, s: SpeculationState, target: Engine, obs: Observation, now: float
) -> tuple[str, str] | None:
    sp = spec.speculation
    if target not in obs.available:
        return "TargetNotReady", f"the {target} engine is not ready to serve"
    dwell = parse_duration(sp.min_dwell)
    if now - s.since < dwell:
        return "MinDwell", f"on {s.engine} for {now - s.since:.0f}s < minDwell {sp.min_dwell}"
    cool = parse_duration(sp.cooldown)
    if s.last_switch is not None and now - s.last_switch < cool:
        return "Cooldown", f"last switch {now - s.last_switch:.0f}s ago < cooldown {sp.cooldown}"
    return None


def _switch(
    s: SpeculationState,
    target: Engine,
    reason: str,
    msg: str,
    m: Measurement,
    healthy: Literal["True", "False", "Unknown"],
    now: float,
) -> tuple[Decision, SpeculationState]:
    new = s.model_copy(
        update={
            "engine": target,
            "since": now,
            "last_switch": now,
            "failures": 0,
            "successes": 0,
            "recent": [],
            "fallback_reason": reason if target == "base" else None,
        }
    )
    action: Action = "SwitchToBase" if target == "base" else "SwitchToRedrafter"
    return Decision(action, target, reason, msg, m, healthy), new


def _health(sp: Speculation, s: SpeculationState, m: Measurement) -> Literal["True", "False", "Unknown"]:
    """SpeculationHealthy: True while ReDrafter pays, False when it does not, Unknown without data.

    An Error below ``consecutiveErrorLimit`` keeps the previous status; at the limit it is Unknown.
    """
    if m.outcome == "Error":
        return "Unknown" if s.errors >= sp.consecutive_error_limit or s.health is None else s.health
    if m.outcome == "Successful":
        return "True"
    if m.outcome == "Failed" or s.engine == "base":
        return "False"
    return "Unknown"
