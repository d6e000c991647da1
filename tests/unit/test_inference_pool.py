"""The InferencePool <name>: rendered per the upstream v1 CRD, moved in the Service's blue/green step, its condition.

The CRD is kubernetes-sigs/gateway-api-inference-extension v1.0.0's, kept verbatim in tests/fixtures/crds/
(the header names the source): every rendered pool must be one that an API server with that CRD accepts, which
tests/integration/test_crd_validation.py checks on the real API server.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from engine_jobs.contract import OPENAI_PORT
from redrafter_operator.api.engine_key import engine_key
from redrafter_operator.api.spec import spec_errors
from redrafter_operator.controller.conditions import find
from redrafter_operator.controller.facts import DeploymentFact, JobFact, ObjectFact, Observed
from redrafter_operator.controller.plan_types import Resource, ServingTargets
from redrafter_operator.controller.planner import plan
from redrafter_operator.controller.renderers import default_renderers
from redrafter_operator.controller.routing import CONDITION
from redrafter_operator.controller.targets import plan_switch
from redrafter_operator.render import names
from redrafter_operator.render.common import Owner
from redrafter_operator.render.inference_pool import inference_pool
from redrafter_operator.render.serving import stable_service

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "crds" / "inference.networking.k8s.io_inferencepools.yaml"
NOW = "2026-01-01T00:00:00Z"
PICKER = {"name": "llama3-8b-epp", "port": 9002}


def upstream_crd() -> dict:
    return yaml.safe_load(FIXTURE.read_text())


def example(**routing) -> dict:
    doc = yaml.safe_load((ROOT / "examples" / "llama3-8b.yaml").read_text())
    doc["metadata"].update(uid="u-1", generation=1, namespace="default")
    if routing:
        doc["spec"]["routing"] = {"inferencePool": routing}
    return doc


def test_fixture_is_the_released_v1_crd():
    crd = upstream_crd()
    header = FIXTURE.read_text().splitlines()[:3]
    assert "kubernetes-sigs/gateway-api-inference-extension" in header[0] and "Tag:    v1.0.0" in header[2]
    assert crd["metadata"]["annotations"]["inference.networking.k8s.io/bundle-version"] == "v1.0.0"
    assert crd["spec"]["group"] == "inference.networking.k8s.io"
    assert [v["name"] for v in crd["spec"]["versions"]] == ["v1"]


@pytest.mark.parametrize("name", ["llama3-8b", "a" * 63, "m.with.dots"])
@pytest.mark.parametrize("pool", ["redrafter", "base"])
@pytest.mark.parametrize(
    "picker",
    [PICKER, {**PICKER, "failureMode": "FailOpen"}, {"name": "epp", "port": 65535, "failureMode": "FailClose"}],
)
def test_rendered_pool_selects_what_the_stable_service_selects(name, pool, picker):
    doc = example(enabled=True, endpointPickerRef=picker)
    doc["metadata"]["name"] = name
    owner = Owner.from_body(doc)
    obj = inference_pool(owner, pool)
    # it selects exactly what the stable Service selects, on the OpenAI port
    assert obj["spec"]["selector"]["matchLabels"] == stable_service(owner, pool)["spec"]["selector"]
    assert obj["spec"]["targetPorts"] == [{"number": OPENAI_PORT}]
    assert obj["spec"]["endpointPickerRef"]["failureMode"] == picker.get("failureMode", "FailClose")
    assert obj["metadata"]["name"] == names.service_name(name)
    assert obj["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == names.MANAGED_BY


def test_enabled_needs_an_endpoint_picker_in_the_model():
    doc = example(enabled=True)
    assert spec_errors(doc["spec"]) == [
        "spec.routing.inferencePool: endpointPickerRef is required when the InferencePool is enabled"
    ]
    good = example(enabled=True, endpointPickerRef={**PICKER, "failureMode": "FailOpen"})
    assert spec_errors(good["spec"]) == []
    bad_mode = example(enabled=True, endpointPickerRef={**PICKER, "failureMode": "Open"})
    assert spec_errors(bad_mode["spec"])
    assert spec_errors(example(enabled=False)["spec"]) == []


# ---------------------------------------------------------------------------------------------- planner


def dep(variant: str, replicas: int, ready: int, key: str = "", name: str = "x") -> DeploymentFact:
    return DeploymentFact(
        name=names.serving_deployment_name(name, variant),
        variant=variant,
        key=key or f"k-{variant}",
        replicas=replicas,
        ready_replicas=ready,
        updated_replicas=replicas,
        total_replicas=replicas,
        generation=1,
        observed_generation=1,
    )


def test_the_old_pool_stays_up_until_the_inference_pool_is_observed_on_the_target():
    targets = ServingTargets(active="base", replicas={"base": 2, "redrafter": 0})
    both = {"redrafter": True, "base": True}
    obs = Observed(
        deployments={"redrafter": dep("redrafter", 2, 2), "base": dep("base", 2, 2)},
        service_pool="base",
        routing_pool="redrafter",
    )
    s = plan_switch(targets, both, obs, "BlueGreen", routed=True)
    assert s.pool == "base" and s.replicas == {"base": 2, "redrafter": 2} and s.switching
    assert "InferencePool" in s.message
    obs.routing_pool = "base"
    s = plan_switch(targets, both, obs, "BlueGreen", routed=True)
    assert s.replicas == {"base": 2, "redrafter": 0} and not s.switching
    # without routing, a leftover pool holds nothing back
    obs.routing_pool = "redrafter"
    assert plan_switch(targets, both, obs, "BlueGreen").replicas == {"base": 2, "redrafter": 0}


def serving(doc: dict, *, service: str | None, routing: str | None) -> Observed:
    """Both engines built, ReDrafter's Deployment Ready; the Service / InferencePool as given."""
    owner = Owner.from_body(doc)
    jobs = []
    for v in ("redrafter", "base"):
        key = engine_key(owner.spec, v)
        jobs.append(
            JobFact(
                name=names.build_job_name("llama3-8b", v, key),
                namespace="default",
                owner="llama3-8b",
                variant=v,
                key=key,
                attempt=0,
                retry_token="",
                claim="engine-cache",
                artifact=f"engines/{key}",
                state="Succeeded",
                reason="",
                message="",
            )
        )
    return Observed(
        jobs=jobs,
        deployments={"redrafter": dep("redrafter", 1, 1, engine_key(owner.spec, "redrafter"), "llama3-8b")},
        service_pool=service,
        routing_pool=routing,
    )


