"""Validation pieces without a server: output comparison, verdicts, termination messages, prompt files,
endpoint parsing, the CLI's input errors, and the validation Job render (Kubernetes 1.30, strict)."""

from __future__ import annotations

import json
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from redrafter_operator.api.spec import ReDrafterDeploymentSpec
from redrafter_operator.cli import main
from redrafter_operator.evaluate import outcome as oc
from redrafter_operator.evaluate.compare import compare_outputs, first_divergence
from redrafter_operator.evaluate.prompts import (
    DEFAULT_PROMPTS,
    FILLER_WORD,
    Prompt,
    load_prompts,
    max_length_prompt,
    parse_prompts,
)
from redrafter_operator.evaluate.stream import RequestResult, grpc_target
from redrafter_operator.evaluate.validate import Item, ValidationConfig, judge
from redrafter_operator.render import names
from redrafter_operator.render.common import Owner
from redrafter_operator.render.validation import validation_job

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
DEMO = ROOT / "examples" / "demo-tiny.yaml"  # a ReDrafter example
RKEY, BKEY = "r" * 16 + "0123456789abcdef", "b" * 16 + "fedcba9876543210"
IMAGE = "ghcr.io/redrafter/operator:0.1.0"


# ---- comparison ------------------------------------------------------------------------------------
def test_identical_outputs_do_not_diverge():
    assert first_divergence("k", "p", "w1 w2 w3", "w1 w2 w3") is None


def test_divergence_position_in_characters_and_tokens():
    d = first_divergence("single#0", "Explain", "w10 w11 w12", "w10 w99 w12")
    assert (d.char, d.token) == (5, 1)  # common prefix "w10 w"
    # differing inside a token: the shared prefix "w1" of w12/w13 must not count as a token
    d = first_divergence("k", "p", "w10 w11 w12", "w10 w11 w13")
    assert (d.char, d.token) == (10, 2)
    assert "w12" in d.redrafter and "w13" in d.base
    # one output is a prefix of the other (stopped early)
    d = first_divergence("k", "p", "w10 w11", "w10 w11 w12")
    assert (d.char, d.token) == (7, 2)
    assert "differ at character 7 (token 2)" in d.describe()


def test_compare_outputs_only_on_keys_both_answered():
    prompts = {"a": "pa", "b": "pb", "c": "pc"}
    out = compare_outputs(prompts, {"a": "x", "b": "y"}, {"a": "x", "b": "z", "c": "q"})
    assert [d.key for d in out] == ["b"]


def _items(texts: dict[str, str], errors: dict[str, str] | None = None) -> list[Item]:
    errors = errors or {}
    return [Item(k, f"prompt {k}", RequestResult(0, 0.0, 1.0, error=errors.get(k), text=t)) for k, t in texts.items()]


CFG = ValidationConfig("r:8001", "b:8001", list(DEFAULT_PROMPTS))


def test_judge_passes_identical_outputs():
    texts = {"single#0": "w1 w2", "context_only#0": "w3", "mixed#long-0": "w4 w5"}
    verdict, failures, divergences = judge({"redrafter": _items(texts), "base": _items(texts)}, CFG, None)
    assert verdict.passed and not failures and not divergences
    assert "3 requests per engine (context_only, mixed, single)" in verdict.message


def test_judge_reports_divergence_with_prompt_and_position():
    r = {"single#0": "w1 w2", "single#1": "w1 w7 w8"}
    b = {"single#0": "w1 w2", "single#1": "w1 w9 w8"}
    verdict, _, divergences = judge({"redrafter": _items(r), "base": _items(b)}, CFG, None)
    assert verdict.reason == oc.DIVERGED and verdict.exit_code == 1
    assert "1 of 2 greedy outputs differ" in verdict.message
    assert "single#1 prompt 'prompt single#1'" in verdict.message and "token 1" in verdict.message
    tolerant = ValidationConfig("r", "b", CFG.prompts, max_divergences=1)
    assert judge({"redrafter": _items(r), "base": _items(b)}, tolerant, None)[0].passed


def test_judge_request_failures_win_over_divergences():
    r = _items({"single#0": "", "single#1": "w1"}, errors={"single#0": "empty generation batch"})
    verdict, failures, _ = judge({"redrafter": r, "base": _items({"single#0": "w1", "single#1": "w2"})}, CFG, None)
    assert verdict.reason == oc.REQUEST_FAILED
    assert verdict.message.startswith("redrafter engine failed request single#0")
    assert "empty generation batch" in verdict.message and len(failures) == 1


