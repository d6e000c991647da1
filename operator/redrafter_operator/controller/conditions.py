"""Condition bookkeeping (pure): set a condition, keeping lastTransitionTime unless the status changes.

Kubernetes convention (metav1.Condition): ``lastTransitionTime`` marks when ``status`` last flipped, not
when the reason or message were last rewritten. Keeping it stable is also what makes a re-run of the
reconciler with the same inputs produce byte-identical status (and therefore no write).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Literal

from ..api.status import CONDITION_TYPES, Condition

Status = Literal["True", "False", "Unknown"]
MESSAGE_LIMIT = 4096  # conditions are shown by `kubectl describe`; keep them readable and bounded


@dataclass(frozen=True)
class Cond:
    """A desired condition, before bookkeeping (no timestamps)."""

    type: str
    status: Status
    reason: str
    message: str = ""


def _clip(message: str) -> str:
    return message if len(message) <= MESSAGE_LIMIT else message[: MESSAGE_LIMIT - 3] + "..."


def merge_conditions(
    old: Iterable[Condition], desired: Iterable[Cond], *, generation: int, now: str
) -> list[Condition]:
    """The new ``status.conditions``: desired ones replace old ones of the same type.

    Conditions of types not in ``desired`` are kept as they are (another component, e.g. the
    speculation policy, may own them). Output order is the canonical CONDITION_TYPES order, then others.
    """
    by_type: dict[str, Condition] = {c.type: c for c in old}
    for cond in desired:
        prev = by_type.get(cond.type)
        changed = prev is None or prev.status != cond.status
        by_type[cond.type] = Condition(
            type=cond.type,
            status=cond.status,
            reason=cond.reason,
            message=_clip(cond.message),
            last_transition_time=(None if changed or prev is None else prev.last_transition_time) or now,
            observed_generation=generation,
        )
    order = {t: i for i, t in enumerate(CONDITION_TYPES)}
    return sorted(by_type.values(), key=lambda c: (order.get(c.type, len(order)), c.type))


def find(conditions: Iterable[dict[str, Any]], type_: str) -> dict[str, Any] | None:
    return next((c for c in conditions if c.get("type") == type_), None)


def is_true(conditions: Iterable[dict[str, Any]], type_: str) -> bool:
    c = find(conditions, type_)
    return bool(c and c.get("status") == "True")
