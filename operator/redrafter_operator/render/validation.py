"""The pre-promotion validation Job: ``redrafter-operator evaluate validate`` against the two per-variant
Services (``<name>-redrafter`` and ``<name>-base``; ``<name>-redrafter-candidate`` instead of the first
while a promoted ReDrafter engine keeps serving), CPU only.

Image: ``spec.validation.image``, else the operator's own image (passed in by the controller). The
operator image already carries the ``redrafter-operator`` CLI and, with the ``client`` extra,
tritonclient; the Triton serving image would be a multi-GB pull onto a CPU node and has no CLI.

One Job per (resource, ReDrafter key, base key, attempt): deterministic, so a restarted operator
finds it, and a new engine pair is validated by a new Job. Verdicts that are deterministic (exit 1:
Diverged/RequestFailed, 2: InvalidInput) fail the Job at once through a podFailurePolicy; other pod
failures (endpoint not ready yet, eviction, OOM) are retried up to ``backoffLimit``. The verdict is
the container's termination message (:mod:`redrafter_operator.evaluate.outcome`).
"""

from __future__ import annotations

import posixpath
from typing import Any

from engine_jobs.contract import API_KEYS_MOUNT, GRPC_PORT, OPENAI_PORT, TERMINATION_LOG

from .. import __version__
from ..api.spec import ReDrafterDeploymentSpec
from ..evaluate.outcome import DIVERGED, EXIT_CODES, INVALID_INPUT, REQUEST_FAILED
from ..evaluate.stats import default_concurrencies
from . import names, resources, security
from .common import Owner, metadata
from .serving import api_keys_volumes

#: the operator's own image: what the controller runs validation Jobs in unless told otherwise
DEFAULT_OPERATOR_IMAGE = f"ghcr.io/redrafter/redrafter-operator:{__version__}"
CONTAINER = "validate"
COMPONENT = "validation"
PROMPTS_MOUNT = "/etc/redrafter/prompts"
BACKOFF_LIMIT = 2  # retries of non-deterministic failures only (see pod_failure_policy)
FINISHED_JOB_TTL_SECONDS = 86400
READY_TIMEOUT_SECONDS = 300
ANNOTATION_REDRAFTER_KEY = f"{names.DOMAIN}/redrafter-engine-key"
ANNOTATION_BASE_KEY = f"{names.DOMAIN}/base-engine-key"


def validation_job_name(deployment: str, redrafter_key: str, base_key: str, attempt: int = 0) -> str:
    return names.safe_name(
        deployment,
        "validate",
        redrafter_key[:8],
        base_key[:8],
        str(attempt) if attempt else "",
        limit=names.JOB_NAME_MAX,
    )


def service_endpoint(owner: Owner, service: str) -> str:
    """A Service's in-cluster address for the Job's protocol (gRPC, or the OpenAI API's base URL)."""
    if owner.spec.validation_protocol() == "openai":
        return f"http://{service}.{owner.namespace}.svc:{OPENAI_PORT}"
    return f"{service}.{owner.namespace}.svc:{GRPC_PORT}"


