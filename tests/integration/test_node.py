"""The simulated node as a kubelet of a real control plane (kube-apiserver, etcd, the controller manager and the
scheduler built by ``make controlplane``): it registers and keeps its Lease as ``system:node:<name>``, runs the Pods
the real Job and ReplicaSet controllers create and the real scheduler binds to it, and reports them so that those
controllers compute Job and Deployment status; the real EndpointSlice controller lists its serving pods.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import itertools
import json
import re
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from engine_jobs import contract
from redrafter_operator.controller.facts import DeploymentFact, ServingPodFact
from redrafter_operator.render import names
from redrafter_operator.render.build import build_configmap, build_job, build_spec
from redrafter_operator.render.common import Owner
from redrafter_sim.controlplane import ControlPlane, missing_binaries
from redrafter_sim.kubeapi import (
    CONFIGMAPS,
    DEPLOYMENTS,
    JOBS,
    LEASES,
    NODES,
    PODS,
    PVCS,
    PVS,
    SECRETS,
    SERVICE_ACCOUNTS,
    SERVICES,
    ApiStatusError,
    Kind,
    KubeApi,
)
from redrafter_sim.node import SimNode
from redrafter_sim.router import NoEndpoints, ServiceRouter
from redrafter_sim.triton import TritonInstall, TritonUnavailable

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
NODE = "sim-node-0"
NAMESPACES = Kind("v1", "namespaces", namespaced=False)
EVENTS = Kind("v1", "events")
_serial = itertools.count()


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    absent = missing_binaries()
    if absent:
        pytest.fail(
            f"the control-plane binaries are missing ({', '.join(absent)}): build them with `make controlplane`"
        )
    cp = ControlPlane(tmp_path_factory.mktemp("controlplane")).start()
    try:
        yield cp
    finally:
        cp.stop()


@pytest.fixture
async def admin(control_plane: ControlPlane) -> AsyncIterator[KubeApi]:
    async with KubeApi.from_kubeconfig(control_plane.admin_kubeconfig, timeout=30) as api:
        yield api


async def wait_for(predicate: Callable[[], Any], timeout: float = 60.0, what: str = "condition") -> Any:
    """Poll ``predicate`` (sync or async) every 0.2 s until it is truthy, bounded by ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.fixture
async def ns(admin: KubeApi) -> AsyncIterator[str]:
    name = f"node-test-{next(_serial)}-{int(time.time()) % 100000}"
    await admin.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    await wait_for(lambda: admin.get(SERVICE_ACCOUNTS, "default", name), 30, "the default ServiceAccount")
    yield name


@pytest.fixture
async def node(control_plane: ControlPlane, admin: KubeApi, ns: str, tmp_path: Path) -> AsyncIterator[SimNode]:
    """The node, with kube-proxy's identity for Services; torn down after its namespace is gone (so the next
    test's node inherits no pod)."""
    proxy = control_plane.write_kubeconfig(tmp_path / "kube-proxy.kubeconfig", user="system:kube-proxy")
    sim = SimNode(control_plane.node_kubeconfig(NODE), name=NODE, proxy_kubeconfig=proxy, heartbeat_seconds=1.0)
    await sim.start()
    try:
        for claim in ("engine-cache", "models"):
            pv, pvc = sim.claim_objects(ns, claim)
            if await admin.get(PVS, pv["metadata"]["name"]) is None:
                await admin.create(PVS, pv)
            await admin.create(PVCS, pvc, ns)
        yield sim
    finally:
        with_pods = await admin.list(PODS, ns)
        await admin.delete(NAMESPACES, ns)
        if with_pods:
            await wait_for(lambda: _no_pods(admin, ns), 90, f"the pods of {ns} to be gone")
        await sim.stop()
        for claim in ("engine-cache", "models"):
            await admin.delete(PVS, sim.claim_objects(ns, claim)[0]["metadata"]["name"])


async def _no_pods(admin: KubeApi, ns: str) -> bool:
    return not await admin.list(PODS, ns)


def demo_owner(namespace: str, **spec_changes: Any) -> Owner:
    body = yaml.safe_load((ROOT / "examples" / "demo-tiny.yaml").read_text())
    body["metadata"].update(namespace=namespace, uid="11111111-2222-3333-4444-555555555555")
    for path, value in spec_changes.items():
        target = body["spec"]
        *parents, leaf = path.split(".")
        for p in parents:
            target = target.setdefault(p, {})
        target[leaf] = value
    return Owner.from_body(body)


def without_owner(obj: dict[str, Any]) -> dict[str, Any]:
    """The rendered object without its owner reference (no ReDrafterDeployment exists here: the real garbage
    collector would delete a dependent whose owner is absent)."""
    obj["metadata"].pop("ownerReferences", None)
    return obj


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    return next((c for c in ((obj or {}).get("status") or {}).get("conditions") or [] if c["type"] == kind), None)


async def finished(admin: KubeApi, ns: str, job: str) -> str:
    body = await admin.get(JOBS, job, ns)
    for kind in ("Complete", "Failed"):
        if (condition(body, kind) or {}).get("status") == "True":
            return kind
    return ""


async def job_pods(admin: KubeApi, ns: str, job: str) -> list[dict[str, Any]]:
    return await admin.list(PODS, ns, label_selector=f"batch.kubernetes.io/job-name={job}")


async def run_build(admin: KubeApi, owner: Owner, variant: str = "base") -> str:
    ns = owner.namespace
    await admin.create(CONFIGMAPS, without_owner(build_configmap(owner, variant)), ns)
    job = await admin.create(JOBS, without_owner(build_job(owner, variant)), ns)
    name: str = job["metadata"]["name"]
    await wait_for(lambda: finished(admin, ns, name), 120, f"Job {name} to finish")
    return name


