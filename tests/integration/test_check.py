"""``redrafter-operator check`` against the emulated API server, run as a user runs it (a subprocess).

Each check is made to fail (✗ and its fix line) and then to pass after the cluster is fixed; the
warning variants are covered on the pure check functions, which need no server.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from redrafter_operator.check import checks
from redrafter_operator.check.checks import check_driver, check_operator
from redrafter_operator.check.facts import ClusterFacts, DeploymentFacts, Resource
from redrafter_operator.render import rbac
from redrafter_operator.render.placement import Node
from redrafter_sim.apiserver import ApiServerEmulator
from redrafter_sim.server import EmulatorHandle

ROOT = Path(__file__).resolve().parents[2]
CLI = Path(sys.executable).parent / "redrafter-operator"
EXAMPLE = ROOT / "examples" / "llama3-8b.yaml"
A100 = "NVIDIA-A100-SXM4-80GB"
H100 = "NVIDIA-H100-80GB-HBM3"
SECRET_VALUE = "hf_sEcReT-VaLuE-4242"
OPERATOR_NS = "redrafter-system"
OPERATOR_SA = "redrafter-operator"
RBAC_API = "rbac.authorization.k8s.io/v1"
CHART_LABELS = {
    "app.kubernetes.io/name": "redrafter-operator",
    "app.kubernetes.io/instance": "redrafter-operator",
    "app.kubernetes.io/component": "operator",
    "app.kubernetes.io/part-of": "redrafter",
}


def check(kubeconfig: Path, *args: str) -> tuple[int, str, str]:
    proc = subprocess.run(
        [str(CLI), "check", "--kubeconfig", str(kubeconfig), *args], capture_output=True, text=True, timeout=60
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, proc.stdout, proc.stderr


def line(out: str, name: str) -> str:
    """The line of check ``name`` and its fix line, if any."""
    lines = out.splitlines()
    for i, text in enumerate(lines):
        if text[2:].startswith(f"{name}: "):
            fix = lines[i + 1] if i + 1 < len(lines) and lines[i + 1].startswith("    fix: ") else ""
            return text + ("\n" + fix if fix else "")
    raise AssertionError(f"no check {name!r} in:\n{out}")


def example(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    for path, value in changes.items():
        node = body["spec"]
        *parents, leaf = path.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return body


def write(tmp_path: Path, body: dict[str, Any]) -> str:
    path = tmp_path / "rdd.yaml"
    path.write_text(yaml.safe_dump(body))
    return str(path)


def apply_crd(kubectl: Any, path: Path) -> None:
    kubectl("apply", "--server-side", "-f", str(path), check=True)


def node(em: ApiServerEmulator, name: str, product: str | None, gpus: int, driver: int | None = 590) -> None:
    em.add_node(name, product, gpus, driver=f"{driver}.95.05" if driver else None)


def pvc(em: ApiServerEmulator, name: str, modes: list[str], phase: str = "Bound", size: str = "500Gi") -> None:
    em.create_object(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"accessModes": modes, "resources": {"requests": {"storage": size}}},
        }
    )
    status = {"phase": phase, "accessModes": modes, "capacity": {"storage": size}}
    em.patch_object("v1", "PersistentVolumeClaim", name, "default", {"status": status}, subresource="status")


def operator(em: ApiServerEmulator, replicas: int, ready: int) -> None:
    """The chart's Deployment (its labels), with the status its pods would give it."""
    name = "redrafter-operator"
    if em.find_object("v1", "Namespace", OPERATOR_NS) is None:
        em.create_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OPERATOR_NS}})
    if em.find_object("apps/v1", "Deployment", name, OPERATOR_NS) is None:
        em.create_object(
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": name, "namespace": OPERATOR_NS, "labels": CHART_LABELS},
                "spec": {
                    "replicas": replicas,
                    "selector": {"matchLabels": CHART_LABELS},
                    "template": {
                        "metadata": {"labels": CHART_LABELS},
                        "spec": {
                            "serviceAccountName": OPERATOR_SA,
                            "containers": [
                                {
                                    "name": "operator",
                                    "image": "ghcr.io/redrafter/operator:0.1.0",
                                    "args": ["run", "--all-namespaces", "--standalone"],
                                }
                            ],
                        },
                    },
                },
            }
        )
    else:
        em.patch_object("apps/v1", "Deployment", name, OPERATOR_NS, {"spec": {"replicas": replicas}})
    status = {"replicas": replicas, "readyReplicas": ready, "availableReplicas": ready}
    em.patch_object("apps/v1", "Deployment", name, OPERATOR_NS, {"status": status}, subresource="status")


