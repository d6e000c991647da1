"""Everything `render` prints for every example is valid against the Kubernetes 1.30 schemas (strict)."""

from __future__ import annotations

import json
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from engine_jobs.contract import BuildSpec
from redrafter_operator.cli import main
from redrafter_operator.controller.preview import PreviewError, planned_children
from redrafter_operator.render.build import build_job, build_spec
from redrafter_operator.render.common import Owner

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def owner_of(path: Path) -> Owner:
    return Owner.from_body(yaml.safe_load(path.read_text()))


def body_of(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
@pytest.mark.parametrize(
    "stage",
    [{}, {"active": "base", "canary": True}, {"promoted_key": "0" * 20}],
    ids=["serving", "canary", "candidate"],
)
def test_rendered_manifests_are_valid(example, stage):
    docs = planned_children(body_of(example), **stage)
    assert {d["kind"] for d in docs} == {"Job", "ConfigMap", "Deployment", "Service", "NetworkPolicy"}
    refs = [(d["kind"], d["metadata"]["name"]) for d in docs]
    assert len(refs) == len(set(refs))  # each child once
    name = body_of(example)["metadata"]["name"]
    assert (("Deployment", f"{name}-redrafter-canary") in refs) == ("canary" in stage)
    assert (("Deployment", f"{name}-redrafter-candidate") in refs) == ("promoted_key" in stage)
    for doc in docs:
        kubernetes_validate.validate(doc, "1.30", strict=True)
        assert doc["metadata"]["ownerReferences"][0]["controller"] is True


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_build_spec_roundtrips_through_configmap(example):
    owner = owner_of(example)
    for doc in planned_children(body_of(example)):
        if doc["kind"] == "ConfigMap" and "build.json" in doc["data"]:
            parsed = BuildSpec.model_validate_json(doc["data"]["build.json"])
            assert parsed == build_spec(owner.spec, parsed.variant)


def test_secrets_are_mounted_not_inlined():
    owner = owner_of(ROOT / "examples" / "qwen2.5-7b-fp8-tp2.yaml")
    job = build_job(owner, "redrafter")
    pod = job["spec"]["template"]["spec"]
    secret_volumes = [v for v in pod["volumes"] if "secret" in v]
    assert [v["secret"]["secretName"] for v in secret_volumes] == ["s3-credentials"]
    container = pod["containers"][0]
    assert not any("secretKeyRef" in json.dumps(e) for e in container.get("env", []))
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert pod["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"


def test_pvc_sources_are_mounted_read_only():
    owner = owner_of(ROOT / "examples" / "llama3-8b.yaml")
    pod = build_job(owner, "redrafter")["spec"]["template"]["spec"]
    src = [v for v in pod["volumes"] if v["name"].startswith("source-")]
    assert src == [{"name": "source-0", "persistentVolumeClaim": {"claimName": "drafters", "readOnly": True}}]
    # the base variant needs no drafter claim
    base_pod = build_job(owner, "base")["spec"]["template"]["spec"]
    assert not [v for v in base_pod["volumes"] if v["name"].startswith("source-")]


def test_cli_render_prints_yaml(capsys):
    assert main(["render", "-f", str(ROOT / "examples" / "llama3-8b.yaml")]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert docs == planned_children(body_of(ROOT / "examples" / "llama3-8b.yaml"))


def test_cli_render_rejects_invalid_with_field(tmp_path, capsys):
    bad = yaml.safe_load((ROOT / "examples" / "llama3-8b.yaml").read_text())
    bad["spec"]["parallelism"]["tensor"] = 3
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(bad))
    assert main(["render", "-f", str(f)]) == 2
    assert "spec.parallelism.tensor" in capsys.readouterr().err


def test_cli_crd_matches_committed(capsys):
    assert main(["crd"]) == 0
    assert capsys.readouterr().out == (ROOT / "crds" / "redrafter.dev_redrafterdeployments.yaml").read_text()


@pytest.mark.parametrize("variant", ["redrafter", "base"])
def test_build_job_fails_at_once_on_exit_codes_no_retry_can_fix(variant):
    from engine_jobs.errors import ExitCode

    job = build_job(owner_of(ROOT / "examples" / "llama3-8b.yaml"), variant)
    spec = job["spec"]
    assert spec["podFailurePolicy"] == {
        "rules": [
            {
                "action": "FailJob",
                "onExitCodes": {
                    "containerName": "build",
                    "operator": "In",
                    "values": [int(ExitCode.BAD_INPUT), int(ExitCode.SOURCE_UNAVAILABLE)],
                },
            }
        ]
    }
    assert spec["template"]["spec"]["restartPolicy"] == "Never"  # required by podFailurePolicy
    assert spec["backoffLimit"] >= 1  # other codes (tool failure, OOM, lock timeout) still retry in the Job
    # the rule names the container the template runs (the API server checks it: tests/integration/test_pod_admission)
    assert spec["template"]["spec"]["containers"][0]["name"] == "build"


def test_cli_render_admits_the_operators_namespace_to_scrape(capsys):
    assert main(["render", "-f", str(ROOT / "examples" / "llama3-8b.yaml"), "--operator-namespace", "ops"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    (serving, _) = [d for d in docs if d["kind"] == "NetworkPolicy"]
    peers = [p for rule in serving["spec"]["ingress"] for p in rule["from"]]
    assert {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ops"}}} in peers
    assert any(d["kind"] == "Job" and d["metadata"]["name"].startswith("llama3-8b-validate-") for d in docs)


def test_render_shows_the_retention_children_and_the_canary_and_candidate(capsys, tmp_path):
    body = body_of(ROOT / "examples" / "llama3-8b.yaml")
    body["spec"]["engine"] = {
        **body["spec"].get("engine", {}),
        "cache": {**body["spec"].get("engine", {}).get("cache", {}), "retention": {"keep": 2, "schedule": "0 3 * * *"}},
    }
    f = tmp_path / "retained.yaml"
    f.write_text(yaml.safe_dump(body))
    assert main(["render", "-f", str(f), "--active", "base", "--canary", "--promoted-key", "0" * 20]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert docs == planned_children(body, active="base", canary=True, promoted_key="0" * 20)
    refs = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert {("CronJob", "engine-cache-gc-engine-cache"), ("ConfigMap", "engine-cache-gc-engine-cache")} <= refs, refs
    assert {("Deployment", "llama3-8b-redrafter-canary"), ("Deployment", "llama3-8b-redrafter-candidate")} <= refs
    stable = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "llama3-8b")
    assert stable["spec"]["selector"]["redrafter.dev/traffic"] == "base"


def test_render_errors_are_a_preview_error_naming_the_field():
    bad = body_of(ROOT / "examples" / "llama3-8b.yaml")
    bad["spec"]["parallelism"]["tensor"] = 3
    with pytest.raises(PreviewError, match="spec.parallelism.tensor"):
        planned_children(bad)
