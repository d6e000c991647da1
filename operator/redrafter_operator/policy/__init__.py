"""Pure decisions: the speculation state machine, the cost model and the autoscaler (no I/O)."""

from .autoscaler import AutoscalerState, PoolLoad, ScaleDecision, pool_load, recommend
from .loop import Evaluation, PolicyState, ServingPlan, step
from .cost import CostParams, crossover, speedup, throughput, tokens_per_step
from .speculation import (
    Decision, Measurement, Observation, SpeculationState, due, evaluate, initial_state, measure,
)

__all__ = [
    "AutoscalerState", "CostParams", "PoolLoad", "Decision", "Evaluation", "Measurement", "Observation", "PolicyState",
    "ScaleDecision", "ServingPlan", "SpeculationState", "step", "crossover", "due", "evaluate", "initial_state", "measure", "pool_load", "recommend",
    "speedup", "throughput", "tokens_per_step",
]
