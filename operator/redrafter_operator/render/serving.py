"""Serving: (resource, variant, engine key, replicas, traffic pool) -> ConfigMap, Deployments, Services.

Pods run ``python -m engine_jobs serve``: it writes the Triton repository from serving.json into a
writable emptyDir (the engine volume is mounted read-only) and runs tritonserver, under mpirun for
TP > 1, plus the OpenAI-compatible front on port ``openai``. Pods carry the label of the traffic pool
they belong to; the stable Service ``<name>`` selects a pool, so switching engines is a Service
selector change, never a pod restart. A canary Deployment runs the ReDrafter engine in the base pool,
so acceptance stays measured while the service runs on base.
A candidate Deployment runs a new ReDrafter engine in no pool while it is validated against base.
"""

from __future__ import annotations

import hashlib
import math
import posixpath
from typing import Any

from engine_jobs import contract
from engine_jobs.contract import ServingConfig, TritonParams, Variant
from engine_jobs.llmapi_config import IN_ENGINE_LIMIT_METHODS

from . import names, resources, security
from .build import speculative_params
from .common import Owner, metadata
from .gpu_job import gpu_resources, node_selector

ANNOTATION_CONFIG_HASH = f"{names.DOMAIN}/serving-config-hash"
REPO_DIR = f"{security.TMP_MOUNT}/redrafter/model_repo"  # inside the writable emptyDir (read-only root fs)
PRESTOP_SLEEP_SECONDS = 10  # endpoints drop the pod before Triton stops accepting requests
EXIT_TIMEOUT_SECONDS = 60  # Triton's --exit-timeout-secs: in-flight requests may finish this long
STARTUP_PERIOD_SECONDS = 10
LIVE_PATH = "/v2/health/live"
FRONT_LIVE_PATH = "/health/live"
PORTS = (
    ("http", contract.HTTP_PORT),
    ("grpc", contract.GRPC_PORT),
    ("metrics", contract.METRICS_PORT),
    ("openai", contract.OPENAI_PORT),
)
#: Triton's own client protocols: unauthenticated, so with API keys they listen only inside the pod
#: (engine_jobs.serve.rank_argv) and no Service, container port or NetworkPolicy names them
TRITON_API_PORTS = ("http", "grpc")


def serving_ports(owner: Owner) -> list[tuple[str, int]]:
    """(name, port) the serving pods expose: all of PORTS, or without Triton's HTTP and gRPC when
    ``spec.serving.auth.apiKeysSecret`` is set (only the OpenAI API, behind the keys, and the metrics)."""
    if owner.spec.serving.auth.api_keys_secret:
        return [(n, p) for n, p in PORTS if n not in TRITON_API_PORTS]
    return list(PORTS)


API_KEYS_VOLUME = "api-keys"


def api_keys_volumes(owner: Owner) -> list[dict[str, Any]]:
    """[volume, mount] of ``spec.serving.auth.apiKeysSecret`` (empty without one): a read-only Secret volume,
    never an env var, so a rotated key reaches the pod without a restart (the front re-reads the files)."""
    secret = owner.spec.serving.auth.api_keys_secret
    if not secret:
        return []
    return [
        {"name": API_KEYS_VOLUME, "secret": {"secretName": secret, "defaultMode": security.SECRET_MODE}},
        {"name": API_KEYS_VOLUME, "mountPath": contract.API_KEYS_MOUNT, "readOnly": True},
    ]


def artifact_dir(key: str) -> str:
    """Where the pod sees its engine artifact (only that one key is mounted)."""
    return posixpath.join(contract.CACHE_MOUNT, key)


def serving_config(owner: Owner, variant: Variant, key: str) -> ServingConfig:
    spec = owner.spec
    t = spec.serving.triton
    redrafter = variant == "redrafter"
    fields: dict[str, Any] = {
        "draft_len_per_beam": spec.redrafter.draft_len_per_beam if redrafter else 0,
        "num_beams": spec.redrafter.num_beams if redrafter else 0,
    }
    fields.update(_pytorch_fields(owner, variant))
    return ServingConfig(
        deployment=owner.name,
        variant=variant,
        engine_key=key,
        artifact_dir=artifact_dir(key),
        tensor_parallel=spec.parallelism.tensor,
        max_batch_size=spec.engine.max_batch_size,
        paged_context_fmha=spec.engine.paged_context_fmha,
        model_name=spec.serving.model_name or owner.name,
        max_input_len=spec.engine.max_input_len,
        max_seq_len=spec.engine.max_seq_len,
        api_keys_dir=contract.API_KEYS_MOUNT if spec.serving.auth.api_keys_secret else None,
        triton=TritonParams(
            batching_strategy=t.batching_strategy,
            max_queue_delay_microseconds=t.max_queue_delay_microseconds,
            kv_cache_free_gpu_mem_fraction=t.kv_cache_free_gpu_mem_fraction,
            enable_chunked_context=t.enable_chunked_context,
            enable_kv_cache_reuse=t.enable_kv_cache_reuse,
            decoupled=True,
        ),
        **fields,
    )


