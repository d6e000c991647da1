"""The PyTorch backend's methods through the whole lifecycle, each: apply -> prepare -> serve -> validate ->
fall back -> return.

The policy-loop harness (emulated API over HTTP, per-pod metrics over HTTP, the operator in-process), plus the
emulated node's Job runner for the build Jobs only: the real prepare program (``python -m engine_jobs build``
on a ``backend: pytorch`` spec) fetches the sim's hf:// fixtures and publishes the one artifact both variants
serve. The test plays the validation Job (its verdict and the crossover it measured) and the acceptance the
pods report; real serving of each method's model repository is tests/integration/test_serving_llmapi.py's.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_lifecycle import NAME, NS, apply, until  # noqa: I001 (same dir)
from test_policy_loop import MeteredCluster, Watched, cluster, operator, policy_doc  # noqa: F401 (fixtures)
from test_validation_gate import validated, validation_jobs

from engine_jobs import contract
from engine_jobs.contract import ServingConfig
from engine_jobs.llmapi_backend import check_model_yaml
from engine_jobs.llmapi_config import model_yaml
from redrafter_operator.render import names
from redrafter_sim import controllers
from redrafter_sim.buildjobs import JobRunner
from redrafter_sim.hostfs import HostFS
from redrafter_sim.kubeapi import KubeApi
from redrafter_sim.server import EmulatorHandle

pytestmark = pytest.mark.timeout(240)

#: each method with the sim's fixtures (hf://redrafter-sim/<name>, served offline by the emulated node)
METHODS: dict[str, dict[str, Any]] = {
    "eagle3": {
        "model": {"base": "tiny-llama", "drafter": "tiny-llama-eagle3"},
        "block": {"eagle3": {"maxDraftLen": 3}},
        "speculative": {"decoding_type": "Eagle3", "max_draft_len": 3},
    },
    "mtp": {
        "model": {"base": "tiny-deepseek-mtp"},
        "block": {"mtp": {"numNextnPredictLayers": 1}},
        "speculative": {"decoding_type": "MTP", "num_nextn_predict_layers": 1},
    },
    "ngram": {
        "model": {"base": "tiny-llama"},
        "block": {"ngram": {"maxDraftLen": 4, "maxMatchingNgramSize": 3}},
        "speculative": {"decoding_type": "NGram", "max_draft_len": 4, "max_matching_ngram_size": 3},
    },
    "draftModel": {
        "model": {"base": "tiny-llama", "drafter": "tiny-llama-draft"},
        "block": {"draftModel": {"maxDraftLen": 4}},
        "speculative": {"decoding_type": "Draft_Target", "max_draft_len": 4},
    },
}
CROSSOVER = 4.5  # what the played validation Job reports; the engine gets max_concurrency 4


def method_doc(method: str) -> dict[str, Any]:
    doc = policy_doc()
    spec = doc["spec"]
    case = METHODS[method]
    spec["method"] = method
    spec["model"] = {role: {"source": f"hf://redrafter-sim/{name}"} for role, name in case["model"].items()}
    for dropped in ("redrafter", "precision"):  # the ReDrafter build's blocks
        spec.pop(dropped, None)
    spec.update(case["block"])
    spec["validation"] = {"enabled": True}
    spec["speculation"].update(cooldown="2s", minDwell="2s")  # shorter holds; the test waits on outcomes only
    return doc


@pytest.fixture
async def node_jobs(apiserver: EmulatorHandle, tmp_path: Path) -> AsyncIterator[JobRunner]:
    """The emulated node's Job runner, running the build (prepare) Jobs only."""
    async with KubeApi(apiserver.url) as api:
        runner = JobRunner(api, HostFS(tmp_path / "node"), components=("engine-build",))
        stop = asyncio.Event()

        async def loop() -> None:
            while not stop.is_set():
                await runner.sync()
                await asyncio.sleep(0.2)

        task = asyncio.create_task(loop())
        try:
            yield runner
        finally:
            stop.set()
            await task
            await runner.shutdown()


def serving_config(cl: MeteredCluster, variant: str) -> ServingConfig:
    cm = cl.emu.find_object("v1", "ConfigMap", names.serving_config_name(NAME, variant), NS)
    assert cm is not None, f"no serving.json for {variant}"
    return ServingConfig.model_validate_json(cm["data"][contract.SERVING_CONFIG_FILE])


