"""Serving renderers: valid Kubernetes 1.30 objects (strict) for TP1 and TP8, and the wiring between them."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from engine_jobs import contract
from engine_jobs.contract import ServingConfig
from redrafter_operator.api.engine_key import engine_key
from redrafter_operator.render import names
from redrafter_operator.render.common import Owner
from redrafter_operator.render.serving import (
    canary_deployment,
    candidate_deployment,
    candidate_service,
    services,
    serving_configmap,
    serving_deployment,
)

ROOT = Path(__file__).resolve().parents[2]


def owner(tensor: int = 1, **engine_build) -> Owner:
    body = {
        "metadata": {"name": "chat", "namespace": "llm", "uid": "1b4e28ba-2fa1-11d2-883f-0016d3cca427"},
        "spec": {
            "model": {
                "base": {"source": "hf://meta-llama/Llama-3.1-8B-Instruct"},
                "drafter": {"source": "pvc://drafters/llama3-8b"},
            },
            "parallelism": {"tensor": tensor},
            "engine": {"build": engine_build},
            "serving": {"startupTimeoutSeconds": 1200, "nodeSelector": {"pool": "gpu"}},
        },
    }
    return Owner.from_body(body)


def everything(o: Owner) -> list[dict]:
    key_r, key_b = engine_key(o.spec, "redrafter"), engine_key(o.spec, "base")
    return [
        serving_configmap(o, "redrafter", key_r),
        serving_configmap(o, "base", key_b),
        serving_deployment(o, "redrafter", key_r, 2),
        serving_deployment(o, "base", key_b, 0),
        canary_deployment(o, key_r, 1),
        *services(o, "redrafter"),
        serving_configmap(o, "redrafter", "new" + key_r[3:], names.candidate_config_name("chat")),
        candidate_deployment(o, "new" + key_r[3:], 1),
        candidate_service(o),
    ]


@pytest.mark.parametrize("tensor", [1, 8])
def test_all_serving_objects_are_valid_kubernetes(tensor):
    for doc in everything(owner(tensor, gpuProduct="NVIDIA-H100-80GB-HBM3")):
        kubernetes_validate.validate(doc, "1.30", strict=True)
        assert doc["metadata"]["ownerReferences"][0]["uid"] == "1b4e28ba-2fa1-11d2-883f-0016d3cca427"


def test_tp8_example_deployment_is_valid():
    body = yaml.safe_load((ROOT / "examples" / "llama3-70b-tp8.yaml").read_text())
    o = Owner.from_body(body)
    dep = serving_deployment(o, "redrafter", engine_key(o.spec, "redrafter"), 1)
    kubernetes_validate.validate(dep, "1.30", strict=True)
    gpu = o.spec.engine.build.gpu_resource
    assert dep["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"][gpu] == "8"


def test_deployment_pod_wiring():
    o = owner(8, gpuProduct="NVIDIA-H100-80GB-HBM3", gpuResource="nvidia.com/gpu")
    key = engine_key(o.spec, "redrafter")
    dep = serving_deployment(o, "redrafter", key, 3)
    pod = dep["spec"]["template"]
    c = pod["spec"]["containers"][0]
    assert dep["spec"]["replicas"] == 3
    assert c["resources"]["requests"]["nvidia.com/gpu"] == c["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert c["command"] == ["python3", "-m", "engine_jobs", "serve", "--config", "/etc/redrafter/serving.json"]
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {
        "http": 8000,
        "grpc": 8001,
        "metrics": 8002,
        "openai": 9000,
    }
    # ready only when the OpenAI front answers, and it answers ready only while Triton is ready
    assert c["readinessProbe"]["httpGet"] == {"path": "/health/ready", "port": "openai"}
    assert c["startupProbe"]["httpGet"] == c["readinessProbe"]["httpGet"]
    assert c["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 1200
    engine = next(m for m in c["volumeMounts"] if m["name"] == "engine")
    assert engine["readOnly"] is True
    assert engine["mountPath"] == f"{contract.CACHE_MOUNT}/{key}"
    assert engine["subPath"] == f"{o.spec.engine.cache.sub_path}/{key}"
    vols = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert vols["engine"]["persistentVolumeClaim"] == {"claimName": "engine-cache", "readOnly": True}
    assert vols["dshm"]["emptyDir"] == {"medium": "Memory"}
    assert pod["spec"]["nodeSelector"] == {"pool": "gpu", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == "8002"
    labels = pod["metadata"]["labels"]
    assert labels[names.LABEL_TRAFFIC] == "redrafter" and labels[names.LABEL_ENGINE_KEY] == key
    assert set(dep["spec"]["selector"]["matchLabels"].items()) <= set(labels.items())
    # graceful drain: grace period covers the preStop sleep plus Triton's exit timeout
    sleep = int(c["lifecycle"]["preStop"]["exec"]["command"][1])
    exit_timeout = int(next(e["value"] for e in c["env"] if e["name"] == "REDRAFTER_EXIT_TIMEOUT_SECS"))
    assert pod["spec"]["terminationGracePeriodSeconds"] > sleep + exit_timeout
    assert c["securityContext"]["allowPrivilegeEscalation"] is False


def test_serving_config_roundtrips_and_matches_variant():
    o = owner(2)
    for variant in contract.VARIANTS:
        key = engine_key(o.spec, variant)
        cm = serving_configmap(o, variant, key)
        assert cm["metadata"]["name"] == names.serving_config_name("chat", variant)
        cfg = ServingConfig.model_validate_json(cm["data"][contract.SERVING_CONFIG_FILE])
        assert cfg.variant == variant and cfg.engine_key == key and cfg.tensor_parallel == 2
        assert cfg.artifact_dir == f"{contract.CACHE_MOUNT}/{key}"
        assert (cfg.draft_len_per_beam > 0) == (variant == "redrafter")
        assert cfg.served_model_name == "chat"  # no spec.serving.modelName: the resource name
        assert (cfg.max_input_len, cfg.max_seq_len) == (o.spec.engine.max_input_len, o.spec.engine.max_seq_len)
        dep = serving_deployment(o, variant, key, 1)
        vols = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
        assert vols["serving-config"]["configMap"]["name"] == cm["metadata"]["name"]


def test_serving_change_rolls_pods_but_keeps_engine_key():
    a = owner(1)
    body = {"metadata": {"name": "chat", "namespace": "llm"}, "spec": a.spec.wire()}
    body["spec"]["serving"]["triton"] = {"kvCacheFreeGpuMemFraction": 0.5}
    b = Owner.from_body(body)
    assert engine_key(a.spec, "redrafter") == engine_key(b.spec, "redrafter")
    key = engine_key(a.spec, "redrafter")
    hash_a = serving_deployment(a, "redrafter", key, 1)["spec"]["template"]["metadata"]["annotations"]
    hash_b = serving_deployment(b, "redrafter", key, 1)["spec"]["template"]["metadata"]["annotations"]
    assert hash_a != hash_b


def test_canary_is_redrafter_in_base_pool_with_disjoint_selector():
    o = owner(1)
    key = engine_key(o.spec, "redrafter")
    canary = canary_deployment(o, key, 1)
    primary = serving_deployment(o, "redrafter", key, 1)
    assert canary["metadata"]["name"] == names.canary_deployment_name("chat")
    labels = canary["spec"]["template"]["metadata"]["labels"]
    assert labels[names.LABEL_VARIANT] == "redrafter" and labels[names.LABEL_TRAFFIC] == "base"
    # neither Deployment's selector matches the other's pods
    for a, b in ((canary, primary), (primary, canary)):
        sel = a["spec"]["selector"]["matchLabels"]
        assert not set(sel.items()) <= set(b["spec"]["template"]["metadata"]["labels"].items())
    assert canary["spec"]["selector"]["matchLabels"][names.LABEL_ROLE] == "canary"


def test_services_select_pools_and_variants():
    o = owner(1)
    key_r, key_b = engine_key(o.spec, "redrafter"), engine_key(o.spec, "base")
    base_pods = [serving_deployment(o, "base", key_b, 1), canary_deployment(o, key_r, 1)]
    red_pods = [serving_deployment(o, "redrafter", key_r, 1)]

    def selected(svc, deps):
        sel = set(svc["spec"]["selector"].items())
        return [d["metadata"]["name"] for d in deps if sel <= set(d["spec"]["template"]["metadata"]["labels"].items())]

    stable, red, base = services(o, "base")
    assert [s["metadata"]["name"] for s in (stable, red, base)] == ["chat", "chat-redrafter", "chat-base"]
    assert selected(stable, base_pods + red_pods) == ["chat-base", "chat-redrafter-canary"]
    assert selected(red, base_pods + red_pods) == ["chat-redrafter-canary", "chat-redrafter"]
    assert selected(base, base_pods + red_pods) == ["chat-base"]
    stable_on_red = services(o, "redrafter")[0]
    assert selected(stable_on_red, base_pods + red_pods) == ["chat-redrafter"]
    for svc in (stable, red, base, candidate_service(o)):
        assert [(p["name"], p["port"], p["targetPort"]) for p in svc["spec"]["ports"]] == [
            ("http", 8000, "http"),
            ("grpc", 8001, "grpc"),
            ("metrics", 8002, "metrics"),
            ("openai", 9000, "openai"),
        ]


def test_model_name_reaches_the_serving_config():
    body = {"metadata": {"name": "chat", "namespace": "llm"}, "spec": owner(1).spec.wire()}
    body["spec"]["serving"]["modelName"] = "meta-llama/Llama-3.1-8B-Instruct"
    o = Owner.from_body(body)
    cm = serving_configmap(o, "base", engine_key(o.spec, "base"))
    cfg = ServingConfig.model_validate_json(cm["data"][contract.SERVING_CONFIG_FILE])
    assert cfg.served_model_name == "meta-llama/Llama-3.1-8B-Instruct"
    body["spec"]["serving"]["modelName"] = "bad name"
    with pytest.raises(ValueError, match="model_name|modelName"):
        Owner.from_body(body)


def test_candidate_runs_the_new_engine_in_no_pool_with_its_own_config():
    o = owner(1)
    old, new = engine_key(o.spec, "redrafter"), "f" * 20
    primary, canary = serving_deployment(o, "redrafter", old, 2), canary_deployment(o, old, 1)
    base = serving_deployment(o, "base", engine_key(o.spec, "base"), 1)
    cand = candidate_deployment(o, new, 1)
    assert cand["metadata"]["name"] == names.candidate_name("chat") == "chat-redrafter-candidate"
    labels = cand["spec"]["template"]["metadata"]["labels"]
    assert labels[names.LABEL_ENGINE_KEY] == new and labels[names.LABEL_VARIANT] == "redrafter"
    assert labels[names.LABEL_TRAFFIC] == names.NO_POOL and labels[names.LABEL_ROLE] == names.ROLE_CANDIDATE
    vols = {v["name"]: v for v in cand["spec"]["template"]["spec"]["volumes"]}
    assert vols["serving-config"]["configMap"]["name"] == names.candidate_config_name("chat")
    assert vols["serving-config"]["configMap"]["name"] != names.serving_config_name("chat", "redrafter")
    deps = [primary, canary, base, cand]

    def selected(selector, pods):
        return [
            d["metadata"]["name"]
            for d in pods
            if set(selector.items()) <= set(d["spec"]["template"]["metadata"]["labels"].items())
        ]

    # only the candidate Service reaches it; no traffic pool and no other Deployment's selector does
    assert selected(candidate_service(o)["spec"]["selector"], deps) == ["chat-redrafter-candidate"]
    for pool in ("redrafter", "base"):
        assert "chat-redrafter-candidate" not in selected(services(o, pool)[0]["spec"]["selector"], deps)
    for d in (primary, canary, base):
        assert selected(d["spec"]["selector"]["matchLabels"], deps) == [d["metadata"]["name"]]
    assert selected(cand["spec"]["selector"]["matchLabels"], deps) == ["chat-redrafter-candidate"]


def test_negative_replicas_rejected():
    o = owner(1)
    with pytest.raises(ValueError):
        serving_deployment(o, "base", "k", -1)


def test_api_keys_secret_is_a_read_only_volume_never_a_value():
    import dataclasses

    plain = owner()
    serving = plain.spec.serving.model_copy(
        update={"auth": plain.spec.serving.auth.model_copy(update={"api_keys_secret": "keys"})}
    )
    o = dataclasses.replace(plain, spec=plain.spec.model_copy(update={"serving": serving}))
    key = engine_key(o.spec, "redrafter")
    pod = serving_deployment(o, "redrafter", key, 1)["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if "secret" in v]
    assert volume["secret"] == {"secretName": "keys", "defaultMode": 0o440}
    (c,) = pod["containers"]
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == volume["name"]]
    assert mount == {"name": volume["name"], "mountPath": contract.API_KEYS_MOUNT, "readOnly": True}
    assert "keys" not in str(c["env"]) and "envFrom" not in c
    cfg = ServingConfig.model_validate_json(serving_configmap(o, "redrafter", key)["data"]["serving.json"])
    assert cfg.api_keys_dir == contract.API_KEYS_MOUNT  # the ConfigMap names the path only
    # without a Secret: no volume and no keys directory, so the front asks for no key
    plain_pod = serving_deployment(plain, "redrafter", key, 1)["spec"]["template"]["spec"]
    assert not any("secret" in v for v in plain_pod["volumes"])
    plain_cfg = serving_configmap(plain, "redrafter", key)["data"]["serving.json"]
    assert ServingConfig.model_validate_json(plain_cfg).api_keys_dir is None


def test_api_keys_keep_tritons_own_ports_out_of_services_and_policies():
    """With keys, Triton's unauthenticated HTTP/gRPC listen on the pod's loopback only: no container port,
    Service port or NetworkPolicy port names them, and liveness asks the front; metrics stay reachable."""
    import dataclasses

    from redrafter_operator.render.serving import network_policies

    plain = owner()
    serving = plain.spec.serving.model_copy(
        update={
            "auth": plain.spec.serving.auth.model_copy(update={"api_keys_secret": "keys"}),
            "network_policy": plain.spec.serving.network_policy.model_copy(update={"enabled": True}),
        }
    )
    o = dataclasses.replace(plain, spec=plain.spec.model_copy(update={"serving": serving}))
    key = engine_key(o.spec, "redrafter")
    (c,) = serving_deployment(o, "redrafter", key, 1)["spec"]["template"]["spec"]["containers"]
    assert [(p["name"], p["containerPort"]) for p in c["ports"]] == [("metrics", 8002), ("openai", 9000)]
    assert c["livenessProbe"]["httpGet"] == {"path": "/health/live", "port": "openai"}
    assert c["readinessProbe"]["httpGet"]["port"] == "openai"
    for svc in [*services(o, "redrafter"), candidate_service(o)]:
        assert [(p["name"], p["port"]) for p in svc["spec"]["ports"]] == [("metrics", 8002), ("openai", 9000)]
    serve_rule = network_policies(o)[0]["spec"]["ingress"][0]
    assert [p["port"] for p in serve_rule["ports"]] == [8002, 9000]
    # without keys: every port, and Triton's own liveness
    (plain_c,) = serving_deployment(plain, "redrafter", key, 1)["spec"]["template"]["spec"]["containers"]
    assert [p["containerPort"] for p in plain_c["ports"]] == [8000, 8001, 8002, 9000]
    assert plain_c["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}


def test_a_redrafter_spec_renders_no_pytorch_field_and_a_pytorch_spec_its_method() -> None:
    """ReDrafter's serving.json and build.json keep exactly the fields they always had; a PyTorch-backend
    method's speculative variant carries its method and the promoted pair's in-engine limit, its base none."""
    from redrafter_operator.controller.renderers import default_renderers
    from redrafter_operator.render.build import build_configmap

    o = owner()
    key = engine_key(o.spec, "redrafter")
    served = yaml.safe_load(serving_configmap(o, "redrafter", key)["data"]["serving.json"])
    built = yaml.safe_load(build_configmap(o, "redrafter")["data"]["build.json"])
    assert not {"backend", "speculative", "max_concurrency", "max_num_tokens"} & (set(served) | set(built))

    body = yaml.safe_load((ROOT / "examples" / "llama3.1-8b-eagle3.yaml").read_text())
    body["status"] = {"validation": {"promoted": {"redrafterKey": "k", "baseKey": "k", "crossoverConcurrency": 5.9}}}
    eagle = Owner.from_body(body)
    assert eagle.in_engine_concurrency == 5
    key = engine_key(eagle.spec, "redrafter")
    assert key == engine_key(eagle.spec, "base")  # one prepared artifact serves both variants
    spec_cfg = ServingConfig.model_validate_json(serving_configmap(eagle, "redrafter", key)["data"]["serving.json"])
    base_cfg = ServingConfig.model_validate_json(serving_configmap(eagle, "base", key)["data"]["serving.json"])
    assert spec_cfg.backend == base_cfg.backend == "pytorch"
    assert spec_cfg.speculative is not None and spec_cfg.speculative.method == "eagle3"
    # Eagle3 is one-model at the pinned release: no drafter reads max_concurrency, so none is written
    assert spec_cfg.speculative.max_draft_len == 3 and spec_cfg.max_concurrency is None
    assert base_cfg.speculative is None and base_cfg.max_concurrency is None
    # NGram has a drafter that stops drafting above it: the speculative variant gets the measured crossover
    body = yaml.safe_load((ROOT / "examples" / "qwen2.5-coder-7b-ngram.yaml").read_text())
    body["status"] = {"validation": {"promoted": {"redrafterKey": "k", "baseKey": "k", "crossoverConcurrency": 5.9}}}
    ngram = Owner.from_body(body)
    key = engine_key(ngram.spec, "redrafter")
    for variant, limit in (("redrafter", 5), ("base", None)):
        cm = serving_configmap(ngram, variant, key)
        assert ServingConfig.model_validate_json(cm["data"]["serving.json"]).max_concurrency == limit
    # the candidate under validation drafts at every batch: its sweep measures the crossover
    (cm, *_) = default_renderers().candidate(eagle, key, 1)
    assert ServingConfig.model_validate_json(cm["data"]["serving.json"]).max_concurrency is None