def _pytorch_fields(owner: Owner, variant: Variant) -> dict[str, Any]:
    """The PyTorch path's settings of one pod: its method (on the speculative variant), the in-engine
    concurrency limit once validation measured the crossover (and the draft_len_schedule when its sweep found
    a shorter draft paying; model.yaml writes one of the two) where the method's engine reads them, and the
    LLM's limits."""
    spec = owner.spec
    params = speculative_params(spec)
    if params is None:
        return {}
    speculative = variant == "redrafter"
    limited = speculative and params.method in IN_ENGINE_LIMIT_METHODS
    return {
        "backend": "pytorch",
        "speculative": params if speculative else None,
        "max_concurrency": owner.in_engine_concurrency if limited else None,
        "draft_len_schedule": owner.in_engine_schedule if limited else None,
        "max_num_tokens": spec.engine.max_num_tokens,
        "draft_len_per_beam": params.max_draft_len if speculative else 0,
        "num_beams": 1 if speculative else 0,
    }


def _config_json(owner: Owner, variant: Variant, key: str) -> str:
    return serving_config(owner, variant, key).wire_json()


def serving_configmap(owner: Owner, variant: Variant, key: str, name: str | None = None) -> dict[str, Any]:
    """serving.json of ``key`` (``name``: the candidate's own, so the promoted engine's stays untouched)."""
    labels = {**names.common_labels(owner.name, "serving"), names.LABEL_VARIANT: variant, names.LABEL_ENGINE_KEY: key}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(owner, name or names.serving_config_name(owner.name, variant), labels),
        "data": {contract.SERVING_CONFIG_FILE: _config_json(owner, variant, key)},
    }


def _pod_labels(owner: Owner, variant: Variant, key: str, pool: str, role: str) -> dict[str, str]:
    return {
        **names.common_labels(owner.name, "serving"),
        **names.serving_selector(owner.name, variant),
        names.LABEL_ROLE: role,
        names.LABEL_TRAFFIC: pool,
        names.LABEL_ENGINE_KEY: key,
    }


def _probe(path: str, port: str, period: int, failures: int, timeout: int = 3) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period,
        "timeoutSeconds": timeout,
        "failureThreshold": failures,
    }


def _container(owner: Owner, key: str) -> dict[str, Any]:
    spec = owner.spec
    startup_failures = max(1, math.ceil(spec.serving.startup_timeout_seconds / STARTUP_PERIOD_SECONDS))
    return {
        "name": "triton",
        "image": spec.serving.image,
        "imagePullPolicy": "IfNotPresent",
        "command": [
            "python3",
            "-m",
            "engine_jobs",
            "serve",
            "--config",
            posixpath.join(contract.CONFIG_MOUNT, contract.SERVING_CONFIG_FILE),
        ],
        "env": [
            {"name": "REDRAFTER_MODEL_REPO_DIR", "value": REPO_DIR},
            {"name": "REDRAFTER_EXIT_TIMEOUT_SECS", "value": str(EXIT_TIMEOUT_SECONDS)},
            {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
            {"name": "HF_HUB_OFFLINE", "value": "1"},
        ],
        "ports": [{"name": n, "containerPort": p, "protocol": "TCP"} for n, p in serving_ports(owner)],
        "resources": gpu_resources(spec, spec.serving.resources, resources.SERVING_PER_RANK),
        # Ready = the OpenAI front answers AND Triton with its entry model is ready (the front asks
        # Triton), so a pod joins the Service only when both of its protocols work.
        "startupProbe": _probe(contract.OPENAI_READY_PATH, "openai", STARTUP_PERIOD_SECONDS, startup_failures),
        "readinessProbe": _probe(contract.OPENAI_READY_PATH, "openai", 5, 3),
        # Triton's liveness on its HTTP port; with API keys that port is the pod's own (loopback), so the
        # front's: the container exits when Triton does (engine_jobs.serve.run_together), and a stuck Triton
        # makes the pod unready through the readiness probe
        "livenessProbe": _probe(LIVE_PATH, "http", 10, 6, timeout=5)
        if not spec.serving.auth.api_keys_secret
        else _probe(FRONT_LIVE_PATH, "openai", 10, 6, timeout=5),
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRESTOP_SLEEP_SECONDS)]}}},
        "volumeMounts": [
            {
                "name": "engine",
                "mountPath": artifact_dir(key),
                "readOnly": True,
                "subPath": posixpath.join(spec.engine.cache.sub_path, key),
            },
            {"name": "serving-config", "mountPath": contract.CONFIG_MOUNT, "readOnly": True},
            {"name": "dshm", "mountPath": "/dev/shm"},
            security.tmp_volume()[1],
            *api_keys_volumes(owner)[1:],
        ],
        "terminationMessagePath": contract.TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": security.container_security_context(security.IMAGE_USER),
    }


