"""``redrafter-operator check`` against the real control plane, run as a user runs it (a subprocess).

Each check is made to fail (✗ and its fix line) and then to pass after the cluster is fixed; the
warning variants are covered on the pure check functions, which need no server. Each test has a namespace for
its resources and one for the operator, whose Deployment's pods run (held Ready, no process) on a CPU node of
the test's own; GPU nodes are plain Node objects, as GPU Feature Discovery labels them. The Nodes, PersistentVolumes
and the chart's ClusterRoles are cluster-wide: each test deletes the ones it created.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import threading
import urllib.error
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.cluster import CRDS, Kube, new_namespace
from harness.lifecycle import HeldPods, api_path, is_ready
from harness.waiting import until
from redrafter_operator.check import checks
from redrafter_operator.check.checks import check_driver, check_operator
from redrafter_operator.check.facts import ClusterFacts, DeploymentFacts, Resource
from redrafter_operator.render import rbac
from redrafter_operator.render.placement import Node
from redrafter_sim import nodes
from redrafter_sim.chartrbac import chart_rbac
from redrafter_sim.controlplane import ControlPlane, write_yaml
from redrafter_sim.faultproxy import FaultProxy
from redrafter_sim.node import SimNode
from redrafter_sim.nodevolumes import claim_objects

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]
CLI = Path(sys.executable).parent / "redrafter-operator"
EXAMPLE = ROOT / "examples" / "llama3-8b.yaml"
CRD_NAME = "redrafterdeployments.redrafter.dev"
INFERENCE_POOL_CRD = ROOT / "tests" / "fixtures" / "crds" / "inference.networking.k8s.io_inferencepools.yaml"
A100 = "NVIDIA-A100-SXM4-80GB"
H100 = "NVIDIA-H100-80GB-HBM3"
SECRET_VALUE = "hf_sEcReT-VaLuE-4242"
CPU_NODE = "cpu-0"
CHART_LABELS = {
    "app.kubernetes.io/name": "redrafter-operator",
    "app.kubernetes.io/instance": "redrafter-operator",
    "app.kubernetes.io/component": "operator",
    "app.kubernetes.io/part-of": "redrafter",
}


@dataclass
class Env:
    """One test's cluster: ``kube`` (the resources' namespace, as the admin), the operator's namespace, the
    chart's ServiceAccount there, and the cluster-scoped objects to delete afterwards (API paths)."""

    kube: Kube
    op: Kube
    account: str
    home: Path
    created: list[str] = field(default_factory=list)
    nodes: list[SimNode] = field(default_factory=list)

    @property
    def ns(self) -> str:
        return self.kube.namespace

    @property
    def op_ns(self) -> str:
        return self.op.namespace

    @property
    def cp(self) -> ControlPlane:
        return self.kube.cp

    def request(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        return self.cp.request(method, path, body, **kw)

    def create(self, doc: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
        """Create as the admin; a cluster-scoped object is deleted after the test."""
        path = api_path(doc["apiVersion"], doc["kind"], namespace)
        obj = self.request("POST", path, doc)
        if namespace is None:
            self.created.append(api_path(doc["apiVersion"], doc["kind"], None, doc["metadata"]["name"]))
        return obj  # type: ignore[no-any-return]

    def find(self, path: str) -> Any | None:
        try:
            return self.request("GET", path)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    def merge(self, path: str, body: dict[str, Any]) -> Any:
        return self.request("PATCH", path, body, content_type="application/merge-patch+json")


async def check(env: Env, *args: str, kubeconfig: Path | None = None) -> tuple[int, str, str]:
    """The CLI as a subprocess (the CPU node runs on this loop), as the admin, for the test's namespace."""
    argv = [str(CLI), "check", "--kubeconfig", str(kubeconfig or env.kube.kubeconfig), "-n", env.ns, *args]
    proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 90)
    assert "Traceback" not in err.decode(), err.decode()
    return proc.returncode or 0, out.decode(), err.decode()


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
    body["metadata"].pop("namespace", None)
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


async def node(env: Env, name: str, product: str | None, gpus: int, driver: int | None = 590) -> None:
    """A node whose kubelet registers it and keeps its Lease (else the node lifecycle controller taints it
    unreachable), labelled as GPU Feature Discovery labels it with this driver; it runs no process."""
    sim = SimNode(
        env.cp.node_kubeconfig(name),
        name=name,
        product=product,
        gpus=gpus,
        node_dir=env.home / "nodes" / name,
        heartbeat_seconds=5.0,
        stages=HeldPods(),
    )
    await sim.start()
    env.nodes.append(sim)
    env.created.append(f"/api/v1/nodes/{name}")
    body, _ = nodes.node(name, product, gpus, driver=f"{driver}.95.05" if driver else None)
    env.merge(f"/api/v1/nodes/{name}", {"metadata": {"labels": body["metadata"]["labels"]}})


async def pvc(env: Env, name: str, modes: list[str], size: str = "500Gi") -> None:
    """A claim and a PersistentVolume bound to it (the real PV binder binds them), awaited Bound."""
    pv_name = f"{env.ns}-{name}-{len(env.created)}"
    pv, claim = claim_objects(env.ns, name, env.home / "pv" / pv_name, size, tuple(modes), pv_name)
    env.create(pv)
    env.create(claim, env.ns)
    path = f"/api/v1/namespaces/{env.ns}/persistentvolumeclaims/{name}"
    await until(lambda: _bound(env.find(path) or {}), 60, f"PVC {name} Bound")


def _bound(claim: dict[str, Any]) -> bool:
    return (claim.get("status") or {}).get("phase") == "Bound"


async def operator(env: Env, replicas: int, ready: int | None = None) -> None:
    """The chart's Deployment (its labels), its pods Ready on the CPU node; awaited ``ready`` Ready replicas."""
    name = "redrafter-operator"
    path = f"/apis/apps/v1/namespaces/{env.op_ns}/deployments/{name}"
    if env.find(path) is None:
        env.create(
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": name, "labels": CHART_LABELS},
                "spec": {
                    "replicas": replicas,
                    "selector": {"matchLabels": CHART_LABELS},
                    "template": {
                        "metadata": {"labels": CHART_LABELS},
                        "spec": {
                            "serviceAccountName": env.account,
                            "nodeSelector": {"kubernetes.io/hostname": CPU_NODE},
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
            },
            env.op_ns,
        )
    else:
        env.merge(path, {"spec": {"replicas": replicas}})
    want = replicas if ready is None else ready

    def ready() -> bool:
        status = (env.find(path) or {}).get("status") or {}
        return status.get("readyReplicas", 0) == want and status.get("replicas") == replicas

    await until(ready, 60, f"{want} operator replicas Ready")


CHART_RULES = rbac.NAMESPACED + rbac.CLUSTER + rbac.NODES


def operator_rbac(env: Env) -> None:
    """The chart's cluster-wide RBAC for its ServiceAccount (a ClusterRole with the rules of render/rbac.py)."""
    docs, _ = chart_rbac(f"rdo-{env.op_ns}", env.op_ns)
    for doc in docs:
        if doc["kind"] == "ServiceAccount":
            continue
        namespaced = doc["kind"] in ("Role", "RoleBinding")
        env.create(doc, doc["metadata"]["namespace"] if namespaced else None)


def cluster_roles(env: Env) -> list[str]:
    return [p for p in env.created if "/clusterroles/" in p]


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


def host_ip() -> str:
    """This machine's own address: kube-apiserver refuses loopback addresses in Endpoints and EndpointSlices."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: only the route is looked up
            ip = str(s.getsockname()[0])
        except OSError:
            ip = "127.0.0.1"
    if ip.startswith("127."):
        pytest.skip("no address but loopback: kube-apiserver refuses one as an endpoint")
    return ip


@pytest.fixture
def metrics_port() -> Iterator[tuple[str, int]]:
    """The operator pod's metrics server, on this machine's address, as the API server's service proxy reaches it."""
    server = ThreadingHTTPServer((host_ip(), 0), _Metrics)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield str(server.server_address[0]), int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def metrics_service(env: Env, endpoint: tuple[str, int] | None) -> None:
    """The chart's metrics Service and (``endpoint``) the address behind it. The Service selects no pods: theirs
    are on loopback, which kube-apiserver refuses as an endpoint, so its endpoints are written here, as for a
    Service without a selector (an Endpoints object and the EndpointSlice the mirroring controller would make)."""
    path = f"/api/v1/namespaces/{env.op_ns}/services/{METRICS_SERVICE}"
    if env.find(path) is None:
        env.create(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": METRICS_SERVICE, "labels": CHART_LABELS},
                "spec": {"ports": [{"name": "metrics", "port": 9090, "targetPort": 9090, "protocol": "TCP"}]},
            },
            env.op_ns,
        )
    if endpoint is not None:
        ip, port = endpoint
        # the service proxy dials an endpoint only where it targets a pod of that IP: the operator pod's network
        # reaches this machine's address (a node's CNI would give it a routable one)
        pods = env.request("GET", f"/api/v1/namespaces/{env.op_ns}/pods")["items"]
        pod = next(p for p in pods if is_ready(p))["metadata"]["name"]
        env.request(
            "PATCH",
            f"/api/v1/namespaces/{env.op_ns}/pods/{pod}/status",
            {"status": {"podIP": ip, "podIPs": [{"ip": ip}]}},
            content_type="application/merge-patch+json",
        )
        target = {"kind": "Pod", "namespace": env.op_ns, "name": pod}
        env.request(
            "POST",
            f"/api/v1/namespaces/{env.op_ns}/endpoints",
            {
                "apiVersion": "v1",
                "kind": "Endpoints",
                "metadata": {"name": METRICS_SERVICE},
                "subsets": [
                    {"addresses": [{"ip": ip, "targetRef": target}], "ports": [{"name": "metrics", "port": port}]}
                ],
            },
        )
        env.create(
            {
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": f"{METRICS_SERVICE}-1",
                    "labels": {
                        "kubernetes.io/service-name": METRICS_SERVICE,
                        "endpointslice.kubernetes.io/managed-by": "test.redrafter.dev",
                    },
                },
                "addressType": "IPv4",
                "endpoints": [{"addresses": [ip], "conditions": {"ready": True}, "targetRef": target}],
                "ports": [{"name": "metrics", "port": port, "protocol": "TCP"}],
            },
            env.op_ns,
        )


def dcgm_exporter(env: Env) -> None:
    """NVIDIA's DCGM exporter as the GPU Operator deploys it (assets/state-dcgm-exporter), in the operator's
    namespace here (the GPU Operator's would be cluster-wide)."""
    labels = {"app": "nvidia-dcgm-exporter"}
    env.create(
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "nvidia-dcgm-exporter", "labels": labels},
            "spec": {
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "nodeSelector": {"nvidia.com/gpu.present": "true"},
                        "containers": [{"name": "nvidia-dcgm-exporter", "image": "nvcr.io/nvidia/k8s/dcgm-exporter"}],
                    },
                },
            },
        },
        env.op_ns,
    )


