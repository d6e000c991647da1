"""``ReDrafterDeployment.spec``: the whole ReDrafter service a user asks for.

Every field's description becomes its CRD description. Cross-field rules live twice on purpose: as
CEL (``x-kubernetes-validations``, enforced by the API server) and as pydantic validators (enforced by
the operator, for specs that got past an older CRD), with the same wording.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic.config import JsonDict

from . import defaults
from .cron import check_schedule
from .defaults import DEFAULT_BUILDER_IMAGE, DEFAULT_SERVING_IMAGE  # noqa: F401 (re-exported)
from .types import (
    SOURCE_PATTERN,
    ApiModel,
    Duration,
    NetworkPolicyPeer,
    ResourceRequirements,
    StringMap,
    Toleration,
    parse_duration,
    parse_source,
)

_DNS1123_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_IMAGE = r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]*$"
_REVISION = r"^[A-Za-z0-9][A-Za-z0-9._/-]*$"
_MODEL_NAME = r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]*$"


MAX_DRAFT_TOKENS = 64  # numBeams x draftLenPerBeam; larger trees cost more than they accept


class FieldError(ValueError):
    """A cross-field rule's error about one field: ``parse_spec`` reports it at that field's path, as the
    API server reports the CEL rule's ``fieldPath``."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path, self.message = path, message


API_KEYS_GRPC_MESSAGE = (
    "must not be grpc while serving.auth.apiKeysSecret is set: with API keys, Triton's HTTP and gRPC ports listen "
    "only inside the serving pod; leave it unset or set openai (the Job then calls the OpenAI API with a key)"
)


def _cel(rule: str, message: str, field_path: str | None = None) -> JsonDict:
    out: JsonDict = {"rule": rule, "message": message}
    if field_path:
        out["fieldPath"] = field_path
    return out


class ModelSource(ApiModel):
    """Where a checkpoint comes from."""

    model_config = {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                _cel(
                    r"!self.source.matches('^[a-z0-9]+://(.*/)?\\.\\.?(/.*)?$')",
                    "source must not contain '.' or '..' path segments",
                    ".source",
                ),
                _cel(
                    "!has(self.revision) || self.source.startsWith('hf://')",
                    "revision is only meaningful for hf:// sources",
                    ".revision",
                ),
            ]
        }
    }

    source: str = Field(
        pattern=SOURCE_PATTERN,
        max_length=512,
        description="hf://org/name (Hugging Face Hub), pvc://claim/sub/path (a PersistentVolumeClaim "
        "in this namespace) or s3://bucket/prefix. Paths are relative; '..' is rejected.",
    )
    revision: str | None = Field(
        default=None,
        pattern=_REVISION,
        max_length=128,
        description="hf:// only: branch, tag or commit; resolved to a commit at build time and "
        "recorded in the engine manifest. Defaults to main.",
    )
    credentials_secret: str | None = Field(
        default=None,
        pattern=_DNS1123_LABEL,
        max_length=253,
        description="Name of a Secret in this namespace mounted into the build Job: key `token` for "
        "hf://, keys `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY` (optional `AWS_ENDPOINT_URL`) for s3://.",
    )

    @field_validator("source")
    @classmethod
    def _strict_source(cls, v: str) -> str:
        parse_source(v)
        return v

    @model_validator(mode="after")
    def _revision_only_for_hf(self) -> ModelSource:
        if self.revision and not self.source.startswith("hf://"):
            raise ValueError("revision is only meaningful for hf:// sources")
        return self


class DatasetSource(ModelSource):
    """Prompts to self-distil the drafter on: a JSONL file, or a Hugging Face dataset (JSONL, JSON or Parquet files)."""

    column: str = Field(
        default="text",
        pattern=r"^[A-Za-z0-9_.-]+$",
        max_length=128,
        description="The field of each record (JSONL line or dataset row) that holds the prompt.",
    )


class DrafterRecipe(ApiModel):
    """The training recipe of arXiv 2403.09919 (self-distillation); the defaults are the paper's."""

    draft_len: int = Field(
        default=5,
        ge=1,
        le=16,
        description="Tokens the head learns to draft after the guaranteed one; redrafter.draftLenPerBeam must not "
        "exceed it.",
    )
    rnn: bool = Field(default=True, description="The recurrent state over drafted tokens (off: a Medusa-like head).")
    layers: int = Field(default=2, ge=1, le=8, description="Residual blocks of the head (num_draft_layers).")
    exit_dim: int | None = Field(default=None, ge=8, le=65536, description="Width of the head; unset: 2x hidden.")
    epochs: int = Field(default=2, ge=1, le=100, description="Passes over the distilled data.")
    learning_rate: float = Field(default=1e-3, gt=0, le=1, description="AdamW learning rate.")
    batch_size: int = Field(default=8, ge=1, le=4096, description="Sequences per optimizer step (all ranks).")
    max_steps: int | None = Field(default=None, ge=1, le=10_000_000, description="Stop after this many steps.")
    response_len: int = Field(
        default=256, ge=8, le=8192, description="Tokens the base model generates per prompt (distillation)."
    )
    held_out_fraction: float = Field(
        default=0.05, ge=0, lt=1, description="Prompts kept out of training to measure acceptance."
    )
    eval_beams: int = Field(default=5, ge=1, le=16, description="Beams of the held-out acceptance measurement.")
    seed: int = Field(default=0, ge=0, le=2**31 - 1, description="Seed of the split, the init and the order.")