def _deployment(
    owner: Owner,
    name: str,
    variant: Variant,
    key: str,
    replicas: int,
    pool: str,
    role: str,
    config_name: str | None = None,
) -> dict[str, Any]:
    if replicas < 0:
        raise ValueError("replicas must be >= 0")
    spec = owner.spec
    labels = _pod_labels(owner, variant, key, pool, role)
    selector = {**names.serving_selector(owner.name, variant), names.LABEL_ROLE: role}
    config_hash = hashlib.sha256(_config_json(owner, variant, key).encode()).hexdigest()[:16]
    if spec.serving.rollout.strategy == "Recreate":
        strategy: dict[str, Any] = {"type": "Recreate"}
    else:
        strategy = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    pod_annotations = {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(contract.METRICS_PORT),
        "prometheus.io/path": "/metrics",
        ANNOTATION_CONFIG_HASH: config_hash,
    }
    pod_spec: dict[str, Any] = {
        "containers": [_container(owner, key)],
        "terminationGracePeriodSeconds": PRESTOP_SLEEP_SECONDS + EXIT_TIMEOUT_SECONDS + 15,
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,  # Triton serves; it never calls the API server
        "securityContext": security.pod_security_context(security.IMAGE_USER),
        "volumes": [
            {"name": "engine", "persistentVolumeClaim": {"claimName": spec.engine.cache.claim_name, "readOnly": True}},
            {
                "name": "serving-config",
                "configMap": {"name": config_name or names.serving_config_name(owner.name, variant)},
            },
            {"name": "dshm", "emptyDir": {"medium": "Memory"}},
            security.tmp_volume()[0],
            *api_keys_volumes(owner)[:1],
        ],
    }
    selector_nodes = node_selector(spec, spec.serving.node_selector)
    if selector_nodes:
        pod_spec["nodeSelector"] = selector_nodes
    if spec.serving.tolerations:
        pod_spec["tolerations"] = list(spec.serving.tolerations)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(owner, name, labels),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector},
            "strategy": strategy,
            "revisionHistoryLimit": 3,
            # engine loading may take the whole startup budget; report a stuck rollout after it
            "progressDeadlineSeconds": spec.serving.startup_timeout_seconds + 600,
            "template": {"metadata": {"labels": labels, "annotations": pod_annotations}, "spec": pod_spec},
        },
    }


def serving_deployment(
    owner: Owner, variant: Variant, key: str, replicas: int, pool: Variant | None = None
) -> dict[str, Any]:
    """The Deployment of one variant; its pods join ``pool`` (default: their own variant)."""
    return _deployment(
        owner, names.serving_deployment_name(owner.name, variant), variant, key, replicas, pool or variant, "primary"
    )


def canary_deployment(owner: Owner, key: str, replicas: int) -> dict[str, Any]:
    """ReDrafter engine pods in the base traffic pool: they share base traffic and keep acceptance measured."""
    return _deployment(owner, names.canary_deployment_name(owner.name), "redrafter", key, replicas, "base", "canary")


def candidate_deployment(owner: Owner, key: str, replicas: int) -> dict[str, Any]:
    """A new ReDrafter engine's pods while it is validated: in no traffic pool, so the promoted engine
    keeps serving until the validation passes (then the primary Deployment rolls to ``key``)."""
    return _deployment(
        owner,
        names.candidate_name(owner.name),
        "redrafter",
        key,
        replicas,
        names.NO_POOL,
        names.ROLE_CANDIDATE,
        names.candidate_config_name(owner.name),
    )


