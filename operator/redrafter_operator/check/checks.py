"""The checks (pure): ``ClusterFacts`` and the resources under check in, one ``CheckResult`` per finding out.

Each result carries a one-line fix for a failure or warning, phrased as the command or change that
clears it, so the output is a to-do list.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, Literal, Mapping

from engine_jobs.contract import VARIANTS

from ..api import CRD_NAME, KIND, VERSION
from ..api.spec import ReDrafterDeploymentSpec
from ..api.types import parse_quantity
from ..render import inference_pool as ip
from ..render import placement, podsecurity
from ..render.build import build_job, build_spec, named_sources, source_claims
from ..render.common import Owner
from ..render.placement import GPU, Node
from ..render.serving import serving_deployment
from ..render.training import training_job
from ..render.validation import DEFAULT_OPERATOR_IMAGE, validation_job
from . import sizing
from .facts import Access, ClusterFacts, DeploymentFacts, Resource

Status = Literal["ok", "fail", "warn"]

CRD_FIX = "kubectl apply --server-side -f charts/redrafter-operator/crds/"
PLACEHOLDER_UID = "00000000-0000-0000-0000-000000000000"
# GPU Feature Discovery's driver labels (NVIDIA/k8s-device-plugin >= v0.15, docs/gpu-feature-discovery/README.md):
# the current spelling, and the deprecated one it still writes beside it.
LABEL_DRIVER_MAJOR = "nvidia.com/cuda.driver-version.major"
LABEL_DRIVER_MAJOR_DEPRECATED = "nvidia.com/cuda.driver.major"
GFD_FIX = "deploy GPU Feature Discovery (part of the NVIDIA GPU Operator) so GPU nodes carry nvidia.com/gpu.* labels"


@dataclass(frozen=True)
class DriverRequirement:
    """The driver branch a Triton release needs, and the older data-center branches CUDA's forward
    compatibility package still supports (a warning: only with that package, on data-center GPUs)."""

    minimum: int
    forward_compatible: tuple[int, ...]


# Triton release -> minimum NVIDIA driver major. One pair serves both paths (images/versions.env), so one floor:
# triton-inference-server/server tag v2.71.0, docs/introduction/compatibility.md, lists CUDA 13.1 and driver
# 590.44.01 for 26.07; it names no forward-compatible branches, so none is assumed. A serving image on another
# release (set in a spec) gets a warning that no minimum is known, never a guessed one.
DRIVER_MINIMUM: dict[str, DriverRequirement] = {
    "26.07": DriverRequirement(590, ()),
}
# The serving image names the Triton release it is built on: ...:<ours>-<YY.MM>-trtllm-python-py3
_TRITON_RELEASE = re.compile(r"(?<![0-9])(\d{2}\.\d{2})-trtllm")
# The keys a credentials Secret must hold, per source scheme (engine_jobs/fetch.py reads them as files).
REQUIRED_KEYS: dict[str, tuple[str, ...]] = {
    "hf": ("token",),
    "s3": ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"),
}
_PLACEHOLDER = {"token": "<your Hugging Face token>"}
_MAX_NAMES = 3


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: Status
    message: str
    fix: str | None = None


def ok(name: str, message: str) -> CheckResult:
    return CheckResult(name, "ok", message)


def fail(name: str, message: str, fix: str) -> CheckResult:
    return CheckResult(name, "fail", message, fix)


def warn(name: str, message: str, fix: str) -> CheckResult:
    return CheckResult(name, "warn", message, fix)


def run_checks(facts: ClusterFacts, resources: list[Resource], *, looked_in: str | None = None) -> list[CheckResult]:
    """Cluster checks first, then each resource's. ``looked_in``: the namespace listed when no resource was named."""
    out = [check_crd(facts), check_operator(facts)]
    rbac_result = check_operator_rbac(facts)
    if rbac_result is not None:
        out.append(rbac_result)
    metrics = check_metrics(facts)
    if metrics is not None:
        out.append(metrics)
    prometheus = check_prometheus_crds(facts)
    if prometheus is not None:
        out.append(prometheus)
    out.append(check_gpu_nodes(facts))
    out.append(check_dcgm(facts))
    access = check_access(facts)
    if access is not None:
        out.append(access)
    for ns, name in facts.missing_resources:
        out.append(
            fail(
                f"resource {name}",
                f"{KIND} {ns}/{name} not found",
                f"kubectl -n {ns} get rdd (or check a file before applying it: redrafter-operator check -f FILE)",
            )
        )
    if looked_in is not None and not resources and not facts.missing_resources:
        out.append(
            warn(
                "resources",
                f"no {KIND} in namespace {looked_in}: only the cluster was checked",
                "name one (RDD-NAME), pick its namespace (-n), or check a file (-f FILE)",
            )
        )
    for res in resources:
        out.extend(check_resource(facts, res))
    return out