def operator_rbac(
    em: ApiServerEmulator, rules: tuple[rbac.Rule, ...] = rbac.NAMESPACED + rbac.CLUSTER + rbac.NODES
) -> None:
    """The chart's cluster-wide RBAC (a ClusterRole with the rules of render/rbac.py, bound to the operator's SA)."""
    em.create_object(
        {
            "apiVersion": RBAC_API,
            "kind": "ClusterRole",
            "metadata": {"name": OPERATOR_SA},
            "rules": [r.as_policy_rule() for r in rules],
        }
    )
    em.create_object(
        {
            "apiVersion": RBAC_API,
            "kind": "ClusterRoleBinding",
            "metadata": {"name": OPERATOR_SA},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": OPERATOR_SA},
            "subjects": [{"kind": "ServiceAccount", "name": OPERATOR_SA, "namespace": OPERATOR_NS}],
        }
    )


METRICS_SERVICE = "redrafter-operator-metrics"
METRICS_TEXT = (
    b"# HELP redrafter_reconciles_total x\n# TYPE redrafter_reconciles_total counter\nredrafter_reconciles_total 3\n"
)


class _Metrics(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        code, body = (200, METRICS_TEXT) if self.path == "/metrics" else (404, b"not found\n")
        self.send_response(code)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def metrics_port() -> Iterator[int]:
    """The operator pod's metrics server, as the emulator's service proxy reaches it (on loopback)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def metrics_service(em: ApiServerEmulator, port: int | None) -> None:
    """The chart's metrics Service, and (``port``) the Endpoints the endpoints controller would give it."""
    if em.find_object("v1", "Service", METRICS_SERVICE, OPERATOR_NS) is None:
        em.create_object(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": METRICS_SERVICE, "namespace": OPERATOR_NS, "labels": CHART_LABELS},
                "spec": {
                    "selector": {k: v for k, v in CHART_LABELS.items() if k != "app.kubernetes.io/part-of"},
                    "ports": [{"name": "metrics", "port": 9090, "targetPort": "metrics", "protocol": "TCP"}],
                },
            }
        )
    if port is not None:
        em.create_object(
            {
                "apiVersion": "v1",
                "kind": "Endpoints",
                "metadata": {"name": METRICS_SERVICE, "namespace": OPERATOR_NS},
                "subsets": [{"addresses": [{"ip": "127.0.0.1"}], "ports": [{"name": "metrics", "port": port}]}],
            }
        )


def dcgm_exporter(em: ApiServerEmulator) -> None:
    """NVIDIA's DCGM exporter as the GPU Operator deploys it (assets/state-dcgm-exporter)."""
    if em.find_object("v1", "Namespace", "gpu-operator") is None:
        em.create_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gpu-operator"}})
    labels = {"app": "nvidia-dcgm-exporter"}
    em.create_object(
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "nvidia-dcgm-exporter", "namespace": "gpu-operator", "labels": labels},
            "spec": {
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "containers": [{"name": "nvidia-dcgm-exporter", "image": "nvcr.io/nvidia/k8s/dcgm-exporter"}]
                    },
                },
            },
        }
    )


def secret(kubectl: Any, key: str = "token") -> None:
    kubectl("create", "secret", "generic", "hf-token", f"--from-literal={key}={SECRET_VALUE}", check=True)