def candidate_service(owner: Owner) -> dict[str, Any]:
    """``<name>-redrafter-candidate``: the validation Job's ReDrafter endpoint while a candidate runs."""
    selector = {**names.serving_selector(owner.name, "redrafter"), names.LABEL_ROLE: names.ROLE_CANDIDATE}
    return _service(
        owner,
        names.candidate_name(owner.name),
        selector,
        {names.LABEL_VARIANT: "redrafter", names.LABEL_ROLE: names.ROLE_CANDIDATE},
    )


def _service(owner: Owner, name: str, selector: dict[str, str], extra_labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(owner, name, {**names.common_labels(owner.name, "serving"), **extra_labels}),
        "spec": {
            "type": "ClusterIP",
            "selector": selector,
            "ports": [{"name": n, "port": p, "targetPort": n, "protocol": "TCP"} for n, p in serving_ports(owner)],
        },
    }


def stable_service(owner: Owner, pool: Variant) -> dict[str, Any]:
    """``<name>``: what clients call; selects every pod of the active traffic pool."""
    return _service(
        owner, names.service_name(owner.name), names.traffic_selector(owner.name, pool), {names.LABEL_TRAFFIC: pool}
    )


def variant_service(owner: Owner, variant: Variant) -> dict[str, Any]:
    """``<name>-redrafter`` / ``<name>-base``: one variant's pods (canary included), for tests and metrics."""
    return _service(
        owner,
        names.service_name(owner.name, variant),
        names.serving_selector(owner.name, variant),
        {names.LABEL_VARIANT: variant},
    )


def services(owner: Owner, pool: Variant) -> list[dict[str, Any]]:
    return [stable_service(owner, pool), *(variant_service(owner, v) for v in contract.VARIANTS)]


# ---- NetworkPolicies (spec.serving.networkPolicy) ----------------------------------------------
JOB_COMPONENTS = ("engine-build", "validation")  # the operator's Job pods: nothing connects to them


def _deployment_pods(owner: Owner, components: list[str]) -> dict[str, Any]:
    return {
        "matchLabels": {names.LABEL_DEPLOYMENT: names.label_value(owner.name)},
        "matchExpressions": [{"key": names.LABEL_COMPONENT, "operator": "In", "values": components}],
    }


def _ports(*ports: int) -> list[dict[str, Any]]:
    return [{"protocol": "TCP", "port": p} for p in ports]


def network_policies(owner: Owner, operator_namespace: str | None = None) -> list[dict[str, Any]]:
    """The serving pods' ingress allow-list and the Job pods' deny-all, when the spec enables them.

    Peers of the serving ports: ``ingressFrom`` (default: this namespace's pods) and, always, this
    resource's validation pods (they call both variants even when ``ingressFrom`` names only clients).
    The metrics ports (Triton's, and the OpenAI front's port, whose /metrics holds its queue) also admit
    the operator's namespace (``operator_namespace``; the Pods metrics source scrapes each pod from there)
    and ``metricsFrom``. Egress stays open: builds download from
    the Hub or S3, and the serving pods need none but a cluster's DNS policy is not ours to decide.
    """
    np = owner.spec.serving.network_policy
    if not np.enabled:
        return []
    all_ports = [p for _, p in serving_ports(owner)]
    validation = {"podSelector": _deployment_pods(owner, ["validation"])}
    clients = [dict(p) for p in np.ingress_from] or [{"podSelector": {}}]
    scrapers = [dict(p) for p in np.metrics_from]
    if operator_namespace and operator_namespace != owner.namespace:
        scrapers.insert(0, {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": operator_namespace}}})
    ingress = [{"from": [*clients, validation], "ports": _ports(*all_ports)}]
    if scrapers:
        ingress.append({"from": scrapers, "ports": _ports(contract.METRICS_PORT, contract.OPENAI_PORT)})
    serving_labels = names.common_labels(owner.name, "serving")
    return [
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": metadata(owner, names.safe_name(owner.name, "serving"), serving_labels),
            "spec": {
                "podSelector": _deployment_pods(owner, ["serving"]),
                "policyTypes": ["Ingress"],
                "ingress": ingress,
            },
        },
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": metadata(owner, names.safe_name(owner.name, "jobs"), names.common_labels(owner.name, "jobs")),
            "spec": {"podSelector": _deployment_pods(owner, list(JOB_COMPONENTS)), "policyTypes": ["Ingress"]},
        },
    ]