class DrafterTraining(ApiModel):
    """Train the drafter from the base model in a GPU Job (content-addressed: never trained twice)."""

    dataset: DatasetSource = Field(description="The prompts to self-distil on.")
    samples: int = Field(default=20000, ge=1, le=10_000_000, description="Prompts used: the first N of the dataset.")
    recipe: DrafterRecipe = Field(default_factory=DrafterRecipe, description="Hyperparameters.")
    gpus: int = Field(default=1, ge=1, le=64, description="GPUs of the Job; more than 1 trains data-parallel.")
    gpu_product: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9._-]+$",
        max_length=63,
        description="GPU product to train on (the nvidia.com/gpu.product node label); part of the drafter key. "
        "Unset: engine.build.gpuProduct.",
    )
    image: str | None = Field(
        default=None,
        pattern=_IMAGE,
        max_length=512,
        description="Trainer image (torch, transformers and engine_jobs); part of the drafter key. Unset: "
        "engine.builderImage.",
    )
    resources: ResourceRequirements = Field(
        default_factory=dict,
        description="CPU/memory requests and limits over the default requests of 2 CPUs and 16Gi per GPU.",
    )
    active_deadline_seconds: int = Field(
        default=86400, ge=60, le=1209600, description="Upper bound of one training Job's run time."
    )
    accept_rejected: bool = Field(
        default=False,
        description="Build the ReDrafter engine from a trained head the drafter gate rejects (held-out "
        "acceptance not well above the untrained head and prompt lookup, or held-out top-1 collapsed against "
        "training). Not part of the drafter key.",
    )


class Drafter(ApiModel):
    """The ReDrafter draft head: a trained one (``source``) or one the operator trains (``train``)."""

    model_config = {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                _cel(
                    "has(self.source) != has(self.train)",
                    "give exactly one of drafter.source (a trained head) or drafter.train (train one from the base)",
                ),
                _cel(
                    r"!has(self.source) || !self.source.matches('^[a-z0-9]+://(.*/)?\\.\\.?(/.*)?$')",
                    "source must not contain '.' or '..' path segments",
                    ".source",
                ),
                _cel(
                    "!has(self.revision) || (has(self.source) && self.source.startsWith('hf://'))",
                    "revision is only meaningful for hf:// sources",
                    ".revision",
                ),
            ]
        }
    }

    source: str | None = Field(
        default=None,
        pattern=SOURCE_PATTERN,
        max_length=512,
        description="A trained head (config.json with hidden_size, exit_dim, num_draft_layers, rnn; "
        "model.safetensors): hf://org/name, pvc://claim/sub/path or s3://bucket/prefix.",
    )
    revision: str | None = Field(default=None, pattern=_REVISION, max_length=128, description="hf:// only.")
    credentials_secret: str | None = Field(
        default=None, pattern=_DNS1123_LABEL, max_length=253, description="As for the base model."
    )
    train: DrafterTraining | None = Field(default=None, description="Train the head from the base model instead.")

    @field_validator("source")
    @classmethod
    def _strict_source(cls, v: str | None) -> str | None:
        if v is not None:
            parse_source(v)
        return v

    @model_validator(mode="after")
    def _one_of(self) -> Drafter:
        if (self.source is None) == (self.train is None):
            raise ValueError(
                "give exactly one of drafter.source (a trained head) or drafter.train (train one from the base)"
            )
        if self.revision and not (self.source or "").startswith("hf://"):
            raise ValueError("revision is only meaningful for hf:// sources")
        return self

    def as_source(self) -> ModelSource | None:
        """The head as a source (None while the operator trains it)."""
        if self.source is None:
            return None
        return ModelSource(source=self.source, revision=self.revision, credentials_secret=self.credentials_secret)


class Model(ApiModel):
    """The checkpoints that make up the service."""

    base: ModelSource = Field(
        description="The base (verifier) model: a Llama or Qwen2/Qwen2.5 checkpoint. Qwen v1 (QWenLMHeadModel) "
        "is refused: its tokenizer is remote code (trust_remote_code), which the operator does not run."
    )
    drafter: Drafter | None = Field(
        default=None,
        description="What drafts for the base model, by method: redrafter: the ReDrafter head, source (a trained "
        "head) or train (the operator trains one; see docs/drafter.md); eagle3: the EAGLE-3 head's checkpoint "
        "(source); draftModel: the draft model's checkpoint (source). ngram and mtp take none.",
    )
    tokenizer: ModelSource | None = Field(
        default=None, description="Tokenizer for pre/post-processing. Defaults to the base model's."
    )
    architecture: Literal["auto", "llama", "qwen"] = Field(
        default="auto",
        description="Base architecture, choosing the TensorRT-LLM converter (qwen: Qwen2/Qwen2.5). "
        "auto reads config.json.",
    )


class Precision(ApiModel):
    """Numeric precision of the engines."""

    dtype: Literal["float16", "bfloat16"] = Field(default="bfloat16", description="Activation/weight dtype.")
    quantization: Literal["none", "fp8"] = Field(
        default="none",
        description="fp8 quantizes the base model only (TensorRT-LLM ReDrafter keeps the drafter in dtype).",
    )


class Redrafter(ApiModel):
    """Recurrent-drafting parameters baked into the ReDrafter engine."""

    model_config = {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                _cel(
                    f"self.numBeams * self.draftLenPerBeam <= {MAX_DRAFT_TOKENS}",
                    f"numBeams x draftLenPerBeam must be at most {MAX_DRAFT_TOKENS}",
                )
            ]
        }
    }

    num_beams: int = Field(default=5, ge=1, le=16, description="Beams the drafter proposes per step.")
    draft_len_per_beam: int = Field(default=5, ge=1, le=16, description="Draft tokens per beam.")
    greedy_search: bool = Field(
        default=True, description="Greedy acceptance; false passes --redrafter_no_greedy_search."
    )

    @model_validator(mode="after")
    def _bounded_tree(self) -> Redrafter:
        if self.num_beams * self.draft_len_per_beam > MAX_DRAFT_TOKENS:
            raise ValueError(f"numBeams x draftLenPerBeam must be at most {MAX_DRAFT_TOKENS}")
        return self


