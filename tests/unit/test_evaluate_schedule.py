"""From a measured sweep per draft length to draft_len_schedule, in the pinned release's (lower-bound) keys."""

from __future__ import annotations

from engine_jobs import llmapi_backend as lb
from redrafter_operator.evaluate.schedule import draft_len_schedule

LEVELS = (1, 2, 4, 8, 16)


def _sweep(**by_len: tuple[float, ...]) -> dict[int, list[tuple[float, float]]]:
    return {int(k[1:]): list(zip(LEVELS, tps)) for k, tps in by_len.items()}


# tokens/s per level: the full draft (3) wins at 1-4, draft 1 at 8, base at 16
MIDDLE = _sweep(d3=(10, 18, 30, 40, 44), d1=(7, 13, 24, 42, 50), d0=(5, 10, 19, 33, 55))


def test_a_shorter_draft_paying_at_middle_batch_sizes_gives_a_schedule():
    """Switches are interpolated between levels and keyed "from this batch on": draft 1 overtakes draft 3
    between 4 (24/30) and 8 (42/40) at 7.2, so from batch 8; base overtakes draft 1 at 13.45, so 0 from 14."""
    assert draft_len_schedule(MIDDLE, 3) == {1: 3, 8: 1, 14: 0}


def test_the_schedule_drafts_the_fastest_measured_length_at_every_level_and_passes_the_pin():
    schedule = draft_len_schedule(MIDDLE, 3)
    assert schedule is not None
    assert lb.check_draft_len_schedule(schedule, 3) == []
    fastest = {c: max(MIDDLE, key=lambda k: dict(MIDDLE[k])[c]) for c in LEVELS}
    assert {c: lb.draft_len_for_batch(schedule, c) for c in LEVELS} == fastest


def test_no_shorter_draft_paying_keeps_max_concurrency():
    """The full draft wins until base does: max_concurrency (the crossover) already says it all."""
    sweep = _sweep(d3=(10, 18, 30, 40, 44), d1=(7, 13, 24, 36, 45), d0=(5, 10, 19, 33, 55))
    assert draft_len_schedule(sweep, 3) is None


def test_a_sweep_without_shorter_drafts_or_base_gives_none():
    assert draft_len_schedule(_sweep(d3=(10, 18, 30, 40, 44), d0=(5, 10, 19, 33, 55)), 3) is None
    assert draft_len_schedule(_sweep(d3=(10, 18, 30, 40, 44), d1=(7, 13, 24, 42, 50)), 3) is None


def test_a_shorter_draft_winning_already_at_batch_one_is_not_scheduled():
    """The pin requires {1: max_draft_len}: a sweep where the full draft never wins says to shorten the draft
    (a new engine), not to schedule it."""
    sweep = _sweep(d3=(6, 11, 20, 30, 40), d1=(7, 13, 24, 42, 50), d0=(5, 10, 19, 33, 55))
    assert draft_len_schedule(sweep, 3) is None


def test_drafts_never_lengthen_as_the_batch_grows():
    """A noisy level where the full draft edges ahead again after the switch does not bring it back."""
    sweep = _sweep(d3=(10, 18, 30, 40, 52), d1=(7, 13, 24, 42, 50), d0=(5, 10, 19, 33, 45))
    assert draft_len_schedule(sweep, 3) == {1: 3, 8: 1}
