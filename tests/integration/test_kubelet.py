"""The simulated node against the emulated API over HTTP: build Jobs run the real engine_jobs program,
serving Deployments become real tritonservers on 127.0.0.N, Services route through Endpoints, and
nothing (process or temp dir) outlives the node.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import os
import re
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from engine_jobs import contract
from engine_jobs.contract import ServingConfig
from redrafter_operator.controller.facts import DeploymentFact, ServingPodFact
from redrafter_operator.render import names
from redrafter_operator.render.build import build_configmap, build_job, build_spec
from redrafter_operator.render.common import Owner
from redrafter_sim.kubeapi import KubeApi
from redrafter_sim.kubelet import SimKubelet
from redrafter_sim.router import NoEndpoints, ServiceRouter
from redrafter_sim.server import EmulatorHandle
from redrafter_sim.triton import TritonInstall, TritonUnavailable

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]
NS = "default"


def demo_owner(**spec_changes: Any) -> Owner:
    body = yaml.safe_load((ROOT / "examples" / "demo-tiny.yaml").read_text())
    body["metadata"]["uid"] = "11111111-2222-3333-4444-555555555555"
    for path, value in spec_changes.items():
        node = body["spec"]
        *parents, leaf = path.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return Owner.from_body(body)


async def wait_for(predicate: Callable[[], Any], timeout: float = 60.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def tritonservers_under(path: Path) -> list[int]:
    """PIDs of live tritonserver processes whose command line mentions ``path``."""
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


@pytest.fixture
async def node(apiserver: EmulatorHandle) -> AsyncIterator[SimKubelet]:
    kubelet = SimKubelet(apiserver.url, sync_period=0.3)
    await kubelet.start()
    try:
        yield kubelet
    finally:
        await kubelet.stop()


def job_state(em, name: str) -> str:
    job = em.get_object("batch/v1", "Job", name, NS)
    for c in (job.get("status") or {}).get("conditions") or []:
        if c["type"] in ("Complete", "Failed") and c["status"] == "True":
            return c["type"]
    return ""


def build_pods(em, job_name: str) -> list[dict]:
    return em.list_objects("v1", "Pod", NS, label_selector=f"job-name={job_name}")


async def build_engines(em, owner: Owner) -> dict[str, str]:
    """Create both build Jobs as the operator would; wait until they finish; name -> final state."""
    jobs = {}
    for variant in contract.VARIANTS:
        em.create_object(build_configmap(owner, variant))
        job = em.create_object(build_job(owner, variant))
        jobs[job["metadata"]["name"]] = variant
    await wait_for(lambda: all(job_state(em, j) for j in jobs), 60, "build Jobs to finish")
    return {j: job_state(em, j) for j in jobs}


async def test_build_jobs_run_engine_jobs_and_report_from_exit_code(apiserver: EmulatorHandle, node: SimKubelet):
    em = apiserver.emulator
    owner = demo_owner()
    states = await build_engines(em, owner)
    assert set(states.values()) == {"Complete"}
    for job_name in states:
        job = em.get_object("batch/v1", "Job", job_name, NS)
        assert job["status"]["succeeded"] == 1 and job["status"]["completionTime"]
        (pod,) = build_pods(em, job_name)
        term = pod["status"]["containerStatuses"][0]["state"]["terminated"]
        assert term["exitCode"] == 0 and term["reason"] == "Completed"
        assert term["message"].startswith("OK: engine ")
        assert pod["metadata"]["ownerReferences"][0]["kind"] == "Job"
    # the artifacts are real: manifest.json (written last) in the engine cache claim, at <subPath>/<key>
    for variant in contract.VARIANTS:
        key = build_spec(owner.spec, variant).key
        artifact = node.fs.claim_dir("engine-cache", "engines") / key
        assert (artifact / contract.MANIFEST_FILE).is_file(), f"no manifest for {variant}"
        assert (artifact / contract.ENGINE_DIR / "rank0.engine").is_file()
    # the pvc:// sources were provisioned with the fake checkpoint
    assert (node.fs.claim_dir("models") / "tiny-llama-drafter" / "config.json").is_file()


async def test_pytorch_prepare_jobs_run_without_a_toolchain_and_share_one_artifact(
    apiserver: EmulatorHandle, node: SimKubelet
):
    """An EAGLE-3 resource on the node's hf:// fixtures: both variants' Jobs complete, one prepares the
    artifact, the other finds it (same key); a draft model with another vocabulary fails at once."""
    em = apiserver.emulator
    eagle3 = {
        "method": "eagle3",
        "redrafter": {},
        "model": {
            "base": {"source": "hf://redrafter-sim/tiny-llama"},
            "drafter": {"source": "hf://redrafter-sim/tiny-llama-eagle3"},
        },
    }
    owner = demo_owner(**eagle3)
    states = await build_engines(em, owner)
    assert set(states.values()) == {"Complete"}, states
    (key,) = {build_spec(owner.spec, v).key for v in contract.VARIANTS}
    messages = []
    for job_name in states:
        (pod,) = build_pods(em, job_name)
        messages.append(pod["status"]["containerStatuses"][0]["state"]["terminated"]["message"])
    assert all(m.startswith(f"OK: engine {key} ") for m in messages), messages
    artifact = node.fs.claim_dir("engine-cache", "engines") / key
    manifest = json.loads((artifact / contract.MANIFEST_FILE).read_text())
    assert manifest["method"] == "eagle3" and (artifact / contract.DRAFT_DIR / "config.json").is_file()

    other = demo_owner(
        method="draftModel",
        redrafter={},
        model={
            "base": {"source": "hf://redrafter-sim/tiny-llama"},
            "drafter": {"source": "hf://redrafter-sim/tiny-llama-draft-other-tokenizer"},
        },
    )
    em.create_object(build_configmap(other, "base"))
    job_name = em.create_object(build_job(other, "base"))["metadata"]["name"]
    await wait_for(lambda: job_state(em, job_name), 60, "the draft-model Job to finish")
    assert job_state(em, job_name) == "Failed"
    (pod,) = build_pods(em, job_name)  # BAD_INPUT fails the Job at its first pod
    term = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 2, term
    assert term["message"].startswith("BAD_INPUT: the draft model's tokenizer does not match the target's"), term


HF_TOKEN = "hf_simNodeTokenThatMustStaySecret"
HF_COMMIT = "0123456789abcdef0123456789abcdef01234567"


def gated_model_build(node: SimKubelet, em, *, rendered: bool) -> tuple[str, dict]:
    """The base-engine build Job of a gated hf:// model whose token Secret is mounted into the pod.

    ``rendered``: as the operator renders it (fsGroup, 0440). Otherwise as before this fix: no fsGroup,
    the token 0400 and so root-owned and owner-only, the container still running as its image's user.
    The Hub is offline on this node: the model comes from the Hugging Face cache in the engine claim
    (HF_HOME=/cache/.hf-home), so the only thing that can fail is reading the token.
    """
    from redrafter_sim.checkpoint import write_base, write_tokenizer
    from redrafter_sim.podidentity import Ownership

    hub = node.fs.claim_dir("engine-cache", "engines") / ".hf-home" / "hub" / "models--acme--gated-llama"
    write_tokenizer(write_base(hub / "snapshots" / HF_COMMIT))
    (hub / "refs").mkdir(parents=True, exist_ok=True)
    (hub / "refs" / "main").write_text(HF_COMMIT)
    gated = {"source": "hf://acme/gated-llama", "credentialsSecret": "hf-token"}
    owner = demo_owner(**{"model.base": gated, "model.tokenizer": gated})
    em.create_object(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "hf-token", "namespace": NS},
            "type": "Opaque",
            "data": {"token": base64.b64encode(HF_TOKEN.encode()).decode()},
        }
    )
    job = build_job(owner, "base")
    pod = job["spec"]["template"]["spec"]
    if not rendered:
        del pod["securityContext"]["fsGroup"], pod["securityContext"]["fsGroupChangePolicy"]
        next(v for v in pod["volumes"] if "secret" in v)["secret"]["defaultMode"] = 0o400
        # a provisioner that leaves the claim world-writable: only the token can be the problem
        node.fs.claim_ownership["engine-cache"] = Ownership(0, 0, 0o777)
    em.create_object(build_configmap(owner, "base"))
    return em.create_object(job)["metadata"]["name"], owner


@pytest.mark.parametrize("rendered", [True, False], ids=["rendered-security-context", "root-owned-0400-token"])
async def test_the_token_secret_is_readable_only_as_a_node_would_allow(
    apiserver: EmulatorHandle, node: SimKubelet, monkeypatch: pytest.MonkeyPatch, rendered
):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the node's runner passes its environment to the container
    em = apiserver.emulator
    job_name, _ = gated_model_build(node, em, rendered=rendered)
    await wait_for(lambda: job_state(em, job_name), 60, "the build Job to finish")
    (pod, *_) = build_pods(em, job_name)
    term = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert HF_TOKEN not in json.dumps(pod)
    if rendered:
        assert job_state(em, job_name) == "Complete", term
        assert term["message"].startswith("OK: engine ")
    else:  # what a node answers a non-root builder reading a root-owned 0400 file: EACCES
        assert job_state(em, job_name) == "Failed"
        assert term["exitCode"] == 6, term  # engine_jobs ExitCode.SOURCE_UNAVAILABLE
        assert term["message"].startswith("SOURCE_UNAVAILABLE: cannot read credentials key token in "), term
        assert term["message"].rstrip().endswith("Permission denied"), term


async def test_a_cache_claim_without_fs_group_is_not_writable(apiserver: EmulatorHandle, node: SimKubelet):
    """No fsGroup and a root-owned 0755 claim (how most provisioners create it): the non-root builder cannot
    create its lock in the engine cache, as on a node."""
    em = apiserver.emulator
    owner = demo_owner()
    job = build_job(owner, "base")
    pod = job["spec"]["template"]["spec"]
    del pod["securityContext"]["fsGroup"], pod["securityContext"]["fsGroupChangePolicy"]
    em.create_object(build_configmap(owner, "base"))
    job_name = em.create_object(job)["metadata"]["name"]
    await wait_for(lambda: job_state(em, job_name), 60, "the build Job to finish")
    assert job_state(em, job_name) == "Failed"
    (pod, *_) = build_pods(em, job_name)
    term = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 6, term  # SOURCE_UNAVAILABLE: a retry cannot help
    assert term["message"].startswith("SOURCE_UNAVAILABLE: cache directory ") and "is not writable" in term["message"]
    assert "Permission denied" in term["message"], term


async def test_failed_build_reports_termination_message_after_backoff(
    apiserver: EmulatorHandle, node: SimKubelet, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("FAKE_TRTLLM_FAIL", "trtllm-build")
    em = apiserver.emulator
    owner = demo_owner(**{"engine.build.backoffLimit": 1})
    states = await build_engines(em, owner)
    assert set(states.values()) == {"Failed"}
    for job_name in states:
        job = em.get_object("batch/v1", "Job", job_name, NS)
        assert job["status"]["failed"] == 2  # backoffLimit 1: two pods
        failed = next(c for c in job["status"]["conditions"] if c["type"] == "Failed")
        assert failed["reason"] == "BackoffLimitExceeded"
        pods = build_pods(em, job_name)
        assert len(pods) == 2
        term = pods[0]["status"]["containerStatuses"][0]["state"]["terminated"]
        assert term["exitCode"] == 3  # engine_jobs ExitCode.TOOL_FAILURE
        assert term["message"].startswith("TOOL_FAILURE:") and "CUDA out of memory" in term["message"]


async def test_bad_input_build_fails_its_job_after_one_pod(apiserver: EmulatorHandle, node: SimKubelet):
    """The rendered podFailurePolicy, honoured by the node's Job controller: exit code 2 (BAD_INPUT) ends
    the Job at once, whatever backoffLimit allows."""
    em = apiserver.emulator
    owner = demo_owner(**{"engine.build.backoffLimit": 3, "model.architecture": "qwen"})  # the base is Llama
    em.create_object(build_configmap(owner, "base"))
    name = em.create_object(build_job(owner, "base"))["metadata"]["name"]
    await wait_for(lambda: job_state(em, name), 60, "the build Job to finish")
    job = em.get_object("batch/v1", "Job", name, NS)
    assert job_state(em, name) == "Failed" and job["status"]["failed"] == 1
    (pod,) = build_pods(em, name)
    term = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 2 and term["message"].startswith("BAD_INPUT: spec says architecture qwen")
    failed = next(c for c in job["status"]["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "PodFailurePolicy"
    assert failed["message"] == (
        f"Container build for pod {NS}/{pod['metadata']['name']} failed with exit code 2 "
        "matching FailJob rule at index 0"
    )
    await asyncio.sleep(1.0)  # a few node syncs: no further pod
    assert len(build_pods(em, name)) == 1


# ---------------------------------------------------------------------------- serving
def serving_objects(owner: Owner, variant: str, pool: str, replicas: int = 1) -> list[dict]:
    """A ConfigMap with serving.json and a Deployment shaped like the operator's serving render."""
    key = build_spec(owner.spec, variant).key
    cfg = ServingConfig(
        deployment=owner.name,
        variant=variant,
        engine_key=key,
        artifact_dir=f"{contract.CACHE_MOUNT}/{key}",
        max_batch_size=owner.spec.engine.max_batch_size,
        draft_len_per_beam=owner.spec.redrafter.draft_len_per_beam if variant == "redrafter" else 0,
        num_beams=owner.spec.redrafter.num_beams if variant == "redrafter" else 0,
    )
    cm_name = names.serving_config_name(owner.name, variant)
    labels = {
        **names.common_labels(owner.name, "serving"),
        names.LABEL_VARIANT: variant,
        names.LABEL_TRAFFIC: pool,
        names.LABEL_ENGINE_KEY: key,
    }
    meta = {"namespace": NS, "labels": labels, "ownerReferences": [owner.owner_reference()]}
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": cm_name, **copy.deepcopy(meta)},
            "data": {contract.SERVING_CONFIG_FILE: cfg.model_dump_json()},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": names.serving_deployment_name(owner.name, variant), **copy.deepcopy(meta)},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": names.serving_selector(owner.name, variant)},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "containers": [
                            {
                                "name": "triton",
                                "image": owner.spec.serving.image,
                                "command": [
                                    "python",
                                    "-m",
                                    "engine_jobs",
                                    "serve",
                                    f"{contract.CONFIG_MOUNT}/{contract.SERVING_CONFIG_FILE}",
                                ],
                                "ports": [
                                    {"name": "http", "containerPort": contract.HTTP_PORT},
                                    {"name": "grpc", "containerPort": contract.GRPC_PORT},
                                    {"name": "metrics", "containerPort": contract.METRICS_PORT},
                                ],
                                "volumeMounts": [
                                    {
                                        "name": "cache",
                                        "mountPath": contract.CACHE_MOUNT,
                                        "subPath": "engines",
                                        "readOnly": True,
                                    },
                                    {"name": "config", "mountPath": contract.CONFIG_MOUNT, "readOnly": True},
                                ],
                            }
                        ],
                        "volumes": [
                            {"name": "cache", "persistentVolumeClaim": {"claimName": "engine-cache"}},
                            {"name": "config", "configMap": {"name": cm_name}},
                        ],
                    },
                },
            },
        },
    ]


