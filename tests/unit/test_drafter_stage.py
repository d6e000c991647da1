"""A spec with model.drafter.train: the API's rules, the drafter key, the training Job, and the planner's stage
before the ReDrafter engine (Pending while training, Ready with the held-out figures, Failed with its cause)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from engine_jobs.contract import TrainingProgress, TrainingResult, TrainSpec
from engine_jobs.errors import ExitCode
from redrafter_operator.api.engine_key import drafter_key, engine_key
from redrafter_operator.api.spec import ReDrafterDeploymentSpec, parse_spec
from redrafter_operator.controller.facts import JobFact, Observed, PodFact
from redrafter_operator.controller.plan_types import Renderers, Resource
from redrafter_operator.controller.planner import Inputs, plan
from redrafter_operator.controller.reports import TrainingReport
from redrafter_operator.render import names
from redrafter_operator.render.common import Owner
from redrafter_operator.render.training import training_configmap, training_job

ROOT = Path(__file__).resolve().parents[2]
NOW = "2026-01-01T00:00:00Z"
TRAIN = {"dataset": {"source": "pvc://datasets/chat/prompts.jsonl", "column": "prompt"}, "samples": 500}
RENDER = Renderers(variant=lambda owner, v, key, n: [], services=lambda owner, pool: [])


def doc(train: dict | None = None, **redrafter) -> dict:
    d = yaml.safe_load((ROOT / "examples" / "llama3-8b.yaml").read_text())
    d["metadata"].update(uid="u-1", generation=1)
    d["spec"]["model"]["drafter"] = {"train": copy.deepcopy(train or TRAIN)}
    d["spec"].setdefault("redrafter", {}).update(redrafter)
    return d


def spec_of(d: dict) -> ReDrafterDeploymentSpec:
    return ReDrafterDeploymentSpec.model_validate(d["spec"])


def res(d: dict, status: dict | None = None) -> Resource:
    d = copy.deepcopy(d)
    if status is not None:
        d["status"] = status
    return Resource.from_body(d)


def training(
    d: dict, state: str, attempt: int = 0, reason: str = "", message: str = "", code: int | None = None
) -> JobFact:
    key = drafter_key(spec_of(d))
    assert key
    return JobFact(
        name=names.training_job_name("llama3-8b", key, attempt),
        namespace="default",
        owner="llama3-8b",
        variant="drafter",
        key=key,
        attempt=attempt,
        retry_token="",
        claim="engine-cache",
        artifact=f"engines/drafters/{key}",
        state=state,  # type: ignore[arg-type]
        reason=reason,
        message=message,
        final_exit_code=code,
    )


# ---- API ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("drafter", "error"),
    [
        ({}, "spec.model.drafter: give exactly one of drafter.source"),
        ({"source": "pvc://d/x", "train": TRAIN}, "spec.model.drafter: give exactly one of drafter.source"),
        ({"train": {"samples": 5}}, "spec.model.drafter.train.dataset: Field required"),
        ({"train": {**TRAIN, "recipe": {"draftLen": 0}}}, "spec.model.drafter.train.recipe.draftLen"),
        ({"train": {**TRAIN, "gpus": 0}}, "spec.model.drafter.train.gpus"),
        ({"train": {"dataset": {"source": "pvc://d/../x"}}}, "spec.model.drafter.train.dataset.source"),
        ({"train": TRAIN, "revision": "v1"}, "revision is only meaningful for hf:// sources"),
    ],
)
def test_drafter_takes_a_source_or_a_training_and_names_the_field(drafter: dict, error: str) -> None:
    d = doc()
    d["spec"]["model"]["drafter"] = drafter
    errors = parse_spec(d["spec"])[1]
    assert any(e.startswith(error) or error in e for e in errors), errors


def test_draft_len_per_beam_must_not_exceed_the_trained_draft_length() -> None:
    errors = parse_spec(doc({**TRAIN, "recipe": {"draftLen": 3}}, draftLenPerBeam=4)["spec"])[1]
    assert errors == [
        "spec: redrafter.draftLenPerBeam must not exceed model.drafter.train.recipe.draftLen (the trained draft "
        "length): 4 > 3"
    ]
    assert parse_spec(doc({**TRAIN, "recipe": {"draftLen": 4}}, draftLenPerBeam=4)["spec"])[1] == []


def test_the_crd_carries_the_same_rules_as_cel() -> None:
    crd = yaml.safe_load((ROOT / "crds" / "redrafter.dev_redrafterdeployments.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    rules = [r["message"] for r in schema["x-kubernetes-validations"]]
    assert any("draftLenPerBeam must not exceed" in m for m in rules)
    drafter = schema["properties"]["model"]["properties"]["drafter"]
    assert any("exactly one of drafter.source" in r["message"] for r in drafter["x-kubernetes-validations"])
    assert set(drafter["properties"]) >= {"source", "revision", "credentialsSecret", "train"}


# ---- keys -----------------------------------------------------------------------------------------
def test_the_drafter_key_covers_every_training_input_and_names_the_redrafter_engine() -> None:
    base = spec_of(doc())
    k = drafter_key(base)
    assert k and len(k) == 20
    for change in (
        {"samples": 501},
        {"dataset": {**TRAIN["dataset"], "column": "text"}},
        {"dataset": {"source": "hf://org/prompts", "revision": "abc"}},
        {"recipe": {"epochs": 3}},
        {"recipe": {"rnn": False}},
        {"gpus": 2},
        {"gpuProduct": "NVIDIA-H100-80GB-HBM3"},
        {"image": "example.com/trainer:2"},
    ):
        other = spec_of(doc({**TRAIN, **change}))
        assert drafter_key(other) != k, change
        assert engine_key(other, "redrafter") != engine_key(base, "redrafter"), change
        assert engine_key(other, "base") == engine_key(base, "base"), change  # base never waits for training
    # serving and speculation settings are not training inputs
    tuned = doc()
    tuned["spec"].setdefault("serving", {})["replicas"] = 7
    assert drafter_key(spec_of(tuned)) == k


# ---- the training Job -----------------------------------------------------------------------------
def test_the_training_job_trains_on_its_gpus_and_serves_progress() -> None:
    spec = spec_of(doc({**TRAIN, "gpus": 2, "gpuProduct": "NVIDIA-A100-SXM4-80GB"}))
    owner = Owner("llama3-8b", "default", "u-1", spec, 1)
    job = training_job(owner)
    pod = job["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["command"] == ["python", "-m", "engine_jobs", "train", "--spec", "/etc/redrafter/train.json"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "2" == c["resources"]["requests"]["nvidia.com/gpu"]
    assert pod["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
    assert c["ports"] == [{"name": "progress", "containerPort": 8080, "protocol": "TCP"}]
    assert {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in c["env"]
    assert job["spec"]["podFailurePolicy"]["rules"][0]["onExitCodes"] == {
        "containerName": "train",
        "operator": "In",
        "values": [int(ExitCode.BAD_INPUT), int(ExitCode.SOURCE_UNAVAILABLE)],
    }
    assert {m["mountPath"] for m in c["volumeMounts"]} >= {"/cache", "/etc/redrafter", "/sources/datasets"}
    key = drafter_key(spec)
    assert job["metadata"]["labels"][names.LABEL_ENGINE_KEY] == key
    assert job["metadata"]["annotations"]["redrafter.dev/artifact"] == f"engines/drafters/{key}"
    ts = TrainSpec.model_validate_json(training_configmap(owner)["data"]["train.json"])
    assert (ts.key, ts.samples, ts.column, ts.gpus) == (key, 500, "prompt", 2)
    assert ts.dataset.uri == "pvc://datasets/chat/prompts.jsonl"
    assert ts.recipe.draft_len == 5 and ts.recipe.rnn is True


# ---- the planner ----------------------------------------------------------------------------------
def test_base_builds_while_the_drafter_trains_and_the_redrafter_engine_waits() -> None:
    d = doc()
    p = plan(res(d), Observed(), now=NOW, renderers=RENDER)
    jobs = [m for m in p.create if m["kind"] == "Job"]
    assert sorted(j["metadata"]["labels"][names.LABEL_VARIANT] for j in jobs) == ["base", "drafter"]
    assert p.status.wire()["drafter"]["state"] == "Training"
    assert p.status.wire()["engines"]["redrafter"]["state"] == "Pending"
    assert "waiting for the drafter" in p.status.wire()["engines"]["redrafter"]["message"]
    assert ("Normal", "TrainingStarted") in {(e.type, e.reason) for e in p.events}


def test_training_progress_goes_into_status_drafter() -> None:
    d = doc()
    running = training(d, "Running")
    report = TrainingReport(
        running.key, running.name, TrainingProgress(phase="training", step=40, total_steps=200, loss=2.5), at=NOW
    )
    p = plan(res(d), Observed(jobs=[running]), now=NOW, renderers=RENDER, inputs=Inputs(training=report))
    drafter = p.status.wire()["drafter"]
    assert (drafter["state"], drafter["phase"], drafter["step"], drafter["totalSteps"], drafter["loss"]) == (
        "Training",
        "training",
        40,
        200,
        2.5,
    )
    assert not [m for m in p.create if m["kind"] == "Job" and "train" in m["metadata"]["name"]]  # never twice
    # a report from another key (an older spec) is not this training's
    stale = TrainingReport("0" * 20, running.name, TrainingProgress(step=99))
    p2 = plan(res(d), Observed(jobs=[running]), now=NOW, renderers=RENDER, inputs=Inputs(training=stale))
    assert "step" not in p2.status.wire()["drafter"]


def test_a_trained_drafter_starts_the_redrafter_build_and_keeps_its_figures() -> None:
    d = doc()
    done = training(d, "Succeeded")
    message = TrainingResult(
        steps=300, loss=0.7, held_out_acceptance=0.81, untrained_acceptance=0.02, tokens_per_step=3.4, size_bytes=10
    ).message("OK: drafter done")
    observed = Observed(jobs=[done], pods={done.name: PodFact(done.name, "Succeeded", message)})
    p = plan(res(d), observed, now=NOW, renderers=RENDER)
    drafter = p.status.wire()["drafter"]
    assert drafter["state"] == "Ready"
    assert (drafter["heldOutAcceptance"], drafter["untrainedAcceptance"], drafter["tokensPerStep"]) == (0.81, 0.02, 3.4)
    builds = {j["metadata"]["labels"][names.LABEL_VARIANT] for j in p.create if j["kind"] == "Job"}
    assert builds == {"redrafter", "base"}
    assert ("Normal", "DrafterTrained") in {(e.type, e.reason) for e in p.events}
    # the Job expires after a day: status keeps the drafter and its figures
    later = plan(res(d, p.status.wire()), Observed(), now=NOW, renderers=RENDER)
    assert later.status.wire()["drafter"]["state"] == "Ready"
    assert later.status.wire()["drafter"]["heldOutAcceptance"] == 0.81


def test_a_bad_dataset_fails_the_drafter_once_with_its_cause() -> None:
    d = doc()
    failed = training(
        d,
        "Failed",
        reason="PodFailurePolicy",
        message="Container train for pod x failed with exit code 2 matching FailJob rule at index 0",
        code=2,
    )
    text = "BAD_INPUT: dataset /sources/datasets/chat/prompts.jsonl line 3: no column 'prompt'"
    observed = Observed(jobs=[failed], pods={failed.name: PodFact(failed.name, "Failed", text)})
    p = plan(res(d), observed, now=NOW, renderers=RENDER)
    drafter = p.status.wire()["drafter"]
    assert drafter["state"] == "Failed" and drafter["exitCode"] == 2
    assert "no column 'prompt'" in drafter["message"]
    assert not [m for m in p.create if m["kind"] == "Job" and m["metadata"]["labels"][names.LABEL_VARIANT] == "drafter"]
    assert p.status.wire()["engines"]["redrafter"]["state"] == "Failed"
    assert "the drafter failed" in p.status.wire()["engines"]["redrafter"]["message"]
    reasons = {(e.type, e.reason) for e in p.events}
    assert ("Warning", "TrainingFailed") in reasons and ("Warning", "TrainingNotRetried") in reasons


# ---- the drafter gate -----------------------------------------------------------------------------

#: what a head trained on a chaotic random base measured (docs/drafter.md): it memorised its training
#: continuations; held-out acceptance near zero, training top-1 far above held-out
MEMORISED = TrainingResult(
    steps=150,
    loss=2.1,
    held_out_acceptance=0.008,
    untrained_acceptance=0.0,
    prompt_lookup_acceptance=0.01,
    held_out_top1=0.02,
    train_top1=0.55,
    tokens_per_step=1.04,
    size_bytes=10,
)


def trained_plan(d: dict, result: TrainingResult, status: dict | None = None):
    done = training(d, "Succeeded")
    observed = Observed(jobs=[done], pods={done.name: PodFact(done.name, "Succeeded", result.message("OK: done"))})
    return plan(res(d, status), observed, now=NOW, renderers=RENDER)


def test_a_rejected_drafter_builds_no_redrafter_engine_and_warns_once() -> None:
    d = doc()
    p = trained_plan(d, MEMORISED)
    status = p.status.wire()
    drafter = status["drafter"]
    assert drafter["state"] == "Rejected"
    assert "held-out acceptance 0.008 is below 0.110" in drafter["message"]
    assert "held-out top-1 0.020 collapsed against training 0.550" in drafter["message"]
    assert (drafter["promptLookupAcceptance"], drafter["heldOutTop1"], drafter["trainTop1"]) == (0.01, 0.02, 0.55)
    builds = {j["metadata"]["labels"][names.LABEL_VARIANT] for j in p.create if j["kind"] == "Job"}
    assert builds == {"base"}  # no ReDrafter engine from a head that does not draft
    engine = status["engines"]["redrafter"]
    assert engine["state"] == "Pending" and "acceptRejected" in engine["message"]
    warnings = [e for e in p.events if e.type == "Warning"]
    assert [e.reason for e in warnings] == ["DrafterRejected"]
    assert "held-out acceptance 0.008" in warnings[0].message and "base keeps serving" in warnings[0].message
    # the next reconcile (the Job gone): still Rejected, no second Event, no training again
    later = plan(res(d, status), Observed(), now=NOW, renderers=RENDER)
    assert later.status.wire()["drafter"]["state"] == "Rejected"
    assert not [e for e in later.events if e.reason in ("DrafterRejected", "DrafterTrained", "TrainingStarted")]
    assert {j["metadata"]["labels"][names.LABEL_VARIANT] for j in later.create if j["kind"] == "Job"} <= {"base"}


def test_accept_rejected_builds_the_redrafter_engine_anyway() -> None:
    d = doc({**TRAIN, "acceptRejected": True})
    assert drafter_key(spec_of(d)) == drafter_key(spec_of(doc()))  # not a training input
    p = trained_plan(d, MEMORISED)
    drafter = p.status.wire()["drafter"]
    assert drafter["state"] == "Ready" and drafter["message"].startswith("accepted by")
    builds = {j["metadata"]["labels"][names.LABEL_VARIANT] for j in p.create if j["kind"] == "Job"}
    assert builds == {"redrafter", "base"}
    assert "DrafterRejected" not in {e.reason for e in p.events}