def check_crd(facts: ClusterFacts) -> CheckResult:
    if "crds" in facts.unreadable:
        return warn(
            "crd", f"cannot list CustomResourceDefinitions ({facts.unreadable['crds']})", "run as a user who may"
        )
    served = facts.crds.get(CRD_NAME)
    if served is None:
        return fail("crd", f"CRD {CRD_NAME} is not installed", CRD_FIX)
    if VERSION not in served:
        return fail("crd", f"CRD {CRD_NAME} does not serve {VERSION} (serves {', '.join(served) or 'none'})", CRD_FIX)
    return ok("crd", f"CRD {CRD_NAME} serves {VERSION}")


def check_operator(facts: ClusterFacts) -> CheckResult:
    where = f"namespace {facts.operator_namespace}" if facts.operator_namespace else "any namespace"
    install = f"helm install redrafter charts/redrafter-operator -n {facts.operator_namespace or 'redrafter-system'} --create-namespace"
    if facts.operator_health is not None:
        url, why = facts.operator_health
        if why is None:
            return ok("operator", f"runs outside the cluster: its liveness endpoint {url} answers")
        return fail(
            "operator",
            f"runs outside the cluster, but its liveness endpoint {url} does not answer ({why})",
            f"start it: redrafter-operator run --liveness {url} (or drop --operator-health to look for its Deployment)",
        )
    if "deployments" in facts.unreadable:
        return warn(
            "operator",
            f"cannot list Deployments in {where} ({facts.unreadable['deployments']})",
            "run as a user who may, or pass --operator-namespace",
        )
    best = operator_deployment(facts)
    if best is None:
        return fail("operator", f"no redrafter-operator Deployment in {where}", install)
    ref = f"{best.namespace}/{best.name}"
    if best.replicas < 1:
        return fail(
            "operator",
            f"Deployment {ref} is scaled to 0",
            f"kubectl -n {best.namespace} scale deployment {best.name} --replicas=1",
        )
    if best.ready < 1:
        return fail(
            "operator",
            f"Deployment {ref}: 0 of {best.replicas} replicas ready",
            f"kubectl -n {best.namespace} describe deployment {best.name}; kubectl -n {best.namespace} logs deployment/{best.name}",
        )
    if best.ready < best.replicas:
        return warn(
            "operator",
            f"Deployment {ref}: {best.ready} of {best.replicas} replicas ready",
            f"kubectl -n {best.namespace} describe deployment {best.name}",
        )
    return ok("operator", f"Deployment {ref}: {best.ready} of {best.replicas} replicas ready")


def operator_deployment(facts: ClusterFacts) -> DeploymentFacts | None:
    """The Deployment the operator checks judge: the readiest one found."""
    found = facts.operator_deployments or ()
    return max(found, key=lambda d: (d.ready, -d.replicas)) if found else None


def _access(access: Access) -> str:
    group, resource, verb, namespace = access
    what = f"{verb} {resource}" + (f".{group}" if group else "")
    return what + (f" in {namespace}" if namespace else "")


def _grouped(denied: list[Access]) -> str:
    """``create,patch jobs.batch in default``: verbs of one resource and namespace together."""
    verbs: dict[tuple[str, str, str], list[str]] = {}
    for group, resource, verb, namespace in denied:
        verbs.setdefault((group, resource, namespace), []).append(verb)
    return ", ".join(_access((g, r, ",".join(v), ns)) for (g, r, ns), v in verbs.items())