#: the speculation methods; redrafter runs on TensorRT-LLM's TensorRT-engine path, the others on its
#: PyTorch backend (docs/speculation-methods.md)
Method = Literal["redrafter", "eagle3", "mtp", "ngram", "draftModel"]
METHODS: tuple[str, ...] = ("redrafter", "eagle3", "mtp", "ngram", "draftModel")
#: methods whose drafter is a checkpoint in model.drafter
DRAFTER_METHODS: tuple[str, ...] = ("redrafter", "eagle3", "draftModel")


class Eagle3(ApiModel):
    """EAGLE-3: a small head over the base model's hidden states drafts a chain of tokens."""

    max_draft_len: int = Field(
        default=3, ge=1, le=MAX_DRAFT_TOKENS, description="Tokens the head drafts per step (max_draft_len)."
    )


class Mtp(ApiModel):
    """Multi-token prediction: the base checkpoint's own MTP modules draft (DeepSeek-V3/R1-style models)."""

    num_nextn_predict_layers: int = Field(
        default=1,
        ge=1,
        le=16,
        description="MTP modules used per step; at most what the base config.json declares "
        "(num_nextn_predict_layers), checked when the sources are prepared.",
    )


class NGram(ApiModel):
    """NGram: drafts by matching the last tokens against earlier text of the request; no drafter at all."""

    max_draft_len: int = Field(default=4, ge=1, le=MAX_DRAFT_TOKENS, description="Tokens drafted per step.")
    max_matching_ngram_size: int = Field(
        default=4, ge=1, le=32, description="Longest suffix of the text matched to find a draft."
    )


class DraftModel(ApiModel):
    """A smaller model of the same tokenizer drafts for the base (decoding type DraftTarget)."""

    max_draft_len: int = Field(default=4, ge=1, le=MAX_DRAFT_TOKENS, description="Tokens drafted per step.")


class Parallelism(ApiModel):
    """How the engines are sharded. ReDrafter supports tensor parallelism only."""

    tensor: Literal[1, 2, 4, 8] = Field(default=1, description="Tensor-parallel size = GPUs per replica.")


# The CRD's first filter (the shape of a schedule); the model checks it as the API server will
# (api/cron.py: robfig/cron ParseStandard), so a CronJob apply never fails on it later.
_CRON = r"^(@(hourly|daily|weekly|monthly|yearly|annually|midnight)|@every \S+|\S+( \S+){4})$"


class CacheRetention(ApiModel):
    """What the scheduled collection keeps of the engines no ReDrafterDeployment references.

    Referenced engines (any resource's spec or status, in any namespace, and served ones) are always
    kept. Unset fields take the operator's defaults (Helm value defaults.engineCacheRetention); with
    neither ``keep`` nor ``maxAge`` from either, nothing is ever collected. When resources sharing a
    claim disagree, the collection keeps the most (the largest keep and the largest maxAge).
    """

    keep: int | None = Field(
        default_factory=lambda: defaults.DEFAULTS.cache_retention_keep,
        ge=0,
        le=1000,
        description="Keep this many most recently used unreferenced engines per model and variant.",
    )
    max_age: Duration | None = Field(
        default_factory=lambda: defaults.DEFAULTS.cache_retention_max_age,
        description="Keep unreferenced engines that were referenced within this duration (e.g. 720h).",
    )
    schedule: str = Field(
        default_factory=lambda: defaults.DEFAULTS.cache_retention_schedule,
        max_length=100,
        json_schema_extra={"pattern": _CRON},
        description="Cron schedule of the collection (a CronJob per cache claim, in the claim's namespace): "
        "five fields or a descriptor (@daily, @every 6h) as Kubernetes CronJobs take them, in the time zone of "
        "the cluster's kube-controller-manager (usually UTC).",
    )

    @field_validator("schedule")
    @classmethod
    def _kubernetes_schedule(cls, v: str) -> str:
        return check_schedule(v)

    @property
    def enabled(self) -> bool:
        return self.keep is not None or self.max_age is not None


class EngineCache(ApiModel):
    """The shared, content-addressed engine cache volume."""

    model_config = {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                _cel(
                    r"!self.subPath.matches('(^|/)\\.\\.?(/|$)')",
                    "subPath must not contain '.' or '..' segments",
                    ".subPath",
                ),
            ]
        }
    }

    claim_name: str = Field(
        default_factory=lambda: defaults.DEFAULTS.cache_claim,
        pattern=_DNS1123_LABEL,
        max_length=253,
        description="ReadWriteMany PVC holding engines; shared by every resource that names it. Unset: the "
        "operator's default (Helm value defaults.engineCacheClaim), else engine-cache.",
    )
    sub_path: str = Field(
        default="engines",
        pattern=r"^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$",
        max_length=253,
        description="Directory inside the claim; engines live at <subPath>/<engine-key>/.",
    )

    retention: CacheRetention = Field(
        default_factory=CacheRetention, description="Collection of unreferenced engines in this claim."
    )

    @field_validator("sub_path")
    @classmethod
    def _no_dotdot(cls, v: str) -> str:
        if any(part in (".", "..") for part in v.split("/")):
            raise ValueError("subPath must not contain '.' or '..' segments")
        return v