def service(owner: Owner, pool: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": names.service_name(owner.name), "namespace": NS},
        "spec": {
            "selector": names.traffic_selector(owner.name, pool),
            "ports": [
                {"name": "http", "port": contract.HTTP_PORT, "targetPort": "http"},
                {"name": "grpc", "port": contract.GRPC_PORT, "targetPort": "grpc"},
            ],
        },
    }


async def generate(session: aiohttp.ClientSession, url: str, prompt: str = "w5 w6 w7") -> dict:
    async with session.post(
        f"http://{url}/v2/models/{contract.ENTRY_MODEL}/generate", json={"text_input": prompt, "max_tokens": 8}
    ) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


def ready_pods(em, variant: str) -> list[dict]:
    pods = em.list_objects(
        "v1", "Pod", NS, label_selector=f"{names.LABEL_VARIANT}={variant},{names.LABEL_COMPONENT}=serving"
    )
    return [
        p
        for p in pods
        if any(c["type"] == "Ready" and c["status"] == "True" for c in (p.get("status") or {}).get("conditions") or [])
    ]


async def test_serving_pods_are_real_tritons_routed_by_the_service(apiserver: EmulatorHandle, node: SimKubelet):
    try:
        TritonInstall.find()
    except TritonUnavailable as exc:
        pytest.skip(f"tritonserver cannot run here: {exc}")
    em = apiserver.emulator
    owner = demo_owner()
    assert set((await build_engines(em, owner)).values()) == {"Complete"}
    for obj in serving_objects(owner, "redrafter", pool="redrafter") + serving_objects(owner, "base", pool="base"):
        em.create_object(obj)
    em.create_object(service(owner, "redrafter"))
    dep_name = names.serving_deployment_name(owner.name, "redrafter")

    (pod,) = await wait_for(lambda: ready_pods(em, "redrafter"), 60, "a Ready redrafter pod")
    ip = pod["status"]["podIP"]
    assert ip.startswith("127.0.0.") and ip != "127.0.0.1"
    cs = pod["status"]["containerStatuses"][0]
    assert cs["ready"] and cs["state"]["running"]["startedAt"]
    assert pod["metadata"]["ownerReferences"][0]["name"] == dep_name
    await wait_for(
        lambda: em.get_object("apps/v1", "Deployment", dep_name, NS).get("status", {}).get("readyReplicas") == 1,
        10,
        "Deployment status readyReplicas=1",
    )
    (base_pod,) = await wait_for(lambda: ready_pods(em, "base"), 60, "a Ready base pod")
    node_dir = node.node_dir
    assert len(tritonservers_under(node_dir)) == 2

    async with KubeApi(apiserver.url) as api, aiohttp.ClientSession() as http:
        async with ServiceRouter(
            api, NS, names.service_name(owner.name), port_name="http", default_port=contract.HTTP_PORT, refresh=0.2
        ) as router:
            await wait_for(lambda: router.backends, 10, "router backends")
            backend = router.pick()
            assert backend.ip == ip and backend.port == contract.HTTP_PORT
            out = await generate(http, backend.url)
            assert out["text_output"].strip()
            # the pod's metrics port (what the operator scrapes) has the metering counters and load gauges
            async with http.get(f"http://{ip}:{contract.METRICS_PORT}/metrics") as resp:
                metrics = await resp.text()
            assert f'{contract.METRIC_REQUESTS}{{model="{owner.name}",variant="redrafter"}} 1' in metrics
            max_batch = owner.spec.engine.max_batch_size
            assert (
                f'{contract.METRIC_TRTLLM_REQUESTS}{{model="tensorrt_llm",request_type="max",version="1"}} {max_batch}'
            ) in metrics

            # scale up: a second pod, and round-robin over both
            em.patch_object("apps/v1", "Deployment", dep_name, NS, {"spec": {"replicas": 2}})
            await wait_for(lambda: len(router.backends) == 2, 60, "two backends")
            picked = {router.pick().ip for _ in range(4)}
            assert len(picked) == 2
            for _ in range(4):
                await generate(http, router.pick().url)

            # move the Service selector: the traffic moves to the other pool
            em.patch_object(
                "v1",
                "Service",
                names.service_name(owner.name),
                NS,
                {"spec": {"selector": names.traffic_selector(owner.name, "base")}},
            )
            await wait_for(
                lambda: [b.ip for b in router.backends] == [base_pod["status"]["podIP"]],
                10,
                "router following the selector",
            )
            eps = em.get_object("v1", "Endpoints", names.service_name(owner.name), NS)
            assert [a["ip"] for a in eps["subsets"][0]["addresses"]] == [base_pod["status"]["podIP"]]
            await generate(http, router.pick().url)

            # scale to zero: pods deleted, servers stopped
            em.patch_object("apps/v1", "Deployment", dep_name, NS, {"spec": {"replicas": 0}})
            await wait_for(
                lambda: (
                    not em.list_objects(
                        "v1",
                        "Pod",
                        NS,
                        label_selector=f"{names.LABEL_VARIANT}=redrafter,{names.LABEL_COMPONENT}=serving",
                    )
                ),
                30,
                "redrafter pods deleted",
            )
            await wait_for(lambda: len(tritonservers_under(node_dir)) == 1, 30, "redrafter servers stopped")
            em.patch_object(
                "v1",
                "Service",
                names.service_name(owner.name),
                NS,
                {"spec": {"selector": names.traffic_selector(owner.name, "redrafter")}},
            )
            await wait_for(lambda: not router.backends, 10, "no backends")
            with pytest.raises(NoEndpoints):
                router.pick()

    await node.stop()
    assert tritonservers_under(node_dir) == []
    assert not node_dir.exists()