def prepare(
    em: ApiServerEmulator, kubectl: Any, *, skip: frozenset[str] | set[str] = frozenset(), metrics: int | None = None
) -> None:
    """A cluster where the example passes every check, less the parts named in ``skip`` (``metrics``: the
    port of the operator's metrics server; without it the operator-metrics check warns)."""
    if "crd" not in skip:
        apply_crd(kubectl, ROOT / "charts" / "redrafter-operator" / "crds")
    if "operator" not in skip:
        operator(em, replicas=1, ready=1)
    if "rbac" not in skip:
        operator_rbac(em)
    if "operator" not in skip and metrics is not None:
        metrics_service(em, metrics)
    if "nodes" not in skip:
        node(em, "a100-0", A100, 8)
        node(em, "cpu-0", None, 0, driver=None)
    if "claims" not in skip:
        pvc(em, "engine-cache", ["ReadWriteMany"])
        pvc(em, "drafters", ["ReadOnlyMany"])
    if "secret" not in skip:
        secret(kubectl)
    if "dcgm" not in skip:
        dcgm_exporter(em)
    if "pod-security" not in skip:  # a hardened namespace: the operator's pods meet restricted
        labels = {
            "pod-security.kubernetes.io/enforce": "restricted",
            "pod-security.kubernetes.io/enforce-version": "latest",
        }
        em.patch_object("v1", "Namespace", "default", None, {"metadata": {"labels": labels}})


@pytest.fixture
def em(apiserver: EmulatorHandle) -> ApiServerEmulator:
    """The emulated cluster, less the GPU nodes it starts with: each test registers the nodes it means."""
    for item in apiserver.emulator.list_objects("v1", "Node"):
        apiserver.emulator.delete_object("v1", "Node", item["metadata"]["name"])
    return apiserver.emulator


def test_a_prepared_cluster_passes_every_check(
    em: ApiServerEmulator, kubectl: Any, kubeconfig: Path, metrics_port: int
) -> None:
    prepare(em, kubectl, metrics=metrics_port)
    code, out, err = check(kubeconfig, "-f", str(EXAMPLE), "--operator-namespace", OPERATOR_NS)
    assert code == 0, out + err
    names = [text[2:].split(":")[0] for text in out.splitlines() if text[:2] in ("✓ ", "✗ ", "! ")]
    assert names == [
        "crd",
        "operator",
        "operator-rbac",
        "operator-metrics",
        "prometheus-crds",
        "gpu-nodes",
        "dcgm-exporter",
        "access",
        "spec llama3-8b",
        "gpu-product llama3-8b",
        "driver llama3-8b",
        "pod-security llama3-8b",
        "cache-claim llama3-8b",
        "source-claims llama3-8b",
        "credentials llama3-8b",
    ]
    assert all(text.startswith("✓ ") for text in out.splitlines() if text[:2] in ("✓ ", "✗ ", "! ")), out
    assert "fix:" not in out and SECRET_VALUE not in out + err
    assert line(out, "dcgm-exporter") == (
        "✓ dcgm-exporter: NVIDIA's DCGM exporter runs: DaemonSet gpu-operator/nvidia-dcgm-exporter"
    )
    assert line(out, "pod-security llama3-8b") == (
        "✓ pod-security llama3-8b: namespace default enforces restricted:latest; the 5 pod templates the operator "
        "creates pass it"
    )
    print(out)  # the sample in docs/check.md

    # the same resource read back from the cluster, by name, as JSON
    kubectl("apply", "-f", str(EXAMPLE), check=True)
    code, out, err = check(kubeconfig, "llama3-8b", "-o", "json")
    assert code == 0, out + err
    doc = json.loads(out)
    assert doc["ok"] is True and set(doc) == {"checks", "ok"}
    assert all(set(c) == {"name", "status", "message", "fix"} and c["status"] == "ok" for c in doc["checks"])
    assert {c["name"] for c in doc["checks"]} >= {"crd", "operator", "credentials llama3-8b"}
    assert SECRET_VALUE not in out + err


def test_crd(em: ApiServerEmulator, kubectl: Any, kubeconfig: Path) -> None:
    prepare(em, kubectl, skip={"crd"})
    code, out, _ = check(kubeconfig, "-f", str(EXAMPLE))
    assert code == 1
    assert line(out, "crd") == (
        "✗ crd: CRD redrafterdeployments.redrafter.dev is not installed\n"
        "    fix: kubectl apply --server-side -f charts/redrafter-operator/crds/"
    )
    apply_crd(kubectl, ROOT / "charts" / "redrafter-operator" / "crds")
    code, out, _ = check(kubeconfig, "-f", str(EXAMPLE))
    assert code == 0, out
    assert line(out, "crd") == "✓ crd: CRD redrafterdeployments.redrafter.dev serves v1alpha1"


