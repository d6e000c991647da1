"""``ReDrafterDeployment.status``: what the operator observed and decided, in Kubernetes conventions."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Mapping, Self

from pydantic import Field, Strict, ValidationError, WithJsonSchema

from .types import ApiModel

#: Prewarmed: engines built and validated, nothing served (serving.replicas 0, autoscaling Disabled)
Phase = Literal["Pending", "Building", "Deploying", "Serving", "Prewarmed", "Degraded", "Failed"]
EngineState = Literal["Pending", "Cached", "Building", "Ready", "Failed"]
ConditionType = Literal[
    "SpecValid",
    "EnginesReady",
    "Validated",
    "Available",
    "Progressing",
    "SpeculationHealthy",
    "Ready",
    "Reconciling",
    "Stalled",
    "InferencePoolReady",
    "Schedulable",
]
CONDITION_TYPES: tuple[str, ...] = ConditionType.__args__  # type: ignore[attr-defined]
HISTORY_LIMIT = 20


class Condition(ApiModel):
    """A Kubernetes-style condition (metav1.Condition)."""

    type: str = Field(
        description="SpecValid, EnginesReady, Validated, Available, Progressing, SpeculationHealthy, the "
        "GitOps health conditions Ready, Reconciling and Stalled (kstatus conventions), InferencePoolReady "
        "(with spec.routing.inferencePool), and Schedulable (whether a node can run the GPU Jobs; with the "
        "operator's GPU node check)."
    )
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(
        pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
        max_length=1024,
        description="CamelCase machine-readable reason.",
    )
    message: str = Field(default="", max_length=32768, description="Human-readable details.")
    last_transition_time: str | None = Field(default=None, description="When status last changed (RFC 3339).")
    observed_generation: int | None = Field(default=None, description="Generation this condition reflects.")


class EngineStatus(ApiModel):
    """One engine variant's build state."""

    key: str = Field(description="Content hash of the build inputs (cache directory name).")
    state: EngineState = Field(default="Pending", description="Pending, Cached, Building, Ready or Failed.")
    job: str | None = Field(default=None, description="Name of the current/last build Job.")
    path: str | None = Field(default=None, description="Artifact directory inside the cache volume.")
    size_bytes: int | None = Field(
        default=None,
        ge=0,
        description="Size of the artifact (engine, tokenizer, model repository) in bytes, from "
        "its manifest, as the build Job reported it.",
    )
    built_at: str | None = Field(default=None, description="When the artifact was built (RFC 3339, from its manifest).")
    message: str | None = Field(default=None, description="Failure reason (Job termination message).")
    attempts: int = Field(default=0, description="Build Jobs created for this key since the last retry request.")
    exit_code: int | None = Field(
        default=None,
        description="Exit code of a build that no retry can fix (2 bad input, 6 source unavailable): its Job "
        "failed at once (podFailurePolicy) and no further Job starts until the spec or the "
        "redrafter.dev/retry-build annotation changes.",
    )
    retry_token: str | None = Field(
        default=None,
        description="Value of the redrafter.dev/retry-build annotation the attempts count against "
        "(a new value grants a fresh set of retries).",
    )


class EnginesStatus(ApiModel):
    redrafter: EngineStatus | None = Field(default=None, description="The ReDrafter engine.")
    base: EngineStatus | None = Field(default=None, description="The base (fallback) engine.")