async def test_serving_pods_run_the_openai_front_behind_the_service(apiserver: EmulatorHandle):
    """With the operator's own serving render: readiness through the front, a chat completion with the
    official client through the Service's ``openai`` port, and the front stopped with its pod."""
    try:
        TritonInstall.find()
    except TritonUnavailable as exc:
        pytest.skip(f"tritonserver cannot run here: {exc}")
    from openai import AsyncOpenAI

    from redrafter_operator.render.serving import serving_configmap, serving_deployment, stable_service

    em = apiserver.emulator
    owner = demo_owner(**{"serving.modelName": "demo/tiny-chat"})
    async with SimKubelet(apiserver.url, sync_period=0.3, openai_front=True) as node:
        assert set((await build_engines(em, owner)).values()) == {"Complete"}
        key = build_spec(owner.spec, "redrafter").key
        em.create_object(serving_configmap(owner, "redrafter", key))
        dep = em.create_object(serving_deployment(owner, "redrafter", key, 1))
        em.create_object(stable_service(owner, "redrafter"))
        (pod,) = await wait_for(lambda: ready_pods(em, "redrafter"), 90, "a Ready redrafter pod")
        (served,) = node.serving.pods.values()
        assert served.probe == ("/health/ready", contract.OPENAI_PORT) and served.front.poll() is None
        async with (
            KubeApi(apiserver.url) as api,
            ServiceRouter(
                api,
                NS,
                names.service_name(owner.name),
                port_name="openai",
                default_port=contract.OPENAI_PORT,
                refresh=0.2,
            ) as router,
        ):
            await wait_for(lambda: router.backends, 10, "router backends")
            backend = router.pick()
            assert (backend.ip, backend.port) == (pod["status"]["podIP"], contract.OPENAI_PORT)
            async with AsyncOpenAI(base_url=f"http://{backend.url}/v1", api_key="unused", max_retries=0) as client:
                assert [m.id for m in (await client.models.list()).data] == ["demo/tiny-chat"]
                raw = await client.chat.completions.with_raw_response.create(
                    model="demo/tiny-chat", messages=[{"role": "user", "content": "w5 w6 w7"}], max_tokens=12
                )
                done = raw.parse()
        assert done.usage.completion_tokens == 12 and len(done.choices[0].message.content.split()) == 12
        assert 0 < float(raw.headers[contract.ACCEPTANCE_HEADER]) <= 1
        front = served.front
        em.patch_object("apps/v1", "Deployment", dep["metadata"]["name"], NS, {"spec": {"replicas": 0}})
        await wait_for(lambda: front.poll() is not None, 30, "the front stopped with its pod")
        assert front.returncode == 0  # SIGTERM: drained and exited cleanly


