"""Binds the planner to the serving renderers.

Until render/serving.py (Triton ConfigMap, Deployment, canary, Services) lands, this renders the
minimal valid serving Deployment per variant and the three Services with the names and selectors of
names.py, so the lifecycle runs end to end; it is replaced by the real renderers, not extended.
"""
from __future__ import annotations

from ..render import names
from ..render.common import metadata
from .planner import Renderers


def _variant(owner, variant, key, path, replicas):
    labels = {**names.common_labels(owner.name, "serving"), names.LABEL_VARIANT: variant, names.LABEL_ENGINE_KEY: key}
    sel = names.serving_selector(owner.name, variant)
    pod_labels = {**labels, names.LABEL_TRAFFIC: variant}
    return [{"apiVersion": "apps/v1", "kind": "Deployment",
             "metadata": metadata(owner, names.serving_deployment_name(owner.name, variant), labels),
             "spec": {"replicas": replicas, "selector": {"matchLabels": sel},
                      "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
                      "template": {"metadata": {"labels": pod_labels},
                                   "spec": {"containers": [{"name": "triton", "image": owner.spec.serving.image,
                                                            "args": [path],
                                                            "ports": [{"name": "http", "containerPort": 8000}]}]}}}}]


def _services(owner, pool):
    out = []
    for v, sel in ((None, names.traffic_selector(owner.name, pool)), ("redrafter", names.serving_selector(owner.name, "redrafter")), ("base", names.serving_selector(owner.name, "base"))):
        out.append({"apiVersion": "v1", "kind": "Service",
                    "metadata": metadata(owner, names.service_name(owner.name, v), names.common_labels(owner.name, "serving")),
                    "spec": {"selector": sel, "ports": [{"name": "http", "port": 8000, "targetPort": "http"}]}})
    return out


def default_renderers() -> Renderers:
    return Renderers(variant=_variant, services=_services)
