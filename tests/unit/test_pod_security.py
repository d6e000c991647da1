"""Every pod the operator creates sets what the Pod Security Standards' "restricted" profile asks for, runs as its
image's user, requests CPU and memory; the optional NetworkPolicies. The admission verdict itself is the real
kube-apiserver's: tests/integration/test_pod_admission.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from redrafter_operator.controller.preview import planned_children
from redrafter_operator.render import resources, security
from redrafter_operator.render.build import build_job
from redrafter_operator.render.common import Owner
from redrafter_operator.render.serving import network_policies

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
DEMO = ROOT / "examples" / "demo-tiny.yaml"  # a ReDrafter example
# the volume types the restricted profile allows (pod-security-admission's check_restrictedVolumes.go)
RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


def load(path: Path, **spec_changes: Any) -> Owner:
    body = yaml.safe_load(path.read_text())
    for dotted, value in spec_changes.items():
        node = body["spec"]
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return Owner.from_body(body)


def children(owner: Owner, **kw: Any) -> list[dict[str, Any]]:
    """What `render` prints for ``owner`` (its parsed spec, dumped back as the API would hold it)."""
    body = {
        "metadata": {"name": owner.name, "namespace": owner.namespace, "uid": owner.uid},
        "spec": owner.spec.model_dump(mode="json", by_alias=True, exclude_none=True),
    }
    return planned_children(body, **kw)


def pod_templates(owner: Owner) -> list[tuple[str, dict[str, Any]]]:
    """(name, pod spec) of every workload the operator creates for ``owner``, canary and candidate included."""
    docs = children(owner, active="base", canary=True, promoted_key="0" * 20)
    assert {names_of for names_of in (d["metadata"]["name"] for d in docs)} >= {
        f"{owner.name}-redrafter-canary",
        f"{owner.name}-redrafter-candidate",
    }
    return [(d["metadata"]["name"], d["spec"]["template"]["spec"]) for d in docs if d["kind"] in ("Job", "Deployment")]


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_every_pod_sets_the_restricted_profile_as_its_images_user(example: Path):
    owner = load(example)
    pods = pod_templates(owner)
    trains = 1 if owner.spec.trained_drafter() is not None else 0
    assert len(pods) == 2 + 2 + 1 + 2 + trains  # builds, primaries, validation, canary + candidate, training
    for name, pod in pods:
        (container,) = pod["containers"]
        uid = security.OPERATOR_USER if "-validate-" in name else security.IMAGE_USER
        ctx = pod["securityContext"]
        assert (ctx["runAsNonRoot"], ctx["runAsUser"], ctx["runAsGroup"], ctx["fsGroup"]) == (True, uid, uid, uid), name
        assert ctx["seccompProfile"] == {"type": "RuntimeDefault"}
        c = container["securityContext"]
        assert c["readOnlyRootFilesystem"] is True and c["allowPrivilegeEscalation"] is False, name
        assert c["capabilities"] == {"drop": ["ALL"]} and c["runAsUser"] == uid
        assert pod["automountServiceAccountToken"] is False, f"{name}: no pod of ours calls the API server"
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes[mounts["/tmp"]] == {"name": "tmp", "emptyDir": {}}, f"{name}: HOME/TMPDIR must be writable"
        for v in volumes.values():
            assert set(v) - {"name"} <= RESTRICTED_VOLUMES, f"{name}: {v['name']} is a volume type restricted refuses"
            if "secret" in v:
                assert v["secret"]["defaultMode"] == 0o440, "owner and fsGroup read; 0400 would be root-only"
        requests = container["resources"]["requests"]
        assert {"cpu", "memory"} <= set(requests), f"{name}: a pod without requests is evicted first"


def test_the_gated_model_example_mounts_its_token_readable_by_the_builder():
    owner = load(ROOT / "examples" / "llama3-8b.yaml")
    pod = build_job(owner, "base")["spec"]["template"]["spec"]
    (secret,) = [v for v in pod["volumes"] if "secret" in v]
    assert secret["secret"] == {"secretName": "hf-token", "defaultMode": 0o440}
    assert pod["securityContext"]["fsGroup"] == security.IMAGE_USER


# ---- resources ---------------------------------------------------------------------------------


def test_default_requests_scale_with_tensor_parallel_ranks():
    tp1 = load(DEMO, **{"parallelism.tensor": 1, "serving.resources": {}, "engine.build.resources": {}})
    tp8 = load(DEMO, **{"parallelism.tensor": 8, "serving.resources": {}, "engine.build.resources": {}})
    for owner, ranks in ((tp1, 1), (tp8, 8)):
        for name, pod in pod_templates(owner):
            res = pod["containers"][0]["resources"]
            if "-validate-" in name:
                assert res == resources.VALIDATION
                continue
            assert res["requests"]["cpu"] == str(2 * ranks)
            assert res["requests"]["memory"] == f"{16 * ranks}Gi"
            assert res["requests"]["nvidia.com/gpu"] == res["limits"]["nvidia.com/gpu"] == str(ranks)
            assert set(res["limits"]) == {"nvidia.com/gpu"}, "no default CPU/memory limit on GPU pods"


def test_a_prepare_job_asks_for_no_gpu_but_its_serving_pods_do():
    owner = load(ROOT / "examples" / "deepseek-v3-mtp.yaml", **{"serving.resources": {}, "engine.build.resources": {}})
    for name, pod in pod_templates(owner):
        res = pod["containers"][0]["resources"]
        if "-build-" in name:
            assert res == resources.PREPARE, "fetching and verifying needs no GPU, and has a memory limit"
            assert "nodeSelector" not in pod
        elif "-validate-" not in name:
            assert res["requests"]["nvidia.com/gpu"] == "8"


@pytest.mark.parametrize(
    ("user", "expected"),
    [
        ({}, {"requests": {"cpu": "2", "memory": "16Gi"}}),
        ({"requests": {"cpu": "6"}}, {"requests": {"cpu": "6", "memory": "16Gi"}}),
        # a limit without a request: the API server defaults the request to it, so ours must not be there
        ({"limits": {"memory": "8Gi"}}, {"requests": {"cpu": "2"}, "limits": {"memory": "8Gi"}}),
        (
            {"requests": {"memory": "64Gi"}, "limits": {"memory": "80Gi", "cpu": "8"}},
            {"requests": {"memory": "64Gi"}, "limits": {"memory": "80Gi", "cpu": "8"}},
        ),
    ],
)
def test_spec_resources_override_the_defaults_per_resource(user, expected):
    assert resources.merged(resources.per_rank(resources.SERVING_PER_RANK, 1), user) == expected


def test_a_user_request_above_a_default_limit_drops_that_limit():
    assert resources.merged(resources.VALIDATION, {"requests": {"memory": "2Gi"}}) == {
        "requests": {"cpu": "250m", "memory": "2Gi"}
    }


# ---- NetworkPolicy -----------------------------------------------------------------------------


def test_network_policies_are_optional():
    assert network_policies(load(DEMO, **{"serving.networkPolicy": {"enabled": False}})) == []


def test_serving_policy_admits_the_namespace_the_validation_job_and_the_operators_scrape():
    owner = load(ROOT / "examples" / "llama3-8b.yaml", **{"serving.networkPolicy": {"enabled": True}})
    serving, jobs = network_policies(owner, operator_namespace="redrafter-system")
    for doc in (serving, jobs):
        kubernetes_validate.validate(doc, "1.30", strict=True)
    spec = serving["spec"]
    assert spec["policyTypes"] == ["Ingress"]
    assert spec["podSelector"]["matchExpressions"] == [
        {"key": "app.kubernetes.io/component", "operator": "In", "values": ["serving"]}
    ]
    serve_rule, metrics_rule = spec["ingress"]
    assert [p["port"] for p in serve_rule["ports"]] == [8000, 8001, 8002, 9000]  # HTTP, gRPC, metrics, OpenAI
    assert serve_rule["from"][0] == {"podSelector": {}}, "default: every pod of this namespace"
    assert serve_rule["from"][1]["podSelector"]["matchExpressions"][0]["values"] == ["validation"]
    assert metrics_rule == {
        "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "redrafter-system"}}}],
        # Triton's metrics, and the front's port whose /metrics holds its queue (the autoscaler reads both)
        "ports": [{"protocol": "TCP", "port": 8002}, {"protocol": "TCP", "port": 9000}],
    }
    assert "ingress" not in jobs["spec"], "nothing connects to build or validation pods"
    assert jobs["spec"]["podSelector"]["matchExpressions"][0]["values"] == ["engine-build", "validation"]
    # every pod of the resource is selected by one of them (the scanners' "pod without a NetworkPolicy")
    for name, pod_doc in [(d["metadata"]["name"], d) for d in children(owner) if d["kind"] in ("Job", "Deployment")]:
        component = pod_doc["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]
        assert component in ["serving", "engine-build", "validation"], name


def test_configured_peers_replace_the_namespace_default_and_metrics_peers_add():
    clients = [{"namespaceSelector": {"matchLabels": {"team": "gateway"}}}]
    prometheus = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    owner = load(
        DEMO, **{"serving.networkPolicy": {"enabled": True, "ingressFrom": clients, "metricsFrom": prometheus}}
    )
    serving, _ = network_policies(owner, operator_namespace=owner.namespace)  # operator next to it: no extra peer
    serve_rule, metrics_rule = serving["spec"]["ingress"]
    assert serve_rule["from"][0] == clients[0] and len(serve_rule["from"]) == 2
    assert metrics_rule["from"] == prometheus