# ---------------------------------------------------------------------------- the node itself
async def test_the_node_registers_with_its_gpus_and_renews_its_lease(admin: KubeApi, node: SimNode):
    body = await admin.get(NODES, NODE)
    assert body is not None
    labels = body["metadata"]["labels"]
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3" and labels["nvidia.com/gpu.count"] == "8"
    assert body["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert {"cpu", "memory", "pods"} <= set(body["status"]["allocatable"])
    assert (condition(body, "Ready") or {}).get("status") == "True"
    assert {"type": "InternalIP", "address": "127.0.0.1"} in body["status"]["addresses"]

    lease = await admin.get(LEASES, NODE, "kube-node-lease")
    assert lease is not None and lease["spec"]["holderIdentity"] == NODE
    assert lease["metadata"]["ownerReferences"][0]["uid"] == body["metadata"]["uid"]
    first = lease["spec"]["renewTime"]

    async def renewed() -> bool:
        again = await admin.get(LEASES, NODE, "kube-node-lease")
        return bool(again and again["spec"]["renewTime"] > first)

    await wait_for(renewed, 10, "the lease renewed")
    # the node's identity is a node's: the Node authorizer denies a Secret no pod on it references
    await admin.create(
        SECRETS, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "x"}, "data": {}}, "default"
    )
    try:
        with pytest.raises(ApiStatusError) as denied:
            await node.api.get(SECRETS, "x", "default")
        assert denied.value.code == 403
    finally:
        await admin.delete(SECRETS, "x", "default")


# ---------------------------------------------------------------------------- Jobs: the real Job controller
async def test_a_build_job_completes_through_the_real_job_controller(admin: KubeApi, node: SimNode, ns: str):
    owner = demo_owner(ns)
    name = await run_build(admin, owner)
    job = await admin.get(JOBS, name, ns)
    assert await finished(admin, ns, name) == "Complete", job
    assert job is not None and job["status"]["succeeded"] == 1 and job["status"].get("completionTime")
    (pod,) = await job_pods(admin, ns, name)
    assert pod["spec"]["nodeName"] == NODE and pod["status"]["phase"] == "Succeeded"
    term = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 0 and term["reason"] == "Completed" and term["message"].startswith("OK: engine ")
    assert pod["status"]["podIP"].startswith("127.") and pod["status"]["hostIP"] == "127.0.0.1"
    # the artifact is in the engine-cache claim's PersistentVolume, under the node's directory
    artifact = node.claim_path(ns, "engine-cache") / "engines" / build_spec(owner.spec, "base").key
    assert (artifact / contract.MANIFEST_FILE).is_file()
    assert (node.claim_path(ns, "models") / "tiny-llama" / "config.json").is_file()


async def test_a_failing_build_fails_its_job_with_the_termination_message(
    admin: KubeApi, node: SimNode, ns: str, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("FAKE_TRTLLM_FAIL", "trtllm-build")  # the node passes its environment to the containers
    owner = demo_owner(ns, **{"engine.build.backoffLimit": 0})
    name = await run_build(admin, owner)
    job = await admin.get(JOBS, name, ns)
    assert await finished(admin, ns, name) == "Failed"
    assert (condition(job, "Failed") or {}).get("reason") == "BackoffLimitExceeded"
    (pod,) = await job_pods(admin, ns, name)
    assert pod["status"]["phase"] == "Failed"
    term = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 3 and term["reason"] == "Error"  # engine_jobs ExitCode.TOOL_FAILURE
    assert term["message"].startswith("TOOL_FAILURE:") and "CUDA out of memory" in term["message"]


async def test_pod_failure_policy_fail_job_ends_the_job_at_its_first_pod(admin: KubeApi, node: SimNode, ns: str):
    owner = demo_owner(ns, **{"engine.build.backoffLimit": 3, "model.architecture": "qwen"})  # the base is Llama
    name = await run_build(admin, owner)
    job = await admin.get(JOBS, name, ns)
    failed = condition(job, "Failed") or {}
    assert failed.get("reason") == "PodFailurePolicy", job
    (pod,) = await job_pods(admin, ns, name)
    assert failed["message"] == (
        f"Container build for pod {ns}/{pod['metadata']['name']} failed with exit code 2 matching FailJob rule at index 0"
    )
    term = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 2 and term["message"].startswith("BAD_INPUT: spec says architecture qwen")


async def test_a_final_status_answered_503_is_reported_again(
    admin: KubeApi, node: SimNode, ns: str, monkeypatch: pytest.MonkeyPatch
):
    """kube-apiserver answers 503 (or 429, 500) while it starts, shuts down or waits for etcd: the node reports
    the pod's final status again, else the pod stays Running and its Job never finishes."""
    refused: list[str] = []
    patch = node.api.patch

    async def unavailable_at_first(kind: Kind, name: str, namespace: str | None, body: Any, *a: Any, **kw: Any) -> Any:
        if kind == PODS and (body.get("status") or {}).get("phase") in ("Succeeded", "Failed") and len(refused) < 2:
            refused.append(name)
            raise ApiStatusError(503, "ServiceUnavailable", "the server is currently unable to handle the request")
        return await patch(kind, name, namespace, body, *a, **kw)

    monkeypatch.setattr(node.api, "patch", unavailable_at_first)
    name = await run_build(admin, demo_owner(ns))
    assert len(refused) == 2
    assert await finished(admin, ns, name) == "Complete"
    (pod,) = await job_pods(admin, ns, name)
    assert pod["status"]["phase"] == "Succeeded"


# ---------------------------------------------------------------------------- plain pods: volumes, deletion
def bare_pod(name: str, argv: list[str], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "python:3.11", "command": argv}],
            **spec,
        },
    }


async def pod_phase(admin: KubeApi, ns: str, name: str, *phases: str) -> dict[str, Any] | None:
    pod = await admin.get(PODS, name, ns)
    return pod if pod and (pod.get("status") or {}).get("phase") in phases else None


READ_TOKEN = (
    "import base64, json, sys\n"
    "token = open(sys.argv[1] + '/token').read().split('.')[1]\n"
    "claims = json.loads(base64.urlsafe_b64decode(token + '=='))\n"
    "out = [open(sys.argv[1] + '/namespace').read(), claims['sub'], claims['kubernetes.io']['pod']['name'],\n"
    "       str('BEGIN CERTIFICATE' in open(sys.argv[1] + '/ca.crt').read())]\n"
    "open(sys.argv[2], 'w').write(' '.join(out))\n"
)


async def test_a_pod_gets_a_bound_service_account_token(admin: KubeApi, node: SimNode, ns: str):
    """The kube-api-access-* volume the ServiceAccount admission adds: a TokenRequest made as the node, bound to
    this pod, with the cluster's CA and the namespace."""
    sa_dir = "/var/run/secrets/kubernetes.io/serviceaccount"
    pod = await admin.create(PODS, bare_pod("token", ["python", "-c", READ_TOKEN, sa_dir, "/dev/termination-log"]), ns)
    assert any(v["name"].startswith("kube-api-access-") for v in pod["spec"]["volumes"])
    done = await wait_for(lambda: pod_phase(admin, ns, "token", "Succeeded", "Failed"), 60, "the token pod to finish")
    term = done["status"]["containerStatuses"][0]["state"]["terminated"]
    assert done["status"]["phase"] == "Succeeded", term
    assert term["message"] == f"{ns} system:serviceaccount:{ns}:default token True"