def history(cl: MeteredCluster) -> list[tuple[str, str]]:
    return [(h["from"], h["to"]) for h in cl.status().get("history") or []]


@pytest.mark.parametrize("method", list(METHODS))
async def test_a_pytorch_method_prepares_serves_validates_falls_back_and_returns(
    method: str, cluster: MeteredCluster, operator: Watched, node_jobs: JobRunner, kubectl: Any
) -> None:
    apply(kubectl, method_doc(method))  # the CRD's CEL rules accept it as a user would apply it

    # prepare: both variants' Jobs run the real prepare program; one artifact, one key, no GPU asked
    await until(
        lambda: all(
            (cluster.status().get("engines") or {}).get(v, {}).get("state") == "Ready" for v in ("redrafter", "base")
        ),
        timeout=90,
        what="both variants Ready from the prepare Jobs",
    )
    engines = cluster.status()["engines"]
    assert engines["redrafter"]["key"] == engines["base"]["key"]
    jobs = cluster.jobs()
    assert len(jobs) == 2 and all(
        "nvidia.com/gpu" not in j["spec"]["template"]["spec"]["containers"][0]["resources"].get("requests", {})
        for j in jobs
    )
    artifact = node_jobs.fs.claim_dir("engine-cache", "engines") / engines["base"]["key"]
    manifest = json.loads((artifact / contract.MANIFEST_FILE).read_text())
    assert manifest["method"] == method and (artifact / contract.CHECKPOINT_DIR / "config.json").is_file()
    assert (artifact / contract.DRAFT_DIR).is_dir() == ("drafter" in METHODS[method]["model"])

    # validate: the Job compares the variants' greedy outputs; its pass promotes the speculative variant
    await until(lambda: validation_jobs(cluster), timeout=60, what="the validation Job")
    (job,) = validation_jobs(cluster)
    controllers.complete_job(
        cluster.emu, job, NS, message=f"Passed: 12 prompts identical | crossoverConcurrency={CROSSOVER}"
    )
    await until(lambda: validated(cluster).get("status") == "True", timeout=30, what="Validated=True")
    await until(lambda: cluster.pool() == "redrafter", timeout=60, what="the speculative variant promoted")

    # serve: the speculative pods' model.yaml has the method and, once measured, the in-engine limit;
    # the base pods' is the same checkpoint without speculative_config; upstream's contract accepts both
    await until(
        lambda: serving_config(cluster, "redrafter").max_concurrency == int(CROSSOVER),
        timeout=30,
        what="max_concurrency from the measured crossover",
    )
    spec_doc, base_doc = (model_yaml(serving_config(cluster, v)) for v in ("redrafter", "base"))
    expected = dict(METHODS[method]["speculative"], max_concurrency=int(CROSSOVER))
    got = {k: v for k, v in spec_doc["speculative_config"].items() if k != "speculative_model_dir"}
    assert got == expected
    assert ("speculative_model_dir" in spec_doc["speculative_config"]) == ("drafter" in METHODS[method]["model"])
    assert "speculative_config" not in base_doc and base_doc["model"] == spec_doc["model"]
    assert check_model_yaml(spec_doc) == [] and check_model_yaml(base_doc) == []
    rendered = yaml.safe_dump(spec_doc)
    assert "acceptance_rate_threshold" not in rendered and "acceptance_length_threshold" not in rendered

    # fall back: acceptance collapses on the speculative pods -> the Service moves to base
    await until(lambda: (cluster.status().get("speculation") or {}).get("samples", 0) > 0, what="measured")
    cluster.acceptance["redrafter"] = 0.05
    await until(lambda: cluster.pool() == "base", timeout=60, what="fallback to base")
    assert ("redrafter", "base") in history(cluster)

    # return: the canary measures recovered acceptance -> back to the speculative variant
    cluster.acceptance["redrafter"] = 0.85
    await until(lambda: cluster.pool() == "redrafter" and len(history(cluster)) >= 2, timeout=60, what="return")
    assert history(cluster)[-1] == ("base", "redrafter")
