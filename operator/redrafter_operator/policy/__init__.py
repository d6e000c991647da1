"""Pure decisions: the speculation state machine, the cost model and the autoscaler (no I/O)."""

from .autoscaler import AutoscalerState, ScaleDecision, recommend
from .loop import Evaluation, PolicyState, ServingPlan, step
from .cost import CostParams, crossover, speedup, throughput, tokens_per_step
from .speculation import (
    Decision, Measurement, Observation, SpeculationState, due, evaluate, initial_state, measure,
)

__all__ = [
    "AutoscalerState", "CostParams", "Decision", "Evaluation", "Measurement", "Observation", "PolicyState",
    "ScaleDecision", "ServingPlan", "SpeculationState", "step", "crossover", "due", "evaluate", "initial_state", "measure", "recommend",
    "speedup", "throughput", "tokens_per_step",
]