def secret(env: Env, key: str = "token") -> None:
    env.kube.kubectl("create", "secret", "generic", "hf-token", f"--from-literal={key}={SECRET_VALUE}", check=True)


def install_crd(kube: Kube, path: Path) -> None:
    """Apply a CRD file (or a folder of them) and wait until each is Established."""
    kube.kubectl("apply", "--server-side", "-f", str(path), check=True)
    for file in sorted(path.glob("*.yaml")) if path.is_dir() else [path]:
        kube.cp.wait_established(yaml.safe_load(file.read_text())["metadata"]["name"])


async def prepare(
    env: Env, *, skip: frozenset[str] | set[str] = frozenset(), metrics: tuple[str, int] | None = None
) -> None:
    """A cluster where the example passes every check, less the parts named in ``skip`` (``metrics``: the
    address of the operator's metrics server; without it the operator-metrics check warns). The session's
    control plane has the CRD installed; ``test_crd`` removes it."""
    if "operator" not in skip:
        await operator(env, replicas=1)
    if "rbac" not in skip:
        operator_rbac(env)
    if "operator" not in skip and metrics is not None:
        metrics_service(env, metrics)
    if "nodes" not in skip:
        await node(env, "a100-0", A100, 8)
    if "claims" not in skip:
        await pvc(env, "engine-cache", ["ReadWriteMany"])
        await pvc(env, "drafters", ["ReadOnlyMany"])
    if "secret" not in skip:
        secret(env)
    if "dcgm" not in skip:
        dcgm_exporter(env)
    if "pod-security" not in skip:  # a hardened namespace: the operator's pods meet restricted
        labels = {
            "pod-security.kubernetes.io/enforce": "restricted",
            "pod-security.kubernetes.io/enforce-version": "latest",
        }
        env.merge(f"/api/v1/namespaces/{env.ns}", {"metadata": {"labels": labels}})


