"""Could any node run this pod? (pure): the scheduler's node filters a GPU Job depends on, and why not.

Both the operator (before it creates a GPU Job) and ``redrafter-operator check`` ask it of the rendered pod
template, so they judge exactly what the scheduler will be given. The filters are the kube-scheduler's that
decide on node facts alone (pkg/scheduler/framework/plugins): NodeUnschedulable (``spec.unschedulable``,
unless the pod tolerates ``node.kubernetes.io/unschedulable``), NodeAffinity (``nodeSelector`` only: the
operator renders no affinity), TaintToleration (NoSchedule and NoExecute taints; PreferNoSchedule never
filters) and NodeResourcesFit against *allocatable*, not free: a node busy now still counts, because the
Job waits for it rather than for a node that will never exist.

GPU Feature Discovery labels the products and counts (``nvidia.com/gpu.product``, ``nvidia.com/gpu.count``),
so the messages can name what the cluster has instead.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from ..api.types import parse_quantity

GPU = "nvidia.com/gpu"
# GPU Feature Discovery's node labels (NVIDIA/k8s-device-plugin, docs/gpu-feature-discovery/README.md)
LABEL_PRODUCT = "nvidia.com/gpu.product"
LABEL_COUNT = "nvidia.com/gpu.count"
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
_FILTERING_EFFECTS = ("NoSchedule", "NoExecute")
_CORE_RESOURCES = ("cpu", "memory", "ephemeral-storage")
_MAX_NAMES = 3


@dataclass(frozen=True)
class Taint:
    key: str
    value: str = ""
    effect: str = ""

    def __str__(self) -> str:
        return f"{self.key}{'=' + self.value if self.value else ''}:{self.effect}"


@dataclass(frozen=True)
class Node:
    """What placement reads of a Node: its labels, allocatable resources, taints and cordon."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    allocatable: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> "Node":
        meta, spec = body.get("metadata") or {}, body.get("spec") or {}
        return cls(
            name=str(meta.get("name") or ""),
            labels={str(k): str(v) for k, v in (meta.get("labels") or {}).items()},
            allocatable={str(k): str(v) for k, v in ((body.get("status") or {}).get("allocatable") or {}).items()},
            taints=tuple(
                Taint(str(t.get("key") or ""), str(t.get("value") or ""), str(t.get("effect") or ""))
                for t in spec.get("taints") or []
                if isinstance(t, Mapping)
            ),
            unschedulable=bool(spec.get("unschedulable")),
        )

    def offers(self, resource: str) -> float:
        """Allocatable amount of ``resource`` (GPUs: GFD's count label when the device plugin is not reporting)."""
        if resource in self.allocatable:
            return _quantity(self.allocatable[resource])
        if resource == GPU:
            return _quantity(self.labels.get(LABEL_COUNT, "0"))
        return 0.0


def _quantity(text: str) -> float:
    try:
        return parse_quantity(text)
    except ValueError:
        return 0.0


def tolerates(tolerations: Iterable[Mapping[str, Any]], taint: Taint) -> bool:
    """core/v1 Toleration.ToleratesTaint: an empty key with Exists matches every taint; an empty effect, every effect."""
    for t in tolerations:
        effect = str(t.get("effect") or "")
        if effect and effect != taint.effect:
            continue
        key, op = str(t.get("key") or ""), str(t.get("operator") or "Equal")
        if not key and op == "Exists":
            return True
        if key != taint.key:
            continue
        if op == "Exists" or str(t.get("value") or "") == taint.value:
            return True
    return False


def requests(pod_spec: Mapping[str, Any]) -> dict[str, float]:
    """The pod's effective requests (NodeResourcesFit): the sum over containers, or the largest init
    container's when larger; a limit stands for the request it defaults (extended resources set limits only)."""

    def of(container: Mapping[str, Any]) -> dict[str, float]:
        res = container.get("resources") or {}
        merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        return {str(k): _quantity(str(v)) for k, v in merged.items()}

    total: dict[str, float] = {}
    for c in pod_spec.get("containers") or []:
        for name, amount in of(c).items():
            total[name] = total.get(name, 0.0) + amount
    for c in pod_spec.get("initContainers") or []:
        for name, amount in of(c).items():
            total[name] = max(total.get(name, 0.0), amount)
    return total