async def test_engine_control_file_reaches_every_pod_of_a_variant(apiserver: EmulatorHandle, node: SimKubelet):
    """The demo collapses acceptance by writing one control file per (resource, variant)."""
    owner = demo_owner()
    ctl = node.set_engine(NS, owner.name, "redrafter", acceptance_rate=0.1)
    assert ctl.acceptance_rate == 0.1
    path = node.control_file(NS, owner.name, "redrafter")
    assert path.is_file() and str(path).startswith(str(node.node_dir))
    assert os.path.basename(path) == f"{NS}.{owner.name}.redrafter.json"


async def test_validation_job_runs_against_the_variant_services(apiserver: EmulatorHandle, node: SimKubelet):
    """Validation Jobs run `redrafter-operator evaluate validate`; `<svc>.<ns>.svc:8001` resolves to a Ready pod."""
    try:
        TritonInstall.find()
    except TritonUnavailable as exc:
        pytest.skip(f"tritonserver cannot run here: {exc}")
    from redrafter_operator.render.validation import validation_job

    em = apiserver.emulator
    owner = demo_owner()
    assert set((await build_engines(em, owner)).values()) == {"Complete"}
    for variant in contract.VARIANTS:
        for obj in serving_objects(owner, variant, pool=variant):
            em.create_object(obj)
        svc = service(owner, variant)
        svc["metadata"]["name"] = names.service_name(owner.name, variant)
        svc["spec"]["selector"] = names.serving_selector(owner.name, variant)
        em.create_object(svc)
    for variant in contract.VARIANTS:
        await wait_for(lambda v=variant: ready_pods(em, v), 60, f"a Ready {variant} pod")
    job = em.create_object(
        validation_job(
            owner,
            redrafter_key=build_spec(owner.spec, "redrafter").key,
            base_key=build_spec(owner.spec, "base").key,
            operator_image="op:dev",
        )
    )
    name = job["metadata"]["name"]
    state = await wait_for(lambda: job_state(em, name), 150, "the validation Job to finish")
    pods = build_pods(em, name)
    term = pods[-1]["status"]["containerStatuses"][0]["state"]["terminated"]
    assert state == "Complete", term
    assert term["exitCode"] == 0 and term["message"]


