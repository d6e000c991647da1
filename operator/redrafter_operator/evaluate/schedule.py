"""From a measured sweep per draft length to the PyTorch engine's ``draft_len_schedule`` (pure).

The sweep gives tokens/s at each concurrency for the full draft, for shorter drafts and for base (draft
length 0). At each concurrency the fastest draft length wins; where the winner changes, the switch point is
interpolated between the two measured levels, as :func:`.stats.crossover` does for ReDrafter against base.
Drafts never lengthen as the batch grows. A schedule is written only when a shorter, non-zero draft wins
somewhere between the full draft and base: otherwise ``max_concurrency`` (the crossover) says everything.

Keys follow the pinned TensorRT-LLM's reading (``engine_jobs/llmapi_backend.py``, lower bounds: "from this
batch size on"), so a switch crossing at ``x`` becomes the key ``floor(x) + 1``, the same rounding as
``max_concurrency = floor(crossover)``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from engine_jobs.llmapi_backend import DRAFT_LEN_SCHEDULE_KEYS

#: draft length -> [(concurrency, tokens/s)]; 0 is the base engine
Sweep = Mapping[int, Sequence[tuple[float, float]]]


def _switch_point(c0: float, r0: float, c1: float, r1: float) -> float:
    """Where the ratio new/old tokens/s crosses 1 between two levels (r0 < 1 <= r1)."""
    return c0 + (1.0 - r0) / (r1 - r0) * (c1 - c0) if r1 != r0 else c1


def draft_len_schedule(sweep: Sweep, max_draft_len: int) -> dict[int, int] | None:
    """The schedule the sweep supports, or None when no shorter draft pays at any middle batch size."""
    if DRAFT_LEN_SCHEDULE_KEYS != "lower_bound":  # the keys below are lower bounds; a new pin must re-derive them
        raise NotImplementedError(f"draft_len_schedule keys read as {DRAFT_LEN_SCHEDULE_KEYS}")
    lengths = sorted(k for k in sweep if 0 <= k <= max_draft_len)
    if max_draft_len not in lengths or 0 not in lengths:
        return None
    tps = {k: {c: t for c, t in sweep[k] if t > 0} for k in lengths}
    levels = sorted(set.intersection(*(set(v) for v in tps.values())))
    if not levels:
        return None
    schedule = {1: max_draft_len}
    current, previous = max_draft_len, None
    for c in levels:
        best = max((k for k in lengths if k <= current), key=lambda k: (tps[k][c], k))
        if best != current:
            key = 1
            if previous is not None:
                x = _switch_point(
                    previous, tps[best][previous] / tps[current][previous], c, tps[best][c] / tps[current][c]
                )
                key = max(2, math.floor(x) + 1, max(schedule) + 1)
            if key == 1:  # a shorter draft (or none) wins already at the lowest level: nothing to schedule
                return None
            schedule[key] = best
            current = best
        previous = c
    return schedule if any(0 < v < max_draft_len for v in schedule.values()) else None