def check_operator_rbac(facts: ClusterFacts) -> CheckResult | None:
    """Whether the operator's ServiceAccount may do what render/rbac.py says it needs (SubjectAccessReview)."""
    best = operator_deployment(facts)
    if best is None:
        return None
    sa = f"ServiceAccount {best.namespace}/{best.service_account}"
    if "subjectaccessreviews" in facts.unreadable:
        return warn(
            "operator-rbac",
            f"cannot ask what {sa} may do: creating SubjectAccessReviews failed "
            f"({facts.unreadable['subjectaccessreviews']})",
            "run as a user who may create subjectaccessreviews.authorization.k8s.io, or try "
            f"kubectl auth can-i --list --as={best.user}",
        )
    if facts.operator_access is None:
        return None
    denied = [a for a, allowed in facts.operator_access.items() if not allowed]
    if not denied:
        return ok("operator-rbac", f"{sa} may do all {len(facts.operator_access)} things the operator needs")
    release = best.release or "redrafter"
    return fail(
        "operator-rbac",
        f"{sa} may not {_grouped(denied)}",
        f"helm upgrade {release} charts/redrafter-operator -n {best.namespace} --reuse-values --set rbac.create=true "
        "(the chart grants exactly what the operator needs), or grant these in the (Cluster)Role bound to it",
    )


def check_metrics(facts: ClusterFacts) -> CheckResult | None:
    """The operator's metrics Service answers /metrics through the API server's service proxy (a warning:
    the operator works without it, its dashboards and alerts do not)."""
    best = operator_deployment(facts)
    if best is None:
        return None
    if "services" in facts.unreadable:
        return warn(
            "operator-metrics", f"cannot list Services ({facts.unreadable['services']})", "run as a user who may"
        )
    m = facts.metrics
    if m is None:
        return None
    release = best.release or "redrafter"
    if m.service is None:
        return warn(
            "operator-metrics",
            f"no Service with a metrics port beside Deployment {best.namespace}/{best.name}",
            f"helm upgrade {release} charts/redrafter-operator -n {best.namespace} --reuse-values (the chart creates it)",
        )
    if m.status != 200:
        return warn(
            "operator-metrics",
            f"Service {m.service} does not answer /metrics through the API server ({m.status}: {m.error})",
            f"kubectl -n {best.namespace} get endpoints; kubectl -n {best.namespace} logs deployment/{best.name}",
        )
    return ok("operator-metrics", f"Service {m.service} answers /metrics ({m.samples} samples)")


# The Prometheus Operator's kinds the chart can create: their CRD, and the chart value that turns each on.
PROMETHEUS_KINDS: dict[str, tuple[str, str]] = {
    "ServiceMonitor": ("servicemonitors.monitoring.coreos.com", "metrics.serviceMonitor.enabled"),
    "PodMonitor": ("podmonitors.monitoring.coreos.com", "metrics.podMonitor.enabled"),
    "PrometheusRule": ("prometheusrules.monitoring.coreos.com", "prometheusRule.enabled"),
}
PROMETHEUS_KINDS_ANNOTATION = "redrafter.dev/prometheus-operator-kinds"  # set by the chart's Deployment
PROMETHEUS_VERSION = "v1"


def check_prometheus_crds(facts: ClusterFacts) -> CheckResult | None:
    """The CRDs of the Prometheus Operator kinds the operator's release creates (its Deployment's annotation
    names them): ``!`` when one is missing, since Helm then cannot upgrade the release."""
    best = operator_deployment(facts)
    if best is None or "crds" in facts.unreadable:
        return None
    used = [k for k in best.annotations.get(PROMETHEUS_KINDS_ANNOTATION, "").split(",") if k in PROMETHEUS_KINDS]
    served = {k for k, (crd, _) in PROMETHEUS_KINDS.items() if PROMETHEUS_VERSION in facts.crds.get(crd, ())}
    if not used:
        have = "installed" if served == set(PROMETHEUS_KINDS) else "not all installed"
        return ok(
            "prometheus-crds",
            f"the release creates no ServiceMonitor, PodMonitor or PrometheusRule (Prometheus Operator CRDs {have})",
        )
    missing = [k for k in used if k not in served]
    if not missing:
        return ok("prometheus-crds", f"the CRDs of the release's {', '.join(used)} are installed")
    crds = ", ".join(PROMETHEUS_KINDS[k][0] for k in missing)
    off = " ".join(f"--set {PROMETHEUS_KINDS[k][1]}=false" for k in missing)
    release = best.release or "redrafter"
    return warn(
        "prometheus-crds",
        f"the release creates {', '.join(missing)} but CRD {crds} ({PROMETHEUS_VERSION}) is not installed: "
        "nothing scrapes or alerts, and the next helm upgrade fails",
        f"install the Prometheus Operator CRDs (kube-prometheus-stack), or helm upgrade {release} "
        f"charts/redrafter-operator -n {best.namespace} --reuse-values {off}",
    )