@pytest.fixture
async def env(kube: Kube, tmp_path: Path) -> AsyncIterator[Env]:
    """The test's two namespaces, the chart's ServiceAccount, and a CPU node (the only node it starts with) that
    holds the operator's pods Ready; everything cluster-scoped it created is deleted after it."""
    op = new_namespace(kube.cp, tmp_path / "op")
    docs, account = chart_rbac(f"rdo-{op.namespace}", op.namespace)
    (sa,) = [d for d in docs if d["kind"] == "ServiceAccount"]
    kube.cp.request("POST", f"/api/v1/namespaces/{op.namespace}/serviceaccounts", sa)
    e = Env(kube, op, account, tmp_path)
    cpu = SimNode(
        kube.cp.node_kubeconfig(CPU_NODE),
        name=CPU_NODE,
        product=None,
        gpus=0,
        node_dir=tmp_path / "cpu-node",
        heartbeat_seconds=5.0,
        stages=HeldPods(),
    )
    e.created.append(f"/api/v1/nodes/{CPU_NODE}")
    try:
        await cpu.start()
        yield e
    finally:
        for path in (  # gone at once, not when the namespace is: the checks list these in every namespace
            f"/apis/apps/v1/namespaces/{op.namespace}/deployments/redrafter-operator",
            f"/apis/apps/v1/namespaces/{op.namespace}/daemonsets/nvidia-dcgm-exporter",
            f"/api/v1/namespaces/{op.namespace}",
        ):
            with contextlib.suppress(urllib.error.HTTPError):
                kube.cp.request("DELETE", path)
        for sim in [cpu, *e.nodes]:
            await sim.stop()
        for path in reversed(e.created):
            with contextlib.suppress(urllib.error.HTTPError):
                kube.cp.request("DELETE", path)
        if kube.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD_NAME}") is None:
            install_crd(kube, CRDS)  # test_crd failed before it put it back