def test_operator(em: ApiServerEmulator, kubectl: Any, kubeconfig: Path) -> None:
    prepare(em, kubectl, skip={"operator"})
    code, out, _ = check(kubeconfig, "-f", str(EXAMPLE), "--operator-namespace", OPERATOR_NS)
    assert code == 1
    assert line(out, "operator") == (
        f"✗ operator: no redrafter-operator Deployment in namespace {OPERATOR_NS}\n"
        f"    fix: helm install redrafter charts/redrafter-operator -n {OPERATOR_NS} --create-namespace"
    )
    operator(em, replicas=2, ready=2)
    code, out, _ = check(kubeconfig, "-f", str(EXAMPLE))  # found in any namespace
    assert code == 0, out
    assert line(out, "operator") == f"✓ operator: Deployment {OPERATOR_NS}/redrafter-operator: 2 of 2 replicas ready"


def test_operator_rbac(em: ApiServerEmulator, kubectl: Any, kubeconfig: Path) -> None:
    """SubjectAccessReviews of render/rbac.py's needs for the Deployment's ServiceAccount, in the resource's namespace."""
    prepare(em, kubectl, skip={"rbac"})
    code, out, _ = check(kubeconfig, "-f", str(EXAMPLE))
    assert code == 1
    sa = f"ServiceAccount {OPERATOR_NS}/{OPERATOR_SA}"
    first = line(out, "operator-rbac")
    assert first.startswith(f"✗ operator-rbac: {sa} may not create,list,patch,watch configmaps in default, ")
    assert (
        "list,watch customresourcedefinitions.apiextensions.k8s.io\n" in first and "create events in default" in first
    )
    # the chart's rules less one: exactly that one is listed, with the chart's upgrade as the fix
    events = rbac.Rule(("",), ("events",), ("create",))
    operator_rbac(em, tuple(r for r in rbac.NAMESPACED + rbac.CLUSTER + rbac.NODES if r != events))
    code, out, _ = check(kubeconfig, "-f", str(EXAMPLE))
    assert code == 1
    assert line(out, "operator-rbac") == (
        f"✗ operator-rbac: {sa} may not create events in default\n"
        f"    fix: helm upgrade redrafter-operator charts/redrafter-operator -n {OPERATOR_NS} --reuse-values --set "
        "rbac.create=true (the chart grants exactly what the operator needs), or grant these in the (Cluster)Role "
        "bound to it"
    )
    em.patch_object(
        RBAC_API,
        "ClusterRole",
        OPERATOR_SA,
        None,
        {"rules": [r.as_policy_rule() for r in rbac.NAMESPACED + rbac.CLUSTER + rbac.NODES]},
    )
    code, out, _ = check(kubeconfig, "-f", str(EXAMPLE))
    assert code == 0, out
    need = len(rbac.calls(rbac.NAMESPACED + rbac.CLUSTER + rbac.NODES))
    assert line(out, "operator-rbac") == f"✓ operator-rbac: {sa} may do all {need} things the operator needs"


def test_operator_metrics(em: ApiServerEmulator, kubectl: Any, kubeconfig: Path, metrics_port: int) -> None:
    """/metrics of the chart's metrics Service through the API server's service proxy; a warning, never a failure."""
    prepare(em, kubectl)
    code, out, _ = check(kubeconfig, "-f", str(EXAMPLE))
    assert code == 0, out
    assert line(out, "operator-metrics") == (
        f"! operator-metrics: no Service with a metrics port beside Deployment {OPERATOR_NS}/redrafter-operator\n"
        f"    fix: helm upgrade redrafter-operator charts/redrafter-operator -n {OPERATOR_NS} --reuse-values (the chart "
        "creates it)"
    )
    metrics_service(em, None)  # no ready pod behind it
    code, out, _ = check(kubeconfig, "-f", str(EXAMPLE))
    assert line(out, "operator-metrics").startswith(
        f"! operator-metrics: Service {OPERATOR_NS}/{METRICS_SERVICE}:metrics does not answer /metrics through the "
        f'API server (503: no endpoints available for service "{METRICS_SERVICE}:metrics")\n'
    )
    metrics_service(em, metrics_port)
    code, out, _ = check(kubeconfig, "-f", str(EXAMPLE))
    assert code == 0, out
    assert line(out, "operator-metrics") == (
        f"✓ operator-metrics: Service {OPERATOR_NS}/{METRICS_SERVICE}:metrics answers /metrics (1 samples)"
    )


