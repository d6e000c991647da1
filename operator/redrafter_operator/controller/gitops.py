"""The conditions GitOps tools read (pure): ``Ready``, ``Reconciling`` and ``Stalled``.

Flux and ``kubectl wait`` use kstatus (sigs.k8s.io/cli-utils pkg/kstatus/status, v0.37.2): after
``status.observedGeneration == metadata.generation``, ``Reconciling=True`` means InProgress,
``Stalled=True`` means Failed, then ``Ready`` True/False means Current/InProgress. Argo CD reads the same
three through docs/argocd-health.lua. They are derived here from the operator's own conditions, so a
tool waiting on health never sees "done" while engines build, a rollout or a switch runs, or validation
is pending, and sees "failed" when nothing will progress without a change (an invalid spec, a failed
build or validation, serving that cannot come up). A speculation fallback to base is healthy.
"""

from __future__ import annotations

from .conditions import Cond


def gitops_conditions(progressing: Cond, available: Cond | None, stall: tuple[str, str] | None) -> list[Cond]:
    """Ready/Reconciling/Stalled from Progressing, Available and the cause that stops progress (if any)."""
    if stall is not None:
        reason, message = stall
        return [
            Cond("Ready", "False", reason, message),
            Cond("Reconciling", "False", reason),
            Cond("Stalled", "True", reason, message),
        ]
    if progressing.status != "False":
        return [
            Cond("Ready", "False", progressing.reason, progressing.message),
            Cond("Reconciling", "True", progressing.reason, progressing.message),
            Cond("Stalled", "False", progressing.reason),
        ]
    # scaled to zero or prewarmed on purpose is a settled state: healthy, nothing left to do
    serving = available is not None and (
        available.status == "True" or available.reason in ("ScaledToZero", "Prewarmed")
    )
    ready = (
        Cond("Ready", "True", "Serving" if available.status == "True" else available.reason, available.message)
        if serving and available
        else Cond(
            "Ready",
            "False",
            available.reason if available else progressing.reason,
            available.message if available else progressing.message,
        )
    )
    return [ready, Cond("Reconciling", "False", progressing.reason), Cond("Stalled", "False", progressing.reason)]
