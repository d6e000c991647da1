"""The emulated kubelet's serving and validation tests not yet on SimNode and the real control plane: real
tritonservers routed by a Service (metrics, scale-out, selector moves, clean node stop), the OpenAI front, and
validation Jobs against the variant Services. The rest moved to test_node.py.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from engine_jobs import contract
from engine_jobs.contract import ServingConfig
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