def _failing_deployment(
    owner: Owner, suffix: str, replicas: int = 1, gpus: int = 0, image: str | None = None, env: list[dict] | None = None
) -> list[dict]:
    """A serving Deployment (and its ConfigMap) of ``owner`` under its own name, with the given GPU limit,
    image and env; the engines are not built, so a pod that gets as far as starting crashes."""
    cm, dep = copy.deepcopy(serving_objects(owner, "redrafter", pool="redrafter"))
    dep["metadata"]["name"] = f"{owner.name}-{suffix}"
    dep["spec"]["replicas"] = replicas
    container = dep["spec"]["template"]["spec"]["containers"][0]
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    if image:
        container["image"] = image
    if env:
        container["env"] = env
    return [cm, dep]


def _pods_of(em, deployment: str) -> list[dict]:
    uid = em.get_object("apps/v1", "Deployment", deployment, NS)["metadata"]["uid"]
    return sorted(
        (
            p
            for p in em.list_objects("v1", "Pod", NS, label_selector=f"{names.LABEL_COMPONENT}=serving")
            if p["metadata"]["ownerReferences"][0]["uid"] == uid
        ),
        key=lambda p: p["metadata"]["name"],
    )


def _reasons(em, deployment: str) -> list[str]:
    return [ServingPodFact.from_body(p).reason for p in _pods_of(em, deployment)]


