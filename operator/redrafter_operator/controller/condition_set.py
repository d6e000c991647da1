"""The condition set (pure): what each concern marks, and the Ready, Reconciling and Stalled derived from it.

Each concern of a plan step (engines, serving, validation, placement, routing, speculation) marks the conditions
it owns on one :class:`Marks`, and says when its state stops all progress (:meth:`Marks.stall`). The
:class:`ConditionSet` declares those conditions and derives the three GitOps tools read, so no concern sets them
(KServe's llmisvc does the same with Knative's ``LivingConditionSet``; here one rule replaces its ``Mark*``
functions).

Flux and ``kubectl wait`` use kstatus (sigs.k8s.io/cli-utils pkg/kstatus/status, v0.37.2): after
``status.observedGeneration == metadata.generation``, ``Reconciling=True`` means InProgress, ``Stalled=True``
means Failed, then ``Ready`` True/False means Current/InProgress. Argo CD reads the same three through
docs/argocd-health.lua. A tool waiting on health never sees "done" while engines build, a rollout or a switch
runs, or validation is pending, and sees "failed" when nothing will progress without a change (an invalid spec,
a failed build or validation, serving that cannot come up). A speculation fallback to base is healthy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from ..api.status import Condition
from .conditions import Cond, Status, merge_conditions


@dataclass
class Marks:
    """The conditions one plan step marks, the ones it removes, and the stalls its concerns report."""

    conds: dict[str, Cond] = field(default_factory=dict)
    removed: set[str] = field(default_factory=set)
    stalls: dict[str, tuple[str, str]] = field(default_factory=dict)  # condition type -> (reason, message)

    def mark(self, type_: str, status: Status, reason: str, message: str = "") -> Cond:
        cond = self.conds[type_] = Cond(type_, status, reason, message)
        self.removed.discard(type_)
        return cond

    def set(self, cond: Cond | None) -> None:
        """A condition a concern computed whole; None leaves it as it was."""
        if cond is not None:
            self.mark(cond.type, cond.status, cond.reason, cond.message)

    def remove(self, type_: str) -> None:
        """The concern is off: its condition goes (InferencePoolReady without spec.routing.inferencePool)."""
        self.conds.pop(type_, None)
        self.removed.add(type_)

    def stall(self, type_: str, reason: str, message: str) -> None:
        """The state behind ``type_`` stops all progress until the spec or an annotation changes."""
        self.stalls[type_] = (reason, message)

    def get(self, type_: str) -> Cond | None:
        return self.conds.get(type_)


@dataclass(frozen=True)
class ConditionSet:
    """The conditions the planner declares and how Ready, Reconciling and Stalled follow from them.

    ``stall_order``: which concern's stall names the cause when several stop progress; ``progress``: the
    condition that says work is under way; ``available``: the one that says serving is up, with the reasons
    under which not serving is settled on purpose (scaled to zero, prewarmed).
    """

    stall_order: tuple[str, ...] = ("SpecValid", "Progressing", "EnginesReady", "Available", "Validated")
    progress: str = "Progressing"
    available: str = "Available"
    settled_reasons: tuple[str, ...] = ("ScaledToZero", "Prewarmed")

    def derive(self, marks: Marks) -> list[Cond]:
        """Ready, Reconciling and Stalled for what ``marks`` holds (a progress condition is always marked)."""
        stall = next((marks.stalls[t] for t in self.stall_order if t in marks.stalls), None)
        if stall is not None:
            reason, message = stall
            return [
                Cond("Ready", "False", reason, message),
                Cond("Reconciling", "False", reason),
                Cond("Stalled", "True", reason, message),
            ]
        progressing = marks.get(self.progress)
        assert progressing is not None, "every plan step marks its progress"
        if progressing.status != "False":
            return [
                Cond("Ready", "False", progressing.reason, progressing.message),
                Cond("Reconciling", "True", progressing.reason, progressing.message),
                Cond("Stalled", "False", progressing.reason),
            ]
        available = marks.get(self.available)
        if available is not None and (available.status == "True" or available.reason in self.settled_reasons):
            reason = "Serving" if available.status == "True" else available.reason
            ready = Cond("Ready", "True", reason, available.message)
        elif available is not None:
            ready = Cond("Ready", "False", available.reason, available.message)
        else:
            ready = Cond("Ready", "False", progressing.reason, progressing.message)
        return [ready, Cond("Reconciling", "False", progressing.reason), Cond("Stalled", "False", progressing.reason)]

    def conditions(self, old: Iterable[Condition], marks: Marks, *, generation: int, now: str) -> list[Condition]:
        """``status.conditions`` after one step: the marked and derived ones over the old, the removed gone."""
        kept = [c for c in old if c.type not in marks.removed]
        desired = [*marks.conds.values(), *self.derive(marks)]
        return merge_conditions(kept, desired, generation=generation, now=now)


CONDITIONS = ConditionSet()

__all__ = ["CONDITIONS", "ConditionSet", "Marks"]
