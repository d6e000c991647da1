"""Everything the checks need, read once from the API into a frozen ``ClusterFacts``.

Reads are narrow on purpose: the named PVCs and Secrets are fetched one by one (get, not list), and of a
Secret only the data key names are kept; its values never leave this module's local variables. A 403 or
404 on one read is a fact (``unreadable`` / absent), not an error: the check that needs it says so.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any, Mapping

import aiohttp
from kubernetes_asyncio import client as k8s_client

from ..api import GROUP, PLURAL, VERSION
from ..api.spec import ReDrafterDeploymentSpec, parse_spec
from ..render import rbac
from ..render.build import named_sources, source_claims
from ..render.placement import Node

# The chart's Deployment carries these whatever nameOverride says (templates/_helpers.tpl, labels);
# the operator's own children never say part-of=redrafter.
OPERATOR_SELECTOR = "app.kubernetes.io/part-of=redrafter,app.kubernetes.io/component=operator"
REQUEST_TIMEOUT = 15
# NVIDIA's DCGM exporter: as the GPU Operator deploys it (DaemonSet nvidia-dcgm-exporter, its pods labelled
# app=nvidia-dcgm-exporter), and as its own Helm chart does (app.kubernetes.io/name=dcgm-exporter)
DCGM_SELECTORS = ("app=nvidia-dcgm-exporter", "app.kubernetes.io/name=dcgm-exporter")
METRICS_PORT_NAME = "metrics"  # the chart's metrics Service port (templates/service.yaml)


class ClusterUnreachable(Exception):
    """The API server could not be reached, or answered with an error that is not about one object."""


@dataclass(frozen=True)
class Resource:
    """One ReDrafterDeployment under check: from a file or from the cluster."""

    name: str
    namespace: str
    spec: Mapping[str, Any]

    def parsed(self) -> tuple[ReDrafterDeploymentSpec | None, list[str]]:
        return parse_spec(dict(self.spec))


@dataclass(frozen=True)
class ClaimFacts:
    phase: str
    access_modes: tuple[str, ...]
    capacity: str | None


@dataclass(frozen=True)
class DeploymentFacts:
    namespace: str
    name: str
    replicas: int
    ready: int
    service_account: str = "default"
    args: tuple[str, ...] = ()  # the operator container's: its watch scope and leader election
    release: str | None = None  # the Helm release (app.kubernetes.io/instance)
    annotations: Mapping[str, str] = field(default_factory=dict)

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.service_account}"

    @property
    def watched_namespaces(self) -> tuple[str, ...]:
        """The namespaces of ``--namespace=NS`` flags (none: every namespace)."""
        return tuple(a.split("=", 1)[1] for a in self.args if a.startswith("--namespace="))

    @property
    def leader_elect(self) -> bool:
        return "--leader-elect" in self.args

    @property
    def gpu_node_check(self) -> bool:
        return "--no-gpu-node-check" not in self.args


@dataclass(frozen=True)
class MetricsFacts:
    """The operator's metrics Service, and what its /metrics answered through the API server's service proxy."""

    service: str | None  # "ns/name:port" (None: no Service with a metrics port)
    status: int = 0  # the proxied answer's HTTP status (0: not asked)
    samples: int = 0  # sample lines of the Prometheus text it returned
    error: str = ""  # why it did not answer (the API server's message)


# (API group, resource[/subresource], verb, namespace; "" for cluster-wide or every namespace)
Access = tuple[str, str, str, str]


@dataclass(frozen=True)
class ClusterFacts:
    nodes: tuple[Node, ...] = ()  # with their taints and cordon: what render/placement.py judges
    crds: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # name -> served versions
    operator_deployments: tuple[DeploymentFacts, ...] | None = None  # None: not looked for
    operator_namespace: str | None = None
    claims: Mapping[tuple[str, str], ClaimFacts] = field(default_factory=dict)  # (ns, name), found only
    secret_keys: Mapping[tuple[str, str], frozenset[str]] = field(default_factory=dict)  # (ns, name), found only
    unreadable: Mapping[str, str] = field(default_factory=dict)  # "nodes", "pvc/ns/name", ...: why (403)
    missing_resources: tuple[tuple[str, str], ...] = ()  # (ns, name) asked for by name, not found
    # SubjectAccessReviews of what the operator's ServiceAccount needs (None: not asked, see unreadable)
    operator_access: Mapping[Access, bool] | None = None
    # SelfSubjectAccessReviews of the reads this command makes (None: not asked)
    user_access: Mapping[Access, bool] | None = None
    metrics: MetricsFacts | None = None  # None: no operator Deployment to look beside
    namespace_labels: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # found only
    operator_health: tuple[str, str | None] | None = None  # (--operator-health URL, why it failed or None)
    dcgm_exporters: tuple[str, ...] = ()  # "DaemonSet ns/name" or "Pod ns/name" of NVIDIA's DCGM exporter


def operator_needs(deployment: DeploymentFacts, namespaces: set[str]) -> list[Access]:
    """What the operator's ServiceAccount must be allowed (render/rbac.py), where: the namespaced rules in
    ``namespaces`` (the resources' under check; else the watched ones; else every namespace), the
    cluster rules cluster-wide (Nodes with the GPU node check), the Lease rules in the operator's namespace
    when it elects a leader."""
    where = sorted(namespaces) or sorted(deployment.watched_namespaces) or [""]
    out: list[Access] = []
    for group, resource, verb in sorted(rbac.calls(rbac.NAMESPACED)):
        out += [(group, resource, verb, ns) for ns in where]
    cluster = rbac.CLUSTER + (rbac.NAMESPACED_MODE_CLUSTER if deployment.watched_namespaces else ())
    cluster += rbac.NODES if deployment.gpu_node_check else ()
    out += [(g, r, v, "") for g, r, v in sorted(rbac.calls(cluster))]
    if deployment.leader_elect:
        out += [(g, r, v, deployment.namespace) for g, r, v in sorted(rbac.calls(rbac.LEASE))]
    return out


def own_reads(
    resources: list[Resource],
    operator_namespace: str | None,
    claims: set[tuple[str, str]],
    secrets: set[tuple[str, str]],
    in_cluster: bool = True,
) -> list[Access]:
    """The reads this command makes (each check's own 403 is a warning; this says them all at once)."""
    out: list[Access] = [
        ("", "nodes", "list", ""),
        ("apiextensions.k8s.io", "customresourcedefinitions", "list", ""),
        ("authorization.k8s.io", "subjectaccessreviews", "create", ""),
        ("apps", "daemonsets", "list", ""),
        ("", "pods", "list", ""),
    ]
    if in_cluster:
        out.append(("apps", "deployments", "list", operator_namespace or ""))
    if in_cluster and operator_namespace:
        out += [("", "services", "list", operator_namespace), ("", "services/proxy", "get", operator_namespace)]
    out += sorted({("", "namespaces", "get", r.namespace) for r in resources})
    out += sorted({("", "persistentvolumeclaims", "get", ns) for ns, _ in claims})
    out += sorted({("", "secrets", "get", ns) for ns, _ in secrets})
    return out


def _attributes(access: Access) -> dict[str, str]:
    group, resource, verb, namespace = access
    resource, _, sub = resource.partition("/")
    attrs = {"group": group, "resource": resource, "verb": verb}
    if sub:
        attrs["subresource"] = sub
    if namespace:
        attrs["namespace"] = namespace
    return attrs


def wanted(resources: list[Resource]) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """The (namespace, name) of every PVC and Secret the resources' specs refer to (valid specs only)."""
    claims: set[tuple[str, str]] = set()
    secrets: set[tuple[str, str]] = set()
    for res in resources:
        spec, _ = res.parsed()
        if spec is None:
            continue
        sources = named_sources(spec)
        claims.update((res.namespace, claim) for claim in [spec.engine.cache.claim_name, *source_claims(sources)])
        secrets.update((res.namespace, s.credentials_secret) for s in sources if s.credentials_secret)
    return claims, secrets


class _Reader:
    def __init__(self, api: k8s_client.ApiClient):
        self._api = api

    async def get(self, path: str, query: list[tuple[str, str]] | None = None) -> tuple[int, dict[str, Any]]:
        """(status, body) of a GET; raises ClusterUnreachable when there is no answer or a server error."""
        return await self.call("GET", path, query)

    async def post(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """(status, body) of a POST (the access reviews: they create nothing)."""
        return await self.call("POST", path, None, body)

    async def call(
        self, method: str, path: str, query: list[tuple[str, str]] | None = None, body: dict[str, Any] | None = None
    ) -> tuple[int, dict[str, Any]]:
        status, raw = await self.raw(method, path, query, body)
        try:
            payload = json.loads(raw) if raw else {}
        except ValueError:
            payload = {}
        if not isinstance(payload, dict):
            payload = {}
        if status in (401,) or status >= 500:
            message = payload.get("message") or raw.decode(errors="replace")[:200]
            raise ClusterUnreachable(f"{method} {path}: {status} {payload.get('reason', '')}: {_first_line(message)}")
        return status, payload

    async def raw(
        self,
        method: str,
        path: str,
        query: list[tuple[str, str]] | None = None,
        body: dict[str, Any] | None = None,
        accept: str = "application/json",
    ) -> tuple[int, bytes]:
        """(status, body bytes) of a request; raises ClusterUnreachable only when there is no answer."""
        headers = {"Accept": accept}
        if body is not None:
            headers["Content-Type"] = "application/json"
        try:
            resp = await self._api.call_api(
                path,
                method,
                query_params=query or [],
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _return_http_data_only=True,
                _request_timeout=REQUEST_TIMEOUT,
            )
            status, raw = resp.status, await resp.read()
            resp.release()
        except k8s_client.exceptions.ApiException as exc:
            status = exc.status or 0
            raw = exc.body if isinstance(exc.body, bytes) else str(exc.body or "").encode()
            if status == 0:
                raise ClusterUnreachable(f"cannot reach the API server: {exc.reason}") from None
        except (OSError, asyncio.TimeoutError, aiohttp.ClientError) as exc:
            host = self._api.configuration.host
            raise ClusterUnreachable(f"cannot reach the API server at {host}: {_first_line(exc)}") from None
        return status, raw


def _first_line(value: object) -> str:
    text = str(value).strip() or type(value).__name__
    return text.splitlines()[0]


def _why(status: int, payload: Mapping[str, Any]) -> str:
    return f"{status} {payload.get('reason') or ''}: {_first_line(payload.get('message') or 'no message')}".strip()


async def read_resources(
    api: k8s_client.ApiClient, namespace: str, name: str | None
) -> tuple[list[Resource], tuple[tuple[str, str], ...]]:
    """The named ReDrafterDeployment, or every one in the namespace; and the (ns, name) asked for but absent."""
    reader = _Reader(api)
    base = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}"
    status, body = await reader.get(f"{base}/{name}" if name else base)
    if status == 404:  # the object, or the whole API when the CRD is missing: the crd check explains that
        return [], ((namespace, name),) if name else ()
    if status != 200:
        raise ClusterUnreachable(f"cannot read {PLURAL} in {namespace}: {_why(status, body)}")
    items = [body] if name else list(body.get("items") or [])
    return [
        Resource(
            name=str(item["metadata"]["name"]),
            namespace=str(item["metadata"].get("namespace") or namespace),
            spec=item.get("spec") or {},
        )
        for item in items
    ], ()


async def read_facts(
    api: k8s_client.ApiClient,
    resources: list[Resource],
    *,
    operator_namespace: str | None = None,
    missing_resources: tuple[tuple[str, str], ...] = (),
    operator_health: str | None = None,
) -> ClusterFacts:
    """Nodes, CRDs, the operator's Deployments and the PVCs and Secrets the resources name."""
    reader = _Reader(api)
    unreadable: dict[str, str] = {}

    status, body = await reader.get("/api/v1/nodes")
    nodes: list[Node] = []
    if status == 200:
        nodes = [Node.from_body(item) for item in body.get("items") or []]
    else:
        unreadable["nodes"] = _why(status, body)

    crds: dict[str, tuple[str, ...]] = {}
    status, body = await reader.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions")
    if status == 200:
        for item in body.get("items") or []:
            served = tuple(str(v["name"]) for v in (item.get("spec") or {}).get("versions") or [] if v.get("served"))
            crds[str(item["metadata"]["name"])] = served
    else:
        unreadable["crds"] = _why(status, body)

    deployments: tuple[DeploymentFacts, ...] | None = None
    health = await _probe(operator_health) if operator_health else None
    path = (
        f"/apis/apps/v1/namespaces/{operator_namespace}/deployments"
        if operator_namespace
        else "/apis/apps/v1/deployments"
    )
    if health is None:  # an operator outside the cluster has no Deployment to look for
        status, body = await reader.get(path, [("labelSelector", OPERATOR_SELECTOR)])
        if status == 200:
            deployments = tuple(_deployment(item) for item in body.get("items") or [])
        else:
            unreadable["deployments"] = _why(status, body)

    claim_refs, secret_refs = wanted(resources)
    operator_access: dict[Access, bool] | None = None
    best = max(deployments, key=lambda d: (d.ready, -d.replicas)) if deployments else None
    if best is not None:
        namespaces = {r.namespace for r in resources}
        operator_access = {}
        for access in operator_needs(best, namespaces):
            spec = {"user": best.user, "groups": _sa_groups(best.namespace), "resourceAttributes": _attributes(access)}
            status, body = await reader.post(f"{AUTHZ}/subjectaccessreviews", _review("SubjectAccessReview", spec))
            if status != 201 and status != 200:
                unreadable["subjectaccessreviews"] = _why(status, body)
                operator_access = None
                break
            operator_access[access] = bool((body.get("status") or {}).get("allowed"))

    metrics = await _read_metrics(reader, best, unreadable) if best is not None else None

    user_access: dict[Access, bool] | None = {}
    operator_ns = best.namespace if best else operator_namespace
    for access in own_reads(resources, operator_ns, claim_refs, secret_refs, in_cluster=health is None):
        spec = {"resourceAttributes": _attributes(access)}
        status, body = await reader.post(f"{AUTHZ}/selfsubjectaccessreviews", _review("SelfSubjectAccessReview", spec))
        if status not in (200, 201):
            unreadable["selfsubjectaccessreviews"] = _why(status, body)
            user_access = None
            break
        assert user_access is not None
        user_access[access] = bool((body.get("status") or {}).get("allowed"))

    dcgm: list[str] = []
    for kind, path in (("DaemonSet", "/apis/apps/v1/daemonsets"), ("Pod", "/api/v1/pods")):
        for selector in DCGM_SELECTORS:
            status, body = await reader.get(path, [("labelSelector", selector)])
            if status != 200:
                unreadable[f"dcgm/{kind}"] = _why(status, body)
                break
            dcgm += [
                f"{kind} {i['metadata'].get('namespace')}/{i['metadata']['name']}" for i in body.get("items") or []
            ]
        if dcgm:  # its DaemonSet suffices; its pods are asked for only when no DaemonSet can be seen
            unreadable.pop("dcgm/Pod", None)
            break

    namespace_labels: dict[str, Mapping[str, str]] = {}
    for ns in sorted({r.namespace for r in resources}):
        status, body = await reader.get(f"/api/v1/namespaces/{ns}")
        if status == 200:
            namespace_labels[ns] = dict((body.get("metadata") or {}).get("labels") or {})
        elif status != 404:
            unreadable[f"namespace/{ns}"] = _why(status, body)

    claims: dict[tuple[str, str], ClaimFacts] = {}
    for ns, name in sorted(claim_refs):
        status, body = await reader.get(f"/api/v1/namespaces/{ns}/persistentvolumeclaims/{name}")
        if status == 200:
            st = body.get("status") or {}
            modes = tuple((body.get("spec") or {}).get("accessModes") or st.get("accessModes") or ())
            claims[(ns, name)] = ClaimFacts(
                phase=str(st.get("phase") or "Pending"),
                access_modes=modes,
                capacity=(st.get("capacity") or {}).get("storage"),
            )
        elif status != 404:
            unreadable[f"pvc/{ns}/{name}"] = _why(status, body)

    secret_keys: dict[tuple[str, str], frozenset[str]] = {}
    for ns, name in sorted(secret_refs):
        status, body = await reader.get(f"/api/v1/namespaces/{ns}/secrets/{name}")
        if status == 200:  # keep the key names; the values are dropped with ``body``
            secret_keys[(ns, name)] = frozenset((body.get("data") or {}) | (body.get("stringData") or {}))
        elif status != 404:
            unreadable[f"secret/{ns}/{name}"] = _why(status, body)
        del body

    return ClusterFacts(
        nodes=tuple(nodes),
        crds=crds,
        operator_deployments=deployments,
        operator_namespace=operator_namespace,
        claims=claims,
        secret_keys=secret_keys,
        unreadable=unreadable,
        missing_resources=missing_resources,
        operator_access=operator_access,
        user_access=user_access,
        metrics=metrics,
        namespace_labels=namespace_labels,
        dcgm_exporters=tuple(sorted(set(dcgm))),
        operator_health=health,
    )


async def _probe(url: str) -> tuple[str, str | None]:
    """(url, None) when the operator's liveness endpoint answers 2xx, else (url, why not)."""
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
            async with session.get(url) as resp:
                return url, None if 200 <= resp.status < 300 else f"HTTP {resp.status}"
    except (aiohttp.ClientError, OSError, asyncio.TimeoutError, ValueError) as exc:
        return url, _first_line(exc)


async def _read_metrics(reader: _Reader, operator: DeploymentFacts, unreadable: dict[str, str]) -> MetricsFacts | None:
    """The chart's metrics Service (the operator's labels, a port named ``metrics``) and its /metrics, read
    through the API server's service proxy (what Prometheus would scrape, from inside the cluster)."""
    ns = operator.namespace
    status, body = await reader.get(f"/api/v1/namespaces/{ns}/services", [("labelSelector", OPERATOR_SELECTOR)])
    if status != 200:
        unreadable["services"] = _why(status, body)
        return None
    for item in body.get("items") or []:
        ports = [p for p in (item.get("spec") or {}).get("ports") or [] if p.get("name") == METRICS_PORT_NAME]
        if ports:
            name = str(item["metadata"]["name"])
            break
    else:
        return MetricsFacts(service=None)
    ref = f"{ns}/{name}:{METRICS_PORT_NAME}"
    path = f"/api/v1/namespaces/{ns}/services/{name}:{METRICS_PORT_NAME}/proxy/metrics"
    status, raw = await reader.raw("GET", path, accept="text/plain")
    text = raw.decode(errors="replace")
    if status != 200:
        try:
            message = str(json.loads(text).get("message") or "")
        except (ValueError, AttributeError):
            message = text
        return MetricsFacts(ref, status, error=_first_line(message or "no message")[:200])
    samples = sum(1 for line in text.splitlines() if line.strip() and not line.startswith("#"))
    return MetricsFacts(ref, status, samples)


AUTHZ = "/apis/authorization.k8s.io/v1"


def _review(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "authorization.k8s.io/v1", "kind": kind, "spec": spec}


def _sa_groups(namespace: str) -> list[str]:
    """The groups a ServiceAccount's token authenticates with (a SubjectAccessReview must state them)."""
    return ["system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"]


def _deployment(item: Mapping[str, Any]) -> DeploymentFacts:
    meta, spec = item["metadata"], item.get("spec") or {}
    pod = (spec.get("template") or {}).get("spec") or {}
    containers = pod.get("containers") or [{}]
    return DeploymentFacts(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta["name"]),
        replicas=int(spec.get("replicas", 1)),
        ready=int((item.get("status") or {}).get("readyReplicas") or 0),
        service_account=str(pod.get("serviceAccountName") or "default"),
        args=tuple(str(a) for a in containers[0].get("args") or ()),
        release=(meta.get("labels") or {}).get("app.kubernetes.io/instance"),
        annotations=dict(meta.get("annotations") or {}),
    )
