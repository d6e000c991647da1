"""Deterministic, DNS-1123-safe names and the label scheme of every child object.

Names are a pure function of (resource name, role), so a restarted operator finds what it created.
Long names keep a readable prefix and end in a hash of the full name, within Kubernetes' limits.
"""

from __future__ import annotations

import hashlib
import re

from engine_jobs.contract import Variant

from .. import __version__

DNS1035_MAX = 63  # Service names; also label values
JOB_NAME_MAX = 63  # a Job's name becomes the job-name label of its Pods

DOMAIN = "redrafter.dev"
LABEL_DEPLOYMENT = f"{DOMAIN}/deployment"  # name of the owning ReDrafterDeployment
LABEL_VARIANT = f"{DOMAIN}/variant"  # engine inside the pod: redrafter | base
LABEL_TRAFFIC = f"{DOMAIN}/traffic"  # pool the stable Service selects: redrafter | base
LABEL_ENGINE_KEY = f"{DOMAIN}/engine-key"
LABEL_ROLE = f"{DOMAIN}/role"  # primary | canary | candidate: keeps the redrafter Deployments' selectors apart
ROLE_CANDIDATE = "candidate"  # a new ReDrafter engine under validation: in no traffic pool, never scraped by the policy
NO_POOL = "none"  # LABEL_TRAFFIC of candidate pods: no Service selecting a pool selects them
LABEL_COMPONENT = "app.kubernetes.io/component"  # engine-build | drafter-training | serving | ...
ANNOTATION_RETRY_BUILD = f"{DOMAIN}/retry-build"
MANAGED_BY = "redrafter-operator"


def safe_name(*parts: str, limit: int = DNS1035_MAX) -> str:
    """Join parts into a DNS-1123 label; over ``limit``, cut and append an 8-char hash of the whole."""
    raw = "-".join(p for p in parts if p)
    name = re.sub(r"[^a-z0-9-]+", "-", raw.lower()).strip("-")
    if len(name) <= limit and name == raw:
        return name
    digest = hashlib.sha256(raw.encode()).hexdigest()[:8]
    head = name[: limit - len(digest) - 1].rstrip("-")
    return f"{head}-{digest}" if head else digest


_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")


def label_value(value: str) -> str:
    """A label value as it is when already valid (<= 63 chars, [-A-Za-z0-9_.]), else a safe_name of it."""
    if len(value) <= 63 and _LABEL_VALUE.fullmatch(value):
        return value
    return safe_name(value, limit=63)


def service_name(deployment: str, variant: Variant | None = None) -> str:
    """``<name>`` selects the active pool; ``<name>-redrafter`` / ``<name>-base`` one variant each."""
    return safe_name(deployment, variant or "")


def serving_deployment_name(deployment: str, variant: Variant) -> str:
    return safe_name(deployment, variant)


def canary_deployment_name(deployment: str) -> str:
    return safe_name(deployment, "redrafter-canary")


def candidate_name(deployment: str) -> str:
    """Deployment and Service of a new ReDrafter engine under validation (the promoted one keeps serving)."""
    return safe_name(deployment, "redrafter-candidate")


def candidate_config_name(deployment: str) -> str:
    return safe_name(deployment, "redrafter-candidate", "serving")


def serving_config_name(deployment: str, variant: Variant) -> str:
    return safe_name(deployment, variant, "serving")


def build_job_name(deployment: str, variant: Variant, key: str, attempt: int = 0) -> str:
    """One Job per (resource, variant, key, attempt): a retry is a new Job, never a mutated one."""
    return safe_name(deployment, "build", variant, key[:10], str(attempt) if attempt else "", limit=JOB_NAME_MAX)


def build_config_name(deployment: str, variant: Variant, key: str) -> str:
    return safe_name(deployment, "build", variant, key[:10])


def training_job_name(deployment: str, key: str, attempt: int = 0) -> str:
    """One Job per (resource, drafter key, attempt), like the builds."""
    return safe_name(deployment, "train", key[:10], str(attempt) if attempt else "", limit=JOB_NAME_MAX)


def training_config_name(deployment: str, key: str) -> str:
    return safe_name(deployment, "train", key[:10])


def common_labels(deployment: str, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "redrafter",
        "app.kubernetes.io/instance": label_value(deployment),
        LABEL_COMPONENT: component,
        "app.kubernetes.io/managed-by": MANAGED_BY,
        "app.kubernetes.io/version": label_value(__version__),
        LABEL_DEPLOYMENT: label_value(deployment),
    }


def serving_selector(deployment: str, variant: Variant) -> dict[str, str]:
    """Selects the pods of one variant's Deployment (immutable once created)."""
    return {LABEL_DEPLOYMENT: label_value(deployment), LABEL_COMPONENT: "serving", LABEL_VARIANT: variant}


def traffic_selector(deployment: str, pool: Variant) -> dict[str, str]:
    """What the stable Service selects: every pod in the traffic pool (incl. a canary, see policy)."""
    return {LABEL_DEPLOYMENT: label_value(deployment), LABEL_COMPONENT: "serving", LABEL_TRAFFIC: pool}


def selector_string(selector: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
