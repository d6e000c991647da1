"""The PyTorch backend's methods through the whole lifecycle, each: apply -> prepare -> serve -> validate ->
fall back -> return.

The policy-loop harness (the real control plane, per-pod metrics over HTTP, the operator in-process), whose
nodes run the build Jobs' pods for real: the real prepare program (``python -m engine_jobs build`` on a
``backend: pytorch`` spec) fetches the sim's hf:// fixtures and publishes the one artifact both variants
serve. The test plays the validation Job (its verdict and the crossover it measured) and the acceptance the
pods report; real serving of each method's model repository is tests/integration/test_serving_llmapi.py's.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from engine_jobs import contract
from engine_jobs.contract import ServingConfig
from engine_jobs.llmapi_backend import check_model_yaml
from engine_jobs.llmapi_config import IN_ENGINE_LIMIT_METHODS, model_yaml
from harness.lifecycle import NAME, is_ready
from harness.metered import MeteredCluster, WatchedOperator, metered_cluster, policy_doc
from harness.validation import engines_ready, validated, validation_jobs
from harness.waiting import until
from redrafter_operator.render import names
from redrafter_sim.controlplane import ControlPlane

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
async def cluster(control_plane: ControlPlane, tmp_path: Path) -> AsyncIterator[MeteredCluster]:
    """The metered cluster whose nodes run the build (prepare) Jobs' real programs; every other pod is held.

    The claims' PersistentVolumes are hostPath directories of the first node: a node mounts only its own (a
    hostPath volume is node-local), so the other node is cordoned and every pod lands where they are."""
    async with metered_cluster(control_plane, tmp_path / "cluster") as c:
        for other in list(c.nodes)[1:]:
            c.kubectl("cordon", other, check=True)
        c.pods.processes = lambda pod: (
            (pod["metadata"].get("labels") or {}).get(names.LABEL_COMPONENT) == "engine-build"
        )
        yield c


def engine_cache(cluster: MeteredCluster) -> Path:
    """Where the engine cache's PersistentVolume keeps its files on this machine (its hostPath)."""
    pv = cluster.get("v1", "PersistentVolume", f"{cluster.ns}-engine-cache")
    return Path(pv["spec"]["hostPath"]["path"])


def serving_config(cl: MeteredCluster, variant: str) -> ServingConfig:
    cm = cl.find("v1", "ConfigMap", names.serving_config_name(NAME, variant))
    assert cm is not None, f"no serving.json for {variant}"
    return ServingConfig.model_validate_json(cm["data"][contract.SERVING_CONFIG_FILE])


def serving_pods(cl: MeteredCluster) -> list[str]:
    """Each serving pod's name, phase and Ready condition."""
    return [
        f"{p['metadata']['name']} {p['status'].get('phase')} ready={is_ready(p)}"
        for p in cl.list("v1", "Pod", f"{names.LABEL_COMPONENT}=serving")
    ]


def history(cl: MeteredCluster) -> list[tuple[str, str]]:
    return [(h["from"], h["to"]) for h in cl.status().get("history") or []]


@pytest.mark.parametrize("method", list(METHODS))
async def test_a_pytorch_method_prepares_serves_validates_falls_back_and_returns(
    method: str, cluster: MeteredCluster, operator: WatchedOperator
) -> None:
    cluster.apply(method_doc(method))  # the CRD's CEL rules accept it as a user would apply it

    # prepare: both variants' Jobs run the real prepare program; one artifact, one key, no GPU asked
    await until(lambda: engines_ready(cluster), timeout=90, what="both variants Ready from the prepare Jobs")
    engines = cluster.status()["engines"]
    assert engines["redrafter"]["key"] == engines["base"]["key"]
    jobs = cluster.jobs()
    assert len(jobs) == 2 and all(
        "nvidia.com/gpu" not in j["spec"]["template"]["spec"]["containers"][0]["resources"].get("requests", {})
        for j in jobs
    )
    artifact = engine_cache(cluster) / "engines" / engines["base"]["key"]
    manifest = json.loads((artifact / contract.MANIFEST_FILE).read_text())
    assert manifest["method"] == method and (artifact / contract.CHECKPOINT_DIR / "config.json").is_file()
    assert (artifact / contract.DRAFT_DIR).is_dir() == ("drafter" in METHODS[method]["model"])

    # validate: the Job compares the variants' greedy outputs; its pass promotes the speculative variant
    await until(lambda: validation_jobs(cluster), what="the validation Job")
    (job,) = validation_jobs(cluster)
    cluster.complete_job(job, f"Passed: 12 prompts identical | crossoverConcurrency={CROSSOVER}")
    await until(lambda: validated(cluster).get("status") == "True", what="Validated=True")
    await until(lambda: cluster.pool() == "redrafter", what="the speculative variant promoted")

    # serve: the speculative pods' model.yaml has the method and, once measured and where the method's drafter
    # reads it (not the one-model Eagle3 and MTP), the in-engine limit; the base pods' is the same checkpoint
    # without speculative_config; upstream's contract accepts both
    limit = int(CROSSOVER) if method in IN_ENGINE_LIMIT_METHODS else None
    await until(
        lambda: (
            serving_config(cluster, "redrafter").max_concurrency == limit
            and (cluster.status().get("validation") or {}).get("promoted")
        ),
        timeout=30,
        what=f"max_concurrency {limit} once the crossover is measured",
    )
    spec_doc, base_doc = (model_yaml(serving_config(cluster, v)) for v in ("redrafter", "base"))
    expected = dict(METHODS[method]["speculative"], **({"max_concurrency": limit} if limit else {}))
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
    await until(lambda: cluster.pool() == "base", what="fallback to base", explain=operator.recent)
    assert ("redrafter", "base") in history(cluster)

    # return: a canary pod starts in the base pool and measures recovered acceptance -> back to the speculative
    # variant (a pod start and two good windows: the wait allows for a loaded machine)
    cluster.acceptance["redrafter"] = 0.85
    await until(
        lambda: cluster.pool() == "redrafter" and len(history(cluster)) >= 2,
        timeout=120,
        what="return",
        explain=lambda: f"{operator.recent()}; serving pods {serving_pods(cluster)}",
    )
    assert history(cluster)[-1] == ("base", "redrafter")