async def test_a_prepared_cluster_passes_every_check(env: Env, metrics_port: tuple[str, int]) -> None:
    await prepare(env, metrics=metrics_port)
    code, out, err = await check(env, "-f", str(EXAMPLE), "--operator-namespace", env.op_ns)
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
        f"✓ dcgm-exporter: NVIDIA's DCGM exporter runs: DaemonSet {env.op_ns}/nvidia-dcgm-exporter"
    )
    assert line(out, "pod-security llama3-8b") == (
        f"✓ pod-security llama3-8b: namespace {env.ns} enforces restricted:latest; the 5 pod templates the "
        "operator creates pass it"
    )
    print(out)  # the sample in docs/check.md

    # the same resource read back from the cluster, by name, as JSON
    env.kube.apply(example())
    code, out, err = await check(env, "llama3-8b", "-o", "json")
    assert code == 0, out + err
    doc = json.loads(out)
    assert doc["ok"] is True and set(doc) == {"checks", "ok"}
    assert all(set(c) == {"name", "status", "message", "fix"} and c["status"] == "ok" for c in doc["checks"])
    assert {c["name"] for c in doc["checks"]} >= {"crd", "operator", "credentials llama3-8b"}
    assert SECRET_VALUE not in out + err


async def test_crd(env: Env) -> None:
    """The CRD is cluster-wide: removed for this test, put back by it (or, if it fails first, by the fixture)."""
    await prepare(env)
    env.request("DELETE", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD_NAME}")
    await until(
        lambda: env.find(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD_NAME}") is None,
        what="the CRD removed",
    )
    code, out, _ = await check(env, "-f", str(EXAMPLE))
    assert code == 1
    assert line(out, "crd") == (
        f"✗ crd: CRD {CRD_NAME} is not installed\n"
        "    fix: kubectl apply --server-side -f charts/redrafter-operator/crds/"
    )
    install_crd(env.kube, ROOT / "charts" / "redrafter-operator" / "crds")
    code, out, _ = await check(env, "-f", str(EXAMPLE))
    assert code == 0, out
    assert line(out, "crd") == f"✓ crd: CRD {CRD_NAME} serves v1alpha1"


