"""Why serving does not come up (pure): the cause the scheduler, the kubelet or the Deployment controller
already wrote, named with its Pod (or Deployment), reason and message.

Without it every one of these looks like a rollout in progress until someone reads the Pods: the
operator watches its serving Pods and Deployments (:mod:`.facts`) and turns the first failure of the
variants it wants running into ``status.serving.failure``, the Available/Progressing reasons, the
GitOps conditions (:mod:`.condition_set`) and one Event per cause.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

from ..api.status import ServingFailure as FailureStatus
from ..api.status import ServingStatus
from .facts import Observed

PROGRESS_DEADLINE = "ProgressDeadlineExceeded"
_REASON = re.compile(r"[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?")  # api/status.py Condition.reason
PRIMARY_ROLE = "primary"  # the variant Deployment's Pods (render/serving.py); canary and candidate serve no pool


@dataclass(frozen=True)
class ServingFailure:
    """One cause: ``pod`` names the failing Pod, ``deployment`` the Deployment (always set)."""

    reason: str
    message: str
    deployment: str
    pod: str = ""
    deadline_exceeded: bool = False  # the Deployment controller gave up waiting (Progressing=False)

    @property
    def summary(self) -> str:
        where = f"pod {self.pod}" if self.pod else f"Deployment {self.deployment}"
        return f"{where}: {self.reason}" + (f": {self.message}" if self.message else "")

    def as_status(self) -> FailureStatus:
        return FailureStatus(reason=self.reason, message=self.message, deployment=self.deployment, pod=self.pod or None)

    @classmethod
    def from_status(cls, serving: ServingStatus) -> "ServingFailure | None":
        f = serving.failure
        if f is None or not f.reason:
            return None
        return cls(f.reason, f.message, f.deployment, f.pod or "")


def serving_failure(observed: Observed, variants: Iterable[str]) -> ServingFailure | None:
    """The first failure among the primary Deployments of ``variants`` and their Pods.

    Order: the Deployment cannot create Pods at all (ReplicaFailure: admission, quota), then a Pod's own
    cause (sorted by name, so the same cluster state always names the same Pod), then the Deployment's
    progress deadline (which says only that something above has lasted too long).
    """
    wanted = [v for v in variants if v in observed.deployments]
    deadline: ServingFailure | None = None
    for v in wanted:
        dep = observed.deployments[v]
        if dep.failure_reason == PROGRESS_DEADLINE:
            deadline = deadline or ServingFailure(
                dep.failure_reason, dep.failure_message, dep.name, deadline_exceeded=True
            )
        elif dep.failure_reason:  # a condition reason is CamelCase by API convention; the CRD enforces it here
            reason = dep.failure_reason if _REASON.fullmatch(dep.failure_reason) else "ReplicaFailure"
            return ServingFailure(reason, dep.failure_message, dep.name)
    for pod in sorted(observed.serving_pods, key=lambda p: p.name):
        if pod.reason and pod.variant in wanted and pod.role in ("", PRIMARY_ROLE):
            dep = observed.deployments[pod.variant]
            if deadline:  # say which pod is the reason the deadline passed
                return ServingFailure(
                    pod.reason,
                    f"{pod.message} ({deadline.reason}: {deadline.message})",
                    dep.name,
                    pod.name,
                    deadline_exceeded=True,
                )
            return ServingFailure(pod.reason, pod.message, dep.name, pod.name)
    return deadline