# ---- termination message ---------------------------------------------------------------------------
def test_termination_message_roundtrip(tmp_path):
    for outcome in (
        oc.ValidationOutcome(oc.PASSED, "17 requests | fine", 3.25),
        oc.ValidationOutcome(oc.DIVERGED, "1 of 2 differ\nat char 4"),
        oc.ValidationOutcome(oc.ENDPOINT_UNAVAILABLE, "base not ready"),
    ):
        line = oc.format_termination_message(outcome)
        assert "\n" not in line and line.startswith(outcome.reason + ": ")
        back = oc.parse_termination_message(line)
        assert back.reason == outcome.reason
        assert back.crossover_concurrency == (pytest.approx(3.25) if outcome.crossover_concurrency else None)
    path = tmp_path / "termination-log"
    oc.write_termination_message(path, oc.ValidationOutcome(oc.PASSED, "ok", 2.5))
    assert oc.parse_termination_message(path.read_text()) == oc.ValidationOutcome(oc.PASSED, "ok", 2.5)
    oc.write_termination_message(tmp_path / "missing" / "dir", oc.ValidationOutcome(oc.PASSED, "ok"))  # no raise


def test_termination_message_fits_kubernetes_limit():
    line = oc.format_termination_message(oc.ValidationOutcome(oc.DIVERGED, "é" * 5000, 1.5))
    assert len(line.encode()) <= oc.MAX_MESSAGE_BYTES
    assert line.endswith("... | crossoverConcurrency=1.500")
    assert oc.parse_termination_message(line).crossover_concurrency == 1.5


def test_foreign_messages_are_not_outcomes():
    for text in (None, "", "Traceback (most recent call last):", "Oops: something", "passed: lower case"):
        assert oc.parse_termination_message(text) is None


# ---- prompts and endpoints -------------------------------------------------------------------------
def test_prompt_files_json_and_yaml(tmp_path):
    j = tmp_path / "p.json"
    j.write_text(json.dumps({"prompts": ["a b", {"text": "c", "max_tokens": 8}]}))
    assert load_prompts(j) == [Prompt("a b"), Prompt("c", 8)]
    y = tmp_path / "p.yaml"
    y.write_text("- first prompt\n- text: second\n  max_tokens: 4\n")
    assert load_prompts(y) == [Prompt("first prompt"), Prompt("second", 4)]
    assert load_prompts(None) == list(DEFAULT_PROMPTS)
    for bad in ([], {"x": 1}, [""], [{"text": "a", "max_tokens": 0}], [3]):
        with pytest.raises(ValueError):
            parse_prompts(bad)


def test_max_length_prompt_leaves_room_for_special_tokens():
    p = max_length_prompt(64)
    assert p.text.split() == [FILLER_WORD] * 56


def test_grpc_target():
    assert grpc_target("grpc://svc.ns.svc:8001") == "svc.ns.svc:8001"
    assert grpc_target("svc.ns.svc") == "svc.ns.svc:8001"
    assert grpc_target("127.0.0.1:9000/") == "127.0.0.1:9000"
    for bad in ("http://x:8000", ""):
        with pytest.raises(ValueError):
            grpc_target(bad)


def test_openai_endpoints():
    from redrafter_operator.evaluate.channel import endpoint_for

    assert endpoint_for("svc.ns.svc", "openai") == "http://svc.ns.svc:9000/v1"
    assert endpoint_for("http://127.0.0.1:9000/", "openai") == "http://127.0.0.1:9000/v1"
    assert endpoint_for("https://llm.example.com/v1", "openai") == "https://llm.example.com/v1"
    assert endpoint_for("svc:8001", "grpc") == "svc:8001"
    for bad in ("ftp://x", "http://"):
        with pytest.raises(ValueError):
            endpoint_for(bad, "openai")


# ---- CLI input errors (no server needed) -----------------------------------------------------------
def test_validate_cli_reports_invalid_input(tmp_path, capsys):
    bad = tmp_path / "prompts.yaml"
    bad.write_text("[]\n")
    log = tmp_path / "termination-log"
    rc = main(
        [
            "evaluate",
            "validate",
            "--redrafter",
            "127.0.0.1:1",
            "--base",
            "127.0.0.1:2",
            "--prompts",
            str(bad),
            "--termination-log",
            str(log),
        ]
    )
    assert rc == 2
    assert log.read_text().startswith("InvalidInput: prompts must be a non-empty list")


def test_sweep_cli_needs_an_endpoint(capsys):
    assert main(["evaluate"]) == 2
    assert "--redrafter and/or --base" in capsys.readouterr().err