def check_dcgm(facts: ClusterFacts) -> CheckResult:
    """NVIDIA's DCGM exporter runs (a warning only: GPU utilisation and memory panels and alerts need it)."""
    if facts.dcgm_exporters:
        return ok("dcgm-exporter", f"NVIDIA's DCGM exporter runs: {placement.names(list(facts.dcgm_exporters))}")
    why = facts.unreadable.get("dcgm/Pod") or facts.unreadable.get("dcgm/DaemonSet")
    if why:
        return warn(
            "dcgm-exporter", f"cannot look for NVIDIA's DCGM exporter ({why})", "run as a user who may list DaemonSets"
        )
    return warn(
        "dcgm-exporter",
        "no DCGM exporter (DaemonSet or pods labelled app=nvidia-dcgm-exporter or app.kubernetes.io/name=dcgm-exporter): "
        "no GPU utilisation, memory or temperature metrics",
        "enable it in the NVIDIA GPU Operator (dcgmExporter.enabled=true, the default), or install NVIDIA's "
        "dcgm-exporter Helm chart",
    )


def check_access(facts: ClusterFacts) -> CheckResult | None:
    """The reads this command makes, as the user may do them (SelfSubjectAccessReview)."""
    if "selfsubjectaccessreviews" in facts.unreadable:
        return warn(
            "access",
            f"cannot ask what you may read (SelfSubjectAccessReview: {facts.unreadable['selfsubjectaccessreviews']})",
            "every authenticated user may normally create selfsubjectaccessreviews (ClusterRole system:basic-user)",
        )
    if facts.user_access is None:
        return None
    denied = [a for a, allowed in facts.user_access.items() if not allowed]
    if not denied:
        return ok("access", f"you may make all {len(facts.user_access)} reads this check makes")
    return warn(
        "access",
        f"you may not {_grouped(denied)}: the checks that need it are warnings",
        "run as a user who may (kubectl auth can-i --list shows what you may do)",
    )


def _allocatable_gpus(node: Node) -> float:
    """What the device plugin reports (the GFD count label alone does not make a node schedulable)."""
    return node.offers(GPU) if GPU in node.allocatable else 0.0


def check_gpu_nodes(facts: ClusterFacts) -> CheckResult:
    if "nodes" in facts.unreadable:
        return warn("gpu-nodes", f"cannot list nodes ({facts.unreadable['nodes']})", "run as a user who may list nodes")
    with_gpus = [n for n in facts.nodes if _allocatable_gpus(n) > 0]
    if not with_gpus:
        return fail(
            "gpu-nodes",
            f"no node has allocatable {GPU} ({len(facts.nodes)} node(s))",
            "install the NVIDIA GPU Operator or device plugin",
        )
    total = sum(_allocatable_gpus(n) for n in with_gpus)
    return ok("gpu-nodes", f"{len(with_gpus)} node(s) with {GPU}, {int(total)} allocatable")


def owner_of(res: Resource, spec: ReDrafterDeploymentSpec) -> Owner:
    """The resource as the renderers take it (a placeholder uid: nothing rendered here is created)."""
    return Owner(res.name, res.namespace, PLACEHOLDER_UID, spec)


@dataclass(frozen=True)
class GpuJob:
    """A GPU Job the operator will create for a resource, and the spec fields that shape its placement."""

    check: str
    pod_spec: Mapping[str, Any]
    resource: str
    product_field: str
    count_field: str
    selector_field: str = "spec.engine.build.nodeSelector"
    tolerations_field: str = "spec.engine.build.tolerations"