async def test_serving_failures_are_written_as_the_scheduler_and_kubelet_write_them(apiserver: EmulatorHandle):
    em = apiserver.emulator
    owner = demo_owner()
    async with SimKubelet(apiserver.url, sync_period=0.2, gpus=1) as node:
        node.serving.unpullable.add("registry.invalid/triton:missing")
        gpu = f"{owner.name}-gpu"
        for obj in (
            _failing_deployment(owner, "gpu", replicas=2, gpus=1)
            + _failing_deployment(owner, "pull", image="registry.invalid/triton:missing")
            + _failing_deployment(
                owner,
                "config",
                env=[{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}}],
            )
        ):
            if em.find_object(obj["apiVersion"], obj["kind"], obj["metadata"]["name"], NS) is None:
                em.create_object(obj)

        # one GPU on the node: the first pod gets it (and crash-loops: its engine was never built), the second
        # stays Pending with the scheduler's message
        await wait_for(
            lambda: sorted(_reasons(em, gpu)) == ["CrashLoopBackOff", "Unschedulable"],
            30,
            "a crash-looping pod and an unschedulable one",
        )
        by_reason = {ServingPodFact.from_body(p).reason: p for p in _pods_of(em, gpu)}
        sched = next(c for c in by_reason["Unschedulable"]["status"]["conditions"] if c["type"] == "PodScheduled")
        assert (sched["status"], sched["reason"]) == ("False", "Unschedulable")
        assert sched["message"].startswith("0/1 nodes are available: 1 Insufficient nvidia.com/gpu.")
        assert not by_reason["Unschedulable"]["status"].get("podIP")
        crashing = by_reason["CrashLoopBackOff"]
        cs = crashing["status"]["containerStatuses"][0]
        assert cs["state"]["waiting"]["reason"] == "CrashLoopBackOff" or cs["restartCount"] >= 1
        assert cs["lastState"]["terminated"]["exitCode"] == 1 and cs["lastState"]["terminated"]["reason"] == "Error"
        assert "engine artifact" in cs["lastState"]["terminated"]["message"]
        fact = ServingPodFact.from_body(crashing)
        assert "exited with code 1" in fact.message and "engine artifact" in fact.message

        pull = f"{owner.name}-pull"
        await wait_for(lambda: _reasons(em, pull) == ["ErrImagePull"], 20, "ErrImagePull")
        await wait_for(lambda: _reasons(em, pull) == ["ImagePullBackOff"], 20, "ImagePullBackOff")
        waiting = _pods_of(em, pull)[0]["status"]["containerStatuses"][0]["state"]["waiting"]
        assert waiting["message"] == 'Back-off pulling image "registry.invalid/triton:missing"'

        config = f"{owner.name}-config"
        await wait_for(lambda: _reasons(em, config) == ["CreateContainerConfigError"], 20, "CreateContainerConfigError")
        assert ServingPodFact.from_body(_pods_of(em, config)[0]).message == 'secret "hf-token" not found'
        # the Secret appears: the kubelet's next attempt creates the container (which then crashes: no engine)
        em.create_object(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "hf-token", "namespace": NS},
                "data": {"token": "eA=="},
            }
        )
        await wait_for(lambda: _reasons(em, config) == ["CrashLoopBackOff"], 20, "the config error resolved")

        # the crash loop stays one cause across restarts (no flapping to "no failure" in between)
        seen = set()
        for _ in range(25):
            seen.update(_reasons(em, config))
            await asyncio.sleep(0.2)
        assert seen == {"CrashLoopBackOff"}