# ---- the validation Job ----------------------------------------------------------------------------
def owner_of(path: Path, **validation) -> Owner:
    body = yaml.safe_load(path.read_text())
    if validation:
        body["spec"]["validation"] = validation
    return Owner.from_body(body)


def test_validation_is_on_by_default():
    spec = ReDrafterDeploymentSpec.model_validate(
        {"model": {"base": {"source": "hf://a/b"}, "drafter": {"source": "hf://a/c"}}}
    )
    assert spec.validation.enabled and spec.validation.measure_crossover and spec.validation.max_divergences == 0


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_validation_job_is_valid_and_targets_the_variant_services(example):
    owner = owner_of(example)
    job = validation_job(owner, redrafter_key=RKEY, base_key=BKEY, operator_image=IMAGE)
    kubernetes_validate.validate(job, "1.30", strict=True)
    meta, pod = job["metadata"], job["spec"]["template"]["spec"]
    assert meta["ownerReferences"] == [owner.owner_reference()]
    assert meta["labels"][names.LABEL_COMPONENT] == "validation"
    assert meta["labels"][names.LABEL_DEPLOYMENT] == names.label_value(owner.name)
    assert job["spec"]["template"]["metadata"]["labels"] == meta["labels"]
    assert job["spec"]["activeDeadlineSeconds"] == owner.spec.validation.active_deadline_seconds
    (c,) = pod["containers"]
    assert c["image"] == IMAGE and c["command"][:3] == ["redrafter-operator", "evaluate", "validate"]
    args = c["command"][3:]
    opt = dict(zip(args[::2], args[1::2]))
    assert opt["--redrafter"] == f"{names.service_name(owner.name, 'redrafter')}.{owner.namespace}.svc:8001"
    assert opt["--base"] == f"{names.service_name(owner.name, 'base')}.{owner.namespace}.svc:8001"
    e = owner.spec.engine
    assert opt["--batch-size"] == str(e.max_batch_size) and opt["--max-input-len"] == str(e.max_input_len)
    assert int(opt["--long-max-tokens"]) <= e.max_seq_len - e.max_input_len
    assert opt["--sweep-concurrency"].split(",")[-1] == str(e.max_batch_size)
    assert c["terminationMessagePath"] == "/dev/termination-log"
    assert "gpu" not in json.dumps(c["resources"]) and "nodeSelector" not in pod
    assert pod["restartPolicy"] == "Never" and pod["automountServiceAccountToken"] is False
    rules = job["spec"]["podFailurePolicy"]["rules"]
    assert rules[0]["onExitCodes"]["values"] == [1, 2]  # Diverged/RequestFailed, InvalidInput: no retry


def test_validation_job_name_follows_the_engine_pair():
    owner = owner_of(DEMO)
    a = validation_job(owner, redrafter_key=RKEY, base_key=BKEY, operator_image=IMAGE)["metadata"]["name"]
    assert a == validation_job(owner, redrafter_key=RKEY, base_key=BKEY, operator_image=IMAGE)["metadata"]["name"]
    assert a != validation_job(owner, redrafter_key=BKEY, base_key=RKEY, operator_image=IMAGE)["metadata"]["name"]
    retry = validation_job(owner, redrafter_key=RKEY, base_key=BKEY, operator_image=IMAGE, attempt=1)
    assert retry["metadata"]["name"] != a and len(retry["metadata"]["name"]) <= 63