async def test_a_deleted_pod_is_stopped_within_its_grace_period_and_removed(admin: KubeApi, node: SimNode, ns: str):
    argv = ["python", "-c", "import time\nwhile True: time.sleep(1)"]
    await admin.create(PODS, bare_pod("sleeper", argv, terminationGracePeriodSeconds=5), ns)
    running = await wait_for(lambda: pod_phase(admin, ns, "sleeper", "Running"), 60, "the pod running")
    uid = running["metadata"]["uid"]
    await wait_for(lambda: _processes_of(node, ns, "sleeper"), 10, "the container's process")
    started = time.monotonic()
    await admin.delete(PODS, "sleeper", ns)
    await wait_for(lambda: _gone(admin, ns, "sleeper", uid), 15, "the pod deleted by the node")
    assert time.monotonic() - started < 10
    assert not _processes_of(node, ns, "sleeper")


async def _gone(admin: KubeApi, ns: str, name: str, uid: str) -> bool:
    pod = await admin.get(PODS, name, ns)
    return pod is None or pod["metadata"]["uid"] != uid


def _processes_of(node: SimNode, ns: str, pod: str) -> list[int]:
    """PIDs of live processes whose working directory is the pod's root on the node."""
    root = str(node.fs.pod_root(ns, pod).root) if (node.node_dir / "pods").is_dir() else "\0"
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if str(Path(entry / "cwd").readlink()).startswith(root):
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


# ---------------------------------------------------------------------------- serving: the real ReplicaSet controller
def tritonservers_under(path: Path) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "tritonserver" in cmd and str(path) in cmd:
            pids.append(int(entry.name))
    return pids


PROBE_SERVICE = (
    "import sys, urllib.request\n"
    "with urllib.request.urlopen('http://' + sys.argv[1] + '/v2/health/ready', timeout=5) as r:\n"
    "    open(sys.argv[2], 'w').write(sys.argv[1] + ' ' + str(r.status))\n"
)


async def test_a_serving_deployment_becomes_ready_and_is_routed_to(admin: KubeApi, node: SimNode, ns: str):
    skip_without_triton()
    from redrafter_operator.render.serving import serving_configmap, serving_deployment, variant_service

    owner = demo_owner(ns)
    assert await finished(admin, ns, await run_build(admin, owner, "redrafter")) == "Complete"
    key = build_spec(owner.spec, "redrafter").key
    await admin.create(CONFIGMAPS, without_owner(serving_configmap(owner, "redrafter", key)), ns)
    dep = without_owner(serving_deployment(owner, "redrafter", key, 1))
    await admin.create(DEPLOYMENTS, dep, ns)
    service = without_owner(variant_service(owner, "redrafter"))
    await admin.create(SERVICES, service, ns)
    svc = service["metadata"]["name"]
    selector = ",".join(f"{k}={v}" for k, v in names.serving_selector(owner.name, "redrafter").items())

    async def ready_pod() -> dict[str, Any] | None:
        pods = await admin.list(PODS, ns, label_selector=selector)
        return next((p for p in pods if (condition(p, "Ready") or {}).get("status") == "True"), None)

    pod = await wait_for(ready_pod, 120, "a Ready serving pod")
    ip = pod["status"]["podIP"]
    assert ip.startswith("127.0.0.") and ip != "127.0.0.1" and pod["spec"]["nodeName"] == NODE
    assert pod["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet"

    async def available() -> bool:
        body = await admin.get(DEPLOYMENTS, dep["metadata"]["name"], ns)
        return (body or {}).get("status", {}).get("availableReplicas") == 1

    await wait_for(available, 30, "the Deployment available (the real Deployment controller)")

    # kube-apiserver refuses loopback addresses in Endpoints and EndpointSlices (ValidateEndpointIP), so the real
    # endpoint controllers cannot publish a 127.0.0.N pod: the router falls back to the Service's selector
    assert await admin.get(Kind("v1", "endpoints"), svc, ns) is None or not (
        (await admin.get(Kind("v1", "endpoints"), svc, ns)) or {}
    ).get("subsets")
    async with ServiceRouter(admin, ns, svc, port_name="http", default_port=contract.HTTP_PORT, refresh=0.2) as router:
        await wait_for(lambda: router.backends, 15, "router backends")
        backend = router.pick()
        assert (backend.ip, backend.port) == (ip, contract.HTTP_PORT)
        async with (
            aiohttp.ClientSession() as http,
            http.post(
                f"http://{backend.url}/v2/models/{contract.ENTRY_MODEL}/generate",
                json={"text_input": "w5 w6 w7", "max_tokens": 8},
            ) as resp,
        ):
            assert resp.status == 200, await resp.text()
            assert (await resp.json())["text_output"].strip()

    # scale to zero: the ReplicaSet controller deletes the pod, the node stops Triton and removes the pod
    assert tritonservers_under(node.node_dir)
    await admin.patch(DEPLOYMENTS, dep["metadata"]["name"], ns, {"spec": {"replicas": 0}})
    await wait_for(lambda: _no_selected(admin, ns, selector), 60, "the serving pod gone")
    await wait_for(lambda: not tritonservers_under(node.node_dir), 30, "its tritonserver stopped")


async def _no_selected(admin: KubeApi, ns: str, selector: str) -> bool:
    return not await admin.list(PODS, ns, label_selector=selector)


# ---------------------------------------------------------------------------- PyTorch backends, credentials, claims
async def test_pytorch_prepare_jobs_run_without_a_toolchain_and_share_one_artifact(
    admin: KubeApi, node: SimNode, ns: str
):
    """An EAGLE-3 resource on the node's hf:// fixtures: both variants' Jobs complete, one prepares the artifact,
    the other finds it (same key); a draft model with another vocabulary fails at once."""
    eagle3 = {
        "method": "eagle3",
        "redrafter": {},
        "model": {
            "base": {"source": "hf://redrafter-sim/tiny-llama"},
            "drafter": {"source": "hf://redrafter-sim/tiny-llama-eagle3"},
        },
    }
    owner = demo_owner(ns, **eagle3)
    jobs = [await run_build(admin, owner, variant) for variant in contract.VARIANTS]
    assert [await finished(admin, ns, j) for j in jobs] == ["Complete", "Complete"]
    (key,) = {build_spec(owner.spec, v).key for v in contract.VARIANTS}
    messages = []
    for job in jobs:
        (pod,) = await job_pods(admin, ns, job)
        messages.append(pod["status"]["containerStatuses"][0]["state"]["terminated"]["message"])
    assert all(m.startswith(f"OK: engine {key} ") for m in messages), messages
    artifact = node.claim_path(ns, "engine-cache") / "engines" / key
    manifest = json.loads((artifact / contract.MANIFEST_FILE).read_text())
    assert manifest["method"] == "eagle3" and (artifact / contract.DRAFT_DIR / "config.json").is_file()

    other = demo_owner(
        ns,
        method="draftModel",
        redrafter={},
        model={
            "base": {"source": "hf://redrafter-sim/tiny-llama"},
            "drafter": {"source": "hf://redrafter-sim/tiny-llama-draft-other-tokenizer"},
        },
    )
    name = await run_build(admin, other, "base")
    assert await finished(admin, ns, name) == "Failed"
    (pod,) = await job_pods(admin, ns, name)  # BAD_INPUT fails the Job at its first pod
    term = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 2, term
    assert term["message"].startswith("BAD_INPUT: the draft model's tokenizer does not match the target's"), term


HF_TOKEN = "hf_simNodeTokenThatMustStaySecret"
HF_COMMIT = "0123456789abcdef0123456789abcdef01234567"


async def gated_model_build(admin: KubeApi, node: SimNode, ns: str, *, rendered: bool) -> str:
    """The base-engine build Job of a gated hf:// model whose token Secret is mounted into the pod.

    ``rendered``: as the operator renders it (fsGroup, 0440). Otherwise: no fsGroup, the token 0400 and so
    root-owned and owner-only, the container still running as its image's user. The Hub is offline on this node:
    the model comes from the Hugging Face cache in the engine claim (HF_HOME=/cache/.hf-home), so the only thing
    that can fail is reading the token.
    """
    from redrafter_sim.checkpoint import write_base, write_tokenizer
    from redrafter_sim.podidentity import Ownership

    hub = node.claim_path(ns, "engine-cache") / "engines" / ".hf-home" / "hub" / "models--acme--gated-llama"
    write_tokenizer(write_base(hub / "snapshots" / HF_COMMIT))
    (hub / "refs").mkdir(parents=True, exist_ok=True)
    (hub / "refs" / "main").write_text(HF_COMMIT)
    gated = {"source": "hf://acme/gated-llama", "credentialsSecret": "hf-token"}
    owner = demo_owner(ns, **{"model.base": gated, "model.tokenizer": gated})
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "hf-token"},
        "type": "Opaque",
        "data": {"token": base64.b64encode(HF_TOKEN.encode()).decode()},
    }
    await admin.create(SECRETS, secret, ns)
    job = without_owner(build_job(owner, "base"))
    pod = job["spec"]["template"]["spec"]
    if not rendered:
        del pod["securityContext"]["fsGroup"], pod["securityContext"]["fsGroupChangePolicy"]
        next(v for v in pod["volumes"] if "secret" in v)["secret"]["defaultMode"] = 0o400
        # a provisioner that leaves the claim world-writable: only the token can be the problem
        node.fs.claim_ownership["engine-cache"] = Ownership(0, 0, 0o777)
    await admin.create(CONFIGMAPS, without_owner(build_configmap(owner, "base")), ns)
    created = await admin.create(JOBS, job, ns)
    name: str = created["metadata"]["name"]
    await wait_for(lambda: finished(admin, ns, name), 120, f"Job {name} to finish")
    return name


