"""The contract between the operator and the code that runs in its pods.

The operator renders a :class:`BuildSpec` (build Jobs) or a :class:`ServingConfig` (serving pods) as
JSON into a ConfigMap; the code in ``engine_jobs`` reads it. Both sides import this one module, so a
field, a path or a metric name has exactly one spelling. It must stay importable with only pydantic
installed (it runs inside the builder and Triton images).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

CONTRACT_VERSION = 1

# ---- where things live -------------------------------------------------------------------------
#: mount path of the engine cache volume in build Jobs and serving pods
CACHE_MOUNT = "/cache"
#: mount path of the ConfigMap holding build.json / serving.json
CONFIG_MOUNT = "/etc/redrafter"
BUILD_SPEC_FILE = "build.json"
SERVING_CONFIG_FILE = "serving.json"
#: where credentials Secrets are mounted (one sub-directory per Secret name)
SECRETS_MOUNT = "/var/run/secrets/redrafter"
#: where pvc:// sources are mounted in build Jobs (one sub-directory per claim)
SOURCES_MOUNT = "/sources"
TERMINATION_LOG = "/dev/termination-log"

# Layout of one published engine artifact: <cache>/<key>/...
MANIFEST_FILE = "manifest.json"  # written last: its presence means "complete"
ENGINE_DIR = "engine"  # rank<N>.engine + config.json from trtllm-build
TOKENIZER_DIR = "tokenizer"
CHECKPOINT_DIR = "checkpoint"  # PyTorch path: the base checkpoint as fetched and verified
DRAFT_DIR = "draft"  # PyTorch path: the EAGLE-3 head or draft model checkpoint
MODEL_REPO_DIR = "model_repo"  # ready-to-serve Triton repository (defaults)
LOCK_FILE = ".lock"  # <cache>/<key>.lock, owner + heartbeat

# ---- Triton model repository -------------------------------------------------------------------
#: the model clients call; the acceptance-metering BLS model (same interface as TRT-LLM's ensemble)
ENTRY_MODEL = "ensemble"
PREPROCESSING_MODEL = "preprocessing"
ENGINE_MODEL = "tensorrt_llm"
#: entry-model output sent with the perf outputs: how many tokens the engine generated
OUTPUT_TOKEN_COUNT = "num_output_tokens"
POSTPROCESSING_MODEL = "postprocessing"

HTTP_PORT = 8000
GRPC_PORT = 8001
METRICS_PORT = 8002
#: the OpenAI-compatible front (engine_jobs.openai_api) next to Triton in every serving pod; what gateways
#: (InferencePool targetPorts) route to
OPENAI_PORT = 9000
OPENAI_READY_PATH = "/health/ready"
#: response header carrying one request's speculative acceptance rate (accepted / drafted tokens)
ACCEPTANCE_HEADER = "x-redrafter-acceptance-rate"
#: where the serving pod mounts spec.serving.auth.apiKeysSecret (and the validation Job the same Secret)
API_KEYS_MOUNT = "/var/run/secrets/redrafter-api-keys"
#: the front's own metrics (GET /metrics on the openai port): its admission of generations
METRIC_FRONT_IN_FLIGHT = "redrafter_openai_requests_in_flight"
METRIC_FRONT_QUEUED = "redrafter_openai_requests_queued"
METRIC_FRONT_MAX_IN_FLIGHT = "redrafter_openai_max_in_flight"
METRIC_FRONT_MAX_QUEUED = "redrafter_openai_max_queued"
METRIC_FRONT_REJECTED = "redrafter_openai_requests_rejected_total"  # label reason=queue_full|queue_timeout

# ---- serving metrics (exported by the metering model through Triton's custom-metrics API) ------
METRIC_REQUESTS = "redrafter_requests_total"
METRIC_OUTPUT_TOKENS = "redrafter_output_tokens_total"
METRIC_DRAFT_TOKENS = "redrafter_draft_tokens_total"
METRIC_ACCEPTED_DRAFT_TOKENS = "redrafter_accepted_draft_tokens_total"
METRIC_ACCEPTANCE_HISTOGRAM = "redrafter_request_acceptance_rate"
#: generation steps of the engine (tokens per step = output tokens / steps)
METRIC_STEPS = "redrafter_engine_steps_total"
METRIC_LABEL_MODEL = "model"
METRIC_LABEL_VARIANT = "variant"
# Load, exported by Triton's TensorRT-LLM backend itself.
METRIC_TRTLLM_REQUESTS = "nv_trt_llm_request_metrics"  # label request_type=active|waiting|scheduled|max|...
METRIC_TRTLLM_KV_BLOCKS = "nv_trt_llm_kv_cache_block_metrics"
METRIC_QUEUE_DURATION = "nv_inference_queue_duration_us"
# Triton's per-model request counters (docs/user_guide/metrics.md, Triton 25.09): cumulative duration of
# finished requests and their count, exported for every model without extra flags.
METRIC_REQUEST_DURATION = "nv_inference_request_duration_us"
METRIC_REQUEST_SUCCESS = "nv_inference_request_success"
#: histogram of the time to a decoupled model's first response (Triton >= 24.11 with histogram_latencies=true,
#: which the serving pods set; core r25.09 src/metrics.cc)
METRIC_FIRST_RESPONSE_HISTOGRAM = "nv_inference_first_response_histogram_ms"
#: labels of Triton's own nv_* metrics; the TensorRT-LLM backend's add METRIC_TRTLLM_LABEL_TYPE
TRITON_METRIC_LABELS = ("model", "version")
METRIC_TRTLLM_LABEL_TYPE = "request_type"

Variant = Literal["redrafter", "base"]
VARIANTS: tuple[Variant, ...] = ("redrafter", "base")
#: TensorRT-LLM's two execution paths: ReDrafter's engines (trtllm-build, the C++ Triton backend) and the
#: PyTorch backend (checkpoints served by Triton's llmapi model with a speculative_config)
Backend = Literal["tensorrt", "pytorch"]
#: the PyTorch backend's methods, as the API names them
PyTorchMethod = Literal["eagle3", "mtp", "ngram", "draftModel"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    #: fields a ReDrafter (TensorRT) spec leaves out of its JSON
    pytorch_only: ClassVar[frozenset[str]] = frozenset()

    #: fields left out of the JSON while unset, so documents rendered before they existed read the same
    omit_unset: ClassVar[frozenset[str]] = frozenset()

    def wire_json(self) -> str:
        """The JSON a Job or pod reads; a ReDrafter one has no PyTorch-path fields."""
        exclude = set(self.pytorch_only) if getattr(self, "backend", None) == "tensorrt" else set()
        exclude |= {f for f in self.omit_unset if getattr(self, f) is None}
        return self.model_dump_json(indent=2, exclude=exclude or None)


class SpeculativeParams(_Strict):
    """A PyTorch-backend method and its parameters (engine_jobs/llmapi_config.py writes speculative_config)."""

    method: PyTorchMethod
    max_draft_len: int = Field(ge=1, description="tokens drafted per step (mtp: num_nextn_predict_layers)")
    max_matching_ngram_size: int | None = Field(default=None, ge=1, description="ngram only")


class SourceRef(_Strict):
    """One model source as the build Job sees it (already validated by the operator)."""

    uri: str = Field(description="hf://org/name, pvc://claim/path or s3://bucket/prefix")
    revision: str | None = Field(default=None, description="hf:// revision (branch, tag or commit)")
    credentials_dir: str | None = Field(
        default=None, description="directory where the credentials Secret is mounted, if any"
    )


class RedrafterParams(_Strict):
    num_beams: int
    draft_len_per_beam: int
    greedy_search: bool = True


class EngineLimits(_Strict):
    max_batch_size: int
    max_input_len: int
    max_seq_len: int
    max_num_tokens: int
    paged_context_fmha: bool = True


class BuildSpec(_Strict):
    """Everything one build Job needs to produce ``<cache>/<key>/`` for one variant."""

    pytorch_only: ClassVar[frozenset[str]] = frozenset({"backend", "speculative"})

    contract_version: int = CONTRACT_VERSION
    variant: Variant
    key: str = Field(description="content hash of every build input (the cache directory name)")
    inputs: dict[str, Any] = Field(description="the exact inputs that were hashed into key (recorded in the manifest)")
    base: SourceRef
    drafter: SourceRef | None = None  # required for the redrafter variant
    tokenizer: SourceRef
    architecture: Literal["auto", "llama", "qwen"] = "auto"
    dtype: Literal["float16", "bfloat16"]
    quantization: Literal["none", "fp8"] = "none"
    tensor_parallel: int = 1
    redrafter: RedrafterParams | None = None  # required for the redrafter variant
    limits: EngineLimits
    cache_dir: str = CACHE_MOUNT
    backend: Backend = "tensorrt"
    speculative: SpeculativeParams | None = None  # the PyTorch path's redrafter variant


# ---- drafter training (the drafter for the ``redrafter`` variant, trained from the base model) ----
#: where trained drafters live inside the cache claim's sub-path: <cache>/drafters/<drafter-key>/
DRAFTERS_DIR = "drafters"
TRAIN_SPEC_FILE = "train.json"
#: what a trained drafter directory holds, besides MANIFEST_FILE (written last)
DRAFTER_CONFIG_FILE = "config.json"  # what convert_checkpoint.py --drafter_model_dir reads
DRAFTER_WEIGHTS_FILE = "model.safetensors"
DRAFTER_CURVES_FILE = "curves.json"  # the training curve: loss per step, teacher-forced figures over training
DRAFTER_EVALUATION_FILE = "evaluation.json"  # held-out acceptance against its baselines, top-1 per position
#: config.json key naming the recurrence a head was trained with; this operator's trainer writes ENGINE_RECURRENCE
RECURRENCE_KEY = "recurrence"
#: the engine's: s_1 = W e_1, s_k = W e_k + U s_(k-1) + b (TensorRT-LLM ``Drafter.rnn_embed``)
ENGINE_RECURRENCE = "tensorrt_llm"
#: the model_type Apple's ``recurrent_drafting.configuration_drafter.DrafterConfig`` saves: its trainer computes
#: s_k = silu(W e_k + U s_(k-1) + b) from s_0 = 0 (``recurrent_drafting/train/model.py``)
APPLE_MODEL_TYPE = "recurrent_drafting_drafter"
#: the training pod serves its progress (TrainingProgress as JSON) here; the operator reads it
TRAINING_PROGRESS_PORT = 8080
TRAINING_PROGRESS_PATH = "/progress"


class DrafterRecipe(_Strict):
    """The ReDrafter training recipe (arXiv 2403.09919, self-distillation); every field changes the result."""

    draft_len: int = Field(default=5, ge=1, le=16, description="tokens drafted after the guaranteed one")
    rnn: bool = True
    layers: int = Field(default=2, ge=1, le=8, description="residual blocks of the head (num_draft_layers)")
    exit_dim: int | None = Field(default=None, ge=8, description="None: 2 x the base's hidden_size")
    epochs: int = Field(default=2, ge=1, le=100)
    learning_rate: float = Field(default=1e-3, gt=0, le=1)
    batch_size: int = Field(default=8, ge=1, le=4096)
    max_steps: int | None = Field(default=None, ge=1, description="stop after this many optimizer steps")
    response_len: int = Field(default=256, ge=8, le=8192, description="tokens the base generates per prompt")
    held_out_fraction: float = Field(default=0.05, ge=0, lt=1)
    eval_beams: int = Field(default=5, ge=1, le=16)
    seed: int = 0


class TrainSpec(_Strict):
    """Everything one training Job needs to produce ``<cache>/drafters/<key>/``."""

    contract_version: int = CONTRACT_VERSION
    key: str = Field(description="content hash of every training input (the drafter directory name)")
    inputs: dict[str, Any] = Field(description="the exact inputs that were hashed into key (recorded in the manifest)")
    base: SourceRef
    dataset: SourceRef
    column: str = Field(default="text", description="the prompt field of each JSONL record or dataset row")
    samples: int = Field(ge=1, description="prompts used (the first N of the dataset)")
    recipe: DrafterRecipe = DrafterRecipe()
    gpus: int = Field(default=1, ge=0, description="data-parallel ranks (torchrun) when more than 1")
    cache_dir: str = CACHE_MOUNT


class TrainingProgress(BaseModel):
    """What a running training pod serves at TRAINING_PROGRESS_PATH (the operator copies it into
    ``status.drafter``)."""

    model_config = ConfigDict(extra="ignore", frozen=True, alias_generator=to_camel, populate_by_name=True)

    phase: Literal["fetching", "distilling", "training", "evaluating", "publishing"] = "fetching"
    step: int = Field(default=0, ge=0)
    total_steps: int = Field(default=0, ge=0)
    loss: float | None = None


class TrainingResult(BaseModel):
    """What a successful training reports on the second line of its termination message, from its manifest."""

    model_config = ConfigDict(extra="ignore", frozen=True, alias_generator=to_camel, populate_by_name=True)

    steps: int = Field(ge=0)
    loss: float | None = None
    held_out_acceptance: float | None = Field(default=None, description="accepted / drafted tokens, held out")
    untrained_acceptance: float | None = Field(default=None, description="the same, for an untrained head")
    prompt_lookup_acceptance: float | None = Field(default=None, description="the same, for n-gram copying")
    held_out_top1: float | None = Field(default=None, description="teacher-forced top-1 at draft position 1")
    train_top1: float | None = Field(default=None, description="the same on training sequences")
    tokens_per_step: float | None = None
    size_bytes: int = Field(default=0, ge=0)
    trained_at: str | None = None

    def message(self, first_line: str) -> str:
        return f"{first_line}\n{self.model_dump_json(by_alias=True)}"

    @classmethod
    def from_message(cls, message: str) -> TrainingResult | None:
        lines = message.strip().splitlines()
        if len(lines) < 2 or not lines[0].startswith("OK:"):
            return None
        try:
            return cls.model_validate_json(lines[1])
        except ValueError:
            return None


class TritonParams(_Strict):
    #: in-flight batching only: the TensorRT-LLM 1.0 executor does not run static batching ("v1")
    batching_strategy: Literal["inflight_fused_batching"] = "inflight_fused_batching"
    max_queue_delay_microseconds: int = 0
    kv_cache_free_gpu_mem_fraction: float = 0.9
    enable_chunked_context: bool = True
    enable_kv_cache_reuse: bool = True
    decoupled: bool = True


class ServingConfig(_Strict):
    """What a serving pod's launcher needs to assemble its model repository and start Triton."""

    pytorch_only: ClassVar[frozenset[str]] = frozenset(
        {"backend", "speculative", "max_concurrency", "draft_len_schedule", "max_num_tokens"}
    )
    omit_unset: ClassVar[frozenset[str]] = frozenset({"draft_len_schedule"})

    contract_version: int = CONTRACT_VERSION
    deployment: str = Field(description="name of the ReDrafterDeployment (metric label `model`)")
    variant: Variant
    engine_key: str
    artifact_dir: str = Field(description="<cache>/<key>, mounted read-only")
    tensor_parallel: int = 1
    max_batch_size: int
    paged_context_fmha: bool = True
    draft_len_per_beam: int = 0  # 0 for the base variant
    num_beams: int = 0
    triton: TritonParams = TritonParams()
    model_name: str | None = Field(default=None, description="OpenAI model id; None: the deployment name")
    max_input_len: int = Field(default=2048, description="the engine's max prompt tokens (OpenAI front checks)")
    max_seq_len: int = Field(default=4096, description="the engine's max prompt + output tokens")
    api_keys_dir: str | None = Field(
        default=None, description="where the API keys Secret is mounted (a path, never a key); None: no keys"
    )
    backend: Backend = "tensorrt"
    speculative: SpeculativeParams | None = None  # the PyTorch path's redrafter variant
    max_concurrency: int | None = Field(
        default=None,
        ge=1,
        description="PyTorch path: draft only while at most this many requests are batched (the measured "
        "crossover); None: always draft",
    )
    draft_len_schedule: dict[int, int] | None = Field(
        default=None,
        description="PyTorch path: {batch size: draft length} from the measured sweep, keys read as the pinned "
        "TensorRT-LLM reads them (engine_jobs/llmapi_backend.py); replaces max_concurrency when set",
    )
    max_num_tokens: int | None = Field(default=None, description="PyTorch path: tokens per engine iteration")

    @property
    def served_model_name(self) -> str:
        return self.model_name or self.deployment


class BuildResult(BaseModel):
    """What a successful build reports on the second line of its termination message (the operator puts it
    into ``status.engines.<variant>``): the artifact's size and when it was built, from its manifest."""

    model_config = ConfigDict(extra="ignore", frozen=True, alias_generator=to_camel, populate_by_name=True)

    size_bytes: int = Field(ge=0)
    built_at: str | None = None

    def message(self, first_line: str) -> str:
        return f"{first_line}\n{self.model_dump_json(by_alias=True)}"

    @classmethod
    def from_message(cls, message: str) -> BuildResult | None:
        """The result in an ``OK: ...`` termination message, or None (older builders, failures)."""
        lines = message.strip().splitlines()
        if len(lines) < 2 or not lines[0].startswith("OK:"):
            return None
        try:
            return cls.model_validate_json(lines[1])
        except ValueError:
            return None
