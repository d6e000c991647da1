"""Placement (pure): the scheduler's node filters a GPU Job depends on, and the account of why none fits."""

from __future__ import annotations

from typing import Any

import pytest

from redrafter_operator.api.types import parse_quantity
from redrafter_operator.render.placement import GPU, LABEL_PRODUCT, Node, Taint, misfit, place, requests, tolerates

A100 = "NVIDIA-A100-SXM4-80GB"
H100 = "NVIDIA-H100-80GB-HBM3"


def gpu_node(name: str, product: str, gpus: int, **kwargs: Any) -> Node:
    return Node(name, {LABEL_PRODUCT: product}, {GPU: str(gpus), "cpu": "96"}, **kwargs)


def pod(gpus: int, product: str | None = None, **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "build", "resources": {"limits": {GPU: str(gpus), "cpu": "8"}}}]}
    if product:
        spec["nodeSelector"] = {LABEL_PRODUCT: product}
    return spec | extra


@pytest.mark.parametrize(
    ("text", "value"),
    [("8", 8.0), ("500Gi", 500 * 1024**3), ("1.5T", 1.5e12), ("250m", 0.25), ("2k", 2000.0), ("0", 0.0)],
)
def test_quantities(text: str, value: float) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "8 Gi", "Gi", "1e3", "eight"])
def test_bad_quantities_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="is not a quantity"):
        parse_quantity(text)


def test_the_product_and_the_count_must_both_match() -> None:
    nodes = [gpu_node("h100-0", H100, 8), gpu_node("a100-small", A100, 1), gpu_node("a100-0", A100, 8)]
    assert place(pod(2, A100), nodes).fits == ("a100-0",)
    assert misfit(pod(2, A100), nodes[0]) == f"{LABEL_PRODUCT}={H100}"
    assert misfit(pod(2, A100), nodes[1]) == f"1 {GPU}"


def test_the_message_names_what_is_missing_and_what_the_cluster_has() -> None:
    nodes = [gpu_node(f"h100-{i}", H100, 8) for i in range(3)]
    where = place(pod(2, A100), nodes)
    assert where.fits == ()
    assert where.message == f"no node offers 2× {A100}; nodes: 3× {H100} (8 each)"
    assert place(pod(2, A100), []).message == f"no node offers 2× {A100}; nodes: none"


def test_without_a_product_any_node_with_enough_gpus_fits() -> None:
    nodes = [gpu_node("h100-0", H100, 8), Node("cpu-0", {}, {"cpu": "32"})]
    assert place(pod(8), nodes).fits == ("h100-0",)
    assert (
        place(pod(16), nodes).message == f"no node offers 16× {GPU}; nodes: 1× {H100} (8 each), 1× unlabelled (0 each)"
    )


def test_gfd_count_stands_in_when_the_device_plugin_reports_nothing() -> None:
    labelled = Node("a100-0", {LABEL_PRODUCT: A100, "nvidia.com/gpu.count": "4"}, {"cpu": "96"})
    assert place(pod(4, A100), [labelled]).fits == ("a100-0",)
    assert place(pod(5, A100), [labelled]).fits == ()


def test_a_taint_the_pod_does_not_tolerate_keeps_it_off_and_is_named() -> None:
    tainted = gpu_node("a100-0", A100, 8, taints=(Taint("nvidia.com/gpu", "present", "NoSchedule"),))
    where = place(pod(2, A100), [tainted])
    assert where.fits == ()
    assert where.message.endswith("; not tolerated: a100-0 (taint nvidia.com/gpu=present:NoSchedule)")
    tolerated = pod(2, A100, tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}])
    assert place(tolerated, [tainted]).fits == ("a100-0",)


def test_prefer_no_schedule_never_filters() -> None:
    soft = gpu_node("a100-0", A100, 8, taints=(Taint("spot", "true", "PreferNoSchedule"),))
    assert place(pod(1, A100), [soft]).fits == ("a100-0",)


@pytest.mark.parametrize(
    ("toleration", "matches"),
    [
        ({"operator": "Exists"}, True),  # an empty key with Exists tolerates everything
        ({"key": "k", "operator": "Exists"}, True),
        ({"key": "k", "value": "v"}, True),  # operator defaults to Equal
        ({"key": "k", "value": "other"}, False),
        ({"key": "k", "operator": "Exists", "effect": "NoExecute"}, False),  # another effect
        ({"key": "other", "operator": "Exists"}, False),
    ],
)
def test_toleration_matching(toleration: dict[str, str], matches: bool) -> None:
    assert tolerates([toleration], Taint("k", "v", "NoSchedule")) is matches


def test_a_cordoned_node_is_skipped_unless_the_pod_tolerates_it() -> None:
    cordoned = gpu_node("a100-0", A100, 8, unschedulable=True)
    assert misfit(pod(1, A100), cordoned) == "cordoned"
    assert place(pod(1, A100), [cordoned]).message.endswith("; not tolerated: a100-0 (cordoned)")
    tolerating = pod(1, A100, tolerations=[{"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}])
    assert misfit(tolerating, cordoned) is None


def test_the_user_node_selector_counts_too() -> None:
    node = Node("a100-0", {LABEL_PRODUCT: A100, "pool": "build"}, {GPU: "8"})
    assert place(pod(1, A100, nodeSelector={LABEL_PRODUCT: A100, "pool": "build"}), [node]).fits == ("a100-0",)
    where = place(pod(1, A100, nodeSelector={LABEL_PRODUCT: A100, "pool": "train"}), [node])
    assert where.message.startswith(f"no node offers 1× {A100} with pool=train; nodes:")


def test_requests_sum_containers_and_take_the_largest_init_container() -> None:
    spec = {
        "initContainers": [{"resources": {"limits": {GPU: "4"}}}],
        "containers": [{"resources": {"limits": {GPU: "1"}}}, {"resources": {"requests": {GPU: "2"}}}],
    }
    assert requests(spec)[GPU] == 4.0
    spec["initContainers"] = [{"resources": {"limits": {GPU: "1"}}}]
    assert requests(spec)[GPU] == 3.0


def test_the_nodes_body_is_read_as_the_api_serves_it() -> None:
    body = {
        "metadata": {"name": "n1", "labels": {LABEL_PRODUCT: H100}},
        "spec": {"unschedulable": True, "taints": [{"key": "a", "effect": "NoExecute"}]},
        "status": {"allocatable": {GPU: "8"}},
    }
    node = Node.from_body(body)
    assert node == Node("n1", {LABEL_PRODUCT: H100}, {GPU: "8"}, (Taint("a", "", "NoExecute"),), True)
    assert Node.from_body({"metadata": {"name": "bare"}}) == Node("bare")