@pytest.mark.parametrize("rendered", [True, False], ids=["rendered-security-context", "root-owned-0400-token"])
async def test_the_token_secret_is_readable_only_as_a_node_would_allow(
    admin: KubeApi, node: SimNode, ns: str, monkeypatch: pytest.MonkeyPatch, rendered: bool
):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the node passes its environment to the containers
    name = await gated_model_build(admin, node, ns, rendered=rendered)
    (pod, *_) = await job_pods(admin, ns, name)
    term = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert HF_TOKEN not in json.dumps(pod)
    if rendered:
        assert await finished(admin, ns, name) == "Complete", term
        assert term["message"].startswith("OK: engine ")
    else:  # what a node answers a non-root builder reading a root-owned 0400 file: EACCES
        assert await finished(admin, ns, name) == "Failed"
        assert term["exitCode"] == 6, term  # engine_jobs ExitCode.SOURCE_UNAVAILABLE
        assert term["message"].startswith("SOURCE_UNAVAILABLE: cannot read credentials key token in "), term
        assert term["message"].rstrip().endswith("Permission denied"), term


async def test_a_cache_claim_without_fs_group_is_not_writable(admin: KubeApi, node: SimNode, ns: str):
    """No fsGroup and a root-owned 0755 claim (how most provisioners create it): the non-root builder cannot
    create its lock in the engine cache, as on a node."""
    owner = demo_owner(ns)
    job = without_owner(build_job(owner, "base"))
    pod = job["spec"]["template"]["spec"]
    del pod["securityContext"]["fsGroup"], pod["securityContext"]["fsGroupChangePolicy"]
    await admin.create(CONFIGMAPS, without_owner(build_configmap(owner, "base")), ns)
    name = (await admin.create(JOBS, job, ns))["metadata"]["name"]
    await wait_for(lambda: finished(admin, ns, name), 120, f"Job {name} to finish")
    assert await finished(admin, ns, name) == "Failed"
    (pod, *_) = await job_pods(admin, ns, name)
    term = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 6, term  # SOURCE_UNAVAILABLE: a retry cannot help
    assert term["message"].startswith("SOURCE_UNAVAILABLE: cache directory ") and "is not writable" in term["message"]
    assert "Permission denied" in term["message"], term


async def test_engine_control_file_reaches_every_pod_of_a_variant(node: SimNode, ns: str):
    """The demo collapses acceptance by writing one control file per (resource, variant)."""
    owner = demo_owner(ns)
    ctl = node.set_engine(ns, owner.name, "redrafter", acceptance_rate=0.1)
    assert ctl.acceptance_rate == 0.1
    path = node.control_file(ns, owner.name, "redrafter")
    assert path.is_file() and str(path).startswith(str(node.node_dir))
    assert path.name == f"{ns}.{owner.name}.redrafter.json"


