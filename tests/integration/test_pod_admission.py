"""The real kube-apiserver admits every pod the operator creates into a namespace that enforces the Pod Security
Standards' ``restricted`` profile, and every child it renders (strict field validation, server-side dry run): the
Jobs' podFailurePolicy included. A non-compliant pod is refused there, so the acceptance is a verdict."""

from __future__ import annotations

import copy
import json
import urllib.error
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.cluster import Kube, delete_namespace, new_namespace, status_message
from harness.lifecycle import RESTRICTED
from redrafter_operator.controller.preview import planned_children
from redrafter_sim.controlplane import ControlPlane

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
DEMO = ROOT / "examples" / "demo-tiny.yaml"
LLAMA = ROOT / "examples" / "llama3-8b.yaml"
RETENTION = {"keep": 2, "schedule": "0 3 * * *"}
# the variants the unit tests of the pods' settings render: examples as they are, TP 1 and 8 with default
# resources, a prepare-only engine, the NetworkPolicies and the engine cache's retention CronJob
VARIANTS: list[tuple[str, Path, dict[str, Any]]] = [
    *[(p.name, p, {}) for p in EXAMPLES],
    ("demo-tp1", DEMO, {"parallelism.tensor": 1, "serving.resources": {}, "engine.build.resources": {}}),
    ("demo-tp8", DEMO, {"parallelism.tensor": 8, "serving.resources": {}, "engine.build.resources": {}}),
    (
        "mtp-defaults",
        ROOT / "examples" / "deepseek-v3-mtp.yaml",
        {"serving.resources": {}, "engine.build.resources": {}},
    ),
    ("network-policies", LLAMA, {"serving.networkPolicy": {"enabled": True}}),
]

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def restricted(control_plane: ControlPlane, tmp_path: Path) -> Iterator[Kube]:
    """A namespace of this test's own, labelled to enforce ``restricted:latest``, with its default ServiceAccount
    (the ServiceAccount admission refuses a pod before it exists)."""
    kube = new_namespace(control_plane, tmp_path / "kube", RESTRICTED)
    try:
        kube.wait("/api/v1/namespaces/{ns}/serviceaccounts/default", bool, what="the default ServiceAccount")
        yield kube
    finally:
        delete_namespace(kube)


def owner_body(path: Path, namespace: str, **changes: Any) -> dict[str, Any]:
    body = yaml.safe_load(path.read_text())
    body["metadata"] = {"name": body["metadata"]["name"], "namespace": namespace, "uid": "0" * 8 + "-uid"}
    for dotted, value in changes.items():
        node = body["spec"]
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    body["spec"].setdefault("engine", {}).setdefault("cache", {})["retention"] = RETENTION
    return body