def test_operator_partly_ready_warns_and_none_ready_fails() -> None:
    partly = ClusterFacts(operator_deployments=(DeploymentFacts(OPERATOR_NS, "op", replicas=2, ready=1),))
    assert check_operator(partly).status == "warn"
    down = ClusterFacts(operator_deployments=(DeploymentFacts(OPERATOR_NS, "op", replicas=2, ready=0),))
    assert check_operator(down).status == "fail" and "describe deployment op" in (check_operator(down).fix or "")


def test_gpu_nodes_and_gpu_product(em: ApiServerEmulator, kubectl: Any, kubeconfig: Path) -> None:
    prepare(em, kubectl, skip={"nodes"})
    code, out, _ = check(kubeconfig, "-f", str(EXAMPLE))
    assert code == 1
    assert line(out, "gpu-nodes") == (
        "✗ gpu-nodes: no node has allocatable nvidia.com/gpu (0 node(s))\n"
        "    fix: install the NVIDIA GPU Operator or device plugin"
    )
    assert line(out, "gpu-product llama3-8b").startswith(
        f"✗ gpu-product llama3-8b: no node offers 1× {A100}; nodes: none"
    )
    for i in range(3):
        node(em, f"h100-{i}", H100, 8)
    code, out, _ = check(kubeconfig, "-f", str(EXAMPLE))
    assert code == 1
    assert line(out, "gpu-nodes") == "✓ gpu-nodes: 3 node(s) with nvidia.com/gpu, 24 allocatable"
    assert line(out, "gpu-product llama3-8b") == (
        f"✗ gpu-product llama3-8b: no node offers 1× {A100}; nodes: 3× {H100} (8 each)\n"
        f"    fix: add nodes with {A100}, or set spec.engine.build.gpuProduct to one of: {H100}"
    )
    node(em, "a100-0", A100, 8)
    code, out, _ = check(kubeconfig, "-f", str(EXAMPLE))
    assert code == 0, out
    assert line(out, "gpu-product llama3-8b") == f"✓ gpu-product llama3-8b: 1 node(s) offer 1× {A100}: a100-0"


def test_driver(em: ApiServerEmulator, kubectl: Any, kubeconfig: Path) -> None:
    prepare(em, kubectl, skip={"nodes"})
    node(em, "a100-old", A100, 8, driver=550)
    code, out, _ = check(kubeconfig, "-f", str(EXAMPLE))
    assert code == 1
    assert line(out, "driver llama3-8b") == (
        "✗ driver llama3-8b: Triton 26.07 needs driver R590+; older on a100-old (R550)\n"
        "    fix: upgrade the NVIDIA driver on those nodes to R590 or later (GPU Operator: driver.version)"
    )
    # GFD's current label wins over the deprecated one it still writes beside it
    labels = {"nvidia.com/cuda.driver-version.major": "595", "nvidia.com/cuda.driver.major": "550"}
    em.patch_object("v1", "Node", "a100-old", None, {"metadata": {"labels": labels}})
    code, out, _ = check(kubeconfig, "-f", str(EXAMPLE))
    assert code == 0, out
    assert line(out, "driver llama3-8b") == (
        "✓ driver llama3-8b: Triton 26.07 needs driver R590+; 1 matching node(s) have it (R595+)"
    )


