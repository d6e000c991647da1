"""The checks (pure): ``ClusterFacts`` and the resources under check in, one ``CheckResult`` per finding out.

Each result carries a one-line fix for a failure or warning, phrased as the command or change that
clears it, so the output is a to-do list.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Literal

from ..api import CRD_NAME, KIND, VERSION
from ..api.spec import ReDrafterDeploymentSpec
from ..render import inference_pool as ip
from ..render.build import named_sources, source_claims
from .facts import ClusterFacts, NodeFacts, Resource

Status = Literal["ok", "fail", "warn"]

CRD_FIX = "kubectl apply --server-side -f charts/redrafter-operator/crds/"
GPU = "nvidia.com/gpu"
# GPU Feature Discovery's node labels (NVIDIA/k8s-device-plugin, docs/gpu-feature-discovery/README.md).
LABEL_PRODUCT = "nvidia.com/gpu.product"
LABEL_COUNT = "nvidia.com/gpu.count"
LABEL_DRIVER_MAJOR = "nvidia.com/cuda.driver.major"
GFD_FIX = "deploy GPU Feature Discovery (part of the NVIDIA GPU Operator) so GPU nodes carry nvidia.com/gpu.* labels"


@dataclass(frozen=True)
class DriverRequirement:
    """The driver branch a Triton release needs, and the older data-center branches CUDA's forward
    compatibility package still supports (a warning: only with that package, on data-center GPUs)."""

    minimum: int
    forward_compatible: tuple[int, ...]


# Triton release -> minimum NVIDIA driver major, from NVIDIA's Triton release notes, "Driver Requirements":
# 25.08 and 25.10 (https://docs.nvidia.com/deeplearning/triton-inference-server/release-notes/rel-25-08.html,
# .../rel-25-10.html) are based on CUDA 13.0 and require driver 575 or later, or on data-center GPUs
# R470 (470.57+), R525 (525.85+), R535 (535.86+) or R545 (545.23+). 25.09, the release images/versions.env
# pins, sits between them on the same CUDA 13.0 base.
DRIVER_MINIMUM: dict[str, DriverRequirement] = {
    "25.08": DriverRequirement(575, (470, 525, 535, 545)),
    "25.09": DriverRequirement(575, (470, 525, 535, 545)),
    "25.10": DriverRequirement(575, (470, 525, 535, 545)),
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
    out = [check_crd(facts), check_operator(facts), check_gpu_nodes(facts)]
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
    if "deployments" in facts.unreadable:
        return warn(
            "operator",
            f"cannot list Deployments in {where} ({facts.unreadable['deployments']})",
            "run as a user who may, or pass --operator-namespace",
        )
    found = facts.operator_deployments or ()
    if not found:
        return fail("operator", f"no redrafter-operator Deployment in {where}", install)
    best = max(found, key=lambda d: (d.ready, -d.replicas))
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


def _int(text: str | None) -> int:
    try:
        return int(str(text))
    except ValueError:
        return 0


def gpus(node: NodeFacts, resource: str = GPU) -> int:
    """GPUs a node offers: allocatable (what the scheduler counts), else GFD's count label."""
    if resource in node.allocatable:
        return _int(node.allocatable[resource])
    return _int(node.labels.get(LABEL_COUNT))


def check_gpu_nodes(facts: ClusterFacts) -> CheckResult:
    if "nodes" in facts.unreadable:
        return warn("gpu-nodes", f"cannot list nodes ({facts.unreadable['nodes']})", "run as a user who may list nodes")
    with_gpus = [n for n in facts.nodes if _int(n.allocatable.get(GPU)) > 0]
    if not with_gpus:
        return fail(
            "gpu-nodes",
            f"no node has allocatable {GPU} ({len(facts.nodes)} node(s))",
            "install the NVIDIA GPU Operator or device plugin",
        )
    total = sum(_int(n.allocatable.get(GPU)) for n in with_gpus)
    return ok("gpu-nodes", f"{len(with_gpus)} node(s) with {GPU}, {total} allocatable")


def _names(items: list[str]) -> str:
    shown = ", ".join(items[:_MAX_NAMES])
    return shown + (f" and {len(items) - _MAX_NAMES} more" if len(items) > _MAX_NAMES else "")


def node_summary(nodes: tuple[NodeFacts, ...], resource: str) -> str:
    """``3× NVIDIA-H100-80GB-HBM3 (8 each), 1× unlabelled (0 each)``: nodes grouped by product and GPUs."""
    if not nodes:
        return "none"
    groups = Counter((n.labels.get(LABEL_PRODUCT, "unlabelled"), gpus(n, resource)) for n in nodes)
    return ", ".join(f"{count}× {product} ({each} each)" for (product, each), count in sorted(groups.items()))