def run(doc: dict, observed: Observed, status: dict | None = None):
    d = copy.deepcopy(doc)
    if status is not None:
        d["status"] = status
    return plan(Resource.from_body(d), observed, now=NOW, renderers=default_renderers())


def test_the_pool_is_applied_in_the_services_step_and_its_condition_follows_what_is_observed():
    doc = example(enabled=True, endpointPickerRef=PICKER)
    doc["spec"]["validation"] = {"enabled": False}
    doc["spec"]["speculation"] = {"mode": "Always"}
    p = run(doc, serving(doc, service="redrafter", routing=None))
    kinds = [m["kind"] for m in p.apply]
    # in the same step as the stable and variant Services (and the optional NetworkPolicies that guard them)
    step = kinds[kinds.index("Service") :]
    assert step == ["Service"] * 3 + ["NetworkPolicy"] * kinds.count("NetworkPolicy") + ["InferencePool"]
    pool = next(m for m in p.apply if m["kind"] == "InferencePool")
    svc = next(m for m in p.apply if m["kind"] == "Service" and m["metadata"]["name"] == "llama3-8b")
    assert pool["spec"]["selector"]["matchLabels"] == svc["spec"]["selector"]
    assert find(p.status.wire()["conditions"], CONDITION)["reason"] == "Moving"
    fact = ObjectFact.from_body(pool)  # what the watch-fed index keeps of it
    assert fact.pool == "redrafter"
    p2 = run(doc, serving(doc, service="redrafter", routing=fact.pool), p.status.wire())
    c = find(p2.status.wire()["conditions"], CONDITION)
    assert (c["status"], c["reason"]) == ("True", "Selecting") and str(OPENAI_PORT) in c["message"]
    assert p2.delete == []


