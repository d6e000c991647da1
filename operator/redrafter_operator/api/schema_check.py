"""Offline checks of a custom resource against a CRD's openAPIV3Schema, as the API server would do them.

Used to review manifests without a cluster (GitOps, CI) and by the tests: defaulting, structural
validation with strict unknown-field rejection, then the CEL rules (``x-kubernetes-validations``)
evaluated with cel-python when it is installed.
"""

from __future__ import annotations

import copy
from typing import Any

import jsonschema


def apply_defaults(schema: dict[str, Any], obj: Any) -> Any:
    """Fill ``default`` values the way the API server does (recursively, only where absent)."""
    if not isinstance(obj, dict) or schema.get("type") != "object":
        if isinstance(obj, list) and "items" in schema:
            return [apply_defaults(schema["items"], v) for v in obj]
        return obj
    out = dict(obj)
    for name, sub in schema.get("properties", {}).items():
        if name not in out and "default" in sub:
            out[name] = copy.deepcopy(sub["default"])
        if name in out:
            out[name] = apply_defaults(sub, out[name])
    return out


def _strict(schema: Any) -> Any:
    """The schema with unknown fields rejected (kubectl --validate=strict behaviour)."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items() if not k.startswith("x-kubernetes-")}
        if (
            schema.get("type") == "object"
            and "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


def _path(parts: Any) -> str:
    return ".".join(str(p) for p in parts) or "<root>"


def _cel_errors(schema: dict[str, Any], obj: Any, path: list[str]) -> list[str]:
    try:
        import celpy
    except ImportError:  # pragma: no cover - cel-python is a test/dev dependency only
        return []
    errors = []
    for rule in schema.get("x-kubernetes-validations", []):
        env = celpy.Environment()
        program = env.program(env.compile(rule["rule"]))
        if not program.evaluate({"self": celpy.adapter.json_to_cel(obj)}):
            # the API server reports a rule at its fieldPath (relative to the object the rule sits on)
            where = _path(path) + rule.get("fieldPath", "")
            errors.append(f"{where}: {rule.get('message', rule['rule'])}")
    if isinstance(obj, dict):
        for name, sub in schema.get("properties", {}).items():
            if name in obj:
                errors += _cel_errors(sub, obj[name], [*path, name])
    elif isinstance(obj, list) and "items" in schema:
        for i, item in enumerate(obj):
            errors += _cel_errors(schema["items"], item, [*path, str(i)])
    return errors


def crd_schema(crd: dict[str, Any], version: str | None = None) -> dict[str, Any]:
    for v in crd["spec"]["versions"]:
        if version is None and v.get("storage") or v["name"] == version:
            schema: dict[str, Any] = v["schema"]["openAPIV3Schema"]
            return schema
    raise KeyError(f"version {version} not in CRD {crd['metadata']['name']}")


def validate_resource(crd: dict[str, Any], obj: dict[str, Any]) -> list[str]:
    """Errors (each naming its field path) for ``obj`` under ``crd``; [] when the server would accept it."""
    schema = crd_schema(crd)
    defaulted = apply_defaults(schema, obj)
    # OpenAPI v3.0 (boolean exclusiveMinimum) is Draft 4 semantics.
    validator = jsonschema.Draft4Validator(_strict(schema))
    errors = [f"{_path(e.absolute_path)}: {e.message}" for e in validator.iter_errors(defaulted)]
    if errors:  # CEL runs only on structurally valid objects, as on the server
        return sorted(errors)
    return _cel_errors(schema, defaulted, [])