class BuildJob(ApiModel):
    """Scheduling and limits of the GPU build Jobs."""

    gpu_resource: str = Field(
        default="nvidia.com/gpu",
        pattern=r"^[a-z0-9.-]+/[a-z0-9.-]+$",
        max_length=253,
        description="Extended resource name requested (tensor GPUs per build).",
    )
    gpu_product: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9._-]+$",
        max_length=63,
        description="GPU product (the nvidia.com/gpu.product node label). Engines are GPU-specific: "
        "it selects build and serving nodes and is part of the engine key.",
    )
    node_selector: StringMap = Field(default_factory=dict, description="Extra node selector for build Pods.")
    tolerations: list[Toleration] = Field(default_factory=list, description="Tolerations for build Pods.")
    resources: ResourceRequirements = Field(
        default_factory=dict,
        description="CPU/memory requests and limits over the default requests of 2 CPUs and 16Gi per "
        "tensor-parallel rank (a request here wins; a limit without a request replaces the default "
        "request). GPUs are added from tensor size.",
    )
    active_deadline_seconds: int = Field(
        default=14400, ge=60, le=604800, description="Upper bound of one build Job's run time."
    )
    backoff_limit: int = Field(default=1, ge=0, le=10, description="Pod retries inside one build Job.")
    retries: int = Field(
        default=2,
        ge=0,
        le=10,
        description="How many times the operator re-creates a failed build Job before the phase is Failed.",
    )


class Engine(ApiModel):
    """The TensorRT-LLM engines (ReDrafter and its base fallback) and how they are built."""

    model_config = {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                _cel("self.maxInputLen < self.maxSeqLen", "maxInputLen must be less than maxSeqLen"),
                _cel("self.maxNumTokens >= self.maxBatchSize", "maxNumTokens must be at least maxBatchSize"),
            ]
        }
    }

    builder_image: str = Field(
        default_factory=lambda: defaults.DEFAULTS.builder_image,
        pattern=_IMAGE,
        max_length=512,
        description="Image with TensorRT-LLM and engine_jobs; its tag pins the TensorRT-LLM version and "
        "is part of the engine key. Must match the serving image's TensorRT-LLM. Unset: the operator's "
        "default (Helm value defaults.builderImage).",
    )
    max_batch_size: int = Field(default=8, ge=1, le=4096, description="trtllm-build --max_batch_size.")
    max_input_len: int = Field(default=2048, ge=1, le=1048576, description="trtllm-build --max_input_len.")
    max_seq_len: int = Field(default=4096, ge=2, le=1048576, description="trtllm-build --max_seq_len.")
    max_num_tokens: int = Field(default=8192, ge=1, le=1048576, description="trtllm-build --max_num_tokens.")
    paged_context_fmha: bool = Field(
        default=True, description="--use_paged_context_fmha enable (required for chunked context)."
    )
    cache: EngineCache = Field(default_factory=EngineCache, description="Engine cache volume.")
    build: BuildJob = Field(default_factory=BuildJob, description="Build Job scheduling and limits.")

    @model_validator(mode="after")
    def _limits(self) -> Engine:
        if self.max_input_len >= self.max_seq_len:
            raise ValueError("maxInputLen must be less than maxSeqLen")
        if self.max_num_tokens < self.max_batch_size:
            raise ValueError("maxNumTokens must be at least maxBatchSize")
        return self


class Triton(ApiModel):
    """Triton TensorRT-LLM backend parameters (serving-only: changing them never rebuilds)."""

    batching_strategy: Literal["inflight_fused_batching"] = Field(
        default="inflight_fused_batching",
        description="Triton tensorrt_llm batching_strategy. Only in-flight batching: static batching (v1) "
        "is not run by the TensorRT-LLM 1.0 executor.",
    )
    max_queue_delay_microseconds: int = Field(
        default=0, ge=0, le=10_000_000, description="Dynamic batcher max queue delay."
    )
    kv_cache_free_gpu_mem_fraction: float = Field(
        default=0.9, gt=0.0, le=1.0, description="Fraction of free GPU memory given to the KV cache."
    )
    enable_chunked_context: bool = Field(
        default=True, description="Chunked context (only applied when engine.pagedContextFmha is true)."
    )
    enable_kv_cache_reuse: bool = Field(default=True, description="Reuse KV blocks across requests.")

    @field_validator("batching_strategy", mode="before")
    @classmethod
    def _no_static_batching(cls, v: object) -> object:
        # Say why, not only "should be 'inflight_fused_batching'": v1 was accepted before.
        if isinstance(v, str) and v.lower() == "v1":
            raise ValueError(
                "batchingStrategy v1 (static batching) is not supported: the TensorRT-LLM 1.0 "
                "executor runs only in-flight batching; use inflight_fused_batching"
            )
        return v


class Rollout(ApiModel):
    """How serving moves between engines."""

    strategy: Literal["BlueGreen", "Recreate"] = Field(
        default="BlueGreen",
        description="BlueGreen brings the target up and waits Ready before moving the Service; Recreate "
        "scales the old variant down first (for clusters without spare GPUs).",
    )
    keep_standby: bool = Field(
        default=False, description="Keep one replica of the inactive variant running for fast switches."
    )


class ServingNetworkPolicy(ApiModel):
    """NetworkPolicies for this resource's pods (enforced only where the cluster's network plugin does).

    Serving pods admit ingress only on their HTTP, gRPC and metrics ports, from ``ingressFrom`` (by
    default every pod of this namespace: clients and the validation Job), plus the metrics ports (Triton's,
    and the OpenAI front's, whose /metrics holds its queue) from the operator's namespace (its Pods metrics
    source) and ``metricsFrom`` (e.g. Prometheus). Build and
    validation pods admit no ingress at all: nothing connects to them.
    """

    enabled: bool = Field(default=False, description="Create the NetworkPolicies.")
    ingress_from: list[NetworkPolicyPeer] = Field(
        default_factory=list,
        description="NetworkPolicyPeers allowed on the serving ports (HTTP, gRPC, metrics). Empty: every pod "
        "in this namespace.",
    )
    metrics_from: list[NetworkPolicyPeer] = Field(
        default_factory=list,
        description="Extra NetworkPolicyPeers allowed on the metrics ports only (Triton's metrics port and the "
        "OpenAI front's port, which serves its queue on /metrics; e.g. Prometheus's namespace).",
    )


