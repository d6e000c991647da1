"""The cache Jobs' pods pass the restricted Pod Security Standard; references cover spec, status and serving;
the listing survives Kubernetes' 4096-byte termination message."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from engine_jobs.cache_cmd import COMPRESSED_PREFIX, decode_message, encode_message
from engine_jobs.errors import TERMINATION_MESSAGE_LIMIT
from redrafter_operator.api.engine_key import engine_key
from redrafter_operator.api.spec import ReDrafterDeploymentSpec
from redrafter_operator.render import cache_jobs
from redrafter_operator.render.cache_refs import references_document, resource_references

ROOT = Path(__file__).resolve().parents[2]
# kubernetes.io/docs/concepts/security/pod-security-standards (Restricted, Kubernetes 1.30)
RESTRICTED_VOLUME_TYPES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


def restricted_violations(pod: dict) -> list[str]:
    """The Restricted profile's checks that apply to these pods (host namespaces/ports/privileged are absent)."""
    out = []
    psc = pod.get("securityContext") or {}
    for v in pod.get("volumes") or []:
        kinds = set(v) - {"name"}
        if not kinds <= RESTRICTED_VOLUME_TYPES:
            out.append(f"volume {v['name']}: {kinds}")
    for c in pod["containers"]:
        sc = c.get("securityContext") or {}
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append("allowPrivilegeEscalation")
        if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []):
            out.append("capabilities.drop ALL")
        if set((sc.get("capabilities") or {}).get("add") or []) - {"NET_BIND_SERVICE"}:
            out.append("capabilities.add")
        if not (sc.get("runAsNonRoot") or psc.get("runAsNonRoot")):
            out.append("runAsNonRoot")
        if sc.get("runAsUser", psc.get("runAsUser")) == 0:
            out.append("runAsUser 0")
        seccomp = (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append("seccompProfile")
        if sc.get("privileged"):
            out.append("privileged")
    return out


def job(verb: str, read_only: bool) -> dict:
    args = cache_jobs.list_args() if verb == "ls" else cache_jobs.gc_args(keep=0, max_age="30d", dry_run=False)
    return cache_jobs.cache_job(
        name="cache-x",
        namespace="ns",
        claim="engine-cache",
        sub_path="engines",
        references_config_map="refs",
        image="img",
        args=args,
        verb=verb,
        read_only=read_only,
    )


def test_cache_pods_are_restricted_and_the_listing_mounts_read_only():
    for verb, read_only in (("ls", True), ("gc", False)):
        pod = job(verb, read_only)["spec"]["template"]["spec"]
        assert restricted_violations(pod) == []
        (c,) = pod["containers"]
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        assert pod["automountServiceAccountToken"] is False
        cache_mount = next(m for m in c["volumeMounts"] if m["name"] == "cache")
        claim = next(v for v in pod["volumes"] if v["name"] == "cache")["persistentVolumeClaim"]
        assert cache_mount["readOnly"] is read_only and claim["readOnly"] is read_only
        assert c["command"][:4] == ["python", "-m", "engine_jobs", "cache"] and c["command"][4] == verb
    assert job("ls", True)["spec"]["backoffLimit"] == 0


def test_the_checker_sees_violations():
    pod = job("ls", True)["spec"]["template"]["spec"]
    pod["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True
    pod["securityContext"]["seccompProfile"] = {"type": "Unconfined"}
    pod["volumes"].append({"name": "h", "hostPath": {"path": "/"}})
    assert len(restricted_violations(pod)) == 3


def demo_body() -> dict:
    body = yaml.safe_load((ROOT / "examples" / "demo-tiny.yaml").read_text())
    body["metadata"] = {"name": "llama", "namespace": "team-a"}
    return body


def test_references_cover_spec_status_validation_promoted_and_serving():
    body = demo_body()
    spec = ReDrafterDeploymentSpec.model_validate(body["spec"])
    body["status"] = {
        "engines": {"redrafter": {"key": "old-rd"}, "base": {"key": "old-base"}},
        "validation": {
            "redrafterKey": "val-rd",
            "baseKey": "val-base",
            "promoted": {"redrafterKey": "prom-rd", "baseKey": "prom-base"},
        },
    }
    refs = {(r["key"], r["role"]) for r in resource_references(body)}
    assert refs == {
        (engine_key(spec, "redrafter"), "spec.redrafter"),
        (engine_key(spec, "base"), "spec.base"),
        ("old-rd", "status.engines.redrafter"),
        ("old-base", "status.engines.base"),
        ("val-rd", "status.validation.redrafter"),
        ("val-base", "status.validation.base"),
        ("prom-rd", "status.validation.promoted.redrafter"),
        ("prom-base", "status.validation.promoted.base"),
    }
    serving = {
        "metadata": {
            "name": "llama-base",
            "namespace": "team-b",
            "labels": {"redrafter.dev/engine-key": "serving-key", "redrafter.dev/deployment": "llama"},
        }
    }
    doc = json.loads(references_document([body, body], [serving, {"metadata": {"name": "unlabelled"}}]))
    assert {"key": "serving-key", "namespace": "team-b", "name": "llama", "role": "serving:llama-base"} in doc[
        "references"
    ]
    assert len(doc["references"]) == len(refs) + 1, "duplicates collapse"


def test_an_invalid_spec_still_contributes_its_status():
    body = demo_body()
    body["spec"]["engine"]["maxBatchSize"] = -1
    body["status"] = {"engines": {"base": {"key": "kept"}}}
    assert [r["key"] for r in resource_references(body)] == ["kept"]


def listing(n: int) -> dict:
    return {
        "cache": "/cache",
        "totalBytes": n,
        "engines": [
            {
                "key": f"{i:020x}",
                "complete": True,
                "variant": "redrafter",
                "model": "hf://meta-llama/Llama-3.1-8B",
                "tensorrtLlmVersion": "1.0.0",
                "gpuProduct": "NVIDIA-H100-80GB-HBM3",
                "sizeBytes": 16 * 2**30 + i,
                "builtAt": "2026-12-01T10:00:00Z",
                "lockedBy": None,
                "referencedBy": [],
                "unreferencedSince": None,
            }
            for i in range(n)
        ],
    }


def test_listing_message_fits_and_round_trips():
    small = listing(2)
    assert decode_message(encode_message(small)) == small
    big = listing(60)
    text = encode_message(big)
    assert len(text.encode()) <= TERMINATION_MESSAGE_LIMIT and text.startswith(COMPRESSED_PREFIX)
    assert decode_message(text) == big
    huge = listing(2000)
    doc = decode_message(encode_message(huge))
    assert (
        doc["truncated"] == 2000 - len(doc["engines"]) > 0 and doc["engines"] == huge["engines"][: len(doc["engines"])]
    )


def test_collection_cronjob_runs_a_restricted_gc_with_the_claims_references():
    cj = cache_jobs.collection_cronjob(
        namespace="ns",
        claim="engine-cache",
        sub_path="engines",
        image="img",
        schedule="@daily",
        keep=2,
        max_age="2592000s",
        owners=[
            {
                "apiVersion": "redrafter.dev/v1alpha1",
                "kind": "ReDrafterDeployment",
                "name": "a",
                "uid": "u",
                "blockOwnerDeletion": False,
            }
        ],
    )
    assert cj["spec"]["concurrencyPolicy"] == "Forbid" and cj["spec"]["schedule"] == "@daily"
    pod = cj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert restricted_violations(pod) == []
    (c,) = pod["containers"]
    assert c["command"][4:] == [
        "gc",
        "--local",
        "/cache",
        "--references",
        "/etc/redrafter/cache/references.json",
        "--termination-log",
        "/dev/termination-log",
        "--keep",
        "2",
        "--max-age",
        "2592000s",
    ]
    assert next(v for v in pod["volumes"] if v["name"] == "references")["configMap"][
        "name"
    ] == cache_jobs.collection_name("engine-cache")
    assert not any(m.get("readOnly") for m in c["volumeMounts"] if m["name"] == "cache"), "it removes engines"


def test_retentions_sharing_a_claim_keep_the_union():
    from redrafter_operator.controller.collection import merged_retention

    def spec(**retention):
        body = demo_body()
        body["spec"]["engine"]["cache"] = {"retention": retention}
        return ReDrafterDeploymentSpec.model_validate(body["spec"])

    assert merged_retention([spec(), spec()]) is None  # nothing enabled: no collection at all
    assert merged_retention([spec(keep=1), spec(maxAge="24h"), spec(keep=3, schedule="@hourly")]) == (
        3,
        "86400s",
        "30 3 * * *",
    )
    assert merged_retention([spec(), spec(maxAge="90m")]) == (None, "5400s", "30 3 * * *")


def test_chart_defaults_supply_the_retention():
    import pytest

    from redrafter_operator.api.defaults import OperatorDefaults

    d = OperatorDefaults.from_env(
        {
            "REDRAFTER_DEFAULT_CACHE_RETENTION_KEEP": "2",
            "REDRAFTER_DEFAULT_CACHE_RETENTION_MAX_AGE": "720h",
            "REDRAFTER_DEFAULT_CACHE_RETENTION_SCHEDULE": "0 * * * *",
        }
    )
    assert (d.cache_retention_keep, d.cache_retention_max_age, d.cache_retention_schedule) == (2, "720h", "0 * * * *")
    assert OperatorDefaults.from_env({}).cache_retention_keep is None
    with pytest.raises(ValueError, match="REDRAFTER_DEFAULT_CACHE_RETENTION_MAX_AGE"):
        OperatorDefaults.from_env({"REDRAFTER_DEFAULT_CACHE_RETENTION_MAX_AGE": "30d"})
