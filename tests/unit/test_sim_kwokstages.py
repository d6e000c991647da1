"""The node's process-free mode (kwok's pod stages): what a Job's pod and a serving pod report, in order."""

from __future__ import annotations

import asyncio
from typing import Any

from redrafter_sim.kwokstages import KwokStages
from redrafter_sim.nodes import node


def pod(restart: str, containers: tuple[str, ...] = ("main",), component: str = "engine-build") -> dict[str, Any]:
    return {
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "uid": "u-1",
            "labels": {"app.kubernetes.io/component": component},
        },
        "spec": {"restartPolicy": restart, "containers": [{"name": c, "image": f"img/{c}"} for c in containers]},
    }


def staged(p: dict[str, Any], stages: KwokStages) -> list[dict[str, Any]]:
    posted: list[dict[str, Any]] = []

    async def report(_: dict[str, Any], status: dict[str, Any]) -> None:
        posted.append(status)

    asyncio.run(stages.run(p, report))
    return posted


def test_a_job_pod_runs_then_succeeds_with_the_message_on_its_first_container():
    def message(p: dict[str, Any]) -> str:
        return "OK: " + p["metadata"]["labels"]["app.kubernetes.io/component"]

    running, final = staged(pod("Never", ("main", "sidecar")), KwokStages(message=message))
    assert running["phase"] == "Running" and running["podIP"]
    assert [c["name"] for c in running["containerStatuses"]] == ["main", "sidecar"]
    assert final["phase"] == "Succeeded"
    first, second = (c["state"]["terminated"] for c in final["containerStatuses"])
    assert (first["exitCode"], first["message"]) == (0, "OK: engine-build")
    assert (second["exitCode"], second["message"]) == (0, "")
    assert [c["image"] for c in final["containerStatuses"]] == ["img/main", "img/sidecar"]


def test_a_serving_pod_goes_running_and_ready_and_stays():
    (status,) = staged(pod("Always"), KwokStages())
    ready = {c["type"]: c["status"] for c in status["conditions"]}
    assert status["phase"] == "Running" and ready["Ready"] == "True" and ready["ContainersReady"] == "True"
    assert status["containerStatuses"][0]["ready"] is True


def test_a_node_standing_in_for_a_cluster_advertises_the_capacity_it_is_given():
    _, status = node("n", "NVIDIA-A100-SXM4-80GB", 4000, allocatable={"pods": "8100", "cpu": "8100"})
    assert status["capacity"] == status["allocatable"]
    assert (status["allocatable"]["pods"], status["allocatable"]["cpu"]) == ("8100", "8100")
    assert status["allocatable"]["nvidia.com/gpu"] == "4000"
    _, default = node("n", "NVIDIA-A100-SXM4-80GB", 8)
    assert default["allocatable"]["pods"] == "110"