def gpu_jobs(res: Resource, spec: ReDrafterDeploymentSpec) -> list[GpuJob]:
    """The build Job's pod (both variants place alike) and, when the spec trains a drafter, the training Job's.
    The PyTorch backend's prepare Job needs no GPU: there the serving pod is the first that needs one."""
    owner = owner_of(res, spec)
    gpu = spec.engine.build.gpu_resource
    if spec.method == "redrafter":
        first = GpuJob(
            f"gpu-product {res.name}",
            build_job(owner, "base")["spec"]["template"]["spec"],
            gpu,
            "spec.engine.build.gpuProduct",
            "spec.parallelism.tensor",
        )
    else:
        key = build_spec(spec, "base").key
        first = GpuJob(
            f"gpu-product {res.name}",
            serving_deployment(owner, "base", key, 1)["spec"]["template"]["spec"],
            gpu,
            "spec.serving.nodeSelector",
            "spec.parallelism.tensor",
            "spec.serving.nodeSelector",
            "spec.serving.tolerations",
        )
    jobs = [first]
    if spec.trained_drafter() is not None:
        jobs.append(
            GpuJob(
                f"training-gpu {res.name}",
                training_job(owner)["spec"]["template"]["spec"],
                gpu,
                "spec.model.drafter.train.gpuProduct",
                "spec.model.drafter.train.gpus",
            )
        )
    return jobs


def _placement_fix(job: GpuJob, nodes: tuple[Node, ...]) -> str:
    selector = dict(job.pod_spec.get("nodeSelector") or {})
    product = selector.get(placement.LABEL_PRODUCT)
    tolerant = {**job.pod_spec, "tolerations": [{"operator": "Exists"}]}
    blocked = [n for n in nodes if placement.misfit(tolerant, n) is None]
    if blocked:
        cordoned = [n.name for n in blocked if n.unschedulable]
        tolerations = list(job.pod_spec.get("tolerations") or [])
        taints = sorted(
            {
                str(t)
                for n in blocked
                for t in n.taints
                if t.effect in ("NoSchedule", "NoExecute") and not placement.tolerates(tolerations, t)
            }
        )
        parts = []
        if taints:
            parts.append(f"tolerate {', '.join(taints)} in {job.tolerations_field}")
        if cordoned:
            parts.append(f"kubectl uncordon {' '.join(cordoned[:_MAX_NAMES])}")
        return " or ".join(parts)
    others = {k: v for k, v in selector.items() if k != placement.LABEL_PRODUCT}
    if others and not any(all(n.labels.get(k) == v for k, v in others.items()) for n in nodes):
        labels = " ".join(f"{k}={v}" for k, v in sorted(others.items()))
        return f"label the GPU nodes {labels} (kubectl label node NAME {labels}), or change {job.selector_field}"
    products = sorted({n.labels[placement.LABEL_PRODUCT] for n in nodes if placement.LABEL_PRODUCT in n.labels})
    if product and products:
        return f"add nodes with {product}, or set {job.product_field} to one of: {', '.join(products)}"
    if product:
        return f"add GPU nodes labelled {placement.LABEL_PRODUCT}={product} ({GFD_FIX})"
    count = int(placement.requests(job.pod_spec).get(job.resource, 0))
    return f"add nodes with {count} allocatable {job.resource}, or lower {job.count_field}"


def check_placement(facts: ClusterFacts, job: GpuJob) -> CheckResult:
    """Could any node run the Job's pod, as render/placement.py (the operator's own rule) judges it."""
    found = placement.place(job.pod_spec, facts.nodes, job.resource)
    if found.fits:
        return ok(job.check, found.message)
    return fail(job.check, found.message, _placement_fix(job, facts.nodes))


def check_resource(facts: ClusterFacts, res: Resource) -> list[CheckResult]:
    spec, errors = res.parsed()
    if spec is None:
        return [
            fail(
                f"spec {res.name}",
                f"{res.namespace}/{res.name} is invalid: {errors[0]}"
                + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""),
                "correct the spec (kubectl explain rdd.spec)",
            )
        ]
    out = [ok(f"spec {res.name}", f"{res.namespace}/{res.name} is a valid {KIND}")]
    if "nodes" not in facts.unreadable:
        jobs = gpu_jobs(res, spec)
        out.extend(check_placement(facts, job) for job in jobs)
        driver = check_driver(facts, res.name, spec, jobs[0])
        if driver is not None:
            out.append(driver)
    out.append(check_pod_security(facts, res, spec))
    out.append(check_cache_claim(facts, res, spec))
    sources = check_source_claims(facts, res, spec)
    if sources is not None:
        out.append(sources)
    creds = check_credentials(facts, res, spec)
    if creds is not None:
        out.append(creds)
    if spec.routing.inference_pool.enabled:
        out.append(check_inference_pool(facts, res.name))
    return out


