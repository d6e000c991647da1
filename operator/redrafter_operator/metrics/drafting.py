"""What one drafting step can yield, per speculation method: the normalisation of acceptance.

Every method's serving pods report the same counters (draft tokens proposed, draft tokens accepted, engine
steps, output tokens: the metering model reads them from the engine's per-request perf outputs), so the
acceptance rate is accepted / drafted for all of them. What differs is the geometry that turns it into
tokens per step and verification work: ReDrafter verifies ``numBeams x draftLenPerBeam`` tokens and keeps
at most ``draftLenPerBeam``; the PyTorch backend's methods draft one chain of ``maxDraftLen`` tokens
(MTP: ``numNextnPredictLayers``), verify it and keep a prefix of it.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine_jobs.llmapi_config import IN_ENGINE_LIMIT_METHODS

from ..api.spec import Mtp, ReDrafterDeploymentSpec


@dataclass(frozen=True)
class Drafting:
    """The draft geometry of one deployment's speculative engine."""

    method: str
    draft_len: int  # the most tokens a step can accept beyond the one the base model produces
    verified_tokens: int  # tokens the base model verifies per request per step

    @property
    def stops_at_load(self) -> bool:
        """The engine itself stops drafting above a batch size (the PyTorch backend's max_concurrency, which the
        operator sets to the crossover validation measured). Only a method with a separate drafter reads it at
        the pinned TensorRT-LLM (engine_jobs/llmapi_config.py ``IN_ENGINE_LIMIT_METHODS``): not the one-model
        Eagle3 and MTP, and not ReDrafter's engine; for those the fleet switch alone answers load."""
        return self.method in IN_ENGINE_LIMIT_METHODS


def drafting(spec: ReDrafterDeploymentSpec) -> Drafting:
    params = spec.method_params()
    if params is None:
        rd = spec.redrafter
        return Drafting("redrafter", rd.draft_len_per_beam, 1 + rd.num_beams * rd.draft_len_per_beam)
    draft_len = params.num_nextn_predict_layers if isinstance(params, Mtp) else params.max_draft_len
    return Drafting(spec.method, draft_len, 1 + draft_len)
