"""Operator-wide defaults for fields a resource may leave unset (set at install time by the Helm chart).

The CRD gives these fields no server-side default on purpose: an unset image or cache claim means "the
operator's default", which platform teams choose once per installation (chart values -> environment).
The resolved value is what the resource's spec holds in memory, so engine keys include the real builder
image. Read once at import: the operator's environment does not change while it runs.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Mapping

from .cron import schedule_errors
from .types import DURATION_PATTERN

DEFAULT_BUILDER_IMAGE = "ghcr.io/redrafter/engine-builder:0.1.0-trtllm1.2.1"
DEFAULT_SERVING_IMAGE = "ghcr.io/redrafter/triton-runtime:0.1.0-26.07-trtllm-python-py3"
#: the PyTorch-backend methods (eagle3, mtp, ngram, draftModel) run on the same pair as ReDrafter (one
#: TensorRT-LLM release has both paths); the separate setting stays so an installation may still split them
DEFAULT_PYTORCH_BUILDER_IMAGE = DEFAULT_BUILDER_IMAGE
DEFAULT_PYTORCH_SERVING_IMAGE = DEFAULT_SERVING_IMAGE
DEFAULT_CACHE_CLAIM = "engine-cache"
DEFAULT_RETENTION_SCHEDULE = "30 3 * * *"

IMAGE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]*$"
DNS1123_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"

ENV_BUILDER_IMAGE = "REDRAFTER_DEFAULT_BUILDER_IMAGE"
ENV_SERVING_IMAGE = "REDRAFTER_DEFAULT_SERVING_IMAGE"
ENV_PYTORCH_BUILDER_IMAGE = "REDRAFTER_DEFAULT_PYTORCH_BUILDER_IMAGE"
ENV_PYTORCH_SERVING_IMAGE = "REDRAFTER_DEFAULT_PYTORCH_SERVING_IMAGE"
ENV_CACHE_CLAIM = "REDRAFTER_DEFAULT_CACHE_CLAIM"
ENV_RETENTION_KEEP = "REDRAFTER_DEFAULT_CACHE_RETENTION_KEEP"
ENV_RETENTION_MAX_AGE = "REDRAFTER_DEFAULT_CACHE_RETENTION_MAX_AGE"
ENV_RETENTION_SCHEDULE = "REDRAFTER_DEFAULT_CACHE_RETENTION_SCHEDULE"


@dataclass(frozen=True)
class OperatorDefaults:
    builder_image: str = DEFAULT_BUILDER_IMAGE
    serving_image: str = DEFAULT_SERVING_IMAGE
    pytorch_builder_image: str = DEFAULT_PYTORCH_BUILDER_IMAGE
    pytorch_serving_image: str = DEFAULT_PYTORCH_SERVING_IMAGE
    cache_claim: str = DEFAULT_CACHE_CLAIM
    cache_retention_keep: int | None = None  # None and no max age: never collect (deleting is opt-in)
    cache_retention_max_age: str | None = None
    cache_retention_schedule: str = DEFAULT_RETENTION_SCHEDULE

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> "OperatorDefaults":
        """Defaults from the environment; a malformed value is a startup error naming the variable."""
        values: dict[str, Any] = {}  # OperatorDefaults keyword arguments (str or int by field)
        for attr, var, pattern in (
            ("builder_image", ENV_BUILDER_IMAGE, IMAGE_PATTERN),
            ("serving_image", ENV_SERVING_IMAGE, IMAGE_PATTERN),
            ("pytorch_builder_image", ENV_PYTORCH_BUILDER_IMAGE, IMAGE_PATTERN),
            ("pytorch_serving_image", ENV_PYTORCH_SERVING_IMAGE, IMAGE_PATTERN),
            ("cache_claim", ENV_CACHE_CLAIM, DNS1123_LABEL_PATTERN),
            ("cache_retention_keep", ENV_RETENTION_KEEP, r"^\d{1,3}$"),
            ("cache_retention_max_age", ENV_RETENTION_MAX_AGE, DURATION_PATTERN),
            ("cache_retention_schedule", ENV_RETENTION_SCHEDULE, None),
        ):
            value = env.get(var, "").strip()
            if not value:
                continue
            if pattern is None:  # a CronJob schedule: the API server's own check (api/cron.py)
                if errors := schedule_errors(value) or ([] if len(value) <= 100 else ["longer than 100 characters"]):
                    raise ValueError(f"{var}={value!r} is not a schedule Kubernetes CronJobs take: {'; '.join(errors)}")
            elif not re.fullmatch(pattern, value) or len(value) > 253:
                raise ValueError(f"{var}={value!r} is not valid (expected {pattern})")
            values[attr] = int(value) if attr == "cache_retention_keep" else value
        return cls(**values)


DEFAULTS = OperatorDefaults.from_env()