class ServingAuth(ApiModel):
    """Who may call the OpenAI-compatible API (port 9000)."""

    api_keys_secret: str | None = Field(
        default=None,
        pattern=_DNS1123_LABEL,
        max_length=253,
        description="Name of a Secret in this namespace holding the API keys, one key per data entry (the "
        "entry names are free, e.g. one per client). Set: every request to the OpenAI API needs "
        "`Authorization: Bearer <key>` (health and metrics paths excepted); a Secret update takes effect "
        "without a restart once the kubelet refreshes the mounted volume. The validation Job sends the first "
        "key by entry name. Unset: no authentication (rely on the NetworkPolicy).",
    )


class Serving(ApiModel):
    """Triton serving pods."""

    image: str = Field(
        default_factory=lambda: defaults.DEFAULTS.serving_image,
        pattern=_IMAGE,
        max_length=512,
        description="Triton + TensorRT-LLM backend image with the redrafter launcher and metering model. "
        "Unset: the operator's default (Helm value defaults.servingImage).",
    )
    replicas: int = Field(default=1, ge=0, le=1000, description="Replicas of the active variant (scale subresource).")
    triton: Triton = Field(default_factory=Triton, description="Triton backend parameters.")
    resources: ResourceRequirements = Field(
        default_factory=dict,
        description="CPU/memory for each pod, over the default requests of 2 CPUs and 16Gi per tensor-parallel "
        "rank (a request here wins; a limit without a request replaces the default request). GPUs are added "
        "from tensor size.",
    )
    node_selector: StringMap = Field(default_factory=dict, description="Node selector for serving Pods.")
    tolerations: list[Toleration] = Field(default_factory=list, description="Tolerations for serving Pods.")
    startup_timeout_seconds: int = Field(
        default=1800, ge=30, le=86400, description="How long engine loading may take before the pod restarts."
    )
    rollout: Rollout = Field(default_factory=Rollout, description="Engine switch strategy.")
    network_policy: ServingNetworkPolicy = Field(
        default_factory=ServingNetworkPolicy, description="Optional NetworkPolicies for this resource's pods."
    )
    auth: ServingAuth = Field(default_factory=ServingAuth, description="API keys of the OpenAI-compatible API.")

    model_name: str | None = Field(
        default=None,
        pattern=_MODEL_NAME,
        max_length=256,
        description="Model id of the OpenAI-compatible API (GET /v1/models, the `model` of requests). "
        "Unset: the resource name.",
    )


class EndpointPickerRef(ApiModel):
    """The Endpoint Picker (EPP) Service the gateway consults for each request (InferencePool v1 ``endpointPickerRef``)."""

    name: str = Field(
        min_length=1,
        max_length=63,
        pattern=_DNS1123_LABEL,
        description="Name of the endpoint picker's Service, in the resource's namespace.",
    )
    port: int = Field(ge=1, le=65535, description="The endpoint picker Service's port (its gRPC ext-proc port).")
    failure_mode: Literal["FailOpen", "FailClose"] = Field(
        default="FailClose",
        description="What the gateway does when the endpoint picker does not answer: FailClose rejects the "
        "request, FailOpen routes it to any pod of the pool.",
    )


class InferencePool(ApiModel):
    """A Gateway API Inference Extension ``InferencePool`` (inference.networking.k8s.io/v1) named like the Service."""

    model_config = {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                _cel(
                    "!self.enabled || has(self.endpointPickerRef)",
                    "endpointPickerRef is required when the InferencePool is enabled",
                )
            ]
        }
    }

    enabled: bool = Field(
        default=False,
        description="Manage an InferencePool <name> that selects the active "
        "engine's pods exactly as the Service <name> does (moved blue/green with it).",
    )
    endpoint_picker_ref: EndpointPickerRef | None = Field(
        default=None, description="The endpoint picker the gateway consults; required when enabled."
    )

    @model_validator(mode="after")
    def _picker_when_enabled(self) -> "InferencePool":
        if self.enabled and self.endpoint_picker_ref is None:
            raise ValueError("endpointPickerRef is required when the InferencePool is enabled")
        return self


class Routing(ApiModel):
    """How gateways reach the serving pods beyond the Service <name>."""

    inference_pool: InferencePool = Field(
        default_factory=InferencePool, description="Gateway API Inference Extension InferencePool."
    )


class Autoscaling(ApiModel):
    """Replica autoscaling with HPA semantics on the serving queue."""

    model_config = {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                _cel("self.minReplicas <= self.maxReplicas", "minReplicas must be at most maxReplicas")
            ]
        }
    }

    mode: Literal["Operator", "External", "Disabled"] = Field(
        default="Operator",
        description="Operator scales replicas itself; External leaves replicas to an HPA/KEDA via the scale "
        "subresource; Disabled keeps serving.replicas.",
    )
    min_replicas: int = Field(default=1, ge=0, le=1000, description="Lower bound.")
    max_replicas: int = Field(default=4, ge=1, le=1000, description="Upper bound.")
    target_queue_per_replica: float = Field(
        default=4.0,
        gt=0,
        le=10000,
        description="Target queue per replica: requests Triton is generating or holding (active + waiting) "
        "plus requests waiting in the pod's OpenAI front for a generation slot.",
    )
    scale_up_stabilization: Duration = Field(default="0s", description="Window of recommendations for scale-up.")
    scale_down_stabilization: Duration = Field(default="300s", description="Window of recommendations for scale-down.")
    tolerance: float = Field(default=0.1, ge=0, lt=1, description="No change while |metric/target - 1| <= tolerance.")
    max_step: int = Field(default=4, ge=1, le=1000, description="At most this many replicas added or removed at once.")

    @model_validator(mode="after")
    def _bounds(self) -> Autoscaling:
        if self.min_replicas > self.max_replicas:
            raise ValueError("minReplicas must be at most maxReplicas")
        return self


class CostModel(ApiModel):
    """Step-latency model predicting ReDrafter's speedup over base at a batch size (see policy/cost.py).

    Step latency of an engine processing T tokens in one step: L(T) = 1 + tokenCost x T (in units of
    the fixed per-step cost). Base processes 1 token per request per step, ReDrafter verifies
    verifiedTokensPerRequest and pays drafterOverhead per step. Defaults reproduce the published
    2.7x at low batch with 3.5 tokens/step and a crossover near 13 concurrent requests.
    """

    token_cost: float = Field(
        default=0.0072,
        gt=0,
        le=10,
        description="Per-token compute cost relative to the fixed (weight-loading) cost of one step.",
    )
    drafter_overhead: float = Field(
        default=0.10, ge=0, le=10, description="Extra step time of the drafter, as a fraction of a step."
    )
    verified_tokens_per_request: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="Tokens ReDrafter verifies per request per step; default 1 + numBeams x draftLenPerBeam.",
    )


class Speculation(ApiModel):
    """When to serve with ReDrafter and when to fall back to the base engine."""

    model_config = {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                _cel(
                    "self.minAcceptanceRate + self.acceptanceHysteresis <= 1.0",
                    "minAcceptanceRate + acceptanceHysteresis must be at most 1 (else recovery is impossible)",
                ),
                # the pattern admits 0s; a duration of that pattern is positive when some digit is not 0
                *(
                    _cel(f"!has(self.{f}) || self.{f}.matches('[1-9]')", "must be a positive duration", f".{f}")
                    for f in ("interval", "cooldown", "minDwell")
                ),
            ]
        }
    }

    mode: Literal["Auto", "Always", "Never"] = Field(
        default="Auto",
        description="Auto measures and switches; Always pins ReDrafter; Never pins the base engine.",
    )
    min_acceptance_rate: float = Field(
        default=0.35, ge=0, le=1, description="A measurement below this acceptance rate is a failure."
    )
    interval: Duration = Field(default="30s", description="Evaluation interval.")
    failure_limit: int = Field(default=3, ge=1, le=100, description="Consecutive failures before falling back.")
    success_limit: int = Field(default=3, ge=1, le=100, description="Consecutive successes before returning.")
    min_samples: int = Field(
        default=50, ge=1, le=1_000_000, description="Fewer finished requests in a window is inconclusive."
    )
    consecutive_error_limit: int = Field(
        default=4, ge=1, le=100, description="Metric read errors in a row before SpeculationHealthy=Unknown."
    )
    cooldown: Duration = Field(default="10m", description="Minimum time between two switches.")
    min_dwell: Duration = Field(default="2m", description="Minimum time on an engine before leaving it.")
    load_aware: bool = Field(
        default=True, description="Also fall back when the cost model predicts no speedup at the current load."
    )
    margin: float = Field(
        default=0.05,
        ge=0,
        lt=1,
        description="Hysteresis of the load-aware rule: leave below 1-margin, return above 1+margin.",
    )
    canary_replicas: int = Field(
        default=1,
        ge=0,
        le=100,
        description="While on base, ReDrafter replicas that keep receiving a share of live traffic so "
        "acceptance stays measured and recovery can be detected (0 disables recovery detection). None run "
        "after a fallback caused by load alone (loadAware, at an acceptance above minAcceptanceRate + "
        "acceptanceHysteresis): its return is judged from the load.",
    )
    acceptance_hysteresis: float = Field(
        default=0.05,
        ge=0,
        le=1,
        description="Returning to ReDrafter needs the canary's acceptance at least minAcceptanceRate plus this.",
    )
    cost_model: CostModel = Field(
        default_factory=CostModel, description="Parameters of the load-aware cost model (all overridable)."
    )

    @field_validator("interval", "cooldown", "min_dwell")
    @classmethod
    def _positive(cls, v: str) -> str:
        if parse_duration(v) <= 0:
            raise ValueError("must be a positive duration")
        return v

    @model_validator(mode="after")
    def _recoverable(self) -> Speculation:
        if self.min_acceptance_rate + self.acceptance_hysteresis > 1.0:
            raise ValueError("minAcceptanceRate + acceptanceHysteresis must be at most 1 (else recovery is impossible)")
        return self


class Metrics(ApiModel):
    """Where serving metrics are read from."""

    source: Literal["Pods", "Prometheus"] = Field(
        default="Pods", description="Pods scrapes each Ready pod's metrics port; Prometheus uses PromQL."
    )
    prometheus_url: str | None = Field(
        default=None,
        pattern=r"^https?://[A-Za-z0-9.:/_-]+$",
        max_length=512,
        description="Prometheus base URL (source: Prometheus).",
    )
    scrape_timeout_seconds: float = Field(default=2.0, gt=0, le=60, description="Per-pod scrape timeout.")

    @model_validator(mode="after")
    def _url_for_prometheus(self) -> Metrics:
        if self.source == "Prometheus" and not self.prometheus_url:
            raise ValueError("prometheusUrl is required when source is Prometheus")
        return self


class Validation(ApiModel):
    """Validation of a new engine pair before the stable Service points at it (a CPU-only Job).

    Once a new engine's pods are Ready, the operator runs ``redrafter-operator evaluate validate``
    against the ``<name>-redrafter`` and ``<name>-base`` Services: context-only, generation-only and
    mixed batches, single requests and max-length inputs, checking that ReDrafter's greedy outputs
    equal the base engine's. A failure blocks promotion (the previous engine keeps serving). With
    ``measureCrossover`` a short concurrency sweep then records the measured crossover concurrency in
    status.speculation.crossoverConcurrency, which the load-aware policy uses instead of the cost model.
    """

    enabled: bool = Field(default=True, description="Validate every new engine pair before promoting it.")
    image: str | None = Field(
        default=None,
        pattern=_IMAGE,
        max_length=512,
        description="Image running the validation Job (needs the redrafter-operator CLI with its `client` "
        "extra). Defaults to the operator's own image.",
    )
    max_tokens: int = Field(default=32, ge=1, le=4096, description="Output tokens of normal requests.")
    long_max_tokens: int = Field(
        default=128, ge=1, le=65536, description="Output tokens of the long requests kept in flight."
    )
    single_requests: int = Field(default=4, ge=1, le=256, description="Requests sent one at a time.")
    max_divergences: int = Field(
        default=0,
        ge=0,
        le=1000,
        description="Greedy outputs allowed to differ from the base engine's (0: any divergence fails).",
    )
    prompts_config_map: str | None = Field(
        default=None,
        pattern=_DNS1123_LABEL,
        max_length=253,
        description="ConfigMap in this namespace holding the prompt set (JSON or YAML) under promptsKey; "
        "defaults to a small built-in set.",
    )
    prompts_key: str = Field(
        default="prompts.yaml",
        pattern=r"^[-._a-zA-Z0-9]+$",
        max_length=253,
        description="Key of the prompt set in promptsConfigMap.",
    )
    measure_crossover: bool = Field(
        default=True,
        description="After passing, sweep concurrency 1, 2, 4, ..., maxBatchSize and record the measured crossover.",
    )
    protocol: Literal["grpc", "openai"] | None = Field(
        default=None,
        description="How the Job calls the engines: grpc (Triton's entry model, port 8001) or openai (the "
        "pods' OpenAI-compatible API, port 9000, as applications call it, with a key of "
        "serving.auth.apiKeysSecret when one is set). Unset: openai when serving.auth.apiKeysSecret is set "
        "(Triton's own ports then listen only inside the pod, so grpc is refused), grpc otherwise.",
    )
    active_deadline_seconds: int = Field(
        default=1800, ge=60, le=86400, description="Upper bound of the validation Job's run time."
    )
    resources: ResourceRequirements = Field(
        default_factory=dict,
        description="CPU/memory of the validation pod (it needs no GPU), over the defaults: requests 250m "
        "CPU and 256Mi, memory limit 1Gi.",
    )


_NO_DRAFTER = (
    "methods ngram and mtp take no model.drafter (ngram drafts from the request's own text, mtp with the base "
    "checkpoint's MTP layers)"
)
_TRAIN_REDRAFTER_ONLY = (
    "model.drafter.train trains a ReDrafter head (method redrafter); method eagle3 and draftModel need a "
    "trained checkpoint in model.drafter.source"
)
_FP8_REDRAFTER_ONLY = (
    "precision.quantization fp8 quantizes at build time, which only the redrafter method has; for the PyTorch "
    "backend give a pre-quantized (FP8) checkpoint as model.base"
)
#: per-method parameter blocks: (field name on the wire, the method that reads it)
_METHOD_BLOCKS: tuple[tuple[str, str], ...] = (
    ("eagle3", "eagle3"),
    ("mtp", "mtp"),
    ("ngram", "ngram"),
    ("draftModel", "draftModel"),
)


def _block_message(block: str, method: str) -> str:
    return f"{block} is read only when method is {method}"


def _snake(name: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in name)


