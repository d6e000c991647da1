"""``redrafter-operator cache ls|gc``: on a mounted path, and through the emulated API with the simulated node.

Through the API the command runs a one-pod Job on the cache claim (the node runs its real command,
``python -m engine_jobs cache ...``), reads the pod's termination message and deletes what it created.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest
import yaml
from test_kubelet import build_engines, demo_owner, job_state, node, wait_for  # noqa: F401 (the node fixture)

from engine_jobs.cache import CachePaths, publish, write_json_atomic
from redrafter_operator.render import cache_jobs
from redrafter_operator.render.build import build_configmap, build_job, build_spec
from redrafter_operator.render.common import Owner
from redrafter_sim.kubelet import SimKubelet
from redrafter_sim.server import EmulatorHandle

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]
CLI = Path(sys.executable).parent / "redrafter-operator"
NS = "default"


async def cli(*args: str) -> tuple[int, str, str]:
    """The CLI as a subprocess, without blocking the event loop the simulated node runs on."""
    proc = await asyncio.create_subprocess_exec(
        str(CLI), *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    return proc.returncode or 0, out.decode(), err.decode()


def resource(owner: Owner) -> dict:
    body = yaml.safe_load((ROOT / "examples" / "demo-tiny.yaml").read_text())
    body["metadata"] = {"name": owner.name, "namespace": NS}
    body["spec"]["engine"]["maxBatchSize"] = 2  # a spec change: the built engines are no longer the spec's
    return body


async def test_cache_ls_and_gc_dry_run_through_the_api(
    apiserver: EmulatorHandle,
    node: SimKubelet,  # noqa: F811
    kubeconfig: Path,
):
    em = apiserver.emulator
    em.create_object(yaml.safe_load((ROOT / "crds" / "redrafter.dev_redrafterdeployments.yaml").read_text()))
    owner = demo_owner()
    assert set((await build_engines(em, owner)).values()) == {"Complete"}
    keys = {v: build_spec(owner.spec, v).key for v in ("redrafter", "base")}
    claim = owner.spec.engine.cache.claim_name
    body = resource(owner)
    em.create_object(body)
    # status names the base engine still (e.g. it keeps serving while the new one builds)
    em.patch_object(
        "redrafter.dev/v1alpha1",
        "ReDrafterDeployment",
        owner.name,
        NS,
        {"status": {"engines": {"base": {"key": keys["base"], "state": "Ready"}}}},
        subresource="status",
    )
    cache_dir = node.fs.claim_dir(claim, owner.spec.engine.cache.sub_path)
    abandoned = cache_dir / f".tmp-{keys['redrafter']}-build-pod-x7k-4242"  # a builder killed long ago
    (abandoned / "engine").mkdir(parents=True)
    (abandoned / "engine" / "rank0.engine").write_bytes(b"\0" * 4096)

    code, out, err = await cli(
        "cache", "ls", "-o", "json", "--kubeconfig", str(kubeconfig), "--claim", claim, "--timeout", "90"
    )
    assert code == 0, err
    doc = json.loads(out)
    engines = {e["key"]: e for e in doc["engines"]}
    assert set(engines) == set(keys.values())
    assert engines[keys["base"]]["referencedBy"] == [
        {"namespace": NS, "name": owner.name, "role": "status.engines.base"}
    ]
    assert engines[keys["redrafter"]]["referencedBy"] == [] and engines[keys["redrafter"]]["unreferencedSince"] is None
    assert all(e["sizeBytes"] > 0 and e["builtAt"] for e in engines.values())
    assert (
        doc["partials"] == [{"entry": abandoned.name, "key": keys["redrafter"], "sizeBytes": 4096, "lockedBy": None}]
        and doc["partialBytes"] == 4096
    )

    code, out, err = await cli("cache", "ls", "--kubeconfig", str(kubeconfig), "--claim", claim)
    assert code == 0, err
    assert f"{NS}/{owner.name} (status.engines.base)" in out and "unreferenced (since before any collection" in out
    assert "1 partial build(s), 4.0 KiB; 1 abandoned" in out and f"{abandoned.name}  key {keys['redrafter']}" in out

    code, out, err = await cli(
        "cache", "gc", "--dry-run", "--keep", "0", "--kubeconfig", str(kubeconfig), "--claim", claim
    )
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
    assert not [j for j in em.list_objects("batch/v1", "Job", NS) if j["metadata"]["name"].startswith("cache-")]
    assert not [c for c in em.list_objects("v1", "ConfigMap", NS) if c["metadata"]["name"].startswith("cache-")]


async def test_cache_gc_refuses_to_collect_through_the_api(kubeconfig: Path):
    code, _, err = await cli("cache", "gc", "--keep", "0", "--kubeconfig", str(kubeconfig))
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
    apiserver: EmulatorHandle,  # noqa: F811
    node: SimKubelet,
):
    """The retry after an out-of-disk failure: its init container (the real ``cache gc``) runs to completion
    before the build container starts, on the same claim."""
    em = apiserver.emulator
    owner = demo_owner()
    keys = {v: build_spec(owner.spec, v).key for v in ("redrafter", "base")}
    claim, sub = owner.spec.engine.cache.claim_name, owner.spec.engine.cache.sub_path
    cache_dir = node.fs.claim_dir(claim, sub)
    for stale in ("stale-engine-1", keys["base"]):  # an unreferenced engine, and the base engine (referenced)
        paths = CachePaths(cache_dir, stale)
        tmp = paths.new_tmp()
        (tmp / "engine").mkdir(parents=True)
        (tmp / "engine" / "rank0.engine").write_bytes(b"\0" * 4096)
        write_json_atomic(tmp / "manifest.json", {"key": stale, "variant": "base", "inputs": {}})
        publish(tmp, paths.final)
    em.create_object(
        cache_jobs.references_config_map(
            name=cache_jobs.collection_name(claim),
            namespace=NS,
            claim=claim,
            document=json.dumps(
                {"references": [{"key": keys["base"], "namespace": NS, "name": owner.name, "role": "spec.base"}]}
            ),
        )
    )
    em.create_object(build_configmap(owner, "redrafter"))
    job = cache_jobs.collect_before_build(build_job(owner, "redrafter", 1), claim=claim, keep=0, max_age=None)
    name = em.create_object(job)["metadata"]["name"]
    await wait_for(lambda: job_state(em, name), 90, "the collecting build Job")
    assert job_state(em, name) == "Complete"
    (pod,) = em.list_objects("v1", "Pod", NS, label_selector=f"job-name={name}")
    (init,) = pod["status"]["initContainerStatuses"]
    report = json.loads(init["state"]["terminated"]["message"])
    assert [r["key"] for r in report["removed"]] == ["stale-engine-1"] and report["freedBytes"] > 4096
    assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["message"].startswith("OK: engine ")
    assert not (cache_dir / "stale-engine-1").exists()
    assert all((cache_dir / k / "manifest.json").is_file() for k in keys.values())