def test_validation_job_options_from_spec():
    owner = owner_of(
        DEMO,
        image="registry.local/validator:1",
        promptsConfigMap="my-prompts",
        promptsKey="set.json",
        measureCrossover=False,
        maxDivergences=2,
        maxTokens=100000 // 100,
        resources={"requests": {"cpu": "1"}},
    )
    job = validation_job(owner, redrafter_key=RKEY, base_key=BKEY, operator_image=IMAGE, candidate=True)
    kubernetes_validate.validate(job, "1.30", strict=True)
    pod = job["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["image"] == "registry.local/validator:1"
    args = c["command"]
    assert args[args.index("--prompts") + 1] == "/etc/redrafter/prompts/set.json"
    assert args[args.index("--redrafter") + 1] == f"{names.candidate_name(owner.name)}.{owner.namespace}.svc:8001"
    assert args[args.index("--base") + 1] == f"{names.service_name(owner.name, 'base')}.{owner.namespace}.svc:8001"
    assert args[args.index("--max-divergences") + 1] == "2"
    e = owner.spec.engine
    assert args[args.index("--max-tokens") + 1] == str(min(1000, e.max_seq_len - e.max_input_len))
    assert "--sweep-concurrency" not in args
    assert pod["volumes"] == [{"name": "tmp", "emptyDir": {}}, {"name": "prompts", "configMap": {"name": "my-prompts"}}]
    # the spec's CPU request replaces the default one; the default memory request and limit stay
    assert c["resources"] == {"requests": {"cpu": "1", "memory": "256Mi"}, "limits": {"memory": "1Gi"}}
    assert args[args.index("--protocol") + 1] == "grpc"


def test_validation_job_can_go_through_the_openai_api():
    owner = owner_of(DEMO, protocol="openai")
    args = validation_job(owner, redrafter_key=RKEY, base_key=BKEY, operator_image=IMAGE)["spec"]["template"]["spec"][
        "containers"
    ][0]["command"]
    assert args[args.index("--protocol") + 1] == "openai"
    assert args[args.index("--redrafter") + 1] == (
        f"http://{names.service_name(owner.name, 'redrafter')}.{owner.namespace}.svc:9000"
    )
    assert (
        args[args.index("--base") + 1] == f"http://{names.service_name(owner.name, 'base')}.{owner.namespace}.svc:9000"
    )


def test_validation_job_sends_the_serving_api_key_from_the_same_secret(tmp_path):
    from engine_jobs.contract import API_KEYS_MOUNT
    from redrafter_operator.evaluate.channel import load_api_key

    body = yaml.safe_load(DEMO.read_text())
    body["spec"]["validation"] = {"protocol": "openai"}
    body["spec"].setdefault("serving", {})["auth"] = {"apiKeysSecret": "llm-keys"}
    pod = validation_job(Owner.from_body(body), redrafter_key=RKEY, base_key=BKEY, operator_image=IMAGE)["spec"][
        "template"
    ]["spec"]
    (c,) = pod["containers"]
    assert c["command"][c["command"].index("--api-key-file") + 1] == API_KEYS_MOUNT
    (volume,) = [v for v in pod["volumes"] if "secret" in v]
    assert volume["secret"]["secretName"] == "llm-keys"
    assert {"name": volume["name"], "mountPath": API_KEYS_MOUNT, "readOnly": True} in c["volumeMounts"]
    assert "llm-keys" not in str(c.get("env"))
    # unset, the protocol follows the keys: Triton's own ports are the pods' own, so the OpenAI API with a key
    body["spec"]["validation"] = {}
    auto = validation_job(Owner.from_body(body), redrafter_key=RKEY, base_key=BKEY, operator_image=IMAGE)
    command = auto["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("--protocol") + 1] == "openai" and "--api-key-file" in command
    # gRPC cannot reach Triton behind keys: refused, naming the field
    body["spec"]["validation"] = {"protocol": "grpc"}
    with pytest.raises(ValueError, match="validation.protocol: must not be grpc while serving.auth.apiKeysSecret"):
        Owner.from_body(body)
    # without keys, unset is gRPC, and nothing is mounted
    del body["spec"]["serving"]["auth"]
    body["spec"]["validation"] = {}
    grpc_pod = validation_job(Owner.from_body(body), redrafter_key=RKEY, base_key=BKEY, operator_image=IMAGE)
    command = grpc_pod["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("--protocol") + 1] == "grpc" and "--api-key-file" not in command
    # the client reads the Secret's first key by entry name, or a plain file
    (tmp_path / "b-team").write_text("sk-b\n")
    (tmp_path / "a-team").write_text(" sk-a ")
    (tmp_path / "..data").mkdir()
    assert load_api_key(tmp_path) == "sk-a" and load_api_key(tmp_path / "b-team") == "sk-b"
    with pytest.raises(ValueError, match="no API key"):
        load_api_key(tmp_path / "..data")


def test_the_pytorch_backend_is_validated_without_min_tokens():
    """Triton's llmapi model has no min_tokens input: the Job compares outputs up to the end token."""
    eagle = owner_of(ROOT / "examples" / "llama3.1-8b-eagle3.yaml")
    command = validation_job(eagle, redrafter_key=RKEY, base_key=BKEY, operator_image=IMAGE)["spec"]["template"][
        "spec"
    ]["containers"][0]["command"]
    assert "--no-fixed-length" in command
    redrafter = validation_job(owner_of(DEMO), redrafter_key=RKEY, base_key=BKEY, operator_image=IMAGE)
    assert "--no-fixed-length" not in redrafter["spec"]["template"]["spec"]["containers"][0]["command"]
