"""What a head is judged against: prompt lookup scored as verification scores a head (cut at the response's
end), the loop figures that tell a looping base from real text, the Job's one-line summary, and the drafter
gate's margins."""

from __future__ import annotations

import pytest

from engine_jobs.drafter.baselines import (
    loop_figures,
    prompt_lookup,
    prompt_lookup_counts,
    repeat_share,
    score_drafts,
    summary_line,
)
from redrafter_operator.policy.drafter_gate import DrafterFigures, judge


def test_prompt_lookup_copies_what_followed_the_latest_match() -> None:
    assert prompt_lookup([1, 2, 3, 9, 1, 2, 3, 7, 8, 1, 2, 3], 2) == [7, 8]  # the latest 3-gram match
    assert prompt_lookup([5, 6, 4, 6], 3) == [4, 6]  # falls back to the 1-gram 6
    assert prompt_lookup([1, 2, 3], 3) == []


def test_scoring_cuts_the_last_step_at_the_response_end() -> None:
    """A perfect drafter on a 7-token response with draft_len 4: steps commit 5 then 2 (not 5), so tokens per
    step is 3.5 and the accepted tokens are the 5 committed after a guaranteed one."""
    response = [10, 11, 12, 13, 14, 15, 16]

    def oracle(context, draft_len):
        done = len(context) - 1  # the prompt is one token
        return response[done : done + draft_len]

    counts = score_drafts([9], response, 4, oracle)
    assert (counts.steps, counts.committed, counts.accepted, counts.drafted) == (2, 7, 5, 8)
    assert counts.tokens_per_step == 3.5
    never = score_drafts([9], response, 4, lambda c, n: [])
    assert (never.steps, never.committed, never.accepted) == (7, 7, 0)


def test_prompt_lookup_drafts_a_loop_and_not_fresh_text() -> None:
    loop = [7, 8, 9] * 10
    counts = prompt_lookup_counts([[7, 8, 9]], [loop], 5)
    assert (counts.steps, counts.committed, counts.accepted) == (8, 30, 22)  # every draft right, the last step cut
    assert prompt_lookup_counts([[1, 2, 3]], [list(range(20, 50))], 5).acceptance == 0.0


def test_loop_figures_tell_a_loop_from_text() -> None:
    loop = [1, 2] * 16
    text = list(range(32))
    assert loop_figures([loop], 32) == {"distinct": 0.0625, "repeats": 0.931, "sequences": 1}  # 27 of 29 4-grams
    assert loop_figures([text], 32) == {"distinct": 1.0, "repeats": 0.0, "sequences": 1}
    assert loop_figures([text[:10]], 32)["sequences"] == 0  # shorter than the window: left out
    assert repeat_share([[1, 2, 3, 4] + list(range(10, 30)) + [1, 2, 3, 4]]) == 0.0  # 24 tokens apart: not a loop


def test_the_summary_line() -> None:
    line = summary_line(
        {
            "heldOutAcceptance": 0.5,
            "untrainedAcceptance": 0.0,
            "promptLookupAcceptance": 0.1,
            "heldOutTop1": [0.7, 0.5],
            "trainTop1": [0.75, 0.6],
        }
    )
    assert (
        line == "held-out acceptance 0.500 (untrained 0.000, prompt lookup 0.100); top-1@1 held-out 0.700, train 0.750"
    )
    assert "top-1@1 held-out n/a" in summary_line({})


@pytest.mark.parametrize(
    ("figures", "passed", "why"),
    [
        # the toy's head (docs/drafter.md): well above both baselines, top-1 held
        ((0.56, 0.0, 0.04, 0.62, 0.66), True, "drafts"),
        # a memorising head on a chaotic base: acceptance near zero, training top-1 far above held-out
        ((0.008, 0.0, 0.01, 0.02, 0.55), False, "collapsed against training"),
        # above prompt lookup, but not by the margin
        ((0.35, 0.0, 0.30, 0.6, 0.6), False, "below 0.450"),
        # well above, but held-out top-1 lost more than half of training's
        ((0.5, 0.0, 0.1, 0.2, 0.6), False, "collapsed"),
        # no held-out figures (heldOutFraction 0): not judged
        ((None, None, None, None, None), True, "not judged"),
    ],
)
def test_the_drafter_gate(figures: tuple, passed: bool, why: str) -> None:
    keys = ("heldOutAcceptance", "untrainedAcceptance", "promptLookupAcceptance", "heldOutTop1", "trainTop1")
    verdict = judge(DrafterFigures.model_validate(dict(zip(keys, figures, strict=True))))
    assert verdict.passed is passed and why in verdict.message, verdict.message


def test_the_gate_reads_evaluation_json() -> None:
    evaluation = {"heldOutAcceptance": 0.6, "untrainedAcceptance": 0.0, "heldOutTop1": [0.7, 0.6], "trainTop1": [0.7]}
    figures = DrafterFigures.from_evaluation(evaluation)
    assert (figures.held_out_top1, figures.train_top1, figures.prompt_lookup_acceptance) == (0.7, 0.7, None)
