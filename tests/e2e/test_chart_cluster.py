"""The chart on a real control plane, as a user installs it: ``helm install`` (release storage in Secrets, Helm's
default) against kube-apiserver, the operator running as the chart's Deployment Pod on a kubelet (the simulated
node), in-cluster under the chart's ServiceAccount and RBAC; ``helm test`` runs ``redrafter-operator check`` in its
own Pod under the test hook's ServiceAccount; the in-cluster operator builds an example's engines; ``helm upgrade``
runs the CRD hook Job (kubectl in a Pod); ``helm uninstall`` keeps the CRD.

Nothing plays the cluster here but Kubernetes itself and the node: the real scheduler binds the Pods, the real
Deployment, ReplicaSet and Job controllers make and judge them, RBAC and PodSecurity (restricted, in both
namespaces) are kube-apiserver's. A verb the chart does not grant fails the operator or the check as it would on
a cluster; their logs are asserted free of "forbidden".

Helm's own calls block, so they run in threads while the node (a kubelet on this event loop) runs the Pods.
"""

from __future__ import annotations

import asyncio
import copy
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

import redrafter_operator
from harness.cluster import Kube, delete_namespace, new_namespace
from harness.waiting import until
from redrafter_operator.render.podsecurity import ENFORCE_LABEL, ENFORCE_VERSION_LABEL
from redrafter_sim import nodes
from redrafter_sim.controlplane import ControlPlane
from redrafter_sim.kubeapi import (
    CONFIGMAPS,
    CRDS,
    DEPLOYMENTS,
    JOBS,
    NODES,
    PODS,
    PVCS,
    PVS,
    SERVICE_ACCOUNTS,
    ApiStatusError,
    Kind,
    KubeApi,
)
from redrafter_sim.node import SimNode
from redrafter_sim.podns import SERVICE_ACCOUNT_DIR
from redrafter_sim.triton import TritonInstall, TritonUnavailable

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "redrafter-operator"
RELEASE = "rdo"
FULLNAME = f"{RELEASE}-redrafter-operator"
CRD_NAME = "redrafterdeployments.redrafter.dev"
RDDS = Kind("redrafter.dev/v1alpha1", "redrafterdeployments")
ROLES = Kind("rbac.authorization.k8s.io/v1", "roles")
CLUSTER_ROLES = Kind("rbac.authorization.k8s.io/v1", "clusterroles", namespaced=False)
RESTRICTED = {ENFORCE_LABEL: "restricted", ENFORCE_VERSION_LABEL: "latest"}
CLAIMS = ("models", "engine-cache")  # what examples/demo-tiny.yaml reads and writes

#: the run modes: the operator's RBAC a ClusterRole (every namespace), or Roles in the watched namespace only
MODES = {"cluster": False, "watch-namespaces": True}


class Timings(dict[str, float]):
    """Wall-clock seconds of each step, printed at the end (``pytest -s``)."""

    def __init__(self) -> None:
        super().__init__()
        self._t = time.monotonic()

    def lap(self, step: str) -> None:
        now = time.monotonic()
        self[step] = round(now - self._t, 1)
        self._t = now


@pytest.fixture
async def admin(control_plane: ControlPlane) -> AsyncIterator[KubeApi]:
    async with KubeApi.from_kubeconfig(control_plane.admin_kubeconfig, timeout=30) as api:
        yield api


async def _create(api: KubeApi, kind: Kind, body: dict[str, Any], namespace: str | None = None) -> None:
    """Create unless it exists (the session's control plane is shared)."""
    try:
        await api.create(kind, body, namespace)
    except ApiStatusError as exc:
        if exc.code != 409:
            raise


def _forbidden(text: str) -> list[str]:
    """The log lines of an RBAC denial (``... is forbidden: User "..." cannot ...``). Not the 403 of a write into a
    namespace being deleted: the cluster-wide operator also sees the namespaces other tests leave terminating."""
    return [line for line in text.splitlines() if re.search(r"forbidden: User \\?\"[^\"\\]+\\?\" cannot", line)]


