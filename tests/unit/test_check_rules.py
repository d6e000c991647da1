"""The pure rules of ``redrafter-operator check``, judged from hand-built facts (no API server)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from redrafter_operator.check.checks import check_driver, check_placement, check_pod_security, driver_major, gpu_jobs
from redrafter_operator.check.facts import ClusterFacts, Resource
from redrafter_operator.render.placement import Node, Taint

ROOT = Path(__file__).resolve().parents[2]
A100 = "NVIDIA-A100-SXM4-80GB"
H100 = "NVIDIA-H100-80GB-HBM3"


def resource(**changes: Any) -> Resource:
    body = yaml.safe_load((ROOT / "examples" / "llama3-8b.yaml").read_text())
    for path, value in changes.items():
        node = body["spec"]
        *parents, leaf = path.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return Resource(body["metadata"]["name"], "default", body["spec"])


def gpu_node(name: str, product: str = A100, gpus: int = 8, **kw: Any) -> Node:
    return Node(name, {"nvidia.com/gpu.product": product}, {"nvidia.com/gpu": str(gpus)}, **kw)


def judge(res: Resource, *nodes: Node) -> list[Any]:
    spec, errors = res.parsed()
    assert spec is not None, errors
    return [check_placement(ClusterFacts(nodes=nodes), job) for job in gpu_jobs(res, spec)]


def test_a_taint_the_build_does_not_tolerate_keeps_it_off_and_the_fix_names_the_toleration() -> None:
    taint = Taint("nvidia.com/gpu", "present", "NoSchedule")
    (result,) = judge(resource(), gpu_node("a100-0", taints=(taint,)))
    assert result.status == "fail"
    assert result.message == (
        f"no node offers 1× {A100}; nodes: 1× {A100} (8 each); not tolerated: a100-0 (taint {taint})"
    )
    assert result.fix == f"tolerate {taint} in spec.engine.build.tolerations"
    toleration = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    (result,) = judge(resource(engine__build__tolerations=[toleration]), gpu_node("a100-0", taints=(taint,)))
    assert result.status == "ok" and result.message == f"1 node(s) offer 1× {A100}: a100-0"


def test_a_cordoned_node_is_named_with_uncordon() -> None:
    (result,) = judge(resource(), gpu_node("a100-0", unschedulable=True))
    assert result.status == "fail" and result.fix == "kubectl uncordon a100-0"


def test_the_users_node_selector_counts() -> None:
    (result,) = judge(resource(engine__build__nodeSelector={"pool": "build"}), gpu_node("a100-0"))
    assert result.status == "fail" and "with pool=build" in result.message
    assert result.fix == (
        "label the GPU nodes pool=build (kubectl label node NAME pool=build), or change spec.engine.build.nodeSelector"
    )


def test_the_gpu_count_is_the_tensor_parallelism() -> None:
    (result,) = judge(resource(engine__build__gpuProduct=None, parallelism={"tensor": 4}), gpu_node("h100-0", H100, 2))
    assert result.status == "fail" and result.message.startswith("no node offers 4× nvidia.com/gpu; nodes: ")
    assert result.fix == "add nodes with 4 allocatable nvidia.com/gpu, or lower spec.parallelism.tensor"


def test_a_trained_drafter_adds_the_training_jobs_placement() -> None:
    train = {"train": {"dataset": {"source": "hf://org/prompts"}, "gpus": 2, "gpuProduct": H100}}
    res = resource(model__drafter=train)
    build, training = judge(res, gpu_node("a100-0"))
    assert (build.name, build.status) == ("gpu-product llama3-8b", "ok")
    assert (training.name, training.status) == ("training-gpu llama3-8b", "fail")
    assert training.message == f"no node offers 2× {H100}; nodes: 1× {A100} (8 each)"
    assert training.fix == f"add nodes with {H100}, or set spec.model.drafter.train.gpuProduct to one of: {A100}"
    build, training = judge(res, gpu_node("a100-0"), gpu_node("h100-0", H100))
    assert training.status == "ok" and training.message == f"1 node(s) offer 2× {H100}: h100-0"


def test_the_driver_label_current_first_then_the_deprecated_one() -> None:
    both = Node("n", {"nvidia.com/cuda.driver-version.major": "580", "nvidia.com/cuda.driver.major": "550"})
    assert driver_major(both) == 580
    assert driver_major(Node("n", {"nvidia.com/cuda.driver.major": "550"})) == 550
    assert driver_major(Node("n", {})) is None
    spec = resource().parsed()[0]
    assert spec is not None
    old = Node("n", {"nvidia.com/gpu.product": A100, "nvidia.com/cuda.driver.major": "550"}, {"nvidia.com/gpu": "8"})
    result = check_driver(ClusterFacts(nodes=(old,)), "r", spec)
    assert result is not None and result.status == "fail" and "n (R550)" in result.message


def test_pod_security_names_the_violation_and_the_strictest_level_that_admits_the_pods() -> None:
    res = resource()
    spec = res.parsed()[0]
    assert spec is not None
    labels = {"pod-security.kubernetes.io/enforce": "restricted"}
    facts = ClusterFacts(namespace_labels={"default": labels})
    assert check_pod_security(facts, res, spec).status == "ok"  # what the operator renders meets restricted
    plain = {"spec": {"containers": [{"name": "c", "image": "x"}]}}
    host = {
        "spec": {"containers": [{"name": "c", "image": "x"}], "volumes": [{"name": "h", "hostPath": {"path": "/"}}]}
    }
    result = check_pod_security(facts, res, spec, pods=[("Job/plain", plain)])
    assert result.status == "fail"
    assert result.message.startswith(
        "namespace default enforces restricted:latest; 1 pod template(s) violate it: Job/plain: "
        'allowPrivilegeEscalation != false (container "c" must set securityContext.allowPrivilegeEscalation=false), '
    )
    assert result.fix == (
        "remove what the message names from the spec, or kubectl label namespace default "
        "pod-security.kubernetes.io/enforce=baseline --overwrite"
    )
    result = check_pod_security(facts, res, spec, pods=[("Job/plain", plain), ("Job/host", host)])
    assert result.status == "fail" and (result.fix or "").endswith("enforce=privileged --overwrite")
    assert (
        check_pod_security(ClusterFacts(namespace_labels={"default": {}}), res, spec, [("Job/host", host)]).status
        == "ok"
    )
    assert check_pod_security(ClusterFacts(), res, spec).status == "warn"  # the namespace does not exist yet


def test_every_examples_pods_pass_restricted() -> None:
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        body = yaml.safe_load(path.read_text())
        if body.get("kind") != "ReDrafterDeployment":
            continue
        res = Resource(body["metadata"]["name"], "default", body["spec"])
        spec = res.parsed()[0]
        assert spec is not None, path
        labels = {"pod-security.kubernetes.io/enforce": "restricted"}
        result = check_pod_security(ClusterFacts(namespace_labels={"default": labels}), res, spec)
        assert result.status == "ok", (path, result.message)


def test_prometheus_crds_follow_what_the_release_creates() -> None:
    from redrafter_operator.check.checks import check_prometheus_crds
    from redrafter_operator.check.facts import DeploymentFacts

    def facts(kinds: str | None, *crds: str) -> ClusterFacts:
        annotations = {"redrafter.dev/prometheus-operator-kinds": kinds} if kinds else {}
        operator = DeploymentFacts("ops", "op", 1, 1, release="rdo", annotations=annotations)
        return ClusterFacts(operator_deployments=(operator,), crds={c: ("v1",) for c in crds})

    result = check_prometheus_crds(facts("ServiceMonitor,PodMonitor", "podmonitors.monitoring.coreos.com"))
    assert result is not None and result.status == "warn"
    assert result.message == (
        "the release creates ServiceMonitor but CRD servicemonitors.monitoring.coreos.com (v1) is not installed: "
        "nothing scrapes or alerts, and the next helm upgrade fails"
    )
    assert result.fix == (
        "install the Prometheus Operator CRDs (kube-prometheus-stack), or helm upgrade rdo charts/redrafter-operator "
        "-n ops --reuse-values --set metrics.serviceMonitor.enabled=false"
    )
    all_crds = ("servicemonitors", "podmonitors", "prometheusrules")
    result = check_prometheus_crds(
        facts("ServiceMonitor,PodMonitor", *(f"{c}.monitoring.coreos.com" for c in all_crds))
    )
    assert result is not None and result.status == "ok"
    assert result.message == "the CRDs of the release's ServiceMonitor, PodMonitor are installed"
    result = check_prometheus_crds(facts(None))
    assert result is not None and result.status == "ok" and "creates no ServiceMonitor" in result.message
    assert check_prometheus_crds(ClusterFacts()) is None  # no operator Deployment: nothing to judge by


def test_dcgm_exporter_is_a_warning_only() -> None:
    from redrafter_operator.check.checks import check_dcgm

    result = check_dcgm(ClusterFacts())
    assert result.status == "warn" and "dcgmExporter.enabled=true" in (result.fix or "")
    result = check_dcgm(ClusterFacts(dcgm_exporters=("Pod monitoring/dcgm-exporter-x1",)))
    assert result.status == "ok" and result.message.endswith("Pod monitoring/dcgm-exporter-x1")
    result = check_dcgm(ClusterFacts(unreadable={"dcgm/DaemonSet": "403 Forbidden: no"}))
    assert result.status == "warn" and result.message.startswith("cannot look for")


def test_parameters_from_the_model_name() -> None:
    from redrafter_operator.check.sizing import parameters_from_name

    assert parameters_from_name("hf://meta-llama/Meta-Llama-3-8B-Instruct") == 8e9
    assert parameters_from_name("hf://meta-llama/Llama-3.1-70B-Instruct") == 70e9
    assert parameters_from_name("s3://ckpt/qwen/Qwen2.5-7b-instruct") == 7e9
    assert parameters_from_name("hf://mistralai/Mixtral-8x7B-v0.1") == 56e9
    assert parameters_from_name("hf://HuggingFaceTB/SmolLM-135M") == 135e6
    assert parameters_from_name("hf://org/Qwen2.5-1.5B") == 1.5e9
    assert parameters_from_name("pvc://models/tiny-llama") is None
    assert parameters_from_name("hf://org/model-v3-128k") is None


def test_the_cache_estimate_follows_dtype_quantization_and_training() -> None:
    from redrafter_operator.check.sizing import GIB, estimate_cache

    def estimate(**changes: Any) -> Any:
        spec = resource(**changes).parsed()[0]
        assert spec is not None
        return estimate_cache(spec)

    bf16 = estimate()
    assert (bf16.base, bf16.redrafter, bf16.drafter) == (16e9, 17.6e9, 0.0)
    assert bf16.total == (16e9 + 17.6e9) * 1.2 and round(bf16.total / GIB) == 38
    fp8 = estimate(precision={"dtype": "bfloat16", "quantization": "fp8"})
    assert (fp8.base, fp8.redrafter) == (8e9, 9.6e9)  # the drafter stays in dtype
    train = {"train": {"dataset": {"source": "hf://org/prompts"}}}
    assert estimate(model__drafter=train).drafter == 1.6e9
    assert estimate(model__base={"source": "pvc://models/tiny-llama"}) is None


def test_a_cache_claim_smaller_than_the_estimate_fails_with_it() -> None:
    from redrafter_operator.check.checks import check_cache_claim, check_source_claims
    from redrafter_operator.check.facts import ClaimFacts

    res = resource()
    spec = res.parsed()[0]
    assert spec is not None
    small = ClusterFacts(claims={("default", "engine-cache"): ClaimFacts("Bound", ("ReadWriteMany",), "20Gi")})
    result = check_cache_claim(small, res, spec)
    assert result.status == "fail"
    assert result.message == (
        "PVC default/engine-cache holds 20Gi, less than the 38 GiB the engines need (estimated: 8B parameters: "
        "base 15 GiB + ReDrafter 16 GiB + 20% headroom)"
    )
    assert result.fix == (
        'kubectl -n default patch pvc engine-cache -p \'{"spec":{"resources":{"requests":{"storage":"38Gi"}}}}\' '
        "(if its StorageClass allows volume expansion), else recreate it with 38Gi or more"
    )
    big = ClusterFacts(claims={("default", "engine-cache"): ClaimFacts("Bound", ("ReadWriteMany",), "38Gi")})
    assert check_cache_claim(big, res, spec).status == "ok"
    # the drafter's pvc:// claim holds at least the drafter (a tenth of the base's parameters, 16-bit)
    drafters = ClusterFacts(claims={("default", "drafters"): ClaimFacts("Bound", ("ReadOnlyMany",), "1Gi")})
    result = check_source_claims(drafters, res, spec)
    assert result is not None and result.status == "fail"
    assert result.message == (
        "PVC default/drafters holds 1Gi, less than the checkpoints the spec reads from it (estimated 1.5 GiB: "
        "drafter 1.5 GiB)"
    )


def test_an_operator_outside_the_cluster_is_judged_by_its_liveness_url() -> None:
    from redrafter_operator.check.checks import check_operator, run_checks

    url = "http://127.0.0.1:8080/healthz"
    up = ClusterFacts(operator_health=(url, None))
    assert check_operator(up).status == "ok" and url in check_operator(up).message
    down = check_operator(ClusterFacts(operator_health=(url, "Connection refused")))
    assert down.status == "fail" and down.fix == (
        f"start it: redrafter-operator run --liveness {url} (or drop --operator-health to look for its Deployment)"
    )
    names = [r.name for r in run_checks(up, [])]
    assert "operator-rbac" not in names and "operator-metrics" not in names and "prometheus-crds" not in names


def test_on_the_pytorch_backend_the_serving_pods_are_the_ones_placed_on_gpus() -> None:
    """The prepare Job needs no GPU; the serving pods do, with the serving node selector the example sets."""
    body = yaml.safe_load((ROOT / "examples" / "llama3.1-8b-eagle3.yaml").read_text())
    res = Resource(body["metadata"]["name"], "default", body["spec"])
    (result,) = judge(res, gpu_node("a100-0"))
    assert result.status == "fail" and result.message.startswith(f"no node offers 1× {H100}; nodes: 1× {A100}")
    assert result.fix == f"add nodes with {H100}, or set spec.serving.nodeSelector to one of: {A100}"
    (result,) = judge(res, gpu_node("a100-0"), gpu_node("h100-0", H100))
    assert result.status == "ok" and result.message == f"1 node(s) offer 1× {H100}: h100-0"
