"""The speculation policy's persisted state: small, JSON-able, stored in status between evaluations."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

Engine = Literal["redrafter", "base"]


class SpeculationState(BaseModel):
    """Persisted between evaluations (status): small and JSON-able."""

    engine: Engine = Field(default="redrafter", description="Engine the Service should select.")
    since: float = Field(description="When this engine became the desired one (epoch s).")
    last_switch: float | None = Field(default=None, description="Time of the last switch (epoch s).")
    failures: int = Field(default=0, description="Consecutive failed measurements.")
    successes: int = Field(default=0, description="Consecutive successful measurements.")
    errors: int = Field(default=0, description="Consecutive metric read errors.")
    fallback_reason: str | None = Field(default=None, description="Why the last fallback to base happened.")
    last_acceptance: float | None = Field(default=None, description="Last conclusive ReDrafter acceptance.")
    last_tokens_per_step: float | None = Field(default=None, description="Tokens/step measured with it.")
    last_evaluated: float | None = Field(default=None, description="Time of the last evaluation (epoch s).")
    health: Literal["True", "False", "Unknown"] | None = Field(default=None, description="Last SpeculationHealthy.")
    outcomes: str = Field(default="", description="Last conclusive outcomes, oldest first (S/F).")
    speedups: list[float] = Field(default_factory=list, description="Predicted speedups since flapping began.")
    flapping: bool = Field(default=False, description="The outcomes are flapping (see module docs).")
    batch: float | None = Field(default=None, description="Smoothed in-flight requests per pod of the pool.")
    recent: list[list[float]] = Field(
        default_factory=list,
        description="Last ReDrafter windows' [requests, draft, accepted, output tokens, steps] on this engine.",
    )