def triton_release(image: str) -> str | None:
    found = _TRITON_RELEASE.search(image.rsplit(":", 1)[-1] if ":" in image else image)
    return found.group(1) if found else None


def driver_major(node: Node) -> int | None:
    """GFD's driver major: the current label, else the deprecated one GFD still writes (older GFD: only it)."""
    for label in (LABEL_DRIVER_MAJOR, LABEL_DRIVER_MAJOR_DEPRECATED):
        value = node.labels.get(label, "")
        if value.isdigit():
            return int(value)
    return None


def check_driver(
    facts: ClusterFacts, name: str, spec: ReDrafterDeploymentSpec, build: GpuJob | None = None
) -> CheckResult | None:
    """The driver of the nodes the build Job could land on (None when none could: gpu-product says so)."""
    if build is None:
        build = gpu_jobs(Resource(name, "default", {}), spec)[0]
    fits = set(placement.place(build.pod_spec, facts.nodes, build.resource).fits)
    match = [n for n in facts.nodes if n.name in fits]
    if not match:
        return None
    check = f"driver {name}"
    release = triton_release(spec.serving.image)
    need = DRIVER_MINIMUM.get(release or "")
    if need is None:
        return warn(
            check,
            f"no known driver minimum for serving image {spec.serving.image} (Triton release {release or 'unknown'})",
            f"check NVIDIA's Triton release notes for that release; this check knows {', '.join(DRIVER_MINIMUM)}",
        )
    found = {n.name: driver_major(n) for n in match}
    unknown = [n for n, m in found.items() if m is None]
    majors = {n: m for n, m in found.items() if m is not None}
    too_old = [f"{n} (R{m})" for n, m in majors.items() if m < need.minimum and m not in need.forward_compatible]
    compat = [f"{n} (R{m})" for n, m in majors.items() if m < need.minimum and m in need.forward_compatible]
    what = f"Triton {release} needs driver R{need.minimum}+"
    if too_old:
        return fail(
            check,
            f"{what}; older on {placement.names(too_old)}",
            f"upgrade the NVIDIA driver on those nodes to R{need.minimum} or later (GPU Operator: driver.version)",
        )
    if unknown:
        return warn(
            check,
            f"{what}; cannot tell on {placement.names(unknown)}: no {LABEL_DRIVER_MAJOR} label",
            GFD_FIX,
        )
    if compat:
        return warn(
            check,
            f"{what}; {placement.names(compat)} run an older data-center branch",
            "fine on data-center GPUs with the CUDA forward compatibility package; else upgrade the driver",
        )
    return ok(check, f"{what}; {len(majors)} matching node(s) have it (R{min(majors.values())}+)")


def operator_pods(res: Resource, spec: ReDrafterDeploymentSpec) -> list[tuple[str, dict[str, Any]]]:
    """(kind/name, pod template) of every pod the operator creates for the spec: build Jobs, the training
    Job, the serving Deployments (primaries, canary, candidate share one template) and the validation Job."""
    owner = owner_of(res, spec)
    keys = {v: build_spec(spec, v).key for v in VARIANTS}
    manifests = [build_job(owner, v) for v in VARIANTS]
    if spec.trained_drafter() is not None:
        manifests.append(training_job(owner))
    manifests += [serving_deployment(owner, v, keys[v], 1) for v in VARIANTS]
    if spec.validation.enabled:
        manifests.append(
            validation_job(
                owner, redrafter_key=keys["redrafter"], base_key=keys["base"], operator_image=DEFAULT_OPERATOR_IMAGE
            )
        )
    return [(f"{m['kind']}/{m['metadata']['name']}", m["spec"]["template"]) for m in manifests]