def matching_nodes(facts: ClusterFacts, spec: ReDrafterDeploymentSpec) -> list[NodeFacts]:
    build = spec.engine.build
    return [
        n
        for n in facts.nodes
        if (build.gpu_product is None or n.labels.get(LABEL_PRODUCT) == build.gpu_product)
        and gpus(n, build.gpu_resource) >= spec.parallelism.tensor
    ]


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
        out.append(check_gpu_product(facts, res.name, spec))
        driver = check_driver(facts, res.name, spec)
        if driver is not None:
            out.append(driver)
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


def check_gpu_product(facts: ClusterFacts, name: str, spec: ReDrafterDeploymentSpec) -> CheckResult:
    build, tensor = spec.engine.build, spec.parallelism.tensor
    wanted = f"{tensor}× {build.gpu_product or 'GPU'}"
    match = matching_nodes(facts, spec)
    if match:
        return ok(f"gpu-product {name}", f"{len(match)} node(s) offer {wanted}: {_names([n.name for n in match])}")
    products = sorted({n.labels[LABEL_PRODUCT] for n in facts.nodes if LABEL_PRODUCT in n.labels})
    if build.gpu_product and products:
        fix = (
            f"add nodes with {build.gpu_product}, or set spec.engine.build.gpuProduct to one of: {', '.join(products)}"
        )
    elif build.gpu_product:
        fix = f"add GPU nodes labelled {LABEL_PRODUCT}={build.gpu_product} ({GFD_FIX})"
    else:
        fix = f"add nodes with {tensor} allocatable {build.gpu_resource}, or lower spec.parallelism.tensor"
    return CheckResult(
        f"gpu-product {name}",
        "fail",
        f"no node offers {wanted}; nodes: {node_summary(facts.nodes, build.gpu_resource)}",
        fix,
    )


def triton_release(image: str) -> str | None:
    found = _TRITON_RELEASE.search(image.rsplit(":", 1)[-1] if ":" in image else image)
    return found.group(1) if found else None


def check_driver(facts: ClusterFacts, name: str, spec: ReDrafterDeploymentSpec) -> CheckResult | None:
    """The driver of the nodes the engines could land on (None when none matches: gpu-product says so)."""
    match = matching_nodes(facts, spec)
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
    unknown = [n.name for n in match if not n.labels.get(LABEL_DRIVER_MAJOR, "").isdigit()]
    majors = {n.name: int(n.labels[LABEL_DRIVER_MAJOR]) for n in match if n.name not in unknown}
    too_old = [f"{n} (R{m})" for n, m in majors.items() if m < need.minimum and m not in need.forward_compatible]
    compat = [f"{n} (R{m})" for n, m in majors.items() if m < need.minimum and m in need.forward_compatible]
    what = f"Triton {release} needs driver R{need.minimum}+"
    if too_old:
        return fail(
            check,
            f"{what}; older on {_names(too_old)}",
            f"upgrade the NVIDIA driver on those nodes to R{need.minimum} or later (GPU Operator: driver.version)",
        )
    if unknown:
        return warn(
            check,
            f"{what}; cannot tell on {_names(unknown)}: no {LABEL_DRIVER_MAJOR} label",
            GFD_FIX,
        )
    if compat:
        return warn(
            check,
            f"{what}; {_names(compat)} run an older data-center branch",
            "fine on data-center GPUs with the CUDA forward compatibility package; else upgrade the driver",
        )
    return ok(check, f"{what}; {len(majors)} matching node(s) have it (R{min(majors.values())}+)")


def _claim_fix(ns: str, claim: str, rwx: bool) -> str:
    mode = "ReadWriteMany " if rwx else ""
    return f"create a {mode}PersistentVolumeClaim {claim} in {ns} (kubectl -n {ns} apply -f pvc.yaml)"


def check_cache_claim(facts: ClusterFacts, res: Resource, spec: ReDrafterDeploymentSpec) -> CheckResult:
    check, ns, claim = f"cache-claim {res.name}", res.namespace, spec.engine.cache.claim_name
    holds = "engines and trained drafters" if spec.model.drafter.train is not None else "engines"
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
    return ok(check, f"PVC {ns}/{claim} is Bound, ReadWriteMany{size} (holds {holds}; size not checked)")


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
