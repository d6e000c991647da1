"""The drafter gate: does a trained head draft, or did it memorise its training continuations?

A ReDrafter engine costs a GPU build and a validation; a head that drafts no better than a free drafter
(prompt lookup) or than no training at all wastes them, and one whose held-out top-1 collapses against its
training top-1 has memorised. The margins and the figures behind them are in docs/drafter.md.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

#: held-out acceptance must exceed the better baseline (untrained head, prompt lookup) by this much...
MIN_ACCEPTANCE_MARGIN = 0.10
#: ...and be at least this multiple of it
MIN_ACCEPTANCE_RATIO = 1.5
#: held-out top-1 at the first draft position must keep at least this share of the training top-1
MIN_TOP1_RETENTION = 0.5


class DrafterFigures(BaseModel):
    """What the training Job measured (evaluation.json's names); None where it was not measured."""

    model_config = ConfigDict(extra="ignore", frozen=True, alias_generator=to_camel, populate_by_name=True)

    held_out_acceptance: float | None = Field(default=None, ge=0, le=1)
    untrained_acceptance: float | None = Field(default=None, ge=0, le=1)
    prompt_lookup_acceptance: float | None = Field(default=None, ge=0, le=1)
    held_out_top1: float | None = Field(default=None, ge=0, le=1)
    train_top1: float | None = Field(default=None, ge=0, le=1)

    @classmethod
    def from_evaluation(cls, evaluation: dict[str, Any]) -> DrafterFigures:
        """From evaluation.json, whose top-1 figures are lists by draft position (the gate reads the first)."""
        first = {k: (evaluation.get(k) or [None])[0] for k in ("heldOutTop1", "trainTop1")}
        return cls.model_validate({**evaluation, **first})


class GateVerdict(BaseModel):
    model_config = ConfigDict(frozen=True)

    passed: bool
    message: str


def _f(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def judge(figures: DrafterFigures) -> GateVerdict:
    """Pass when held-out acceptance is well above both baselines and held-out top-1 has not collapsed; a
    drafter without held-out figures is not judged (it passes, and says so)."""
    f = figures
    described = (
        f"held-out acceptance {_f(f.held_out_acceptance)} (untrained {_f(f.untrained_acceptance)}, "
        f"prompt lookup {_f(f.prompt_lookup_acceptance)}); top-1@1 held-out {_f(f.held_out_top1)}, "
        f"train {_f(f.train_top1)}"
    )
    if f.held_out_acceptance is None:  # recipe.heldOutFraction 0, or a result not read (yet): nothing to judge
        return GateVerdict(passed=True, message=f"the drafter was not judged: no held-out figures [{described}]")
    failures: list[str] = []
    baselines = [v for v in (f.untrained_acceptance, f.prompt_lookup_acceptance) if v is not None]
    best = max(baselines, default=0.0)
    need = max(best + MIN_ACCEPTANCE_MARGIN, MIN_ACCEPTANCE_RATIO * best)
    if f.held_out_acceptance < need:
        failures.append(
            f"held-out acceptance {f.held_out_acceptance:.3f} is below {need:.3f} (the better baseline {best:.3f} "
            f"+ {MIN_ACCEPTANCE_MARGIN:g}, and at least {MIN_ACCEPTANCE_RATIO:g} x it)"
        )
    if f.held_out_top1 is not None and f.train_top1 is not None and f.train_top1 > 0:
        floor = MIN_TOP1_RETENTION * f.train_top1
        if f.held_out_top1 < floor:
            failures.append(
                f"held-out top-1 {f.held_out_top1:.3f} collapsed against training {f.train_top1:.3f} "
                f"(needs >= {floor:.3f}): the head memorised its training continuations"
            )
    if failures:
        return GateVerdict(passed=False, message=f"the drafter does not draft: {'; '.join(failures)} [{described}]")
    return GateVerdict(passed=True, message=f"the drafter drafts: {described}")
