"""The simulated nodes' Node objects: GPU nodes as the NVIDIA GPU Operator leaves them.

A real GPU node carries the device plugin's allocatable ``nvidia.com/gpu`` and GPU Feature Discovery's
labels (NVIDIA/k8s-device-plugin, docs/gpu-feature-discovery/README.md: product, count, memory, family,
driver and CUDA versions, in both the current ``cuda.driver-version.*`` and the deprecated
``cuda.driver.*`` spellings GFD still writes). The development cluster and the tests register
:data:`DEFAULT_NODES`, one node per product the examples ask for, so the operator's placement check sees a cluster
that can run them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

A100 = "NVIDIA-A100-SXM4-80GB"
H100 = "NVIDIA-H100-80GB-HBM3"
_MEMORY_MIB = {A100: 81920, H100: 81559}
_FAMILY = {A100: "ampere", H100: "hopper"}
_COMPUTE = {A100: ("8", "0"), H100: ("9", "0")}


def gfd_labels(product: str, gpus: int, driver: str = "590.44.01", cuda: str = "13.0") -> dict[str, str]:
    """GPU Feature Discovery's labels for ``gpus`` GPUs of ``product`` on driver ``driver``."""
    major, minor, rev = (driver.split(".") + ["", ""])[:3]
    cuda_major, cuda_minor = cuda.split(".")
    compute = _COMPUTE.get(product, ("9", "0"))
    return {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.count": str(gpus),
        "nvidia.com/gpu.memory": str(_MEMORY_MIB.get(product, 81920)),
        "nvidia.com/gpu.family": _FAMILY.get(product, "hopper"),
        "nvidia.com/gpu.compute.major": compute[0],
        "nvidia.com/gpu.compute.minor": compute[1],
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/mig.capable": "true",
        "nvidia.com/cuda.driver-version.full": driver,
        "nvidia.com/cuda.driver-version.major": major,
        "nvidia.com/cuda.driver-version.minor": minor,
        "nvidia.com/cuda.driver-version.revision": rev,
        "nvidia.com/cuda.driver.major": major,
        "nvidia.com/cuda.driver.minor": minor,
        "nvidia.com/cuda.driver.rev": rev,
        "nvidia.com/cuda.runtime-version.full": cuda,
        "nvidia.com/cuda.runtime-version.major": cuda_major,
        "nvidia.com/cuda.runtime-version.minor": cuda_minor,
        "nvidia.com/cuda.runtime.major": cuda_major,
        "nvidia.com/cuda.runtime.minor": cuda_minor,
    }


def node(
    name: str,
    product: str | None = None,
    gpus: int = 0,
    *,
    driver: str | None = "590.44.01",
    taints: list[dict[str, str]] | None = None,
    allocatable: Mapping[str, str] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the Node a kubelet registers, its status): a GPU node when ``product`` is given, else a CPU node.

    ``driver=None``: GFD's labels without the driver's (a node where GFD has not run its driver probe).
    ``allocatable``: capacity beyond the default 96 CPUs, 1056Gi and the kubelet's 110 pods (a node standing in
    for a whole cluster).
    The status goes through the status subresource, as the kubelet's does.
    """
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
    }
    if product:
        gfd = gfd_labels(product, gpus, driver or "590.44.01")
        if driver is None:
            gfd = {k: v for k, v in gfd.items() if ".driver" not in k}
        labels |= gfd
    resources = {"cpu": "96", "memory": "1056Gi", "pods": "110", "ephemeral-storage": "3Ti"}
    resources.update(allocatable or {})
    if product and gpus:
        resources["nvidia.com/gpu"] = str(gpus)
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}
    if taints:
        body["spec"] = {"taints": taints}
    status = {
        "capacity": dict(resources),
        "allocatable": dict(resources),
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is ready"}],
        "nodeInfo": {"kubeletVersion": "v1.37.2", "operatingSystem": "linux", "architecture": "amd64"},
    }
    return body, status


#: one 8-GPU node of each product the examples ask for
DEFAULT_NODES: tuple[tuple[str, str, int], ...] = (("gpu-a100-0", A100, 8), ("gpu-h100-0", H100, 8))


#: NVIDIA's DCGM exporter as the GPU Operator deploys it beside GPU Feature Discovery (assets/state-dcgm-exporter)
GPU_OPERATOR_NAMESPACE = "gpu-operator"
DCGM_LABELS = {"app": "nvidia-dcgm-exporter"}


def dcgm_exporter() -> list[dict[str, Any]]:
    """The GPU Operator's namespace and its DCGM exporter DaemonSet (what ``redrafter-operator check`` looks for)."""
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": GPU_OPERATOR_NAMESPACE}},
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "nvidia-dcgm-exporter", "namespace": GPU_OPERATOR_NAMESPACE, "labels": DCGM_LABELS},
            "spec": {
                "selector": {"matchLabels": DCGM_LABELS},
                "template": {
                    "metadata": {"labels": DCGM_LABELS},
                    "spec": {
                        "nodeSelector": {"nvidia.com/gpu.present": "true"},
                        "containers": [{"name": "nvidia-dcgm-exporter", "image": "nvcr.io/nvidia/k8s/dcgm-exporter"}],
                    },
                },
            },
        },
    ]