def validate_args(spec: ReDrafterDeploymentSpec, redrafter: str, base: str) -> list[str]:
    """The CLI arguments after ``redrafter-operator evaluate validate`` (output lengths fit maxSeqLen)."""
    v, e = spec.validation, spec.engine
    room = max(e.max_seq_len - e.max_input_len, 1)  # output room left by the longest allowed input
    args = [
        "--redrafter",
        redrafter,
        "--base",
        base,
        "--protocol",
        spec.validation_protocol(),
        "--max-tokens",
        str(min(v.max_tokens, room)),
        "--long-max-tokens",
        str(min(v.long_max_tokens, room)),
        "--batch-size",
        str(e.max_batch_size),
        "--single-requests",
        str(v.single_requests),
        "--max-input-len",
        str(e.max_input_len),
        "--max-seq-len",
        str(e.max_seq_len),
        "--max-divergences",
        str(v.max_divergences),
        "--ready-timeout",
        str(READY_TIMEOUT_SECONDS),
        "--termination-log",
        TERMINATION_LOG,
    ]
    if v.prompts_config_map:
        args += ["--prompts", posixpath.join(PROMPTS_MOUNT, v.prompts_key)]
    if v.measure_crossover:
        args += ["--sweep-concurrency", ",".join(map(str, default_concurrencies(e.max_batch_size)))]
    if spec.validation_protocol() == "openai" and spec.serving.auth.api_keys_secret:
        args += ["--api-key-file", API_KEYS_MOUNT]  # the Secret's directory: the client reads its first key
    if spec.method != "redrafter":
        args.append("--no-fixed-length")  # Triton's llmapi model takes no min_tokens
    return args


def pod_failure_policy() -> dict[str, Any]:
    """Verdicts about the engines (or the arguments) fail the Job at once; a retry would repeat them."""
    deterministic = sorted({EXIT_CODES[r] for r in (DIVERGED, REQUEST_FAILED, INVALID_INPUT)})
    return {
        "rules": [
            {
                "action": "FailJob",
                "onExitCodes": {"containerName": CONTAINER, "operator": "In", "values": deterministic},
            },
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        ]
    }


def validation_job(
    owner: Owner, *, redrafter_key: str, base_key: str, operator_image: str, attempt: int = 0, candidate: bool = False
) -> dict[str, Any]:
    """The Job validating the engine pair (``redrafter_key``, ``base_key``) behind the variant Services.

    ``candidate``: the new ReDrafter engine runs on the candidate Deployment (a promoted one keeps
    serving from the primary), so the Job reads it through the candidate Service.
    """
    spec = owner.spec
    v = spec.validation
    labels = names.common_labels(owner.name, COMPONENT)
    redrafter = names.candidate_name(owner.name) if candidate else names.service_name(owner.name, "redrafter")
    args = validate_args(
        spec, service_endpoint(owner, redrafter), service_endpoint(owner, names.service_name(owner.name, "base"))
    )
    tmp_volume, tmp_mount = security.tmp_volume()
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": v.image or operator_image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["redrafter-operator", "evaluate", "validate", *args],
        "resources": resources.merged(resources.VALIDATION, v.resources),
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": security.container_security_context(security.OPERATOR_USER),
        "volumeMounts": [tmp_mount],
    }
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [container],
        "automountServiceAccountToken": False,  # it talks to Triton only, never to the API server
        "enableServiceLinks": False,
        "securityContext": security.pod_security_context(security.OPERATOR_USER),
        "volumes": [tmp_volume],
    }
    if v.prompts_config_map:
        container["volumeMounts"].append({"name": "prompts", "mountPath": PROMPTS_MOUNT, "readOnly": True})
        pod_spec["volumes"].append({"name": "prompts", "configMap": {"name": v.prompts_config_map}})
    if spec.validation_protocol() == "openai" and spec.serving.auth.api_keys_secret:
        # the serving pods' own keys Secret, mounted as they mount it (gRPC needs none: it is not the API)
        volume, mount = api_keys_volumes(owner)
        pod_spec["volumes"].append(volume)
        container["volumeMounts"].append(mount)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata(
            owner,
            validation_job_name(owner.name, redrafter_key, base_key, attempt),
            labels,
            {
                ANNOTATION_REDRAFTER_KEY: redrafter_key,
                ANNOTATION_BASE_KEY: base_key,
                f"{names.DOMAIN}/attempt": str(attempt),
            },
        ),
        "spec": {
            "backoffLimit": BACKOFF_LIMIT,
            "activeDeadlineSeconds": v.active_deadline_seconds,
            "ttlSecondsAfterFinished": FINISHED_JOB_TTL_SECONDS,
            "podFailurePolicy": pod_failure_policy(),
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }
