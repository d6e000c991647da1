"""How much the engine cache must hold (pure): a rough estimate from the model's parameter count.

The spec has no parameter count, so it is read from the base model's name, as model names carry it
(``Meta-Llama-3-8B-Instruct``, ``Llama-3.1-70B``, ``Qwen2.5-7B``, ``Mixtral-8x7B``); a name without one
(``tiny-llama``) leaves the size unchecked. The estimate:

- the base engine: parameters × bytes per weight (bfloat16/float16: 2; ``quantization: fp8``: 1);
- the ReDrafter engine: the base's weights again, plus the drafter, which TensorRT-LLM keeps in dtype;
- the drafter: its LM head and recurrent layers, taken as a tenth of the base's parameters (a ReDrafter
  head for Llama-3-8B, vocabulary 128k × hidden 4096, is about 0.5B), in dtype; a drafter the operator
  trains is kept in the cache too;
- 20% headroom (engine plugins and workspace, a rebuild beside the old engine while it still serves).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..api.spec import ReDrafterDeploymentSpec

GIB = 1024.0**3
HEADROOM = 1.2
DRAFTER_FRACTION = 0.1
CHECKPOINT_BYTES = 2  # checkpoints are published in 16-bit
# "8B", "70b", "1.5B", "135M", "8x7B" between separators (not "v3", not "128k")
_PARAMS = re.compile(r"(?<![A-Za-z0-9.])(?:(\d+)x)?(\d+(?:\.\d+)?)([BbMm])(?![A-Za-z0-9])")
_SCALE = {"b": 1e9, "m": 1e6}


def parameters_from_name(source: str) -> float | None:
    """Parameters named in a model source (the last such token of its path), or None."""
    found = _PARAMS.findall(source.rpartition("://")[2])
    if not found:
        return None
    experts, count, unit = found[-1]
    return float(count) * _SCALE[unit.lower()] * (int(experts) if experts else 1)


def bytes_per_weight(spec: ReDrafterDeploymentSpec) -> int:
    return 1 if spec.precision.quantization == "fp8" else 2


@dataclass(frozen=True)
class CacheEstimate:
    parameters: float
    base: float  # bytes
    redrafter: float
    drafter: float  # a trained drafter's checkpoint in the cache (0 when the spec brings one)
    #: the PyTorch path: ``base`` is the base checkpoint and ``redrafter`` the draft checkpoint, in one artifact
    shared: bool = False

    @property
    def total(self) -> float:
        return (self.base + self.redrafter + self.drafter) * HEADROOM

    def describe(self) -> str:
        if self.shared:
            parts = [f"base checkpoint {gib(self.base)}"] + ([f"draft {gib(self.redrafter)}"] if self.redrafter else [])
        else:
            parts = [f"base {gib(self.base)}", f"ReDrafter {gib(self.redrafter)}"]
        if self.drafter:
            parts.append(f"trained drafter {gib(self.drafter)}")
        return f"{params(self.parameters)} parameters: {' + '.join(parts)} + {round((HEADROOM - 1) * 100)}% headroom"


def estimate_cache(spec: ReDrafterDeploymentSpec) -> CacheEstimate | None:
    """The engines (and a trained drafter) the cache claim will hold, or None when the size is not known."""
    p = parameters_from_name(spec.model.base.source)
    if p is None:
        return None
    dtype = 2  # bfloat16 and float16 alike
    base = p * bytes_per_weight(spec)
    drafter = p * DRAFTER_FRACTION * dtype
    if spec.method != "redrafter":
        # one prepared artifact serves both variants: the base checkpoint and the draft checkpoint, if any
        draft = _draft_checkpoint_bytes(spec, p)
        return CacheEstimate(p, base, draft, 0.0, shared=True)
    trained = drafter if spec.trained_drafter() is not None else 0.0
    return CacheEstimate(p, base, base + drafter, trained)


def _draft_checkpoint_bytes(spec: ReDrafterDeploymentSpec, base_parameters: float) -> float:
    """A draft model's size from its name; an EAGLE-3 head as a tenth of the base; none for ngram and mtp."""
    if spec.model.drafter is None or spec.model.drafter.source is None:
        return 0.0
    if spec.method == "draftModel":
        named = parameters_from_name(spec.model.drafter.source)
        return (named if named is not None else base_parameters * DRAFTER_FRACTION) * CHECKPOINT_BYTES
    return base_parameters * DRAFTER_FRACTION * CHECKPOINT_BYTES


def estimate_source(spec: ReDrafterDeploymentSpec, claim: str) -> tuple[float, list[str]] | None:
    """Bytes of the checkpoints the spec reads from pvc://``claim`` (base in 16-bit, the drafter), and what."""
    p = parameters_from_name(spec.model.base.source)
    if p is None:
        return None
    total, what = 0.0, []
    if spec.model.base.source.startswith(f"pvc://{claim}/"):
        total += p * CHECKPOINT_BYTES
        what.append(f"base {gib(p * CHECKPOINT_BYTES)}")
    drafter = spec.model.drafter.source if spec.model.drafter is not None else None
    if drafter and drafter.startswith(f"pvc://{claim}/"):
        total += p * DRAFTER_FRACTION * CHECKPOINT_BYTES
        what.append(f"drafter {gib(p * DRAFTER_FRACTION * CHECKPOINT_BYTES)}")
    return (total, what) if total else None


def gib(n: float) -> str:
    return f"{n / GIB:.0f} GiB" if n >= 10 * GIB else f"{n / GIB:.1f} GiB"


def params(p: float) -> str:
    return f"{p / 1e9:g}B" if p >= 1e9 else f"{p / 1e6:g}M"
