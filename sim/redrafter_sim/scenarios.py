"""Demo scenarios as data: stages with traffic, the simulated engine's acceptance, and end conditions.

A stage sets the load generator's concurrency and/or the ReDrafter engines' target acceptance rate
(None: unchanged), lasts at least ``min_s`` seconds, and ends when ``until`` holds on the resource
(all of ``until``, e.g. ``status.activeEngine == base``) or fails after ``timeout_s``. ``hold`` must stay true for
the whole stage (e.g. the engine does not change under steady traffic). A stage *happened* when its
``until`` was met in time and its ``hold`` never broke. ``--fast`` scales ``min_s`` down; the
conditions and timeouts stay (they are what the operator must do). ``--scenario FILE.yaml`` loads
one from a file, e.g.::

    name: quick-fallback
    stages:
      - {name: deploy, concurrency: 0, acceptance: 0.8, until: "status.phase == Serving", timeout_s: 120}
      - {name: traffic, concurrency: 4, min_s: 5}
      - name: collapse
        acceptance: 0.1
        until: ["status.activeEngine == base", "status.serving.readyReplicas >= 1"]
        timeout_s: 60
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, Mapping

import yaml

OPS: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq,
    "!=": operator.ne,
    ">=": operator.ge,
    "<=": operator.le,
    ">": operator.gt,
    "<": operator.lt,
}


def lookup(obj: Mapping[str, Any] | None, path: str) -> Any:
    """``status.serving.readyReplicas`` in a resource (None when any part is missing)."""
    node: Any = obj
    for part in path.split("."):
        if not isinstance(node, Mapping):
            return None
        node = node.get(part)
    return node


@dataclass(frozen=True)
class Condition:
    path: str
    op: str
    value: Any

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"unknown operator {self.op!r} (use one of {', '.join(OPS)})")

    def holds(self, obj: Mapping[str, Any] | None) -> bool:
        have = lookup(obj, self.path)
        if have is None:
            return False
        try:
            return OPS[self.op](have, self.value)
        except TypeError:
            return False

    def __str__(self) -> str:
        return f"{self.path} {self.op} {self.value}"

    @classmethod
    def parse(cls, raw: Mapping[str, Any] | str) -> "Condition":
        """``{path, op, value}`` or ``"status.activeEngine == base"``."""
        if isinstance(raw, str):
            path, op, value = raw.split(None, 2)
            return cls(path, op, yaml.safe_load(value))
        return cls(str(raw["path"]), str(raw.get("op", "==")), raw["value"])


Conditions = tuple[Condition, ...]


def all_hold(conditions: Conditions, obj: Mapping[str, Any] | None) -> bool:
    return all(c.holds(obj) for c in conditions)


def describe(conditions: Conditions) -> str:
    return " and ".join(map(str, conditions))


def _conditions(raw: Any) -> Conditions:
    if not raw:
        return ()
    items = raw if isinstance(raw, list) else [raw]
    return tuple(Condition.parse(x) for x in items)


@dataclass(frozen=True)
class Stage:
    name: str
    description: str
    concurrency: int | None = None
    acceptance: float | None = None
    min_s: float = 0.0
    until: Conditions = ()  # all must hold to end the stage
    timeout_s: float = 60.0  # ... within this long, else the stage did not happen
    hold: Conditions = ()  # must hold throughout the stage
    #: the operator behaviour this stage demonstrates (shown in the summary)
    expect: str = ""


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    stages: tuple[Stage, ...] = field(default_factory=tuple)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "Scenario":
        stages = []
        for st in raw.get("stages") or []:
            unknown = set(st) - {f.name for f in fields(Stage)}
            if unknown:
                raise ValueError(f"stage {st.get('name')!r}: unknown keys {sorted(unknown)}")
            stages.append(
                Stage(
                    name=str(st["name"]),
                    description=str(st.get("description", "")),
                    concurrency=st.get("concurrency"),
                    acceptance=st.get("acceptance"),
                    min_s=float(st.get("min_s", 0)),
                    until=_conditions(st.get("until")),
                    timeout_s=float(st.get("timeout_s", 60.0)),
                    hold=_conditions(st.get("hold")),
                    expect=str(st.get("expect", "")),
                )
            )
        if not stages:
            raise ValueError("a scenario needs at least one stage")
        return cls(str(raw.get("name", "custom")), str(raw.get("description", "")), tuple(stages))

    def scaled(self, factor: float) -> "Scenario":
        """Minimum stage durations times ``factor`` (``--fast``)."""
        return replace(self, stages=tuple(replace(s, min_s=s.min_s * factor) for s in self.stages))


HIGH_ACCEPTANCE = 0.8
LOW_ACCEPTANCE = 0.1
LOW_LOAD = 2
HIGH_LOAD = 8  # twice the per-replica target: a starved load generator still reads above it

ACTIVE_ENGINE = "status.activeEngine"
READY = "status.serving.readyReplicas"
REPLICAS = "status.serving.replicas"

DEPLOY = Stage(
    "deploy",
    "apply the resource: build both engines, validate ReDrafter against base, promote it",
    concurrency=0,
    acceptance=HIGH_ACCEPTANCE,
    until=(
        Condition("status.phase", "==", "Serving"),
        Condition("status.validation.state", "==", "Passed"),
        Condition(ACTIVE_ENGINE, "==", "redrafter"),
    ),
    timeout_s=180,
    expect="engines built by Jobs; base serves while the validation Job compares greedy outputs; "
    "then the Service moves to ReDrafter",
)
STEADY = Stage(
    "steady",
    "steady light traffic on ReDrafter with high acceptance",
    concurrency=LOW_LOAD,
    min_s=8,
    # ends at the one replica the light load needs: the pool keeps the size validation traffic needed until
    # the scale-down window after the switch has passed, and load-rise must start from there to show a scale-up
    until=(Condition("status.speculation.samples", ">", 0), Condition(REPLICAS, "==", 1)),
    timeout_s=60,
    hold=(Condition(ACTIVE_ENGINE, "==", "redrafter"),),
    expect="acceptance measured on live traffic; ReDrafter kept, at the one replica the light load needs",
)
LOAD_RISE = Stage(
    "load-rise",
    "the load rises well above the per-replica target",
    concurrency=HIGH_LOAD,
    min_s=4,
    until=(Condition(READY, ">=", 2),),
    timeout_s=60,
    expect="autoscaled up (HPA rule on active+waiting requests per replica)",
)
COLLAPSE = Stage(
    "collapse",
    "the drafter stops matching the traffic: acceptance collapses",
    acceptance=LOW_ACCEPTANCE,
    min_s=2,
    until=(Condition(ACTIVE_ENGINE, "==", "base"),),
    timeout_s=120,
    expect="fallback to the base engine after failureLimit bad windows",
)
RECOVER = Stage(
    "recover",
    "acceptance recovers (measured on the ReDrafter canary while on base)",
    acceptance=HIGH_ACCEPTANCE,
    min_s=2,
    until=(Condition(ACTIVE_ENGINE, "==", "redrafter"), Condition(REPLICAS, ">=", 2), Condition(READY, ">=", 2)),
    timeout_s=120,
    expect="back to ReDrafter after successLimit good canary windows, scaled for the load",
)
LOAD_FALL = Stage(
    "load-fall",
    "the load falls back",
    concurrency=LOW_LOAD,
    min_s=2,
    until=(Condition(REPLICAS, "==", 1), Condition(ACTIVE_ENGINE, "==", "redrafter")),
    timeout_s=60,
    expect="scaled down after the scale-down stabilization window",
)

TRAIN = Stage(
    "train",
    "only a base model: the operator trains the drafter (the real recipe, on this CPU)",
    concurrency=0,
    until=(Condition("status.drafter.state", "==", "Ready"), Condition("status.drafter.heldOutAcceptance", ">", 0)),
    timeout_s=300,
    expect="a training Job self-distils the base model while the base engine builds; status.drafter shows its "
    "steps and loss, then the held-out acceptance of the trained head",
)


def with_training(scenario: Scenario) -> Scenario:
    """``demo --train``: the scenario, after a stage in which the operator trains the drafter."""
    return replace(scenario, name=f"{scenario.name}+train", stages=(TRAIN, *scenario.stages))


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "lifecycle",
            "build -> rollout -> autoscale up -> fallback -> recovery -> scale down",
            (DEPLOY, STEADY, LOAD_RISE, COLLAPSE, RECOVER, LOAD_FALL),
        ),
        Scenario(
            "collapse",
            "build -> rollout -> acceptance collapse -> fallback -> recovery",
            (DEPLOY, replace(STEADY, min_s=4), COLLAPSE, RECOVER),
        ),
        Scenario(
            "steady",
            "build -> rollout -> steady traffic: the operator keeps ReDrafter and 1 replica",
            (
                DEPLOY,
                replace(
                    STEADY, min_s=20, hold=(Condition(ACTIVE_ENGINE, "==", "redrafter"), Condition(REPLICAS, "==", 1))
                ),
            ),
        ),
    )
}
DEFAULT_SCENARIO = "lifecycle"
FAST_FACTOR = 0.5


@dataclass
class StageResult:
    """What one stage of a run did: whether its until-conditions held, and what the operator said meanwhile."""

    name: str
    description: str
    expect: str
    condition: str
    started_s: float
    duration_s: float = 0.0
    happened: bool = False
    observed: dict[str, Any] = field(default_factory=dict)  # each until-condition's path -> value at the end
    failure: str = ""
    speculation: dict[str, Any] = field(default_factory=dict)
    replicas: dict[str, Any] = field(default_factory=dict)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    traffic: dict[str, Any] = field(default_factory=dict)
    wall_start: float = 0.0
    wall_end: float = 0.0


def load_scenario(name_or_path: str) -> Scenario:
    """A built-in scenario by name, or one from a YAML/JSON file (same fields as :class:`Stage`)."""
    if name_or_path in SCENARIOS:
        return SCENARIOS[name_or_path]
    path = Path(name_or_path)
    if not path.is_file():
        raise ValueError(f"unknown scenario {name_or_path!r}: use one of {', '.join(SCENARIOS)} or a YAML file")
    return Scenario.from_dict(yaml.safe_load(path.read_text(encoding="utf-8")) or {})
