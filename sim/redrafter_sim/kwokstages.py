"""Pods without processes, as kwok's pod stages run them: for a node that stands in for thousands of pods
(the scale bench), where only the API traffic matters.

A pod restarted always (a Deployment's) goes Running and Ready at once and stays so; any other (a Job's) goes
Running, then Succeeded, every container exited 0, the first with the termination message ``message(pod)``
gives (what the real program would have written to /dev/termination-log). Nothing is mounted or run; the real
Job, ReplicaSet and Deployment controllers turn these statuses into theirs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from . import objects
from .noderun import with_addresses

Report = Callable[[dict[str, Any], dict[str, Any]], Awaitable[None]]


class Stages(Protocol):
    """What a node runs instead of a pod's processes: it posts the pod's statuses through ``report``."""

    async def run(self, pod: dict[str, Any], report: Report) -> None: ...


def _no_message(pod: dict[str, Any]) -> str:
    return ""


@dataclass(frozen=True)
class KwokStages:
    """``message``: a Job pod's termination message; ``running_seconds``: how long a Job pod stays Running."""

    message: Callable[[dict[str, Any]], str] = field(default=_no_message)
    running_seconds: float = 0.0

    async def run(self, pod: dict[str, Any], report: Report) -> None:
        """Post the pod's statuses through ``report`` (the kubelet's ``pods/status`` patch)."""
        meta, containers = pod["metadata"], pod["spec"]["containers"]
        ip, started = objects.pod_ip(meta["uid"]), objects.now()
        serving = pod["spec"].get("restartPolicy", "Always") == "Always"
        running = objects.running_status(containers[0]["name"], ip, started, serving, 0, containers[0].get("image", ""))
        running["containerStatuses"] = [
            {**running["containerStatuses"][0], "name": c["name"], "image": c.get("image", "")} for c in containers
        ]
        await report(pod, with_addresses(running, ip))
        if serving:
            return
        await asyncio.sleep(self.running_seconds)
        message = self.message(pod)
        status = objects.terminated_status(
            containers[0]["name"], ip, started, 0, message, containers[0].get("image", "")
        )
        (first,) = status["containerStatuses"]
        status["containerStatuses"] = [
            {**first, "name": c["name"], "image": c.get("image", ""), "state": _with_message(first, i == 0, message)}
            for i, c in enumerate(containers)
        ]
        await report(pod, with_addresses(status, ip))


def _with_message(entry: dict[str, Any], first: bool, message: str) -> dict[str, Any]:
    terminated = dict(entry["state"]["terminated"])
    terminated["message"] = message if first else ""
    return {"terminated": terminated}
