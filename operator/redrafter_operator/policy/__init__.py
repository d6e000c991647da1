"""Pure decisions: the speculation state machine, the cost model and the autoscaler (no I/O)."""

from .autoscaler import AutoscalerState, ScaleDecision, recommend
from .cost import CostParams, crossover, speedup, throughput, tokens_per_step
from .speculation import (
    Decision, Measurement, Observation, SpeculationState, due, evaluate, initial_state, measure,
)

__all__ = [
    "AutoscalerState", "CostParams", "Decision", "Measurement", "Observation", "ScaleDecision",
    "SpeculationState", "crossover", "due", "evaluate", "initial_state", "measure", "recommend",
    "speedup", "throughput", "tokens_per_step",
]
