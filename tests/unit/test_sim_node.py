"""Pure pieces of the simulated node and the demo: scenarios, Endpoints, Service backends, pod paths."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from engine_jobs.contract import BuildSpec
from redrafter_operator.render.security import tmp_volume
from redrafter_sim.buildjobs import ProgramRunner, localize_build_spec
from redrafter_sim.endpoints import endpoints_for
from redrafter_sim.hostfs import HostFS
from redrafter_sim.router import backends_from_endpoints
from redrafter_sim.scenarios import (
    DEFAULT_SCENARIO,
    SCENARIOS,
    Condition,
    Scenario,
    all_hold,
    load_scenario,
    lookup,
)

ROOT = Path(__file__).resolve().parents[2]


def test_conditions_read_the_resource_and_missing_fields_never_hold():
    obj = {"status": {"activeEngine": "base", "serving": {"readyReplicas": 3}}}
    assert Condition("status.activeEngine", "==", "base").holds(obj)
    assert Condition("status.serving.readyReplicas", ">=", 2).holds(obj)
    assert not Condition("status.serving.replicas", "==", 1).holds(obj)
    assert not Condition("status.activeEngine", ">", 1).holds(obj)  # incomparable: not met
    assert lookup(obj, "status.serving.nothing.deeper") is None
    with pytest.raises(ValueError):
        Condition("status.phase", "~", "x")


def test_default_scenario_covers_the_lifecycle_and_fast_only_shortens_minimums():
    s = SCENARIOS[DEFAULT_SCENARIO]
    assert [st.name for st in s.stages] == ["deploy", "steady", "load-rise", "collapse", "recover", "load-fall"]
    fast = s.scaled(0.5)
    assert [st.min_s for st in fast.stages] == [st.min_s * 0.5 for st in s.stages]
    assert [st.until for st in fast.stages] == [st.until for st in s.stages]


def test_scenario_from_a_yaml_file(tmp_path: Path):
    path = tmp_path / "s.yaml"
    path.write_text(
        "name: quick\n"
        "stages:\n"
        "  - {name: deploy, concurrency: 0, acceptance: 0.8, until: 'status.phase == Serving', timeout_s: 90}\n"
        "  - name: collapse\n"
        "    acceptance: 0.1\n"
        "    until: [{path: status.activeEngine, op: '==', value: base}, 'status.serving.readyReplicas >= 2']\n"
        "    hold: 'status.phase != Failed'\n"
    )
    s = load_scenario(str(path))
    assert s.name == "quick"
    assert s.stages[0].until == (Condition("status.phase", "==", "Serving"),) and s.stages[0].timeout_s == 90
    assert s.stages[1].until == (
        Condition("status.activeEngine", "==", "base"),
        Condition("status.serving.readyReplicas", ">=", 2),
    )
    assert s.stages[1].hold == (Condition("status.phase", "!=", "Failed"),)
    obj = {"status": {"activeEngine": "base", "serving": {"readyReplicas": 1}}}
    assert not all_hold(s.stages[1].until, obj)
    obj["status"]["serving"]["readyReplicas"] = 2
    assert all_hold(s.stages[1].until, obj)
    with pytest.raises(ValueError, match="unknown keys"):
        Scenario.from_dict({"stages": [{"name": "x", "speed": 3}]})
    with pytest.raises(ValueError, match="unknown scenario"):
        load_scenario("no-such-scenario")


def _pod(name: str, ip: str, ready: bool, labels: dict) -> dict:
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": name, "labels": labels},
        "spec": {"containers": [{"ports": [{"name": "grpc", "containerPort": 8001}]}]},
        "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def test_endpoints_follow_the_selector_and_readiness_and_the_router_uses_ready_ones():
    svc = {
        "metadata": {"name": "llm", "namespace": "ns"},
        "spec": {"selector": {"pool": "a"}, "ports": [{"name": "grpc", "port": 8001, "targetPort": "grpc"}]},
    }
    pods = [
        _pod("p1", "127.0.0.11", True, {"pool": "a"}),
        _pod("p2", "127.0.0.12", False, {"pool": "a"}),
        _pod("p3", "127.0.0.13", True, {"pool": "b"}),
    ]
    eps = endpoints_for(svc, pods)
    (subset,) = eps["subsets"]
    assert [a["ip"] for a in subset["addresses"]] == ["127.0.0.11"]
    assert [a["ip"] for a in subset["notReadyAddresses"]] == ["127.0.0.12"]
    assert subset["ports"] == [{"name": "grpc", "port": 8001, "protocol": "TCP"}]
    backends = backends_from_endpoints(eps, "grpc", 8001)
    assert [(b.pod, b.url) for b in backends] == [("p1", "127.0.0.11:8001")]
    svc["spec"]["selector"] = {"pool": "b"}
    assert [b.pod for b in backends_from_endpoints(endpoints_for(svc, pods), "grpc", 8001)] == ["p3"]


def test_pod_paths_map_under_the_pod_root_and_build_spec_paths_are_localized(tmp_path: Path):
    fs = HostFS(tmp_path)
    pod = fs.pod_root("default", "build-x")
    spec = {
        "volumes": [
            {"name": "cache", "persistentVolumeClaim": {"claimName": "engine-cache"}},
            {"name": "cfg", "configMap": {"name": "cm"}},
        ]
    }
    container = {
        "volumeMounts": [
            {"name": "cache", "mountPath": "/cache", "subPath": "engines"},
            {"name": "cfg", "mountPath": "/etc/redrafter"},
        ]
    }
    fs.mount_volumes(pod, spec, container, {"cm": {"a.txt": "hello"}})
    assert Path(pod.to_host("/etc/redrafter/a.txt")).read_text() == "hello"
    assert Path(pod.to_host("/cache")).resolve() == (tmp_path / "pvc" / "engine-cache" / "engines").resolve()
    assert pod.translate("/cache/k1") == pod.to_host("/cache/k1")
    assert pod.translate("/cachex") == "/cachex" and pod.translate("hf://x") == "hf://x"

    raw = (ROOT / "tests" / "fixtures" / "build_specs" / "llama3-8b-redrafter.json").read_text()
    local = BuildSpec.model_validate_json(localize_build_spec(raw, pod))
    assert local.cache_dir == pod.to_host("/cache")
    assert local.base.credentials_dir == pod.to_host("/var/run/secrets/redrafter/hf-token")
    assert local.key == BuildSpec.model_validate_json(raw).key


@pytest.mark.parametrize("entrypoint", ["python", "redrafter-operator"])
async def test_a_checkout_under_a_mount_path_keeps_its_programs_and_maps_only_container_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, entrypoint: str
):
    """The node runs this checkout's programs for the image's; a checkout under ``/tmp`` (an emptyDir in
    every rendered pod) must still run them from the host, while the container's own ``/tmp`` paths move."""
    bin_dir = "/tmp/x/.venv/bin"
    monkeypatch.setattr(sys, "executable", f"{bin_dir}/python")
    fs = HostFS(tmp_path)
    root = fs.pod_root("default", "build-x")
    volume, mount = tmp_volume()
    container = {
        "name": "build",
        "command": [entrypoint],
        "args": ["run", "--workdir", f"{mount['mountPath']}/w"],
        "env": [{"name": "TMPDIR", "value": mount["mountPath"]}],
        "volumeMounts": [mount],
    }
    manifest = {"metadata": {"name": "build-x"}, "spec": {"volumes": [volume], "containers": [container]}}

    argv, env, _ = await ProgramRunner(api=None, fs=fs)._prepare("default", manifest, container, root, "127.244.0.9")  # type: ignore[arg-type]

    assert argv == [f"{bin_dir}/{entrypoint}", "run", "--workdir", root.to_host("/tmp/w")]
    assert env["TMPDIR"] == root.to_host("/tmp")
    assert env["REDRAFTER_PYTHON"] == f"{bin_dir}/python" and env["PATH"].split(os.pathsep)[0] == bin_dir