async def test_an_engine_over_its_memory_limit_is_oom_killed_and_the_rollout_times_out(apiserver: EmulatorHandle):
    try:
        TritonInstall.find()
    except TritonUnavailable as exc:
        pytest.skip(f"tritonserver cannot run here: {exc}")
    em = apiserver.emulator
    owner = demo_owner()
    async with SimKubelet(apiserver.url, sync_period=0.2) as node:
        assert set((await build_engines(em, owner)).values()) == {"Complete"}
        node.serving.memory_needed = 2 * 2**30  # the loaded engine takes 2 GiB
        node.serving.deadline_seconds = 4.0
        cm, dep = _failing_deployment(owner, "oom")
        dep["spec"]["template"]["spec"]["containers"][0]["resources"] = {"limits": {"memory": "1Gi"}}
        em.create_object(cm)
        em.create_object(dep)
        name = dep["metadata"]["name"]
        await wait_for(lambda: _reasons(em, name) == ["OOMKilled"], 60, "OOMKilled")
        cs = _pods_of(em, name)[0]["status"]["containerStatuses"][0]
        assert cs["lastState"]["terminated"]["reason"] == "OOMKilled"
        assert cs["lastState"]["terminated"]["exitCode"] == 137
        assert "exit code 137" in ServingPodFact.from_body(_pods_of(em, name)[0]).message

        def progressing() -> dict:
            status = em.get_object("apps/v1", "Deployment", name, NS).get("status") or {}
            return next((c for c in status.get("conditions") or [] if c["type"] == "Progressing"), {})

        await wait_for(lambda: progressing().get("reason") == "ProgressDeadlineExceeded", 30, "the progress deadline")
        assert progressing()["status"] == "False"
        assert re.fullmatch(rf'ReplicaSet "{name}-[0-9a-f]{{8}}" has timed out progressing\.', progressing()["message"])
        fact = DeploymentFact.from_body(em.get_object("apps/v1", "Deployment", name, NS))
        assert fact.failure_reason == "ProgressDeadlineExceeded"


RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted"}


def unhardened(workload: dict) -> dict:
    """``workload`` with its pod template's security settings removed (what the operator rendered before)."""
    out = copy.deepcopy(workload)
    pod = out["spec"]["template"]["spec"]
    pod.pop("securityContext", None)
    for c in pod["containers"]:
        c.pop("securityContext", None)
    return out


def warning_events(em, namespace: str, name: str) -> list[dict]:
    return [
        e
        for e in em.list_objects("v1", "Event", namespace)
        if e["involvedObject"]["name"] == name and e["reason"] == "FailedCreate"
    ]


