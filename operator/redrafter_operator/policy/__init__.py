"""Pure decisions: the speculation state machine, the cost model and the autoscaler (no I/O)."""

from .autoscaler import AutoscalerState, PoolLoad, ScaleDecision, pool_load, recommend
from .cost import CostParams, crossover, speedup, throughput, tokens_per_step
from .loop import Evaluation, PolicyState, ServingPlan, canary_from_status, step
from .measure import canary_replicas
from .speculation import (
    Decision,
    Measurement,
    Observation,
    SpeculationState,
    due,
    evaluate,
    initial_state,
    measure,
    pinned_engine,
)

__all__ = [
    "AutoscalerState",
    "CostParams",
    "PoolLoad",
    "Decision",
    "Evaluation",
    "Measurement",
    "Observation",
    "PolicyState",
    "ScaleDecision",
    "ServingPlan",
    "SpeculationState",
    "step",
    "canary_from_status",
    "canary_replicas",
    "crossover",
    "due",
    "evaluate",
    "initial_state",
    "measure",
    "pinned_engine",
    "pool_load",
    "recommend",
    "speedup",
    "throughput",
    "tokens_per_step",
]