class DrafterStatus(ApiModel):
    """The drafter the operator trains (model.drafter.train): the training Job's progress and its result."""

    key: str = Field(description="Content hash of the training inputs (directory under <cache>/drafters/).")
    state: Literal["Pending", "Training", "Cached", "Ready", "Rejected", "Failed"] = Field(
        default="Pending",
        description="Pending, Training, Ready, Cached (trained before, found in the cache), Rejected (trained, "
        "but the drafter gate found it does not draft: no ReDrafter engine is built from it) or Failed.",
    )
    job: str | None = Field(default=None, description="Name of the current/last training Job.")
    path: str | None = Field(default=None, description="Drafter directory inside the cache volume.")
    phase: str | None = Field(
        default=None, description="While training: fetching, distilling, training, evaluating or publishing."
    )
    step: int | None = Field(default=None, ge=0, description="Optimizer steps done (while training), or in total.")
    total_steps: int | None = Field(default=None, ge=0, description="Optimizer steps planned.")
    steps: int | None = Field(default=None, ge=0, description="Optimizer steps of the finished training.")
    loss: float | None = Field(default=None, description="Latest training loss.")
    progress_at: str | None = Field(default=None, description="When the progress was last read (RFC 3339).")
    held_out_acceptance: float | None = Field(
        default=None, description="Accepted / drafted tokens of the trained head on held-out prompts (greedy)."
    )
    untrained_acceptance: float | None = Field(
        default=None, description="The same measurement for an untrained head: what training bought."
    )
    tokens_per_step: float | None = Field(default=None, description="Tokens per base-model step on held-out prompts.")
    prompt_lookup_acceptance: float | None = Field(
        default=None, description="The same measurement for prompt lookup (n-gram copying): a free drafter."
    )
    held_out_top1: float | None = Field(
        default=None, description="Teacher-forced top-1 accuracy of the first draft position on held-out prompts."
    )
    train_top1: float | None = Field(default=None, description="The same on training prompts.")
    size_bytes: int | None = Field(default=None, ge=0, description="Size of the drafter directory in bytes.")
    built_at: str | None = Field(default=None, description="When the drafter was published (RFC 3339).")
    trained_at: str | None = Field(default=None, description="When training finished (RFC 3339, from its manifest).")
    message: str | None = Field(
        default=None, description="Why training failed, what it waits for, or why the drafter gate rejected it."
    )
    attempts: int = Field(default=0, description="Training Jobs created for this key since the last retry request.")
    exit_code: int | None = Field(
        default=None,
        description="Exit code of a training no retry can fix (2 bad input or dataset, 6 source unavailable).",
    )
    retry_token: str | None = Field(default=None, description="As for the engines (redrafter.dev/retry-build).")


class ServingFailure(ApiModel):
    """Why serving replicas do not come up, as the scheduler, the kubelet or the Deployment controller said."""

    reason: str = Field(
        description="Unschedulable, ErrImagePull, ImagePullBackOff, CrashLoopBackOff, OOMKilled, "
        "CreateContainerConfigError, FailedCreate (ReplicaFailure), ProgressDeadlineExceeded, ..."
    )
    message: str = Field(default="", description="The scheduler's, kubelet's or Deployment controller's message.")
    deployment: str = Field(description="The serving Deployment.")
    pod: str | None = Field(default=None, description="The failing Pod (absent when the Deployment itself reports it).")


class ServingStatus(ApiModel):
    replicas: int = Field(default=0, description="Replicas of the active variant (scale subresource).")
    ready_replicas: int = Field(default=0, description="Ready replicas of the active variant.")
    selector: str = Field(default="", description="Label selector of the active pods (scale subresource).")
    service: str | None = Field(default=None, description="The stable Service clients use.")
    failure: ServingFailure | None = Field(
        default=None, description="Why serving does not come up (absent when nothing failed)."
    )


class SpeculationStatus(ApiModel):
    acceptance_rate: float | None = Field(default=None, description="Windowed accepted/draft tokens.")
    tokens_per_step: float | None = Field(default=None, description="Output tokens per engine step.")
    samples: int = Field(default=0, description="Finished requests in the last window.")
    last_evaluated: str | None = Field(
        default=None,
        description="Time of the evaluation that last changed this status (one that changes nothing writes nothing).",
    )
    decision: str | None = Field(default=None, description="Last decision (Stay, SwitchToBase, ...).")
    reason: str | None = Field(default=None, description="Why.")
    predicted_speedup: float | None = Field(default=None, description="Cost-model speedup at current load.")
    crossover_concurrency: float | None = Field(
        default=None, description="Measured concurrency above which ReDrafter stops beating base."
    )


ValidationState = Literal["Pending", "Running", "Passed", "Failed"]


class PromotedEngines(ApiModel):
    """The last engine pair that passed validation: its ReDrafter engine keeps serving while a newer one
    is validated on the candidate Deployment, and after that one fails."""

    redrafter_key: str = Field(description="ReDrafter engine key that passed validation.")
    base_key: str = Field(description="Base engine key it was validated against.")
    crossover_concurrency: float | None = Field(
        default=None,
        description="The crossover the validation Job measured for this pair: the PyTorch backend's speculative "
        "engine drafts only up to it (max_concurrency).",
    )
    # JSON object keys are strings on the wire: a key is read as the integer it spells
    draft_len_schedule: dict[Annotated[int, Strict(False)], int] | None = Field(
        default=None,
        description="{batch size: draft length} the validation sweep measured for this pair when a shorter draft "
        "paid at middle batch sizes; keys are lower bounds (from this batch size on), as TensorRT-LLM 1.2.1 "
        "reads them. The PyTorch backend's NGram and draft-model engines get it instead of max_concurrency.",
    )


