"""``redrafter-operator cache ls|gc``: on a mounted path, and through the API of the real control plane with a
simulated node that runs pods as processes (:class:`redrafter_sim.node.SimNode`).

Through the API the command runs a one-pod Job on the cache claim (the node runs its real command,
``python -m engine_jobs cache ...``), reads the pod's termination message and deletes what it created.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from engine_jobs.cache import CachePaths, publish, write_json_atomic
from harness.cluster import Kube
from harness.waiting import until
from redrafter_operator.api import API_VERSION
from redrafter_operator.render import cache_jobs
from redrafter_operator.render.build import build_configmap, build_job, build_spec
from redrafter_operator.render.common import Owner
from redrafter_sim.kubeapi import CONFIGMAPS, JOBS, NODES, PODS, PVCS, PVS, ApiStatusError, Kind, KubeApi
from redrafter_sim.node import SimNode

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]
CLI = Path(sys.executable).parent / "redrafter-operator"
CLAIMS = ("engine-cache", "models")  # the demo's engine cache and its pvc:// model source
RDDS = Kind(API_VERSION, "redrafterdeployments")


async def cli(*args: str) -> tuple[int, str, str]:
    """The CLI as a subprocess, without blocking the event loop the simulated node runs on."""
    proc = await asyncio.create_subprocess_exec(
        str(CLI), *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    return proc.returncode or 0, out.decode(), err.decode()


@pytest.fixture
async def admin(kube: Kube) -> AsyncIterator[KubeApi]:
    async with KubeApi.from_kubeconfig(kube.cp.admin_kubeconfig, timeout=30) as api:
        yield api


@pytest.fixture
async def node(kube: Kube, admin: KubeApi) -> AsyncIterator[SimNode]:
    """A node of this test's own with the claims' PersistentVolumes in its directory; the Node and the volumes
    (cluster-scoped) deleted after it, which also has the pod garbage collector remove the pods left on it."""
    name = f"cache-{kube.namespace}"
    sim = SimNode(kube.cp.node_kubeconfig(name), name=name, heartbeat_seconds=1.0, node_dir=kube.home / "node")
    await sim.start()
    try:
        for claim in CLAIMS:
            pv, pvc = sim.claim_objects(kube.namespace, claim)
            await admin.create(PVS, pv)
            await admin.create(PVCS, pvc, kube.namespace)
        yield sim
    finally:
        await sim.stop()
        for kind, obj in [
            (NODES, name),
            *((PVS, sim.claim_objects(kube.namespace, c)[0]["metadata"]["name"]) for c in CLAIMS),
        ]:
            with contextlib.suppress(ApiStatusError):
                await admin.delete(kind, obj)


def demo_owner(namespace: str) -> Owner:
    body = yaml.safe_load((ROOT / "examples" / "demo-tiny.yaml").read_text())
    body["metadata"].update(namespace=namespace, uid="11111111-2222-3333-4444-555555555555")
    return Owner.from_body(body)


def without_owner(obj: dict[str, Any]) -> dict[str, Any]:
    """The rendered object without its owner reference (no such ReDrafterDeployment exists: the real garbage
    collector would delete a dependent whose owner is absent)."""
    obj["metadata"].pop("ownerReferences", None)
    return obj


async def job_state(admin: KubeApi, ns: str, name: str) -> str:
    job = await admin.get(JOBS, name, ns)
    for c in ((job or {}).get("status") or {}).get("conditions") or []:
        if c["type"] in ("Complete", "Failed") and c["status"] == "True":
            return str(c["type"])
    return ""


async def build_engines(admin: KubeApi, owner: Owner) -> dict[str, str]:
    """Create both build Jobs as the operator would; wait until they finish; name -> final state."""
    ns, jobs = owner.namespace, []
    for variant in ("redrafter", "base"):
        await admin.create(CONFIGMAPS, without_owner(build_configmap(owner, variant)), ns)
        jobs.append((await admin.create(JOBS, without_owner(build_job(owner, variant)), ns))["metadata"]["name"])

    async def done() -> bool:
        return all([await job_state(admin, ns, j) for j in jobs])

    await until(done, 120, "build Jobs to finish")
    return {j: await job_state(admin, ns, j) for j in jobs}


def resource(owner: Owner) -> dict[str, Any]:
    body = yaml.safe_load((ROOT / "examples" / "demo-tiny.yaml").read_text())
    body["metadata"] = {"name": owner.name, "namespace": owner.namespace}
    body["spec"]["engine"]["maxBatchSize"] = 2  # a spec change: the built engines are no longer the spec's
    return body


async def test_cache_ls_and_gc_dry_run_through_the_api(kube: Kube, admin: KubeApi, node: SimNode):
    ns = kube.namespace
    owner = demo_owner(ns)
    assert set((await build_engines(admin, owner)).values()) == {"Complete"}
    keys = {v: build_spec(owner.spec, v).key for v in ("redrafter", "base")}
    claim = owner.spec.engine.cache.claim_name
    await admin.create(RDDS, resource(owner), ns)
    # status names the base engine still (e.g. it keeps serving while the new one builds)
    status = {"status": {"engines": {"base": {"key": keys["base"], "state": "Ready"}}}}
    await admin.patch(RDDS, owner.name, ns, status, "status")
    cache_dir = node.claim_path(ns, claim) / owner.spec.engine.cache.sub_path
    abandoned = cache_dir / f".tmp-{keys['redrafter']}-build-pod-x7k-4242"  # a builder killed long ago
    (abandoned / "engine").mkdir(parents=True)
    (abandoned / "engine" / "rank0.engine").write_bytes(b"\0" * 4096)
    api = ["--kubeconfig", str(kube.kubeconfig), "-n", ns, "--claim", claim]

    code, out, err = await cli("cache", "ls", "-o", "json", *api, "--timeout", "90")
    assert code == 0, err
    doc = json.loads(out)
    engines = {e["key"]: e for e in doc["engines"]}
    assert set(engines) == set(keys.values())
    assert engines[keys["base"]]["referencedBy"] == [
        {"namespace": ns, "name": owner.name, "role": "status.engines.base"}
    ]
    assert engines[keys["redrafter"]]["referencedBy"] == [] and engines[keys["redrafter"]]["unreferencedSince"] is None
    assert all(e["sizeBytes"] > 0 and e["builtAt"] for e in engines.values())
    assert (
        doc["partials"] == [{"entry": abandoned.name, "key": keys["redrafter"], "sizeBytes": 4096, "lockedBy": None}]
        and doc["partialBytes"] == 4096
    )

    code, out, err = await cli("cache", "ls", *api)
    assert code == 0, err
    assert f"{ns}/{owner.name} (status.engines.base)" in out and "unreferenced (since before any collection" in out
    assert "1 partial build(s), 4.0 KiB; 1 abandoned" in out and f"{abandoned.name}  key {keys['redrafter']}" in out

    code, out, err = await cli("cache", "gc", "--dry-run", "--keep", "0", *api)
    assert code == 0, err
    assert f"would remove {keys['redrafter']}" in out and keys["base"] not in out
    assert (
        f"would remove {keys['redrafter']}  partial  unknown  4.0 KiB  (abandoned partial build {abandoned.name})"
        in out
        and "1 engine(s) and 1 abandoned partial build(s)" in out
    )
    assert all((cache_dir / k / "manifest.json").is_file() for k in keys.values()), "a dry run removes nothing"
    assert abandoned.is_dir()
    # what it created is gone again
    assert not [j for j in await admin.list(JOBS, ns) if j["metadata"]["name"].startswith("cache-")]
    assert not [c for c in await admin.list(CONFIGMAPS, ns) if c["metadata"]["name"].startswith("cache-")]


async def test_cache_gc_refuses_to_collect_through_the_api(kube: Kube):
    code, _, err = await cli("cache", "gc", "--keep", "0", "--kubeconfig", str(kube.kubeconfig), "-n", kube.namespace)
    assert code == 2 and "only runs with --dry-run" in err


async def test_cache_ls_local_is_engine_jobs_listing(tmp_path: Path):
    cache = tmp_path / "cache"
    cache.mkdir()
    code, out, err = await cli("cache", "ls", "--local", str(cache), "-o", "json")
    assert code == 0, err
    assert json.loads(out) == {"cache": str(cache), "engines": [], "totalBytes": 0, "partials": [], "partialBytes": 0}
    code, _, err = await cli("cache", "gc", "--local", str(cache), "--keep", "0")
    assert code == 2 and "--references FILE" in err


async def test_a_build_job_that_collects_first_runs_the_collection_then_the_build(
    kube: Kube, admin: KubeApi, node: SimNode
):
    """The retry after an out-of-disk failure: its init container (the real ``cache gc``) runs to completion
    before the build container starts, on the same claim."""
    ns = kube.namespace
    owner = demo_owner(ns)
    keys = {v: build_spec(owner.spec, v).key for v in ("redrafter", "base")}
    claim, sub = owner.spec.engine.cache.claim_name, owner.spec.engine.cache.sub_path
    cache_dir = node.claim_path(ns, claim) / sub
    for stale in ("stale-engine-1", keys["base"]):  # an unreferenced engine, and the base engine (referenced)
        paths = CachePaths(cache_dir, stale)
        tmp = paths.new_tmp()
        (tmp / "engine").mkdir(parents=True)
        (tmp / "engine" / "rank0.engine").write_bytes(b"\0" * 4096)
        write_json_atomic(tmp / "manifest.json", {"key": stale, "variant": "base", "inputs": {}})
        publish(tmp, paths.final)
    references = {"references": [{"key": keys["base"], "namespace": ns, "name": owner.name, "role": "spec.base"}]}
    await admin.create(
        CONFIGMAPS,
        cache_jobs.references_config_map(
            name=cache_jobs.collection_name(claim), namespace=ns, claim=claim, document=json.dumps(references)
        ),
        ns,
    )
    await admin.create(CONFIGMAPS, without_owner(build_configmap(owner, "redrafter")), ns)
    job = cache_jobs.collect_before_build(build_job(owner, "redrafter", 1), claim=claim, keep=0, max_age=None)
    name = (await admin.create(JOBS, without_owner(job), ns))["metadata"]["name"]
    assert await until(lambda: job_state(admin, ns, name), 90, "the collecting build Job") == "Complete"
    (pod,) = await admin.list(PODS, ns, label_selector=f"job-name={name}")
    (init,) = pod["status"]["initContainerStatuses"]
    report = json.loads(init["state"]["terminated"]["message"])
    assert [r["key"] for r in report["removed"]] == ["stale-engine-1"] and report["freedBytes"] > 4096
    assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["message"].startswith("OK: engine ")
    assert not (cache_dir / "stale-engine-1").exists()
    assert all((cache_dir / k / "manifest.json").is_file() for k in keys.values())