async def test_operator(env: Env) -> None:
    await prepare(env, skip={"operator"})
    code, out, _ = await check(env, "-f", str(EXAMPLE), "--operator-namespace", env.op_ns)
    assert code == 1
    assert line(out, "operator") == (
        f"✗ operator: no redrafter-operator Deployment in namespace {env.op_ns}\n"
        f"    fix: helm install redrafter charts/redrafter-operator -n {env.op_ns} --create-namespace"
    )
    await operator(env, replicas=2)
    code, out, _ = await check(env, "-f", str(EXAMPLE))  # found in any namespace
    assert code == 0, out
    assert line(out, "operator") == f"✓ operator: Deployment {env.op_ns}/redrafter-operator: 2 of 2 replicas ready"


def without_event_create(rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ClusterRole's rules less ``create`` on core events (split out of a rule that grants more)."""
    out = []
    for rule in rules:
        if "" not in rule.get("apiGroups", []) or "events" not in rule.get("resources", []):
            out.append(rule)
            continue
        others = [r for r in rule["resources"] if r != "events"]
        if others:
            out.append({**rule, "resources": others})
        verbs = [v for v in rule["verbs"] if v != "create"]
        if verbs:
            out.append({**rule, "resources": ["events"], "verbs": verbs})
    return out


async def test_operator_rbac(env: Env) -> None:
    """SubjectAccessReviews of render/rbac.py's needs for the Deployment's ServiceAccount, in the resource's
    namespace, answered by the real RBAC authorizer."""
    await prepare(env, skip={"rbac"})
    code, out, _ = await check(env, "-f", str(EXAMPLE))
    assert code == 1
    sa = f"ServiceAccount {env.op_ns}/{env.account}"
    first = line(out, "operator-rbac")
    assert first.startswith(f"✗ operator-rbac: {sa} may not create,list,patch,watch configmaps in {env.ns}, ")
    assert (
        "list,watch customresourcedefinitions.apiextensions.k8s.io\n" in first and f"create events in {env.ns}" in first
    )
    # the chart's rules less one: exactly that one is listed, with the chart's upgrade as the fix
    operator_rbac(env)
    roles = {path: env.request("GET", path)["rules"] for path in cluster_roles(env)}
    assert roles, "the chart grants a ClusterRole"
    for path, rules in roles.items():
        env.merge(path, {"rules": without_event_create(rules)})
    code, out, _ = await check(env, "-f", str(EXAMPLE))
    assert code == 1
    assert line(out, "operator-rbac") == (
        f"✗ operator-rbac: {sa} may not create events in {env.ns}\n"
        f"    fix: helm upgrade redrafter-operator charts/redrafter-operator -n {env.op_ns} --reuse-values --set "
        "rbac.create=true (the chart grants exactly what the operator needs), or grant these in the (Cluster)Role "
        "bound to it"
    )
    for path, rules in roles.items():
        env.merge(path, {"rules": rules})
    code, out, _ = await check(env, "-f", str(EXAMPLE))
    assert code == 0, out
    need = len(rbac.calls(CHART_RULES))
    assert line(out, "operator-rbac") == f"✓ operator-rbac: {sa} may do all {need} things the operator needs"


async def test_operator_metrics(env: Env, metrics_port: tuple[str, int]) -> None:
    """/metrics of the chart's metrics Service through the API server's service proxy; a warning, never a failure."""
    await prepare(env)
    code, out, _ = await check(env, "-f", str(EXAMPLE))
    assert code == 0, out
    assert line(out, "operator-metrics") == (
        f"! operator-metrics: no Service with a metrics port beside Deployment {env.op_ns}/redrafter-operator\n"
        f"    fix: helm upgrade redrafter-operator charts/redrafter-operator -n {env.op_ns} --reuse-values (the chart "
        "creates it)"
    )
    metrics_service(env, None)  # no ready pod behind it
    code, out, _ = await check(env, "-f", str(EXAMPLE))
    assert line(out, "operator-metrics").startswith(
        f"! operator-metrics: Service {env.op_ns}/{METRICS_SERVICE}:metrics does not answer /metrics through the "
        f'API server (503: no endpoints available for service "{METRICS_SERVICE}")\n'
    ), out
    metrics_service(env, metrics_port)
    code, out, _ = await check(env, "-f", str(EXAMPLE))
    assert code == 0, out
    assert line(out, "operator-metrics") == (
        f"✓ operator-metrics: Service {env.op_ns}/{METRICS_SERVICE}:metrics answers /metrics (1 samples)"
    )


def test_operator_partly_ready_warns_and_none_ready_fails() -> None:
    partly = ClusterFacts(operator_deployments=(DeploymentFacts("redrafter-system", "op", replicas=2, ready=1),))
    assert check_operator(partly).status == "warn"
    down = ClusterFacts(operator_deployments=(DeploymentFacts("redrafter-system", "op", replicas=2, ready=0),))
    assert check_operator(down).status == "fail" and "describe deployment op" in (check_operator(down).fix or "")


async def test_gpu_nodes_and_gpu_product(env: Env) -> None:
    await prepare(env, skip={"nodes"})
    code, out, _ = await check(env, "-f", str(EXAMPLE))
    assert code == 1
    assert line(out, "gpu-nodes") == (
        "✗ gpu-nodes: no node has allocatable nvidia.com/gpu (1 node(s))\n"  # the CPU node the operator runs on
        "    fix: install the NVIDIA GPU Operator or device plugin"
    )
    assert line(out, "gpu-product llama3-8b").startswith(
        f"✗ gpu-product llama3-8b: no node offers 1× {A100}; nodes: 1× unlabelled (0 each)"  # the CPU node
    )
    for i in range(3):
        await node(env, f"h100-{i}", H100, 8)
    code, out, _ = await check(env, "-f", str(EXAMPLE))
    assert code == 1
    assert line(out, "gpu-nodes") == "✓ gpu-nodes: 3 node(s) with nvidia.com/gpu, 24 allocatable"
    assert line(out, "gpu-product llama3-8b") == (
        f"✗ gpu-product llama3-8b: no node offers 1× {A100}; nodes: 3× {H100} (8 each), 1× unlabelled (0 each)\n"
        f"    fix: add nodes with {A100}, or set spec.engine.build.gpuProduct to one of: {H100}"
    )
    await node(env, "a100-0", A100, 8)
    code, out, _ = await check(env, "-f", str(EXAMPLE))
    assert code == 0, out
    assert line(out, "gpu-product llama3-8b") == f"✓ gpu-product llama3-8b: 1 node(s) offer 1× {A100}: a100-0"


async def test_driver(env: Env) -> None:
    await prepare(env, skip={"nodes"})
    await node(env, "a100-old", A100, 8, driver=550)
    code, out, _ = await check(env, "-f", str(EXAMPLE))
    assert code == 1
    assert line(out, "driver llama3-8b") == (
        "✗ driver llama3-8b: Triton 26.07 needs driver R590+; older on a100-old (R550)\n"
        "    fix: upgrade the NVIDIA driver on those nodes to R590 or later (GPU Operator: driver.version)"
    )
    # GFD's current label wins over the deprecated one it still writes beside it
    labels = {"nvidia.com/cuda.driver-version.major": "595", "nvidia.com/cuda.driver.major": "550"}
    env.merge("/api/v1/nodes/a100-old", {"metadata": {"labels": labels}})
    code, out, _ = await check(env, "-f", str(EXAMPLE))
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


async def test_cache_claim_and_source_claims(env: Env) -> None:
    await prepare(env, skip={"claims"})
    await pvc(env, "engine-cache", ["ReadWriteOnce"])
    code, out, _ = await check(env, "-f", str(EXAMPLE))
    assert code == 1
    assert line(out, "cache-claim llama3-8b") == (
        f"✗ cache-claim llama3-8b: PVC {env.ns}/engine-cache is ReadWriteOnce, not ReadWriteMany: build Jobs and "
        "serving pods on different nodes share it\n"
        "    fix: recreate engine-cache with accessModes: [ReadWriteMany] on an RWX StorageClass (NFS, CephFS, EFS, "
        "Filestore)"
    )
    assert line(out, "source-claims llama3-8b") == (
        f"✗ source-claims llama3-8b: PVC {env.ns}/drafters (a pvc:// source) not found\n"
        f"    fix: create a PersistentVolumeClaim drafters in {env.ns} (kubectl -n {env.ns} apply -f pvc.yaml)"
    )
    claim = f"/api/v1/namespaces/{env.ns}/persistentvolumeclaims/engine-cache"
    env.request("DELETE", claim)
    await until(lambda: env.find(claim) is None, what="the claim deleted")
    await pvc(env, "engine-cache", ["ReadWriteMany"])
    await pvc(env, "drafters", ["ReadOnlyMany"])
    code, out, _ = await check(env, "-f", str(EXAMPLE))
    assert code == 0, out
    assert line(out, "cache-claim llama3-8b") == (
        f"✓ cache-claim llama3-8b: PVC {env.ns}/engine-cache is Bound, ReadWriteMany, 500Gi: room for the engines "
        "(estimated 38 GiB: 8B parameters: base 15 GiB + ReDrafter 16 GiB + 20% headroom)"
    )
    assert line(out, "source-claims llama3-8b") == (
        f"✓ source-claims llama3-8b: PVC(s) {env.ns}/drafters of the pvc:// sources are Bound"
    )


async def test_credentials(env: Env) -> None:
    await prepare(env, skip={"secret"})
    code, out, _ = await check(env, "-f", str(EXAMPLE))
    assert code == 1
    assert line(out, "credentials llama3-8b") == (
        f"✗ credentials llama3-8b: Secret {env.ns}/hf-token not found\n"
        f"    fix: kubectl -n {env.ns} create secret generic hf-token --from-literal=token=<your Hugging Face token>"
    )
    secret(env, key="hf_token")  # the wrong key name
    code, out, err = await check(env, "-f", str(EXAMPLE))
    assert code == 1 and SECRET_VALUE not in out + err
    assert line(out, "credentials llama3-8b").startswith(
        f"✗ credentials llama3-8b: Secret {env.ns}/hf-token has no key token (keys: hf_token)\n"
    )
    env.kube.kubectl("delete", "secret", "hf-token", check=True)
    secret(env)
    code, out, err = await check(env, "-f", str(EXAMPLE), "-o", "json")
    assert code == 0, out
    assert SECRET_VALUE not in out + err
    creds = [c for c in json.loads(out)["checks"] if c["name"] == "credentials llama3-8b"]
    assert creds == [
        {
            "name": "credentials llama3-8b",
            "status": "ok",
            "message": f"Secret(s) {env.ns}/hf-token hold the keys the Jobs read",
            "fix": None,
        }
    ]


async def test_inference_pool(env: Env, tmp_path: Path) -> None:
    """The InferencePool CRD is cluster-wide: installed by this test and removed after it."""
    await prepare(env)
    body = example(routing={"inferencePool": {"enabled": True, "endpointPickerRef": {"name": "epp", "port": 9002}}})
    path = write(tmp_path, body)
    code, out, _ = await check(env, "-f", path)
    assert code == 1, out
    assert line(out, "inference-pool llama3-8b") == (
        "✗ inference-pool llama3-8b: spec.routing.inferencePool.enabled, but the InferencePool CRD "
        "(inferencepools.inference.networking.k8s.io, v1) is not installed\n"
        "    fix: install it from kubernetes-sigs/gateway-api-inference-extension v1.0.0 or later, or set "
        "spec.routing.inferencePool.enabled: false"
    )
    crd = yaml.safe_load(INFERENCE_POOL_CRD.read_text())["metadata"]["name"]
    env.created.append(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}")
    install_crd(env.kube, INFERENCE_POOL_CRD)
    code, out, _ = await check(env, "-f", path)
    assert code == 0, out
    assert line(out, "inference-pool llama3-8b") == (
        "✓ inference-pool llama3-8b: CRD inferencepools.inference.networking.k8s.io serves v1"
    )


async def test_an_invalid_spec_fails_with_the_first_error(env: Env, tmp_path: Path) -> None:
    await prepare(env)
    code, out, _ = await check(env, "-f", write(tmp_path, example(parallelism={"tensor": 3})))
    assert code == 1
    spec_line = line(out, "spec llama3-8b")
    assert spec_line.startswith(f"✗ spec llama3-8b: {env.ns}/llama3-8b is invalid: spec.parallelism.tensor: ")
    assert "gpu-product llama3-8b" not in out  # nothing else is judged from an invalid spec


def test_an_unreachable_api_server_is_one_line_and_exit_2(tmp_path: Path) -> None:
    kubeconfig = write_yaml(
        tmp_path / "kubeconfig",
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:9"}}],  # the discard port: refused
            "users": [{"name": "u", "user": {}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "c",
        },
    )
    proc = subprocess.run(
        [str(CLI), "check", "--kubeconfig", str(kubeconfig), "-f", str(EXAMPLE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    code, out, err = proc.returncode, proc.stdout, proc.stderr
    assert code == 2 and out == ""
    assert err.startswith("error: cannot reach the API server at http://127.0.0.1:9") and err.count("\n") == 1, err


async def test_a_forbidden_read_is_a_warning_not_an_error(env: Env) -> None:
    """The check run by a user whose requests pass a fault proxy that forbids three reads (the rest of what it
    asks kube-apiserver answers as for an admin: the user's ServiceAccount is bound to cluster-admin)."""
    await prepare(env)
    user = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "checker"}}
    env.create(user, env.ns)
    env.create(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"checker-{env.ns}"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"kind": "ServiceAccount", "name": "checker", "namespace": env.ns}],
        }
    )
    token = env.cp.service_account_kubeconfig(env.home / "checker.kubeconfig", env.ns, "checker")
    with FaultProxy(env.cp) as proxy:
        kubeconfig = proxy.kubeconfig(token, env.home / "checker-proxy.kubeconfig")
        proxy.inject(403, times=100, methods=["GET"], path=r"^/api/v1/nodes$", message="nodes is forbidden")
        proxy.inject(403, times=100, methods=["GET"], path=r"/secrets/hf-token$", message="secrets is forbidden")
        proxy.inject(
            403,
            times=100,
            methods=["POST"],
            path=r"/subjectaccessreviews$",
            message="subjectaccessreviews is forbidden",
        )
        code, out, err = await check(env, "-f", str(EXAMPLE), kubeconfig=kubeconfig)
    assert code == 0, out + err
    assert line(out, "operator-rbac") == (
        f"! operator-rbac: cannot ask what ServiceAccount {env.op_ns}/{env.account} may do: creating "
        "SubjectAccessReviews failed (403 Forbidden: subjectaccessreviews is forbidden)\n"
        "    fix: run as a user who may create subjectaccessreviews.authorization.k8s.io, or try kubectl auth can-i "
        f"--list --as=system:serviceaccount:{env.op_ns}:{env.account}"
    )
    assert line(out, "gpu-nodes").startswith("! gpu-nodes: cannot list nodes (403 ")
    assert line(out, "credentials llama3-8b").startswith(
        f"! credentials llama3-8b: cannot read Secret {env.ns}/hf-token"
    )
    assert "gpu-product llama3-8b" not in out  # cannot be judged without the nodes