class ValidationStatus(ApiModel):
    """The pre-promotion validation of one engine pair (see spec.validation)."""

    state: ValidationState = Field(default="Pending", description="Pending, Running, Passed or Failed.")
    redrafter_key: str | None = Field(default=None, description="ReDrafter engine key that was validated.")
    base_key: str | None = Field(default=None, description="Base engine key that was validated.")
    job: str | None = Field(default=None, description="Name of the validation Job.")
    attempt: int = Field(default=0, description="Validation Jobs run for this engine pair, minus one.")
    retry_token: str | None = Field(default=None, description="Retry request that started the current attempt.")
    reason: str | None = Field(
        default=None,
        description="Passed, Diverged, RequestFailed, EndpointUnavailable, InvalidInput or JobFailed.",
    )
    message: str | None = Field(default=None, description="The Job's one-line verdict (termination message).")
    completed: str | None = Field(default=None, description="When the Job finished (RFC 3339).")
    promoted: PromotedEngines | None = Field(default=None, description="The last engine pair that passed validation.")
    crossover_concurrency: float | None = Field(
        default=None, description="Concurrency above which ReDrafter stops beating base, as the Job measured it."
    )


class HistoryEntry(ApiModel):
    time: str = Field(description="When the switch happened.")
    # the wire name is a Python keyword; the aliases are spelled out so that type checkers see from_
    from_: str = Field(validation_alias="from", serialization_alias="from", description="Engine before.")
    to: str = Field(description="Engine after.")
    reason: str = Field(description="Why.")


class ReDrafterDeploymentStatus(ApiModel):
    phase: Phase = Field(
        default="Pending",
        description="Pending, Building, Deploying, Serving, Prewarmed (built and validated, "
        "serving.replicas 0 with autoscaling Disabled), Degraded or Failed.",
    )
    active_engine: Literal["redrafter", "base"] | None = Field(default=None, description="Engine the Service selects.")
    observed_generation: int | None = Field(default=None, description="Last generation acted on.")
    conditions: list[Condition] = Field(default_factory=list, description="Standard conditions.")
    engines: EnginesStatus = Field(default_factory=EnginesStatus, description="Engine build states.")
    drafter: DrafterStatus | None = Field(
        default=None, description="The drafter the operator trains (absent when the spec brings one)."
    )
    serving: ServingStatus = Field(default_factory=ServingStatus, description="Serving replicas.")
    speculation: SpeculationStatus = Field(default_factory=SpeculationStatus, description="Last evaluation.")
    validation: ValidationStatus | None = Field(
        default=None, description="Validation of the newest engine pair before promotion."
    )
    policy: (
        Annotated[dict[str, Any], WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True})]
        | None
    ) = Field(
        default=None,
        description="The speculation policy's and autoscaler's state (counter marks per pod, consecutive "
        "outcomes, dwell/cooldown times, recommendations): what the operator resumes from after a restart. "
        "Internal; its shape may change between versions.",
    )
    history: list[HistoryEntry] = Field(
        default_factory=list, max_length=HISTORY_LIMIT, description="Most recent engine switches (bounded)."
    )

    @classmethod
    def observed(cls, raw: Mapping[str, Any]) -> Self:
        """The status as the API server holds it; a top-level field this version cannot read is left out
        (written by hand, or by another version) rather than failing every reconcile of the resource."""
        wire = {k: v for k, v in raw.items() if k in _WIRE_NAMES}
        while True:
            try:
                return cls.from_wire(wire)
            except ValidationError as exc:
                bad = {str(e["loc"][0]) for e in exc.errors() if e["loc"]}
                if not bad & set(wire):
                    raise
                wire = {k: v for k, v in wire.items() if k not in bad}

    def wire(self) -> dict[str, Any]:
        """The status as the API server stores it: the fields this status holds, camelCase, no nulls.

        Fields left at their defaults and never set are left out, so a status read and written back is the
        same document (and a reconcile that changes nothing writes nothing)."""
        return self.model_dump(by_alias=True, exclude_unset=True, exclude_none=True, mode="json")


_WIRE_NAMES = frozenset(f.alias or name for name, f in ReDrafterDeploymentStatus.model_fields.items())