def check_pod_security(
    facts: ClusterFacts,
    res: Resource,
    spec: ReDrafterDeploymentSpec,
    pods: list[tuple[str, dict[str, Any]]] | None = None,
) -> CheckResult:
    """The pods the operator will create pass the Pod Security level the namespace enforces."""
    check, ns = f"pod-security {res.name}", res.namespace
    if f"namespace/{ns}" in facts.unreadable:
        return warn(
            check, f"cannot read namespace {ns} ({facts.unreadable[f'namespace/{ns}']})", "run as a user who may"
        )
    labels = facts.namespace_labels.get(ns)
    if labels is None:
        return warn(
            check,
            f"namespace {ns} not found: its Pod Security level is not known",
            f"kubectl create namespace {ns} (and label it {podsecurity.ENFORCE_LABEL}=restricted)",
        )
    level, version = podsecurity.namespace_policy(labels)
    pods = operator_pods(res, spec) if pods is None else pods
    enforced = f"namespace {ns} enforces {level}:{version}" + (
        " (judged by the latest rules)" if version != "latest" and level != "privileged" else ""
    )
    found = [(name, podsecurity.violations(t.get("spec") or {}, level, t.get("metadata") or {})) for name, t in pods]
    bad = [(name, v) for name, v in found if v]
    if not bad:
        return ok(check, f"{enforced}; the {len(pods)} pod templates the operator creates pass it")
    strictest = next(
        lvl
        for lvl in reversed(podsecurity.LEVELS)
        if all(not podsecurity.violations(t.get("spec") or {}, lvl, t.get("metadata") or {}) for _, t in pods)
    )
    shown = "; ".join(f"{name}: {', '.join(v)}" for name, v in bad[:_MAX_NAMES])
    return fail(
        check,
        f"{enforced}; {len(bad)} pod template(s) violate it: {shown}",
        f"remove what the message names from the spec, or kubectl label namespace {ns} "
        f"{podsecurity.ENFORCE_LABEL}={strictest} --overwrite",
    )


def _claim_fix(ns: str, claim: str, rwx: bool) -> str:
    mode = "ReadWriteMany " if rwx else ""
    return f"create a {mode}PersistentVolumeClaim {claim} in {ns} (kubectl -n {ns} apply -f pvc.yaml)"


def check_cache_claim(facts: ClusterFacts, res: Resource, spec: ReDrafterDeploymentSpec) -> CheckResult:
    check, ns, claim = f"cache-claim {res.name}", res.namespace, spec.engine.cache.claim_name
    holds = "engines and trained drafters" if spec.trained_drafter() is not None else "engines"
    key = f"pvc/{ns}/{claim}"
    if key in facts.unreadable:
        return warn(check, f"cannot read PVC {ns}/{claim} ({facts.unreadable[key]})", "run as a user who may get PVCs")
    pvc = facts.claims.get((ns, claim))
    if pvc is None:
        return fail(check, f"PVC {ns}/{claim} (the cache of {holds}) not found", _claim_fix(ns, claim, True))
    if pvc.phase != "Bound":
        return fail(
            check,
            f"PVC {ns}/{claim} is {pvc.phase}, not Bound",
            f"kubectl -n {ns} describe pvc {claim} (is there a StorageClass that provisions ReadWriteMany volumes?)",
        )
    if "ReadWriteMany" not in pvc.access_modes:
        return fail(
            check,
            f"PVC {ns}/{claim} is {', '.join(pvc.access_modes) or 'without access modes'}, not ReadWriteMany: "
            "build Jobs and serving pods on different nodes share it",
            f"recreate {claim} with accessModes: [ReadWriteMany] on an RWX StorageClass (NFS, CephFS, EFS, Filestore)",
        )
    size = f", {pvc.capacity}" if pvc.capacity else ""
    estimate = sizing.estimate_cache(spec)
    capacity = _capacity(pvc.capacity)
    if estimate is None or capacity is None:
        return ok(check, f"PVC {ns}/{claim} is Bound, ReadWriteMany{size} (holds {holds}; size not checked)")
    if capacity < estimate.total:
        return fail(
            check,
            f"PVC {ns}/{claim} holds {pvc.capacity}, less than the {sizing.gib(estimate.total)} the {holds} need "
            f"(estimated: {estimate.describe()})",
            _resize_fix(ns, claim, estimate.total),
        )
    return ok(
        check,
        f"PVC {ns}/{claim} is Bound, ReadWriteMany{size}: room for the {holds} (estimated "
        f"{sizing.gib(estimate.total)}: {estimate.describe()})",
    )


def _capacity(text: str | None) -> float | None:
    try:
        return parse_quantity(text) if text else None
    except ValueError:
        return None