def test_driver_unknown_or_forward_compatible_warns(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = Resource("r", "default", example()["spec"]).parsed()[0]
    assert spec is not None
    gpu = {"nvidia.com/gpu": "8"}
    unlabelled = ClusterFacts(nodes=(Node("n", {"nvidia.com/gpu.product": A100}, gpu),))
    result = check_driver(unlabelled, "r", spec)
    assert result is not None and result.status == "warn" and "GPU Feature Discovery" in (result.fix or "")
    r535 = ClusterFacts(
        nodes=(Node("n", {"nvidia.com/gpu.product": A100, "nvidia.com/cuda.driver-version.major": "535"}, gpu),)
    )
    # the one pinned release (26.07) names no forward-compatible branch: R535 is too old
    result = check_driver(r535, "r", spec)
    assert result is not None and result.status == "fail" and "R590" in result.message
    # a release whose notes do name such branches warns instead
    monkeypatch.setitem(checks.DRIVER_MINIMUM, "26.07", checks.DriverRequirement(590, (535,)))
    result = check_driver(r535, "r", spec)
    assert result is not None and result.status == "warn" and "forward compatibility" in (result.fix or "")
    # a serving image on a release the check has no floor for (the former 25.09 pair): a warning, no guess
    old = example()["spec"]
    old.setdefault("serving", {})["image"] = "ghcr.io/redrafter/triton-runtime:0.1.0-25.09-trtllm-python-py3"
    old_spec = Resource("r", "default", old).parsed()[0]
    assert old_spec is not None
    result = check_driver(r535, "r", old_spec)
    assert result is not None and result.status == "warn" and "no known driver minimum" in result.message


def test_cache_claim_and_source_claims(em: ApiServerEmulator, kubectl: Any, kubeconfig: Path, tmp_path: Path) -> None:
    prepare(em, kubectl, skip={"claims"})
    pvc(em, "engine-cache", ["ReadWriteOnce"])
    code, out, _ = check(kubeconfig, "-f", str(EXAMPLE))
    assert code == 1
    assert line(out, "cache-claim llama3-8b") == (
        "✗ cache-claim llama3-8b: PVC default/engine-cache is ReadWriteOnce, not ReadWriteMany: build Jobs and "
        "serving pods on different nodes share it\n"
        "    fix: recreate engine-cache with accessModes: [ReadWriteMany] on an RWX StorageClass (NFS, CephFS, EFS, "
        "Filestore)"
    )
    assert line(out, "source-claims llama3-8b") == (
        "✗ source-claims llama3-8b: PVC default/drafters (a pvc:// source) not found\n"
        "    fix: create a PersistentVolumeClaim drafters in default (kubectl -n default apply -f pvc.yaml)"
    )
    em.delete_object("v1", "PersistentVolumeClaim", "engine-cache", "default")
    pvc(em, "engine-cache", ["ReadWriteMany"])
    pvc(em, "drafters", ["ReadOnlyMany"])
    code, out, _ = check(kubeconfig, "-f", str(EXAMPLE))
    assert code == 0, out
    assert line(out, "cache-claim llama3-8b") == (
        "✓ cache-claim llama3-8b: PVC default/engine-cache is Bound, ReadWriteMany, 500Gi: room for the engines "
        "(estimated 38 GiB: 8B parameters: base 15 GiB + ReDrafter 16 GiB + 20% headroom)"
    )
    assert line(out, "source-claims llama3-8b") == (
        "✓ source-claims llama3-8b: PVC(s) default/drafters of the pvc:// sources are Bound"
    )


def test_credentials(em: ApiServerEmulator, kubectl: Any, kubeconfig: Path) -> None:
    prepare(em, kubectl, skip={"secret"})
    code, out, _ = check(kubeconfig, "-f", str(EXAMPLE))
    assert code == 1
    assert line(out, "credentials llama3-8b") == (
        "✗ credentials llama3-8b: Secret default/hf-token not found\n"
        "    fix: kubectl -n default create secret generic hf-token --from-literal=token=<your Hugging Face token>"
    )
    secret(kubectl, key="hf_token")  # the wrong key name
    code, out, err = check(kubeconfig, "-f", str(EXAMPLE))
    assert code == 1 and SECRET_VALUE not in out + err
    assert line(out, "credentials llama3-8b").startswith(
        "✗ credentials llama3-8b: Secret default/hf-token has no key token (keys: hf_token)\n"
    )
    kubectl("delete", "secret", "hf-token", check=True)
    secret(kubectl)
    code, out, err = check(kubeconfig, "-f", str(EXAMPLE), "-o", "json")
    assert code == 0, out
    assert SECRET_VALUE not in out + err
    creds = [c for c in json.loads(out)["checks"] if c["name"] == "credentials llama3-8b"]
    assert creds == [
        {
            "name": "credentials llama3-8b",
            "status": "ok",
            "message": "Secret(s) default/hf-token hold the keys the Jobs read",
            "fix": None,
        }
    ]


def test_inference_pool(em: ApiServerEmulator, kubectl: Any, kubeconfig: Path, tmp_path: Path) -> None:
    prepare(em, kubectl)
    body = example(routing={"inferencePool": {"enabled": True, "endpointPickerRef": {"name": "epp", "port": 9002}}})
    path = write(tmp_path, body)
    code, out, _ = check(kubeconfig, "-f", path)
    assert code == 1, out
    assert line(out, "inference-pool llama3-8b") == (
        "✗ inference-pool llama3-8b: spec.routing.inferencePool.enabled, but the InferencePool CRD "
        "(inferencepools.inference.networking.k8s.io, v1) is not installed\n"
        "    fix: install it from kubernetes-sigs/gateway-api-inference-extension v1.0.0 or later, or set "
        "spec.routing.inferencePool.enabled: false"
    )
    apply_crd(kubectl, ROOT / "tests" / "fixtures" / "crds" / "inference.networking.k8s.io_inferencepools.yaml")
    code, out, _ = check(kubeconfig, "-f", path)
    assert code == 0, out
    assert line(out, "inference-pool llama3-8b") == (
        "✓ inference-pool llama3-8b: CRD inferencepools.inference.networking.k8s.io serves v1"
    )


def test_an_invalid_spec_fails_with_the_first_error(
    em: ApiServerEmulator, kubectl: Any, kubeconfig: Path, tmp_path: Path
) -> None:
    prepare(em, kubectl)
    code, out, _ = check(kubeconfig, "-f", write(tmp_path, example(parallelism={"tensor": 3})))
    assert code == 1
    spec_line = line(out, "spec llama3-8b")
    assert spec_line.startswith("✗ spec llama3-8b: default/llama3-8b is invalid: spec.parallelism.tensor: ")
    assert "gpu-product llama3-8b" not in out  # nothing else is judged from an invalid spec


def test_an_unreachable_api_server_is_one_line_and_exit_2(tmp_path: Path) -> None:
    from redrafter_sim.server import write_kubeconfig

    kubeconfig = write_kubeconfig("http://127.0.0.1:9", tmp_path / "kubeconfig")  # discard port: refused
    code, out, err = check(kubeconfig, "-f", str(EXAMPLE))
    assert code == 2 and out == ""
    assert err.startswith("error: cannot reach the API server at http://127.0.0.1:9") and err.count("\n") == 1, err


def test_a_forbidden_read_is_a_warning_not_an_error(em: ApiServerEmulator, kubectl: Any, kubeconfig: Path) -> None:
    prepare(em, kubectl)
    em.inject("GET", r"^/api/v1/nodes$", 403, message="nodes is forbidden")
    em.inject("GET", r"/secrets/hf-token$", 403, message="secrets is forbidden")
    em.inject("POST", r"/subjectaccessreviews$", 403, message="subjectaccessreviews is forbidden")
    code, out, err = check(kubeconfig, "-f", str(EXAMPLE))
    assert code == 0, out + err
    assert line(out, "operator-rbac") == (
        f"! operator-rbac: cannot ask what ServiceAccount {OPERATOR_NS}/{OPERATOR_SA} may do: creating "
        "SubjectAccessReviews failed (403 Forbidden: subjectaccessreviews is forbidden)\n"
        "    fix: run as a user who may create subjectaccessreviews.authorization.k8s.io, or try kubectl auth can-i "
        f"--list --as=system:serviceaccount:{OPERATOR_NS}:{OPERATOR_SA}"
    )
    assert line(out, "gpu-nodes").startswith("! gpu-nodes: cannot list nodes (403 ")
    assert line(out, "credentials llama3-8b").startswith("! credentials llama3-8b: cannot read Secret default/hf-token")
    assert "gpu-product llama3-8b" not in out  # cannot be judged without the nodes