def test_turning_the_feature_off_deletes_the_pool_and_drops_the_condition():
    on = example(enabled=True, endpointPickerRef=PICKER)
    on["spec"]["validation"] = {"enabled": False}
    on["spec"]["speculation"] = {"mode": "Always"}
    status = run(on, serving(on, service="redrafter", routing="redrafter")).status.wire()
    assert find(status["conditions"], CONDITION)
    off = copy.deepcopy(on)
    off["spec"]["routing"]["inferencePool"]["enabled"] = False
    p = run(off, serving(off, service="redrafter", routing="redrafter"), status)
    assert [m for m in p.apply if m["kind"] == "InferencePool"] == []
    assert [(d["kind"], d["metadata"]["name"]) for d in p.delete] == [("InferencePool", "llama3-8b")]
    assert find(p.status.wire()["conditions"], CONDITION) is None
    # gone: nothing left to delete
    assert run(off, serving(off, service="redrafter", routing=None), p.status.wire()).delete == []


def test_the_documented_pool_is_what_the_operator_renders():
    """docs/gateway.md shows the pool the operator creates: it must not drift from the renderer."""
    import re

    blocks = re.findall(r"```yaml\n(.*?)```", (ROOT / "docs" / "gateway.md").read_text(), re.S)
    documented = next(d for b in blocks for d in yaml.safe_load_all(b) if d and d.get("kind") == "InferencePool")
    spec_block = next(yaml.safe_load(b) for b in blocks if "routing:" in b)
    doc = example(**spec_block["spec"]["routing"]["inferencePool"])
    rendered = inference_pool(Owner.from_body(doc), "redrafter")
    assert documented["spec"] == rendered["spec"] and documented["apiVersion"] == rendered["apiVersion"]
    route = next(d for b in blocks for d in yaml.safe_load_all(b) if d and d.get("kind") == "HTTPRoute")
    assert route["spec"]["rules"][0]["backendRefs"] == [
        {"group": rendered["apiVersion"].split("/")[0], "kind": "InferencePool", "name": rendered["metadata"]["name"]}
    ]


def test_only_the_optional_inference_pool_api_is_quiet_when_unresolved():
    """kopf 1.45 warns about handlers whose resource is not served (observation._disable_mismatched_selectors):
    with the feature unused that is expected for InferencePools only; any other unresolved API still warns."""
    import logging

    from kopf._cogs.structs.references import Selector

    from redrafter_operator.controller.handlers import OptionalApiFilter
    from redrafter_operator.render import inference_pool as ip

    ours = Selector(ip.GROUP, ip.VERSION, ip.PLURAL)

    def record(selectors: list) -> logging.LogRecord:  # the message exactly as kopf formats it
        msg = "Unresolved resources cannot be served (try creating their CRDs): " + ", ".join(f"{s}" for s in selectors)
        return logging.LogRecord("kopf._core.reactor.observation", logging.WARNING, __file__, 1, msg, None, None)

    f = OptionalApiFilter()
    assert not f.filter(record([ours]))
    assert f.filter(record([ours, Selector("redrafter.dev", "v1alpha1", "redrafterdeployments")]))
    assert f.filter(record([Selector("apps", "v1", "deployments")]))


def test_render_shows_the_pool_only_when_enabled():
    from redrafter_operator.controller.preview import planned_children

    kinds = lambda doc: [m["kind"] for m in planned_children(doc, active="base")]  # noqa: E731
    assert "InferencePool" not in kinds(example())
    pools = [
        m
        for m in planned_children(example(enabled=True, endpointPickerRef=PICKER), active="base")
        if m["kind"] == "InferencePool"
    ]
    assert len(pools) == 1 and pools[0]["spec"]["selector"]["matchLabels"][names.LABEL_TRAFFIC] == "base"