# ---------------------------------------------------------------------------- admission: Pod Security
RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted"}


def unhardened(workload: dict[str, Any]) -> dict[str, Any]:
    """``workload`` with its pod template's security settings removed (what the operator rendered before)."""
    out = copy.deepcopy(workload)
    pod = out["spec"]["template"]["spec"]
    pod.pop("securityContext", None)
    for c in pod["containers"]:
        c.pop("securityContext", None)
    return out


async def failed_create_events(admin: KubeApi, ns: str, kind: str) -> list[dict[str, Any]]:
    return [
        e for e in await admin.list(EVENTS, ns) if e["reason"] == "FailedCreate" and e["involvedObject"]["kind"] == kind
    ]


async def test_restricted_namespace_rejects_unhardened_pods_and_controllers_say_why(
    admin: KubeApi, node: SimNode, ns: str
):
    """kube-apiserver's PodSecurity admission refuses the pods; the real Job and ReplicaSet controllers say why."""
    from redrafter_operator.render.serving import serving_deployment

    await admin.patch(NAMESPACES, ns, None, {"metadata": {"labels": RESTRICTED}})
    bare = bare_pod("bare", ["true"])
    bare["spec"]["containers"][0].pop("command")

    async def refusal() -> ApiStatusError | None:
        """The PodSecurity plugin reads namespace labels through its informer: it enforces new ones a moment later."""
        try:
            created = await admin.create(PODS, bare, ns)
        except ApiStatusError as exc:
            return exc
        await admin.delete(PODS, created["metadata"]["name"], ns, grace_period_seconds=0)
        return None

    rejected = await wait_for(refusal, 30, "PodSecurity enforcing the namespace's new labels")
    assert rejected.code == 403 and rejected.reason == "Forbidden"
    assert 'pods "bare" is forbidden: violates PodSecurity "restricted:latest": ' in str(rejected)
    assert 'allowPrivilegeEscalation != false (container "main" must set ' in str(rejected)

    owner = demo_owner(ns)
    # the Job controller: the build pod is rejected, the Job says why in an Event
    await admin.create(CONFIGMAPS, without_owner(build_configmap(owner, "base")), ns)
    job = await admin.create(JOBS, unhardened(without_owner(build_job(owner, "base"))), ns)
    name = job["metadata"]["name"]
    (event, *_) = await wait_for(lambda: failed_create_events(admin, ns, "Job"), 30, "the Job's FailedCreate Event")
    assert event["message"].startswith(f'Error creating: pods "{name}-')
    assert 'violates PodSecurity "restricted:latest"' in event["message"]
    assert event["type"] == "Warning" and event["involvedObject"]["name"] == name
    assert not await job_pods(admin, ns, name)
    # the ReplicaSet controller: a FailedCreate Event and the Deployment's ReplicaFailure condition
    dep = await admin.create(DEPLOYMENTS, unhardened(without_owner(serving_deployment(owner, "base", "0" * 20, 1))), ns)
    dep_name = dep["metadata"]["name"]

    async def replica_failure() -> dict[str, Any] | None:
        return condition(await admin.get(DEPLOYMENTS, dep_name, ns), "ReplicaFailure")

    failure = await wait_for(replica_failure, 30, "the Deployment's ReplicaFailure condition")
    assert failure["reason"] == "FailedCreate" and "violates PodSecurity" in failure["message"]
    assert await failed_create_events(admin, ns, "ReplicaSet")
    assert not [p for p in await admin.list(PODS, ns) if p["metadata"]["name"].startswith(dep_name)]


# ---------------------------------------------------------------------------- serving failures
def failing_deployment(owner: Owner, suffix: str, replicas: int = 1, **container: Any) -> list[dict[str, Any]]:
    """The operator's serving ConfigMap and Deployment of ``owner`` (under their own names, container fields
    overridden) for an engine that was never built: a pod that gets as far as starting crashes."""
    from redrafter_operator.render.serving import serving_configmap, serving_deployment

    key = build_spec(owner.spec, "redrafter").key
    cm = without_owner(serving_configmap(owner, "redrafter", key))
    dep = without_owner(serving_deployment(owner, "redrafter", key, replicas))
    dep["metadata"]["name"] = f"{owner.name}-{suffix}"
    labels = {**dep["spec"]["selector"]["matchLabels"], "test/deployment": suffix}
    dep["spec"]["selector"]["matchLabels"] = labels
    dep["spec"]["template"]["metadata"]["labels"].update(labels)
    dep["spec"]["template"]["spec"]["containers"][0].update(container)
    return [cm, dep]


async def pods_of(admin: KubeApi, ns: str, suffix: str) -> list[dict[str, Any]]:
    pods = await admin.list(PODS, ns, label_selector=f"test/deployment={suffix}")
    return sorted(pods, key=lambda p: p["metadata"]["name"])


async def reasons(admin: KubeApi, ns: str, suffix: str) -> list[str]:
    return [ServingPodFact.from_body(p).reason for p in await pods_of(admin, ns, suffix)]


