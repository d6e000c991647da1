"""The simulated engines' pure drafting parts: NGram proposals, prefix acceptance, the copying greedy model."""

from __future__ import annotations

import random

from redrafter_sim.engine.speculation import (
    accept_prefix,
    chain_accepted,
    copy_continuation,
    greedy_next,
    ngram_propose,
)


def test_ngram_proposes_what_followed_the_most_recent_longest_suffix():
    seq = [1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 2, 3]
    # suffix [2, 3] (the longest that occurred before within 3) last occurred at 5..6, followed by 7, 8, 5
    assert ngram_propose(seq, 3, 3) == [7, 8, 5]
    assert ngram_propose(seq, 2, 3) == [7, 8]
    # with n-grams of one token only, the most recent earlier 3 is at 6, followed by 7
    assert ngram_propose(seq, 1, 1) == [7]
    # a longer suffix wins over a more recent shorter one
    assert ngram_propose([5, 6, 7, 1, 6, 7, 2, 5, 6, 7], 2, 3) == [1, 6]
    # the proposal stops at the end of the sequence
    assert ngram_propose([4, 5, 4], 5, 2) == [5, 4]


def test_ngram_proposes_nothing_on_novel_text():
    assert ngram_propose([1, 2, 3, 4, 5], 4, 3) == []
    assert ngram_propose([7], 4, 3) == []
    assert ngram_propose([], 4, 3) == []


def test_accept_prefix_stops_at_first_mismatch():
    truth = [10, 11, 12, 13]
    assert accept_prefix([10, 11, 99, 13], lambda j: truth[j]) == 2
    assert accept_prefix([10, 11, 12], lambda j: truth[j]) == 3
    assert accept_prefix([99], lambda j: truth[j]) == 0
    assert accept_prefix([], lambda j: truth[j]) == 0


def test_chain_acceptance_is_a_prefix_with_the_geometric_mean():
    rng = random.Random(1)
    assert chain_accepted(4, 1.0, rng) == 4 and chain_accepted(4, 0.0, rng) == 0
    samples = [chain_accepted(3, 0.7, rng) for _ in range(20000)]
    expected = 0.7 + 0.7**2 + 0.7**3
    assert abs(sum(samples) / len(samples) - expected) < 0.05
    assert max(samples) == 3


def test_greedy_model_copies_repetitive_prompts_and_hashes_novel_ones():
    prompt = [10, 11, 12, 13, 10, 11, 12, 13, 10, 11]
    assert copy_continuation(prompt, prompt) == 12
    out: list[int] = []
    for _ in range(8):
        out.append(greedy_next(prompt, out, 0, False, 3, 1000))
    assert out == [12, 13, 10, 11, 12, 13, 10, 11]
    novel = [10, 20, 30, 40]
    assert copy_continuation(novel, novel) is None
    assert copy_continuation([10, 20, 30, 10], [10, 20, 30, 10]) is None  # one repeated token is no pattern
    first = greedy_next(novel, [], 123, False, 3, 1000)
    assert first == greedy_next(novel, [], 123, False, 3, 1000)  # deterministic
    assert 3 <= first < 1000
    # diverge leaves the first token and copies nothing after it
    assert greedy_next(prompt, [12], 0, True, 3, 1000) != 13


def test_ngram_drafts_are_accepted_on_repetitive_text():
    prompt = [10, 11, 12, 13, 14] * 3

    def truth_after(seq: list[int]):
        return lambda j: greedy_next(prompt, seq[len(prompt) :] + draft[:j], 0, False, 3, 1000)

    seq = list(prompt)
    draft = ngram_propose(seq, 4, 3)
    assert draft == [10, 11, 12, 13]
    assert accept_prefix(draft, truth_after(seq)) == 4
