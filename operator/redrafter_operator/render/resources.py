"""Default CPU and memory requests of the operator's pods, merged with the spec's ``resources``.

Without requests a GPU pod is BestEffort for CPU and memory: the scheduler packs it next to anything,
and under node memory pressure it is the first evicted. The defaults are sized per tensor-parallel
rank, because both the build and the serving pod run one process per GPU:

* build: TensorRT-LLM's convert_checkpoint.py loads the HF weights on the CPU (about 2 bytes per
  parameter in bf16, i.e. ~16 GB for 8B, ~140 GB for 70B at TP 8) and trtllm-build serializes each
  rank's engine in host memory; 2 CPUs per rank keep the converter's workers and the MPI ranks busy.
  16Gi per rank covers the 8B and 70B examples' weight footprint (16 GB, 8 x 16Gi for 140 GB).
* serving: one tritonserver rank per GPU under mpirun (OpenMPI polls: one core per rank stays busy),
  plus the gRPC/HTTP front end and the Python pre/post-processing models with their tokenizers;
  each rank stages its engine shard in host memory while loading (8B bf16: ~16 GB at TP 1,
  70B: ~17.5 GB per rank at TP 8) and keeps pinned host buffers after. 2 CPUs and 16Gi per rank.
* validation: a gRPC client and small prompt sets: 250m / 256Mi, with a 1Gi memory limit.

No default limits on the GPU pods: the memory peak depends on the model, a limit that is too low
kills a build that would succeed, and a CPU limit throttles the MPI ranks' polling. The spec's
``resources`` override per resource: a request given there wins; a limit given without a request
replaces the default request (the API server then defaults the request to that limit).
"""

from __future__ import annotations

from typing import Any

BUILD_PER_RANK = {"cpu": 2, "memory_gi": 16}
SERVING_PER_RANK = {"cpu": 2, "memory_gi": 16}
VALIDATION = {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}}
#: the PyTorch backend's prepare Job fetches, moves and verifies files (streamed, no weights in memory): no GPU,
#: and, unlike a GPU pod whose host-memory peak depends on the model, a memory limit
PREPARE = {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "8Gi"}}


def per_rank(sizing: dict[str, int], ranks: int) -> dict[str, Any]:
    """Default requests of a pod with ``ranks`` GPU processes."""
    return {"requests": {"cpu": str(sizing["cpu"] * ranks), "memory": f"{sizing['memory_gi'] * ranks}Gi"}}


def merged(defaults: dict[str, Any], user: dict[str, Any]) -> dict[str, Any]:
    """``user`` (the spec's resources) over ``defaults``, resource by resource."""
    user_requests = dict(user.get("requests") or {})
    user_limits = dict(user.get("limits") or {})
    requests = {k: v for k, v in (defaults.get("requests") or {}).items() if k not in user_limits}
    requests.update(user_requests)
    limits = {**(defaults.get("limits") or {}), **user_limits}
    # a default limit below a user's request would make the pod invalid: the user's request wins
    limits = {k: v for k, v in limits.items() if k in user_limits or k not in user_requests}
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out