def rendered(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Every child of every stage: serving, canary and candidate (the build and validation Jobs, the retention
    CronJob and its ConfigMap come with them), each once."""
    docs: dict[tuple[str, str], dict[str, Any]] = {}
    for stage in ({}, {"active": "base", "canary": True, "promoted_key": "0" * 20}):
        for d in planned_children(body, **stage):
            docs.setdefault((d["kind"], d["metadata"]["name"]), d)
    return list(docs.values())


def pod_templates(docs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(workload name, pod template) of every Deployment, Job and CronJob."""
    out = []
    for d in docs:
        if d["kind"] in ("Deployment", "Job"):
            out.append((d["metadata"]["name"], d["spec"]["template"]))
        elif d["kind"] == "CronJob":
            out.append((d["metadata"]["name"], d["spec"]["jobTemplate"]["spec"]["template"]))
    return out


def submit_pod(kube: Kube, name: str, template: dict[str, Any]) -> str | None:
    """Create the template as a Pod with server-side dry run (admission runs, nothing is stored): None when
    admitted, else the API server's message."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {**copy.deepcopy(template.get("metadata") or {}), "name": name, "namespace": kube.namespace},
        "spec": copy.deepcopy(template["spec"]),
    }
    path = f"/api/v1/namespaces/{kube.namespace}/pods?dryRun=All&fieldValidation=Strict"
    try:
        kube.cp.request("POST", path, pod)
    except urllib.error.HTTPError as exc:
        return str(json.loads(exc.read() or b"{}").get("message") or exc)
    return None


@pytest.mark.parametrize(("case", "path", "changes"), VARIANTS, ids=[v[0] for v in VARIANTS])
def test_every_rendered_pod_is_admitted_under_the_restricted_profile(
    restricted: Kube, case: str, path: Path, changes: dict[str, Any]
) -> None:
    docs = rendered(owner_body(path, restricted.namespace, **changes))
    pods = pod_templates(docs)
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "Job", "CronJob"} <= kinds and len(pods) >= 8, sorted(kinds)
    refused = {name: message for name, template in pods if (message := submit_pod(restricted, name, template))}
    assert refused == {}


def test_every_rendered_child_is_accepted_by_a_server_side_dry_run(restricted: Kube) -> None:
    """Strict field validation of every example's children, and no PodSecurity warning on the workloads' templates
    (the API server warns of, not refuses, a Deployment or Job whose pods it would refuse)."""
    docs = [d for path in EXAMPLES for d in rendered(owner_body(path, restricted.namespace))]
    result = restricted.apply(*docs, dry_run=True, check=False)
    assert result.returncode == 0, status_message(result)
    assert result.stdout.count("serverside-applied (server dry run)") == len(docs), result.stdout
    assert "PodSecurity" not in result.stderr and "unknown field" not in result.stderr, result.stderr


@pytest.mark.parametrize("variant", ["redrafter", "base"])
def test_the_build_jobs_pod_failure_policy_is_accepted_by_the_api_server(restricted: Kube, variant: str) -> None:
    """The API server validates podFailurePolicy against the pod template (restartPolicy Never, the container
    the rule names, the exit codes): a rendered build Job of each variant is accepted, and the same Job with a
    rule naming a container it does not have is refused."""
    docs = rendered(owner_body(LLAMA, restricted.namespace))
    (job,) = [d for d in docs if d["kind"] == "Job" and d["metadata"]["name"].startswith(f"llama3-8b-build-{variant}")]
    assert job["spec"]["podFailurePolicy"]["rules"], "the build Job carries its policy"
    result = restricted.apply(job, dry_run=True, check=False)
    assert result.returncode == 0, status_message(result)
    broken = copy.deepcopy(job)
    broken["spec"]["podFailurePolicy"]["rules"][0]["onExitCodes"]["containerName"] = "elsewhere"
    result = restricted.apply(broken, dry_run=True, check=False)
    assert result.returncode != 0
    assert "spec.podFailurePolicy.rules[0].onExitCodes.containerName" in status_message(result)


def test_a_bare_pod_is_refused_with_the_real_message(restricted: Kube) -> None:
    template = {"spec": {"containers": [{"name": "app", "image": "nginx"}]}}
    assert submit_pod(restricted, "bad-pod", template) == (
        'pods "bad-pod" is forbidden: violates PodSecurity "restricted:latest": '
        'allowPrivilegeEscalation != false (container "app" must set securityContext.allowPrivilegeEscalation=false), '
        'unrestricted capabilities (container "app" must set securityContext.capabilities.drop=["ALL"]), '
        'runAsNonRoot != true (pod or container "app" must set securityContext.runAsNonRoot=true), '
        'seccompProfile (pod or container "app" must set securityContext.seccompProfile.type to "RuntimeDefault" '
        'or "Localhost")'
    )


# each a change an edit of the renderers could make to a pod of ours, and what the admission names
BREAKAGES: list[tuple[dict[str, Any], list[str]]] = [
    ({"securityContext.runAsUser": 0}, ["runAsUser=0 (pod must not set runAsUser=0)"]),
    (
        {"containers.0.securityContext.runAsNonRoot": False},
        ['runAsNonRoot != true (container "build" must not set securityContext.runAsNonRoot=false)'],
    ),
    # the restricted profile's capabilities check replaces the baseline's: one violation, not two
    (
        {"containers.0.securityContext.capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]}},
        [
            'unrestricted capabilities (container "build" must not include "SYS_ADMIN" in securityContext.capabilities.add)'
        ],
    ),
    ({"hostNetwork": True}, ["host namespaces (hostNetwork=true)"]),
    # privileged with allowPrivilegeEscalation=false is invalid before admission runs: both change
    (
        {
            "containers.0.securityContext.privileged": True,
            "containers.0.securityContext.allowPrivilegeEscalation": True,
        },
        [
            'privileged (container "build" must not set securityContext.privileged=true)',
            'allowPrivilegeEscalation != false (container "build" must set securityContext.allowPrivilegeEscalation=false)',
        ],
    ),
    (
        {"volumes": [{"name": "host", "hostPath": {"path": "/"}}], "containers.0.volumeMounts": []},
        ['restricted volume types (volume "host" uses restricted volume type "hostPath")'],
    ),
    (
        {"containers.0.securityContext.seccompProfile": {"type": "Unconfined"}},
        ['seccompProfile (container "build" must not set securityContext.seccompProfile.type to "Unconfined")'],
    ),
]


@pytest.mark.parametrize(("changes", "named"), BREAKAGES, ids=[",".join(c) for c, _ in BREAKAGES])
def test_a_broken_pod_of_ours_is_refused_naming_each_violation(
    restricted: Kube, changes: dict[str, Any], named: list[str]
) -> None:
    docs = rendered(owner_body(DEMO, restricted.namespace))
    name, template = next((n, t) for n, t in pod_templates(docs) if "-build-" in n)
    assert submit_pod(restricted, name, template) is None
    broken = copy.deepcopy(template)
    for dotted, value in changes.items():
        node = broken["spec"]
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node[int(p)] if p.isdigit() else node[p]
        node[leaf] = value
    message = submit_pod(restricted, name, broken)
    assert message == f'pods "{name}" is forbidden: violates PodSecurity "restricted:latest": ' + ", ".join(named)