async def test_serving_failures_are_written_as_the_scheduler_and_kubelet_write_them(
    admin: KubeApi, node: SimNode, ns: str
):
    owner = demo_owner(ns)
    node.serving.unpullable.add("registry.invalid/triton:missing")
    gpus = {"resources": {"limits": {"nvidia.com/gpu": "8"}, "requests": {"nvidia.com/gpu": "8"}}}
    secret_env = {"env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}}]}
    no_gpu = {"resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}  # the "gpu" pod holds all of them
    for obj in (
        failing_deployment(owner, "gpu", replicas=2, **gpus)
        + failing_deployment(owner, "pull", image="registry.invalid/triton:missing", **no_gpu)
        + failing_deployment(owner, "config", **secret_env, **no_gpu)
    ):
        kind = CONFIGMAPS if obj["kind"] == "ConfigMap" else DEPLOYMENTS
        if await admin.get(kind, obj["metadata"]["name"], ns) is None:
            await admin.create(kind, obj, ns)

    # the node's 8 GPUs: the real scheduler binds the first pod (which crash-loops: its engine was never built)
    # and leaves the second Pending with its diagnosis
    await wait_for(
        lambda: _sorted_reasons(admin, ns, "gpu", ["CrashLoopBackOff", "Unschedulable"]),
        60,
        "a crash-looping pod and an unschedulable one",
    )
    by_reason = {ServingPodFact.from_body(p).reason: p for p in await pods_of(admin, ns, "gpu")}
    sched = condition(by_reason["Unschedulable"], "PodScheduled") or {}
    assert (sched["status"], sched["reason"]) == ("False", "Unschedulable")
    assert sched["message"].startswith("0/1 nodes are available: 1 Insufficient nvidia.com/gpu."), sched
    assert not by_reason["Unschedulable"]["status"].get("podIP")
    cs = by_reason["CrashLoopBackOff"]["status"]["containerStatuses"][0]
    assert cs["state"]["waiting"]["reason"] == "CrashLoopBackOff" or cs["restartCount"] >= 1
    assert cs["lastState"]["terminated"]["exitCode"] == 1 and cs["lastState"]["terminated"]["reason"] == "Error"
    assert "engine artifact" in cs["lastState"]["terminated"]["message"]
    fact = ServingPodFact.from_body(by_reason["CrashLoopBackOff"])
    assert "exited with code 1" in fact.message and "engine artifact" in fact.message

    await wait_for(lambda: _sorted_reasons(admin, ns, "pull", ["ErrImagePull"]), 30, "ErrImagePull")
    await wait_for(lambda: _sorted_reasons(admin, ns, "pull", ["ImagePullBackOff"]), 30, "ImagePullBackOff")
    waiting = (await pods_of(admin, ns, "pull"))[0]["status"]["containerStatuses"][0]["state"]["waiting"]
    assert waiting["message"] == 'Back-off pulling image "registry.invalid/triton:missing"'

    await wait_for(
        lambda: _sorted_reasons(admin, ns, "config", ["CreateContainerConfigError"]), 30, "CreateContainerConfigError"
    )
    assert ServingPodFact.from_body((await pods_of(admin, ns, "config"))[0]).message == 'secret "hf-token" not found'
    # the Secret appears: the kubelet's next attempt creates the container (which then crashes: no engine)
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hf-token"}, "data": {"token": "eA=="}}
    await admin.create(SECRETS, secret, ns)
    await wait_for(lambda: _sorted_reasons(admin, ns, "config", ["CrashLoopBackOff"]), 30, "the config error resolved")

    # the crash loop stays one cause across restarts (no flapping to "no failure" in between)
    restarts = (await pods_of(admin, ns, "config"))[0]["status"]["containerStatuses"][0]["restartCount"]
    seen: set[str] = set()

    async def restarted_twice() -> bool:
        (pod,) = await pods_of(admin, ns, "config")
        seen.add(ServingPodFact.from_body(pod).reason)
        return bool(pod["status"]["containerStatuses"][0]["restartCount"] >= restarts + 2)

    await wait_for(restarted_twice, 60, "two more restarts")
    assert seen == {"CrashLoopBackOff"}


async def _sorted_reasons(admin: KubeApi, ns: str, suffix: str, expected: list[str]) -> bool:
    return sorted(await reasons(admin, ns, suffix)) == expected


async def test_an_engine_over_its_memory_limit_is_oom_killed_and_the_rollout_times_out(
    admin: KubeApi, node: SimNode, ns: str
):
    skip_without_triton()
    owner = demo_owner(ns)
    assert await finished(admin, ns, await run_build(admin, owner, "redrafter")) == "Complete"
    node.serving.memory_needed = 2 * 2**30  # the loaded engine takes 2 GiB
    memory = {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "1Gi"}}
    cm, dep = failing_deployment(owner, "oom", resources=memory)
    dep["spec"]["progressDeadlineSeconds"] = 5  # the real Deployment controller's deadline
    await admin.create(CONFIGMAPS, cm, ns)
    await admin.create(DEPLOYMENTS, dep, ns)
    name = dep["metadata"]["name"]
    await wait_for(lambda: _sorted_reasons(admin, ns, "oom", ["OOMKilled"]), 60, "OOMKilled")
    (pod,) = await pods_of(admin, ns, "oom")
    cs = pod["status"]["containerStatuses"][0]
    assert cs["lastState"]["terminated"]["reason"] == "OOMKilled"
    assert cs["lastState"]["terminated"]["exitCode"] == 137
    assert "exit code 137" in ServingPodFact.from_body(pod).message

    async def progressing() -> dict[str, Any]:
        return condition(await admin.get(DEPLOYMENTS, name, ns), "Progressing") or {}

    async def timed_out() -> bool:
        return (await progressing()).get("reason") == "ProgressDeadlineExceeded"

    await wait_for(timed_out, 60, "the progress deadline")
    assert (await progressing())["status"] == "False"
    assert re.fullmatch(
        rf'ReplicaSet "{name}-[0-9a-f]{{8,10}}" has timed out progressing\.', (await progressing())["message"]
    )
    fact = DeploymentFact.from_body(await admin.get(DEPLOYMENTS, name, ns))
    assert fact.failure_reason == "ProgressDeadlineExceeded"


# ---------------------------------------------------------------------------- serving and validation behind Services
def skip_without_triton() -> None:
    try:
        TritonInstall.find()
    except TritonUnavailable as exc:
        pytest.skip(f"tritonserver cannot run here: {exc}")


async def build_all(admin: KubeApi, owner: Owner) -> dict[str, str]:
    """Both variants' build Jobs, run side by side as the operator starts them: variant -> how each finished."""
    jobs = await asyncio.gather(*(run_build(admin, owner, v) for v in contract.VARIANTS))
    return {v: await finished(admin, owner.namespace, j) for v, j in zip(contract.VARIANTS, jobs, strict=True)}


async def serve(admin: KubeApi, owner: Owner, variant: str, *services: dict[str, Any]) -> dict[str, Any]:
    """The operator's serving ConfigMap and Deployment of ``variant`` (one replica), and ``services``."""
    from redrafter_operator.render.serving import serving_configmap, serving_deployment

    ns, key = owner.namespace, build_spec(owner.spec, variant).key
    await admin.create(CONFIGMAPS, without_owner(serving_configmap(owner, variant, key)), ns)
    dep = await admin.create(DEPLOYMENTS, without_owner(serving_deployment(owner, variant, key, 1)), ns)
    for svc in services:
        await admin.create(SERVICES, without_owner(svc), ns)
    return dep


async def ready_pods(admin: KubeApi, owner: Owner, variant: str) -> list[dict[str, Any]]:
    selector = ",".join(f"{k}={v}" for k, v in names.serving_selector(owner.name, variant).items())
    pods = await admin.list(PODS, owner.namespace, label_selector=selector)
    return [p for p in pods if (condition(p, "Ready") or {}).get("status") == "True"]


async def generate(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with http.post(
        f"http://{url}/v2/models/{contract.ENTRY_MODEL}/generate", json={"text_input": "w5 w6 w7", "max_tokens": 8}
    ) as resp:
        assert resp.status == 200, await resp.text()
        out: dict[str, Any] = await resp.json()
        return out


async def metrics_of(http: aiohttp.ClientSession, ip: str) -> str:
    async with http.get(f"http://{ip}:{contract.METRICS_PORT}/metrics") as resp:
        return await resp.text()


def requests_counted(metrics: str, model: str, variant: str) -> float:
    series = f'{contract.METRIC_REQUESTS}{{model="{model}",variant="{variant}"}} '
    return next((float(line[len(series) :]) for line in metrics.splitlines() if line.startswith(series)), 0.0)


async def test_serving_pods_are_real_tritons_routed_by_the_service(admin: KubeApi, node: SimNode, ns: str):
    """Real tritonservers behind the stable Service: the metrics port the operator scrapes, scale-out with the
    requests spread over both pods, the selector moved to the other pool, scale to zero, and nothing left
    running or on disk once the node stops."""
    from redrafter_operator.render.serving import stable_service

    skip_without_triton()
    owner = demo_owner(ns)
    svc = names.service_name(owner.name)
    assert await build_all(admin, owner) == {"redrafter": "Complete", "base": "Complete"}
    dep = await serve(admin, owner, "redrafter", stable_service(owner, "redrafter"))
    await serve(admin, owner, "base")
    dep_name = dep["metadata"]["name"]

    (pod,) = await wait_for(lambda: ready_pods(admin, owner, "redrafter"), 120, "a Ready redrafter pod")
    ip = pod["status"]["podIP"]
    assert ip.startswith("127.0.0.") and ip != "127.0.0.1"
    cs = pod["status"]["containerStatuses"][0]
    assert cs["ready"] and cs["state"]["running"]["startedAt"]
    # the real Deployment controller's ReplicaSet owns the pod
    (rs_ref,) = pod["metadata"]["ownerReferences"]
    assert rs_ref["kind"] == "ReplicaSet" and rs_ref["name"].startswith(f"{dep_name}-")
    rs = await admin.get(Kind("apps/v1", "replicasets"), rs_ref["name"], ns)
    assert rs is not None and rs["metadata"]["ownerReferences"][0]["name"] == dep_name

    async def ready_replicas(n: int) -> bool:
        return ((await admin.get(DEPLOYMENTS, dep_name, ns)) or {}).get("status", {}).get("readyReplicas") == n

    await wait_for(lambda: ready_replicas(1), 30, "the Deployment's readyReplicas=1")
    (base_pod,) = await wait_for(lambda: ready_pods(admin, owner, "base"), 120, "a Ready base pod")
    base_ip = base_pod["status"]["podIP"]
    node_dir = node.node_dir
    assert len(tritonservers_under(node_dir)) == 2

    async with (
        aiohttp.ClientSession() as http,
        ServiceRouter(admin, ns, svc, port_name="http", default_port=contract.HTTP_PORT, refresh=0.2) as router,
    ):
        await wait_for(lambda: router.backends, 15, "router backends")
        backend = router.pick()
        assert (backend.ip, backend.port) == (ip, contract.HTTP_PORT)
        # what a Job's `<svc>.<ns>.svc:<port>` reaches through the node (cluster DNS and kube-proxy)
        assert await node.runner.service_endpoint(svc, ns, contract.HTTP_PORT) == f"{ip}:{contract.HTTP_PORT}"
        assert (await generate(http, backend.url))["text_output"].strip()
        # the pod's metrics port (what the operator scrapes): the metering counters and the load gauges
        metrics = await metrics_of(http, ip)
        assert f'{contract.METRIC_REQUESTS}{{model="{owner.name}",variant="redrafter"}} 1' in metrics
        max_batch = owner.spec.engine.max_batch_size
        assert (
            f'{contract.METRIC_TRTLLM_REQUESTS}{{model="tensorrt_llm",request_type="max",version="1"}} {max_batch}'
        ) in metrics

        # scale out: a second pod, and the requests spread round-robin over both
        await admin.patch(DEPLOYMENTS, dep_name, ns, {"spec": {"replicas": 2}})
        await wait_for(lambda: len(router.backends) == 2, 120, "two backends")
        await wait_for(lambda: ready_replicas(2), 30, "the Deployment's readyReplicas=2")
        assert len({router.pick().ip for _ in range(4)}) == 2
        for _ in range(4):
            await generate(http, router.pick().url)
        counted = [requests_counted(await metrics_of(http, b.ip), owner.name, "redrafter") for b in router.backends]
        assert sum(counted) == 5 and min(counted) >= 2, counted

        # move the Service's selector: the traffic moves to the other pool
        await admin.patch(SERVICES, svc, ns, {"spec": {"selector": names.traffic_selector(owner.name, "base")}})
        await wait_for(lambda: [b.ip for b in router.backends] == [base_ip], 15, "the router following the selector")
        assert await node.runner.service_endpoint(svc, ns, contract.HTTP_PORT) == f"{base_ip}:{contract.HTTP_PORT}"
        await generate(http, router.pick().url)
        assert requests_counted(await metrics_of(http, base_ip), owner.name, "base") == 1

        # scale to zero: the ReplicaSet controller deletes the pods, the node stops their servers
        await admin.patch(DEPLOYMENTS, dep_name, ns, {"spec": {"replicas": 0}})
        await wait_for(lambda: _no_selected_variant(admin, owner, "redrafter"), 60, "the redrafter pods gone")
        await wait_for(lambda: len(tritonservers_under(node_dir)) == 1, 30, "the redrafter servers stopped")
        await admin.patch(SERVICES, svc, ns, {"spec": {"selector": names.traffic_selector(owner.name, "redrafter")}})
        await wait_for(lambda: not router.backends, 15, "no backends")
        with pytest.raises(NoEndpoints):
            router.pick()
        assert await node.runner.service_endpoint(svc, ns, contract.HTTP_PORT) is None

    # the node stops with the base pod still serving: its server goes, and the node's directory with it
    await node.stop()
    assert tritonservers_under(node_dir) == []
    assert not node_dir.exists()
    await forget_pods_of_a_stopped_node(admin, ns)


async def _no_selected_variant(admin: KubeApi, owner: Owner, variant: str) -> bool:
    selector = ",".join(f"{k}={v}" for k, v in names.serving_selector(owner.name, variant).items())
    return await _no_selected(admin, owner.namespace, selector)


async def forget_pods_of_a_stopped_node(admin: KubeApi, ns: str) -> None:
    """What an admin does for a node that is gone: no more replicas, then the pods force-deleted (no kubelet is
    left to finish a graceful deletion)."""
    for dep in await admin.list(DEPLOYMENTS, ns):
        await admin.patch(DEPLOYMENTS, dep["metadata"]["name"], ns, {"spec": {"replicas": 0}})
    for pod in await admin.list(PODS, ns):
        await admin.delete(PODS, pod["metadata"]["name"], ns, grace_period_seconds=0)
    await wait_for(lambda: _no_pods(admin, ns), 30, f"the pods of {ns} force-deleted")


async def test_serving_pods_run_the_openai_front_behind_the_service(admin: KubeApi, node: SimNode, ns: str):
    """With the operator's own serving render: readiness through the front, a chat completion with the official
    client through the Service's ``openai`` port, and the front stopped with its pod."""
    from openai import AsyncOpenAI

    from redrafter_operator.render.serving import stable_service

    skip_without_triton()
    node.serving.openai_front = True  # serving pods now run the front too, and its readinessProbe decides
    owner = demo_owner(ns, **{"serving.modelName": "demo/tiny-chat"})
    assert await finished(admin, ns, await run_build(admin, owner, "redrafter")) == "Complete"
    dep = await serve(admin, owner, "redrafter", stable_service(owner, "redrafter"))
    (pod,) = await wait_for(lambda: ready_pods(admin, owner, "redrafter"), 120, "a Ready redrafter pod")
    (served,) = node.serving.pods.values()
    assert served.probe == ("/health/ready", contract.OPENAI_PORT) and served.front is not None
    assert served.front.poll() is None
    async with ServiceRouter(
        admin, ns, names.service_name(owner.name), port_name="openai", default_port=contract.OPENAI_PORT, refresh=0.2
    ) as router:
        await wait_for(lambda: router.backends, 15, "router backends")
        backend = router.pick()
        assert (backend.ip, backend.port) == (pod["status"]["podIP"], contract.OPENAI_PORT)
        async with AsyncOpenAI(base_url=f"http://{backend.url}/v1", api_key="unused", max_retries=0) as client:
            assert [m.id for m in (await client.models.list()).data] == ["demo/tiny-chat"]
            raw = await client.chat.completions.with_raw_response.create(
                model="demo/tiny-chat", messages=[{"role": "user", "content": "w5 w6 w7"}], max_tokens=12
            )
            done = raw.parse()
    assert done.usage is not None and done.usage.completion_tokens == 12
    assert len((done.choices[0].message.content or "").split()) == 12
    assert 0 < float(raw.headers[contract.ACCEPTANCE_HEADER]) <= 1
    front = served.front
    await admin.patch(DEPLOYMENTS, dep["metadata"]["name"], ns, {"spec": {"replicas": 0}})
    await wait_for(lambda: front.poll() is not None, 60, "the front stopped with its pod")
    assert front.returncode == 0  # SIGTERM: drained and exited cleanly


async def validate_pair(admin: KubeApi, owner: Owner) -> tuple[dict[str, Any], dict[str, Any]]:
    """Both variants served behind their variant Services, then the operator's validation Job of the pair:
    (the finished Job, its last pod's termination state)."""
    from redrafter_operator.render.serving import variant_service
    from redrafter_operator.render.validation import validation_job

    ns = owner.namespace
    assert await build_all(admin, owner) == {"redrafter": "Complete", "base": "Complete"}
    for variant in contract.VARIANTS:
        await serve(admin, owner, variant, variant_service(owner, variant))
    for variant in contract.VARIANTS:
        await wait_for(lambda v=variant: ready_pods(admin, owner, v), 120, f"a Ready {variant} pod")
    keys = {v: build_spec(owner.spec, v).key for v in contract.VARIANTS}
    job = without_owner(
        validation_job(owner, redrafter_key=keys["redrafter"], base_key=keys["base"], operator_image="op:dev")
    )
    name = (await admin.create(JOBS, job, ns))["metadata"]["name"]
    await wait_for(lambda: finished(admin, ns, name), 180, f"the validation Job {name} to finish")
    pods = sorted(await job_pods(admin, ns, name), key=lambda p: p["metadata"]["creationTimestamp"])
    term = pods[-1]["status"]["containerStatuses"][0]["state"]["terminated"]
    return (await admin.get(JOBS, name, ns)) or {}, term


async def test_validation_job_runs_against_the_variant_services(admin: KubeApi, node: SimNode, ns: str):
    """The validation Job runs `redrafter-operator evaluate validate`; `<svc>.<ns>.svc:8001` reaches a Ready pod
    of each variant; the verdict is its termination message and the real Job controller completes the Job."""
    skip_without_triton()
    owner = demo_owner(ns)
    job, term = await validate_pair(admin, owner)
    args = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert args[:3] == ["redrafter-operator", "evaluate", "validate"]
    assert args[args.index("--redrafter") + 1] == f"{names.service_name(owner.name, 'redrafter')}.{ns}.svc:8001"
    assert (condition(job, "Complete") or {}).get("status") == "True", term
    assert job["status"]["succeeded"] == 1 and not job["status"].get("failed"), job["status"]
    assert term["exitCode"] == 0 and term["message"], term


async def test_validation_job_over_the_openai_api(admin: KubeApi, node: SimNode, ns: str):
    """``spec.validation.protocol: openai``: the Job validates the pair through the pods' OpenAI fronts, reached
    as ``http://<svc>.<ns>.svc:9000``."""
    skip_without_triton()
    node.serving.openai_front = True
    owner = demo_owner(ns, **{"validation.protocol": "openai", "validation.measureCrossover": False})
    job, term = await validate_pair(admin, owner)
    args = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert args[args.index("--protocol") + 1] == "openai"
    assert args[args.index("--base") + 1] == f"http://{names.service_name(owner.name, 'base')}.{ns}.svc:9000"
    assert (condition(job, "Complete") or {}).get("status") == "True", term
    assert job["status"]["succeeded"] == 1 and not job["status"].get("failed"), job["status"]
    assert term["exitCode"] == 0 and "greedy outputs identical" in term["message"], term
