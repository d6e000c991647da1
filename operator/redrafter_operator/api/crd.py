"""Generate the CustomResourceDefinition from the pydantic models (kubebuilder-style: types are the truth).

pydantic emits JSON Schema 2020-12; the API server wants a *structural* OpenAPI v3 schema: no ``$ref``,
no ``anyOf`` for optionals, boolean ``exclusiveMinimum``, ``default: {}`` on nested objects so the
server fills their defaults too. This module does exactly that conversion, nothing else.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from ..yamlio import dump
from . import CRD_NAME, GROUP, KIND, PLURAL, SHORT_NAMES, SINGULAR, VERSION
from .spec import ReDrafterDeploymentSpec
from .status import ReDrafterDeploymentStatus

_KEEP = {
    "type",
    "description",
    "default",
    "enum",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "pattern",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "items",
    "properties",
    "required",
    "additionalProperties",
    "x-kubernetes-validations",
    "x-kubernetes-preserve-unknown-fields",
    "format",
    "nullable",
}


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _resolve(merged, defs)
    return node


def _structural(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    node = _resolve(node, defs)
    if "anyOf" in node:  # Optional[X] -> X (absence is how "unset" is expressed)
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"cannot make a structural schema of anyOf {node['anyOf']}")
        inner = {**_resolve(options[0], defs), **{k: v for k, v in node.items() if k != "anyOf"}}
        if inner.get("default", ...) is None:
            inner.pop("default")
        return _structural(inner, defs)
    if "const" in node:
        node = {**node, "enum": [node["const"]]}
    if "enum" in node and "type" not in node:
        kinds = {type(v) for v in node["enum"]}
        node = {**node, "type": "integer" if kinds == {int} else "string"}
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key not in _KEEP:
            continue
        if key == "properties":
            out[key] = {name: _structural(sub, defs) for name, sub in value.items()}
        elif key == "items":
            out[key] = _structural(value, defs)
        elif key == "additionalProperties":
            # Structural schemas forbid additionalProperties beside properties; the API server prunes
            # unknown fields instead (and kubectl's strict field validation reports them).
            if isinstance(value, dict):
                out[key] = _structural(value, defs)
        elif key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        else:
            out[key] = value
    if out.get("type") == "object" and "properties" in out:
        required = set(out.get("required", []))
        for name, sub in out["properties"].items():
            # Nested objects with a default factory default to {} so the API server applies the
            # defaults inside them; Optional ones (anyOf with null) stay absent.
            optional = "anyOf" in _resolve(node["properties"][name], defs)
            if (
                sub.get("type") == "object"
                and "properties" in sub
                and name not in required
                and "default" not in sub
                and not optional
            ):
                sub["default"] = _filled(sub)
    return out


def _filled(schema: dict[str, Any]) -> dict[str, Any]:
    """An object's default with its properties' defaults in it: kube-apiserver evaluates the object's CEL rules
    on the default itself (a bare ``{}`` fails them with ``no such key``)."""
    return {name: sub["default"] for name, sub in schema.get("properties", {}).items() if "default" in sub}


def _without_defaults(node: Any) -> Any:
    """Status is written whole by the operator; server-side defaults there would only add noise."""
    if isinstance(node, dict):
        return {k: _without_defaults(v) for k, v in node.items() if k != "default"}
    if isinstance(node, list):
        return [_without_defaults(v) for v in node]
    return node


def schema_of(model: type[BaseModel]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return _structural(raw, raw.get("$defs", {}))


def openapi_schema() -> dict[str, Any]:
    spec = schema_of(ReDrafterDeploymentSpec)
    status = _without_defaults(schema_of(ReDrafterDeploymentStatus))
    return {
        "type": "object",
        "description": "A ReDrafter speculative-decoding LLM service: the operator builds its TensorRT-LLM "
        "engines, serves them with Triton, autoscales, and falls back to the base engine when drafting stops paying.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }


PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Engine", "type": "string", "jsonPath": ".status.activeEngine"},
    {"name": "Drafter", "type": "string", "jsonPath": ".status.drafter.state"},
    {"name": "Step", "type": "integer", "jsonPath": ".status.drafter.step", "priority": 1},
    {"name": "Ready", "type": "integer", "jsonPath": ".status.serving.readyReplicas"},
    {"name": "Replicas", "type": "integer", "jsonPath": ".status.serving.replicas", "priority": 1},
    {"name": "Reason", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].reason'},
    {"name": "Message", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].message', "priority": 1},
    {"name": "Acceptance", "type": "number", "jsonPath": ".status.speculation.acceptanceRate"},
    {"name": "Decision", "type": "string", "jsonPath": ".status.speculation.decision", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": CRD_NAME,
            "labels": {"app.kubernetes.io/name": "redrafter-operator", "app.kubernetes.io/part-of": "redrafter"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
                "categories": ["all", "redrafter"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.serving.replicas",
                            "statusReplicasPath": ".status.serving.replicas",
                            "labelSelectorPath": ".status.serving.selector",
                        },
                    },
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                }
            ],
        },
    }


def crd_yaml() -> str:
    header = "# Generated by `redrafter-operator crd` from operator/redrafter_operator/api. Do not edit.\n"
    return header + dump(crd())