def _resize_fix(ns: str, claim: str, need: float) -> str:
    size = f"{math.ceil(need / sizing.GIB)}Gi"
    patch = json.dumps({"spec": {"resources": {"requests": {"storage": size}}}}, separators=(",", ":"))
    return (
        f"kubectl -n {ns} patch pvc {claim} -p '{patch}' (if its StorageClass allows volume expansion), "
        f"else recreate it with {size} or more"
    )


def check_source_claims(facts: ClusterFacts, res: Resource, spec: ReDrafterDeploymentSpec) -> CheckResult | None:
    """Every pvc:// source's claim exists and is Bound (the Jobs mount them read-only)."""
    claims = source_claims(named_sources(spec))
    if not claims:
        return None
    check, ns = f"source-claims {res.name}", res.namespace
    for claim in claims:
        key = f"pvc/{ns}/{claim}"
        if key in facts.unreadable:
            return warn(
                check, f"cannot read PVC {ns}/{claim} ({facts.unreadable[key]})", "run as a user who may get PVCs"
            )
        pvc = facts.claims.get((ns, claim))
        if pvc is None:
            return fail(check, f"PVC {ns}/{claim} (a pvc:// source) not found", _claim_fix(ns, claim, False))
        if pvc.phase != "Bound":
            return fail(check, f"PVC {ns}/{claim} is {pvc.phase}, not Bound", f"kubectl -n {ns} describe pvc {claim}")
        held = sizing.estimate_source(spec, claim)
        capacity = _capacity(pvc.capacity)
        if held is not None and capacity is not None and capacity < held[0]:
            return fail(
                check,
                f"PVC {ns}/{claim} holds {pvc.capacity}, less than the checkpoints the spec reads from it "
                f"(estimated {sizing.gib(held[0])}: {', '.join(held[1])})",
                _resize_fix(ns, claim, held[0]),
            )
    return ok(check, f"PVC(s) {', '.join(f'{ns}/{c}' for c in claims)} of the pvc:// sources are Bound")


def check_credentials(facts: ClusterFacts, res: Resource, spec: ReDrafterDeploymentSpec) -> CheckResult | None:
    """Each credentialsSecret exists with the keys its sources' schemes read (key names only, never values)."""
    needed: dict[str, set[str]] = {}
    for src in named_sources(spec):
        if src.credentials_secret:
            needed.setdefault(src.credentials_secret, set()).update(
                REQUIRED_KEYS.get(src.source.partition("://")[0], ())
            )
    if not needed:
        return None
    check, ns = f"credentials {res.name}", res.namespace
    for secret, keys in sorted(needed.items()):
        literals = " ".join(
            f"--from-literal={k}={_PLACEHOLDER.get(k, '<' + k + '>')}" for k in sorted(keys or {"token"})
        )
        create = f"kubectl -n {ns} create secret generic {secret} {literals}"
        unread = f"secret/{ns}/{secret}"
        if unread in facts.unreadable:
            return warn(
                check,
                f"cannot read Secret {ns}/{secret} ({facts.unreadable[unread]})",
                "run as a user who may get Secrets",
            )
        have = facts.secret_keys.get((ns, secret))
        if have is None:
            return fail(check, f"Secret {ns}/{secret} not found", create)
        missing = sorted(keys - have)
        if missing:
            return fail(
                check,
                f"Secret {ns}/{secret} has no key {', '.join(missing)} (keys: {', '.join(sorted(have)) or 'none'})",
                f"{create} --dry-run=client -o yaml | kubectl apply -f -",
            )
    return ok(check, f"Secret(s) {', '.join(f'{ns}/{s}' for s in sorted(needed))} hold the keys the Jobs read")


def check_inference_pool(facts: ClusterFacts, name: str) -> CheckResult:
    crd = f"{ip.PLURAL}.{ip.GROUP}"
    check = f"inference-pool {name}"
    if "crds" in facts.unreadable:
        return warn(
            check, f"cannot list CustomResourceDefinitions ({facts.unreadable['crds']})", "run as a user who may"
        )
    served = facts.crds.get(crd)
    if served is None or ip.VERSION not in served:
        return fail(
            check,
            f"spec.routing.inferencePool.enabled, but the {ip.KIND} CRD ({crd}, {ip.VERSION}) is not installed",
            "install it from kubernetes-sigs/gateway-api-inference-extension v1.0.0 or later, or set "
            "spec.routing.inferencePool.enabled: false",
        )
    return ok(check, f"CRD {crd} serves {ip.VERSION}")