def _pod_log(node: SimNode, pod: dict[str, Any]) -> str:
    """The container's output as the node has it: from its pod directory while it runs, else as kept."""
    meta = pod["metadata"]
    running = node.fs.pod_root(meta["namespace"], meta["name"]).root / "container.log"
    if running.is_file():
        return running.read_text(errors="replace")
    name = pod["spec"]["containers"][0]["name"]
    return node.runner.logs.get((meta["namespace"], meta["name"], name), "")


def _logs(node: SimNode, namespace: str) -> str:
    """The output of every container that exited in ``namespace`` (for a failure's message)."""
    return "\n".join(
        f"--- {pod}/{c}:\n{text[-3000:]}" for (ns, pod, c), text in node.runner.logs.items() if ns == namespace
    )


@pytest.mark.parametrize("mode", sorted(MODES))
async def test_the_chart_installs_tests_runs_upgrades_and_uninstalls_on_a_real_cluster(
    mode: str, control_plane: ControlPlane, admin: KubeApi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cp, timings = control_plane, Timings()
    # the pods' processes inherit this environment: with no kubeconfig anywhere in it, the in-cluster
    # service account (the token the node mounts at the fixed path) is the only way they can reach the API
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    system = new_namespace(cp, tmp_path / "system", labels=RESTRICTED)  # the release's namespace
    work = new_namespace(cp, tmp_path / "work", labels=RESTRICTED)  # where the example goes
    node_name = f"gpu-{uuid.uuid4().hex[:8]}"
    proxy = cp.write_kubeconfig(tmp_path / "kube-proxy.kubeconfig", "system:kube-proxy")
    node = SimNode(
        cp.node_kubeconfig(node_name),
        name=node_name,
        proxy_kubeconfig=proxy,
        node_dir=tmp_path / "node",
        heartbeat_seconds=2.0,
        parallel=3,  # the operator's Pod holds one of the node's process slots for its whole life
    )
    values: dict[str, Any] = {"watchNamespaces": [work.namespace]} if MODES[mode] else {}
    await node.start()
    try:
        # what a GPU cluster has before the chart: NVIDIA's DCGM exporter, the example's claims
        for obj in nodes.dcgm_exporter():
            await asyncio.to_thread(system.apply, obj)
        for claim in CLAIMS:
            pv, pvc = node.claim_objects(work.namespace, claim)
            await _create(admin, PVS, pv)
            await _create(admin, PVCS, pvc, work.namespace)
        for claim in CLAIMS:  # the PV binder binds them: `check` in the helm test reads them Bound

            async def bound(claim: str = claim) -> bool:
                found = await admin.get(PVCS, claim, work.namespace) or {}
                return bool((found.get("status") or {}).get("phase") == "Bound")

            await until(bound, timeout=60, what=f"claim {claim} Bound")
        timings.lap("node and cluster objects")
        with helm.Config(kubeconfig_path=str(system.kubeconfig), namespace=system.namespace) as cfg:
            await _install_and_test(cfg, system, admin, node, values, timings)
            await _operator_builds_the_example(work, admin, node, system, timings)
            await _upgrade_with_the_crd_hook(cfg, system, admin, node, values, timings)
            await _uninstall_keeps_the_crd(cfg, system, admin, timings)
    finally:
        await node.stop()
        delete_namespace(work)
        delete_namespace(system)
        for claim in CLAIMS:
            pv_name = node.claim_objects(work.namespace, claim)[0]["metadata"]["name"]
            await admin.delete(PVS, pv_name)
        await admin.delete(NODES, node_name)
    print(f"\n{mode}: seconds per step {dict(timings)}")


async def _operator_pod(admin: KubeApi, namespace: str) -> dict[str, Any] | None:
    selector = "app.kubernetes.io/component=operator,app.kubernetes.io/instance=" + RELEASE
    pods = await admin.list(PODS, namespace, label_selector=selector)
    return next((p for p in pods if not p["metadata"].get("deletionTimestamp")), None)


async def _install_and_test(
    cfg: helm.Config, system: Kube, admin: KubeApi, node: SimNode, values: dict[str, Any], timings: Timings
) -> None:
    """Install; the Deployment's Pod becomes Ready on the node (its readinessProbe passes); ``helm test``."""
    release = await asyncio.to_thread(cfg.install, str(CHART), RELEASE, values, namespace=system.namespace, timeout=120)
    assert release["status"] == "deployed" and release["app_version"] == redrafter_operator.__version__
    assert "kubectl get rdd" in release["notes"]
    crds = {c["metadata"]["name"] for c in await admin.list(CRDS)}
    assert CRD_NAME in crds and not [c for c in crds if c.endswith(".kopf.dev")]
    watched = values.get("watchNamespaces")
    role = await admin.get(ROLES if watched else CLUSTER_ROLES, FULLNAME, watched[0] if watched else None)
    assert role is not None, "the operator's (Cluster)Role"
    # Helm's default storage: the release is a Secret in its namespace (the emulated tests kept it in memory)
    stored = await asyncio.to_thread(
        system.kubectl, "get", "secrets", "-l", f"owner=helm,name={RELEASE}", "-o", "name", check=True
    )
    assert stored.stdout.strip() == f"secret/sh.helm.release.v1.{RELEASE}.v1"
    timings.lap("helm install")

    async def available() -> bool:
        dep = await admin.get(DEPLOYMENTS, FULLNAME, system.namespace)
        return bool(dep) and (dep.get("status") or {}).get("availableReplicas") == 1

    try:
        await until(available, 90, "the operator Deployment to be available (its Pod Ready)")
    except AssertionError:
        pod = await _operator_pod(admin, system.namespace)
        raise AssertionError(f"pod: {pod and pod.get('status')}\nlog:\n{pod and _pod_log(node, pod)[-4000:]}") from None
    pod = await _operator_pod(admin, system.namespace)
    assert pod is not None and pod["spec"]["nodeName"] == node.name
    (container,) = pod["spec"]["containers"]
    assert any(m["mountPath"] == SERVICE_ACCOUNT_DIR for m in container["volumeMounts"])  # the admission plugin's
    ready = next(c for c in pod["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True"
    log = _pod_log(node, pod)
    assert not _forbidden(log), log[-4000:]
    # the chart's ServiceAccount may do what the operator needs (kube-apiserver's RBAC, asked as the admin)
    who = await asyncio.to_thread(
        system.kubectl,
        "auth",
        "can-i",
        "list",
        "nodes",
        f"--as=system:serviceaccount:{system.namespace}:{FULLNAME}",
    )
    assert who.stdout.strip() == "yes", who.stderr
    timings.lap("operator Ready")

    try:
        tested = await asyncio.to_thread(cfg.test, RELEASE, timeout=120)
    except helm.HelmError as exc:
        raise AssertionError(f"helm test failed: {exc}\n{_logs(node, system.namespace)}") from None
    assert tested["release"]["status"] == "deployed"
    check_log = node.runner.logs[(system.namespace, f"{FULLNAME}-check", "check")]
    assert not _forbidden(check_log), check_log
    verdicts = {line[2:].split(":")[0]: line[0] for line in check_log.splitlines() if line[:2] in ("✓ ", "! ", "✗ ")}
    # every check passed under the test hook's ServiceAccount (its own reads: "access"), the operator's rights
    # reviewed for the chart's ServiceAccount, the GPU node and DCGM found; one warning, this machine's: the
    # EndpointSlice controller cannot publish the pods' loopback IPs, so the service proxy finds no endpoint
    assert {k for k, v in verdicts.items() if v != "✓"} == {"operator-metrics"}, check_log
    assert {"crd", "operator", "operator-rbac", "gpu-nodes", "dcgm-exporter", "access"} <= set(verdicts), check_log
    assert "no endpoints available" in check_log, check_log
    timings.lap("helm test")


async def _operator_builds_the_example(
    work: Kube, admin: KubeApi, node: SimNode, system: Kube, timings: Timings
) -> None:
    """The in-cluster operator acts on a ReDrafterDeployment: its build Jobs, run by the node, complete; where
    this machine has tritonserver, the example goes on to serve (Deployments, Services, the NetworkPolicy, the
    validation Job, the metrics scrapes: the rest of the operator's rules)."""
    doc = yaml.safe_load((ROOT / "examples" / "demo-tiny.yaml").read_text())
    doc["metadata"]["namespace"] = work.namespace
    await asyncio.to_thread(work.apply, doc)
    listed = await asyncio.to_thread(work.kubectl, "get", "rdd", "-o", "name", check=True)  # the CRD's short name
    assert listed.stdout.strip() == "redrafterdeployment.redrafter.dev/demo-tiny"

    async def built() -> list[dict[str, Any]]:
        jobs = await admin.list(JOBS, work.namespace)
        return [
            j for j in jobs if any(c["type"] == "Complete" for c in (j.get("status") or {}).get("conditions") or [])
        ]

    async def phase() -> str:
        rdd = await admin.get(RDDS, "demo-tiny", work.namespace)
        return str(((rdd or {}).get("status") or {}).get("phase", ""))

    async def explain(what: str) -> AssertionError:
        rdd = await admin.get(RDDS, "demo-tiny", work.namespace)
        pod = await _operator_pod(admin, system.namespace)
        jobs = [(j["metadata"]["name"], j.get("status")) for j in await admin.list(JOBS, work.namespace)]
        return AssertionError(
            f"{what}\nstatus: {(rdd or {}).get('status')}\njobs: {jobs}\n{_logs(node, work.namespace)}\n"
            f"operator log:\n{pod and _pod_log(node, pod)[-4000:]}"
        )

    try:
        done = await until(built, 180, "a build Job of the in-cluster operator to complete")
    except AssertionError as exc:
        raise await explain(str(exc)) from None
    assert {j["metadata"]["labels"]["app.kubernetes.io/component"] for j in done} <= {"engine-build", "validation"}
    assert await phase() not in ("", "Pending")
    timings.lap("example built")
    try:
        TritonInstall.find()
    except TritonUnavailable:
        pass
    else:
        try:
            await until(lambda: _is(phase(), "Serving"), 240, "the example to serve")
        except AssertionError as exc:
            raise await explain(str(exc)) from None
        timings.lap("example Serving")
    pod = await _operator_pod(admin, system.namespace)
    assert pod is not None
    log = _pod_log(node, pod)
    assert not _forbidden(log), log[-4000:]


async def _is(value: Awaitable[str], wanted: str) -> bool:
    return await value == wanted


async def _upgrade_with_the_crd_hook(
    cfg: helm.Config, system: Kube, admin: KubeApi, node: SimNode, values: dict[str, Any], timings: Timings
) -> None:
    """A stale CRD in the cluster (as after a chart whose API changed); the pre-upgrade hook Job runs kubectl
    in a Pod and applies the chart's CRD back, then every hook object is deleted."""
    crd = await admin.get(CRDS, CRD_NAME)
    assert crd is not None
    original = copy.deepcopy(crd["spec"]["names"]["shortNames"])
    await admin.patch(CRDS, CRD_NAME, None, {"spec": {"names": {"shortNames": ["stale"]}}})
    try:
        upgraded = await asyncio.to_thread(
            cfg.upgrade,
            str(CHART),
            RELEASE,
            {**values, "crds": {"upgradeJob": {"enabled": True}}},
            namespace=system.namespace,
            timeout=120,
        )
    except helm.HelmError as exc:
        raise AssertionError(f"helm upgrade failed: {exc}\n{_logs(node, system.namespace)}") from None
    assert upgraded["status"] == "deployed" and upgraded["revision"] == 2
    crd = await admin.get(CRDS, CRD_NAME)
    assert crd is not None and crd["spec"]["names"]["shortNames"] == original == ["rdd"]
    hook = f"{FULLNAME}-crd-upgrade"
    for kind, namespace in (
        (JOBS, system.namespace),
        (CONFIGMAPS, system.namespace),
        (SERVICE_ACCOUNTS, system.namespace),
        (CLUSTER_ROLES, None),
    ):
        assert await admin.get(kind, hook, namespace) is None, kind  # hook-succeeded: every hook object deleted
    timings.lap("helm upgrade (CRD hook Job)")


async def _uninstall_keeps_the_crd(cfg: helm.Config, system: Kube, admin: KubeApi, timings: Timings) -> None:
    await asyncio.to_thread(cfg.uninstall, RELEASE, timeout=60)
    assert await admin.get(DEPLOYMENTS, FULLNAME, system.namespace) is None
    assert await admin.get(CRDS, CRD_NAME) is not None  # Helm keeps CRDs, and so every ReDrafterDeployment

    async def gone() -> bool:
        return await _operator_pod(admin, system.namespace) is None

    await until(gone, 60, "the operator Pod to be gone")
    timings.lap("helm uninstall")