def misfit(pod_spec: Mapping[str, Any], node: Node, only: Iterable[str] | None = None) -> str | None:
    """Why the scheduler would never place the pod on ``node`` (None: it could). ``only``: the resources to
    compare (default: the pod's extended resources, such as GPUs; CPU and memory are left to the scheduler,
    which reports them clearly itself)."""
    tolerations = list(pod_spec.get("tolerations") or [])
    if node.unschedulable and not tolerates(tolerations, Taint(UNSCHEDULABLE_TAINT, "", "NoSchedule")):
        return "cordoned"
    for key, value in (pod_spec.get("nodeSelector") or {}).items():
        if node.labels.get(key) != value:
            return f"{key}={node.labels.get(key, '<unset>')}"
    for taint in node.taints:
        if taint.effect in _FILTERING_EFFECTS and not tolerates(tolerations, taint):
            return f"taint {taint}"
    wanted = requests(pod_spec)
    for resource in only if only is not None else [r for r in wanted if r not in _CORE_RESOURCES]:
        need = wanted.get(resource, 0.0)
        if need and node.offers(resource) < need:
            return f"{_count(node.offers(resource))} {resource}"
    return None


def _count(amount: float) -> str:
    return str(int(amount)) if amount == int(amount) else str(amount)


def nodes_summary(nodes: Iterable[Node], resource: str = GPU) -> str:
    """``3× NVIDIA-H100-80GB-HBM3 (8 each), 1× unlabelled (0 each)``: nodes grouped by product and count."""
    groups = Counter((n.labels.get(LABEL_PRODUCT, "unlabelled"), _count(n.offers(resource))) for n in nodes)
    if not groups:
        return "none"
    return ", ".join(f"{count}× {product} ({each} each)" for (product, each), count in sorted(groups.items()))


def names(items: list[str]) -> str:
    shown = ", ".join(items[:_MAX_NAMES])
    return shown + (f" and {len(items) - _MAX_NAMES} more" if len(items) > _MAX_NAMES else "")


@dataclass(frozen=True)
class Placement:
    fits: tuple[str, ...]  # names of the nodes that could run the pod
    message: str  # what it needs, and which nodes have it or what the cluster has instead


def place(pod_spec: Mapping[str, Any], nodes: Iterable[Node], resource: str = GPU) -> Placement:
    """Which nodes could run the pod, and a one-line account of it.

    ``no node offers 2× NVIDIA-A100-SXM4-80GB; nodes: 3× NVIDIA-H100-80GB-HBM3 (8 each)``; when product
    and count match somewhere but a taint or a cordon keeps the pod off, the message says which.
    """
    nodes = list(nodes)
    gpus = requests(pod_spec).get(resource, 0.0)
    selector = dict(pod_spec.get("nodeSelector") or {})
    product = selector.get(LABEL_PRODUCT)
    wanted = f"{_count(gpus)}× {product or resource}" if gpus else (product or "a node")
    others = {k: v for k, v in selector.items() if k != LABEL_PRODUCT}
    if others:
        wanted += " with " + ", ".join(f"{k}={v}" for k, v in sorted(others.items()))
    fits = tuple(n.name for n in nodes if misfit(pod_spec, n) is None)
    if fits:
        return Placement(fits, f"{len(fits)} node(s) offer {wanted}: {names(list(fits))}")
    # nodes with the hardware that a taint or a cordon keeps the pod off
    hardware = {k: v for k, v in pod_spec.items() if k not in ("tolerations",)}
    blocked = [
        f"{n.name} ({misfit(pod_spec, n)})"
        for n in nodes
        if misfit({**hardware, "tolerations": [{"operator": "Exists"}]}, n) is None
    ]
    message = f"no node offers {wanted}; nodes: {nodes_summary(nodes, resource)}"
    if blocked:
        message += f"; not tolerated: {names(blocked)}"
    return Placement((), message)