async def test_restricted_namespace_rejects_unhardened_pods_and_controllers_say_why(
    apiserver: EmulatorHandle, node: SimKubelet
):
    from redrafter_operator.render.serving import serving_deployment
    from redrafter_sim import controllers
    from redrafter_sim.apiserver import ApiError

    em = apiserver.emulator
    ns = "secure"
    em.create_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": RESTRICTED}})
    bare = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "bare", "namespace": ns},
        "spec": {"containers": [{"name": "app", "image": "busybox:1.36"}]},
    }
    with pytest.raises(ApiError) as rejected:
        em.create_object(bare)
    assert rejected.value.code == 403 and rejected.value.reason == "Forbidden"
    assert rejected.value.message.startswith(
        'pods "bare" is forbidden: violates PodSecurity "restricted:latest": '
        'allowPrivilegeEscalation != false (container "app" must set '
    )
    em.create_object({**bare, "metadata": {"name": "bare", "namespace": NS}})  # unlabelled namespace: admitted

    owner = Owner.from_body(
        {
            **yaml.safe_load((ROOT / "examples" / "demo-tiny.yaml").read_text()),
            "metadata": {"name": "demo-tiny", "namespace": ns, "uid": "1-2-3"},
        }
    )
    # the simulated node's Job controller: the build pod is rejected, the Job says why in an Event
    em.create_object(build_configmap(owner, "base"))
    job = em.create_object(unhardened(build_job(owner, "base")))
    events = await wait_for(lambda: warning_events(em, ns, job["metadata"]["name"]), 30, "the Job's FailedCreate Event")
    assert events[0]["message"].startswith(f'Error creating: pods "{job["metadata"]["name"]}-')
    assert 'violates PodSecurity "restricted:latest"' in events[0]["message"]
    assert events[0]["type"] == "Warning" and events[0]["involvedObject"]["kind"] == "Job"
    assert not build_pods(em, job["metadata"]["name"])
    # its ReplicaSet controller: a FailedCreate Event and the Deployment's ReplicaFailure condition
    dep = em.create_object(unhardened(serving_deployment(owner, "base", "0" * 20, 1)))
    name = dep["metadata"]["name"]

    def replica_failure() -> dict | None:
        status = em.get_object("apps/v1", "Deployment", name, ns).get("status") or {}
        return next((c for c in status.get("conditions") or [] if c["type"] == "ReplicaFailure"), None)

    condition = await wait_for(replica_failure, 30, "the Deployment's ReplicaFailure condition")
    assert condition["reason"] == "FailedCreate" and "violates PodSecurity" in condition["message"]
    assert warning_events(em, ns, name)
    assert not [p for p in em.list_objects("v1", "Pod", ns) if p["metadata"]["name"].startswith(name)]
    # the in-process Deployment controller the lifecycle tests drive reports it the same way
    plain = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "plain", "namespace": ns},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "plain"}},
            "template": {"metadata": {"labels": {"app": "plain"}}, "spec": bare["spec"]},
        },
    }
    em.create_object(plain)
    assert controllers.sync_deployment_pods(em, "plain", ns) == []
    assert controllers.sync_deployment_pods(em, "plain", ns) == []
    (event,) = warning_events(em, ns, "plain")  # the second failure is counted on the first Event
    assert event["count"] == 2 and event["involvedObject"]["kind"] == "Deployment"
    status = em.get_object("apps/v1", "Deployment", "plain", ns)["status"]
    (failure,) = [c for c in status["conditions"] if c["type"] == "ReplicaFailure"]
    assert failure["reason"] == "FailedCreate" and failure["message"].startswith('pods "plain-')


async def test_validation_job_over_the_openai_api(apiserver: EmulatorHandle):
    """``spec.validation.protocol: openai``: the Job validates the pair through the pods' OpenAI fronts,
    reached as ``http://<svc>.<ns>.svc:9000`` (the operator's own serving and validation renders)."""
    try:
        TritonInstall.find()
    except TritonUnavailable as exc:
        pytest.skip(f"tritonserver cannot run here: {exc}")
    from redrafter_operator.render.serving import serving_configmap, serving_deployment, variant_service
    from redrafter_operator.render.validation import validation_job

    em = apiserver.emulator
    owner = demo_owner(**{"validation.protocol": "openai", "validation.measureCrossover": False})
    async with SimKubelet(apiserver.url, sync_period=0.3, openai_front=True):
        assert set((await build_engines(em, owner)).values()) == {"Complete"}
        keys = {v: build_spec(owner.spec, v).key for v in contract.VARIANTS}
        for variant in contract.VARIANTS:
            em.create_object(serving_configmap(owner, variant, keys[variant]))
            em.create_object(serving_deployment(owner, variant, keys[variant], 1))
            em.create_object(variant_service(owner, variant))
        for variant in contract.VARIANTS:
            await wait_for(lambda v=variant: ready_pods(em, v), 90, f"a Ready {variant} pod")
        job = em.create_object(
            validation_job(owner, redrafter_key=keys["redrafter"], base_key=keys["base"], operator_image="op:dev")
        )
        args = job["spec"]["template"]["spec"]["containers"][0]["command"]
        assert args[args.index("--protocol") + 1] == "openai"
        name = job["metadata"]["name"]
        state = await wait_for(lambda: job_state(em, name), 150, "the validation Job to finish")
        term = build_pods(em, name)[-1]["status"]["containerStatuses"][0]["state"]["terminated"]
        assert state == "Complete", term
        assert term["exitCode"] == 0 and "greedy outputs identical" in term["message"]