class ReDrafterDeploymentSpec(ApiModel):
    """A speculative-decoding LLM service: engines, serving, autoscaling and speculation policy."""

    model_config = {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                _cel(
                    "!has(self.model.drafter) || !has(self.model.drafter.train) || !has(self.redrafter) || "
                    "!has(self.redrafter.draftLenPerBeam) || self.redrafter.draftLenPerBeam <= "
                    "(has(self.model.drafter.train.recipe) && has(self.model.drafter.train.recipe.draftLen) "
                    "? self.model.drafter.train.recipe.draftLen : 5)",
                    "redrafter.draftLenPerBeam must not exceed model.drafter.train.recipe.draftLen (the trained "
                    "draft length)",
                    ".redrafter.draftLenPerBeam",
                ),
                _cel(
                    "!has(self.serving) || !has(self.serving.auth) || !has(self.serving.auth.apiKeysSecret) || "
                    "!has(self.validation) || !has(self.validation.protocol) || self.validation.protocol != 'grpc'",
                    API_KEYS_GRPC_MESSAGE,
                    ".validation.protocol",
                ),
                _cel(
                    "!(self.method in ['redrafter', 'eagle3', 'draftModel']) || has(self.model.drafter)",
                    "required by methods redrafter, eagle3 and draftModel (the head or the draft model's checkpoint)",
                    ".model.drafter",
                ),
                _cel(
                    "!(self.method in ['ngram', 'mtp']) || !has(self.model.drafter)",
                    _NO_DRAFTER,
                    ".model.drafter",
                ),
                _cel(
                    "self.method == 'redrafter' || !has(self.model.drafter) || !has(self.model.drafter.train)",
                    _TRAIN_REDRAFTER_ONLY,
                    ".model.drafter.train",
                ),
                _cel(
                    "self.method == 'redrafter' || !has(self.precision) || !has(self.precision.quantization) || "
                    "self.precision.quantization == 'none'",
                    _FP8_REDRAFTER_ONLY,
                    ".precision.quantization",
                ),
                *(
                    _cel(f"!has(self.{block}) || self.method == '{method}'", _block_message(block, method), f".{block}")
                    for block, method in _METHOD_BLOCKS
                ),
            ]
        }
    }

    method: Method = Field(
        default="redrafter",
        description="How drafts are made: redrafter (ReDrafter, TensorRT engines built by trtllm-build), or on "
        "TensorRT-LLM's PyTorch backend eagle3 (an EAGLE-3 head), mtp (the base's own MTP layers), ngram (no "
        "drafter) or draftModel (a smaller model). See docs/speculation-methods.md.",
    )
    model: Model = Field(description="Checkpoints: base, drafter, tokenizer.")
    precision: Precision = Field(default_factory=Precision, description="Engine precision.")
    redrafter: Redrafter = Field(default_factory=Redrafter, description="ReDrafter drafting parameters.")
    eagle3: Eagle3 | None = Field(default=None, description="EAGLE-3 parameters (method eagle3).")
    mtp: Mtp | None = Field(default=None, description="MTP parameters (method mtp).")
    ngram: NGram | None = Field(default=None, description="NGram parameters (method ngram).")
    draft_model: DraftModel | None = Field(default=None, description="Draft-model parameters (method draftModel).")
    parallelism: Parallelism = Field(default_factory=Parallelism, description="Tensor parallelism.")
    engine: Engine = Field(default_factory=Engine, description="Engine build settings.")
    serving: Serving = Field(default_factory=Serving, description="Triton serving settings.")
    autoscaling: Autoscaling = Field(default_factory=Autoscaling, description="Autoscaling.")
    speculation: Speculation = Field(default_factory=Speculation, description="Speculation policy.")
    metrics: Metrics = Field(default_factory=Metrics, description="Serving metrics source.")
    validation: Validation = Field(
        default_factory=Validation, description="Validation of new engines before promotion."
    )
    routing: Routing = Field(default_factory=Routing, description="Gateway routing (InferencePool).")

    @model_validator(mode="after")
    def _method_rules(self) -> ReDrafterDeploymentSpec:
        drafter = self.model.drafter
        if self.method in DRAFTER_METHODS and drafter is None:
            raise FieldError(
                "model.drafter",
                f"required by method {self.method} (the head or the draft model's checkpoint)",
            )
        if self.method in ("ngram", "mtp") and drafter is not None:
            raise FieldError("model.drafter", _NO_DRAFTER)
        if self.method != "redrafter" and drafter is not None and drafter.train is not None:
            raise FieldError("model.drafter.train", _TRAIN_REDRAFTER_ONLY)
        if self.method != "redrafter" and self.precision.quantization != "none":
            raise FieldError("precision.quantization", _FP8_REDRAFTER_ONLY)
        for block, method in _METHOD_BLOCKS:
            if getattr(self, _snake(block)) is not None and self.method != method:
                raise FieldError(block, _block_message(block, method))
        if self.method != "redrafter":
            # the PyTorch path has its own image pair; an image the user set is kept as given
            if "builder_image" not in self.engine.model_fields_set:
                self.engine.builder_image = defaults.DEFAULTS.pytorch_builder_image
            if "image" not in self.serving.model_fields_set:
                self.serving.image = defaults.DEFAULTS.pytorch_serving_image
        return self

    def trained_drafter(self) -> DrafterTraining | None:
        """The drafter the operator trains for this spec (None when the spec brings one, or needs none)."""
        return self.model.drafter.train if self.model.drafter is not None else None

    def method_params(self) -> Eagle3 | Mtp | NGram | DraftModel | None:
        """The parameters of a PyTorch-backend method (defaults when its block is left out); None for redrafter."""
        given: dict[str, Eagle3 | Mtp | NGram | DraftModel | None] = {
            "eagle3": self.eagle3 or Eagle3(),
            "mtp": self.mtp or Mtp(),
            "ngram": self.ngram or NGram(),
            "draftModel": self.draft_model or DraftModel(),
        }
        return given.get(self.method)

    @model_validator(mode="after")
    def _draft_len_trained(self) -> ReDrafterDeploymentSpec:
        train = self.trained_drafter()
        if train is not None and self.redrafter.draft_len_per_beam > train.recipe.draft_len:
            raise ValueError(
                "redrafter.draftLenPerBeam must not exceed model.drafter.train.recipe.draftLen (the trained "
                f"draft length): {self.redrafter.draft_len_per_beam} > {train.recipe.draft_len}"
            )
        return self

    @model_validator(mode="after")
    def _grpc_needs_open_triton_ports(self) -> ReDrafterDeploymentSpec:
        if self.serving.auth.api_keys_secret and self.validation.protocol == "grpc":
            raise FieldError("validation.protocol", API_KEYS_GRPC_MESSAGE)
        return self

    def validation_protocol(self) -> Literal["grpc", "openai"]:
        """``validation.protocol``, or when unset: openai with API keys (Triton's ports are the pod's own),
        grpc without."""
        if self.validation.protocol is not None:
            return self.validation.protocol
        return "openai" if self.serving.auth.api_keys_secret else "grpc"


def parse_spec(raw: dict[str, Any]) -> tuple["ReDrafterDeploymentSpec | None", list[str]]:
    """The parsed spec, or None and its validation errors, each naming its field path
    (``spec.engine.maxSeqLen: ...``): one parse gives both."""
    from pydantic import ValidationError

    try:
        return ReDrafterDeploymentSpec.from_wire(raw), []
    except ValidationError as exc:
        out = []
        for err in exc.errors():
            path = ".".join(["spec", *(str(p) for p in err["loc"])])
            msg = err["msg"].removeprefix("Value error, ")
            if isinstance(cause := (err.get("ctx") or {}).get("error"), FieldError):
                path, msg = f"{path}.{cause.path}", cause.message
            out.append(f"{path}: {msg}")
        return None, out


def spec_errors(raw: dict[str, Any]) -> list[str]:
    """Validation errors of a raw spec, each naming its field path (``spec.engine.maxSeqLen: ...``)."""
    return parse_spec(raw)[1]