def test_resource_quantities_parse_as_kubernetes_reads_them() -> None:
    from redrafter_sim.servingpods import parse_quantity

    assert parse_quantity("1Gi") == 2**30 and parse_quantity("512M") == 512 * 10**6
    assert parse_quantity("1500m") == 2 and parse_quantity("2") == 2 and parse_quantity("1.5Ki") == 1536
    with pytest.raises(ValueError):
        parse_quantity("lots")


async def test_a_mount_point_in_a_flag_is_the_volumes_directory_and_env_field_refs_resolve(tmp_path: Path) -> None:
    """``--filename=/crds`` (the CRD hook's kubectl) names the ConfigMap volume's own directory, which a program
    that lstat()s its argument finds a directory; POD_NAMESPACE comes from the downward API."""
    fs = HostFS(tmp_path)
    root = fs.pod_root("ns", "hook-x")
    container = {
        "name": "apply",
        "command": ["kubectl"],
        "args": ["apply", "--filename=/crds", "--server-side", "/crds/a.yaml"],
        "env": [{"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}],
        "volumeMounts": [{"name": "crds", "mountPath": "/crds"}],
    }
    manifest = {
        "metadata": {"name": "hook-x", "namespace": "ns"},
        "spec": {"volumes": [{"name": "crds", "configMap": {"name": "crds"}}], "containers": [container]},
    }

    class Api:
        async def get(self, kind: object, name: str, ns: str) -> dict[str, object]:
            return {"data": {"a.yaml": "kind: X\n"}}

    argv, env, _ = await ProgramRunner(api=Api(), fs=fs)._prepare("ns", manifest, container, root, "127.244.0.9")  # type: ignore[arg-type]

    (mount,) = root.mounts
    assert argv[1:] == ["apply", f"--filename={mount.host}", "--server-side", root.to_host("/crds/a.yaml")]
    assert Path(argv[2].split("=", 1)[1]).is_dir() and not Path(argv[2].split("=", 1)[1]).is_symlink()
    assert env["POD_NAMESPACE"] == "ns"


def test_listen_addresses_and_readiness_probes_as_in_a_pod_network() -> None:
    from redrafter_sim.noderun import http_readiness
    from redrafter_sim.podns import pod_listen_args

    args = ["run", "--liveness=http://0.0.0.0:8080/healthz", "--metrics-address=0.0.0.0", "--x=10.0.0.0", "0.0.0.0/0"]
    assert pod_listen_args(args, "127.244.1.2") == [
        "run",
        "--liveness=http://127.244.1.2:8080/healthz",
        "--metrics-address=127.244.1.2",
        "--x=10.0.0.0",
        "0.0.0.0/0",
    ]
    container = {
        "name": "operator",
        "ports": [{"name": "health", "containerPort": 8080}],
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": "health"}, "periodSeconds": 10},
    }
    probe, url = http_readiness(container, "127.244.1.2") or ({}, None)
    assert url == "http://127.244.1.2:8080/healthz" and probe["periodSeconds"] == 10
    missing = {**container, "readinessProbe": {"httpGet": {"port": "nope"}}}
    assert http_readiness(missing, "127.244.1.2") == ({"httpGet": {"port": "nope"}}, None)  # never passes
    assert http_readiness({"name": "c"}, "127.244.1.2") is None  # no probe: Ready once running
