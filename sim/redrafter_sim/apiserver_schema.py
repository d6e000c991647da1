"""What the real API server does with a CRD's structural openAPIV3Schema: prune, default, validate.

Order as in kube-apiserver: unknown fields are pruned, then ``default``s are applied, then the object is
validated; violations come back as (field path, reason, message) causes for a 422 Invalid Status.
"""

from __future__ import annotations

import copy
import functools
import json
from dataclasses import dataclass
from typing import Any

import jsonschema

ROOT_KEEP = ("apiVersion", "kind", "metadata")


@dataclass(frozen=True)
class Cause:
    """One field violation, shaped like metav1.StatusCause."""

    field: str
    reason: str  # FieldValueRequired | FieldValueNotSupported | FieldValueInvalid | FieldValueTypeInvalid
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"reason": self.reason, "message": self.message, "field": self.field}


def prune(value: Any, schema: dict[str, Any] | None, *, root: bool = False) -> Any:
    """Drop fields the schema does not declare (unless x-kubernetes-preserve-unknown-fields)."""
    if schema is None:
        return value
    if isinstance(value, dict):
        props: dict[str, Any] = schema.get("properties") or {}
        additional = schema.get("additionalProperties")
        preserve = bool(schema.get("x-kubernetes-preserve-unknown-fields"))
        embedded = bool(schema.get("x-kubernetes-embedded-resource"))
        result: dict[str, Any] = {}
        for key, item in value.items():
            if (root or embedded) and key in ROOT_KEEP:
                result[key] = item  # metadata is ObjectMeta, never pruned by the CRD schema
            elif key in props:
                result[key] = prune(item, props[key])
            elif isinstance(additional, dict):
                result[key] = prune(item, additional)
            elif preserve or additional is True or (not props and schema.get("type") != "object"):
                result[key] = item
        return result
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [prune(item, schema["items"]) for item in value]
    return value


def apply_defaults(value: Any, schema: dict[str, Any] | None) -> Any:
    """Fill absent properties that have a ``default`` (recursively, defaults themselves included)."""
    if schema is None:
        return value
    if isinstance(value, dict):
        result = dict(value)
        props: dict[str, Any] = schema.get("properties") or {}
        for key, sub in props.items():
            if key not in result and "default" in sub:
                result[key] = copy.deepcopy(sub["default"])
            if key in result:
                result[key] = apply_defaults(result[key], sub)
        additional = schema.get("additionalProperties")
        if isinstance(additional, dict):
            for key in result:
                if key not in props:
                    result[key] = apply_defaults(result[key], additional)
        return result
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [apply_defaults(item, schema["items"]) for item in value]
    return value


def _to_jsonschema(schema: Any) -> Any:
    """OpenAPI v3 (nullable, int-or-string) -> JSON Schema draft 7 understood by jsonschema."""
    if isinstance(schema, list):
        return [_to_jsonschema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in ("properties", "patternProperties", "definitions"):
            out[key] = {k: _to_jsonschema(v) for k, v in value.items()}
        elif key in ("items", "additionalProperties", "not", "allOf", "anyOf", "oneOf"):
            out[key] = _to_jsonschema(value)
        elif key.startswith("x-kubernetes-") or key in ("nullable", "default", "example", "format"):
            continue
        else:
            out[key] = value
    if schema.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.pop("anyOf", None)
        out["type"] = ["integer", "string"]
    for bound, exclusive in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        if isinstance(schema.get(exclusive), bool):  # OpenAPI 3.0: a flag on minimum/maximum
            out.pop(exclusive, None)
            if schema[exclusive] and bound in schema:
                out[exclusive] = out.pop(bound)
    if schema.get("nullable") and "type" in out:
        types = out["type"] if isinstance(out["type"], list) else [out["type"]]
        out["type"] = [*types, "null"]
        if "enum" in out and None not in out["enum"]:
            out["enum"] = [*out["enum"], None]
    return out


def _field_path(parts: list[Any]) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _cause(error: jsonschema.ValidationError) -> Cause:
    path = list(error.absolute_path)
    field = _field_path(path)
    if error.validator == "required":
        missing = error.message.split("'")[1] if "'" in error.message else "?"
        full = _field_path([*path, missing])
        return Cause(full, "FieldValueRequired", "Required value")
    if error.validator == "enum":
        allowed = ", ".join(f'"{v}"' for v in error.validator_value)
        return Cause(
            field, "FieldValueNotSupported", f"Unsupported value: {error.instance!r}: supported values: {allowed}"
        )
    if error.validator == "type":
        return Cause(
            field,
            "FieldValueTypeInvalid",
            f"Invalid value: {error.instance!r}: {field} in body must be of type {error.validator_value}",
        )
    bounds = {
        "minimum": "greater than or equal to",
        "maximum": "less than or equal to",
        "exclusiveMinimum": "greater than",
        "exclusiveMaximum": "less than",
        "minLength": "at least",
        "maxLength": "at most",
        "minItems": "at least",
        "maxItems": "at most",
    }
    if error.validator in bounds:
        return Cause(
            field,
            "FieldValueInvalid",
            f"Invalid value: {error.instance!r}: {field} in body should be "
            f"{bounds[error.validator]} {error.validator_value}",
        )
    if error.validator == "pattern":
        return Cause(
            field,
            "FieldValueInvalid",
            f"Invalid value: {error.instance!r}: {field} in body should match '{error.validator_value}'",
        )
    return Cause(field, "FieldValueInvalid", f"Invalid value: {error.message}")


_validators: dict[int, tuple[dict[str, Any], Any]] = {}  # id(schema) -> (schema, its validator)


def _validator(schema: dict[str, Any]) -> Any:
    """The JSON Schema validator of a CRD schema, built once per schema object (they are never mutated:
    a changed CRD installs new ones); the schema is kept with it so that its id is not reused."""
    hit = _validators.get(id(schema))
    if hit is not None and hit[0] is schema:
        return hit[1]
    checked_schema = _to_jsonschema(schema)
    props = dict(checked_schema.get("properties") or {})
    props.pop("metadata", None)
    checked_schema["properties"] = props
    validator = jsonschema.Draft7Validator(checked_schema)
    if len(_validators) >= 256:
        _validators.clear()
    _validators[id(schema)] = (schema, validator)
    return validator


def validate(obj: dict[str, Any], schema: dict[str, Any] | None) -> list[Cause]:
    """Structural validation of a whole custom object (metadata excluded) against its CRD schema."""
    if schema is None:
        return []
    body = {k: v for k, v in obj.items() if k != "metadata"}
    validator = _validator(schema)
    causes = [_cause(e) for e in sorted(validator.iter_errors(body), key=lambda e: [str(p) for p in e.absolute_path])]
    return causes


@functools.lru_cache(maxsize=512)
def _cel_program(rule: str) -> Any:
    import celpy  # cel-python: optional; without it CEL rules are not enforced

    env = celpy.Environment()
    return env.program(env.compile(rule))


def _cel_type_name(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer", float: "number"}.get(
        type(value), "null"
    )


_outcomes: dict[tuple[str, str, str, str], tuple[bool, str]] = {}  # (rule, message, self, oldSelf) -> outcome


def _evaluate_rule(rule: dict[str, Any], value: Any, old: Any) -> tuple[bool, str]:
    """(failed, detail) of one CEL rule; CEL is deterministic, so an outcome is reused for the same inputs
    (every write re-validates the whole object, and most of it is the same as in the last write)."""
    import celpy

    text = rule.get("rule", "")
    uses_old = "oldSelf" in text
    memo = (
        text,
        rule.get("message") or "",
        json.dumps(value, sort_keys=True),
        json.dumps(old, sort_keys=True) if uses_old else "",
    )
    hit = _outcomes.get(memo)
    if hit is not None:
        return hit
    activation = {"self": celpy.json_to_cel(value)}
    if old is not None:
        activation["oldSelf"] = celpy.json_to_cel(old)
    try:
        result = _cel_program(text).evaluate(activation)
        failed, detail = not bool(result), rule.get("message") or f"failed rule: {text}"
    except Exception as exc:  # CELEvalError (e.g. no such key) is a rejection, as on the server
        reason = exc.args[0] if exc.args else exc
        failed, detail = True, f"{rule.get('message') or text}: evaluation error: {reason}"
    if len(_outcomes) >= 20_000:
        _outcomes.clear()
    _outcomes[memo] = (failed, detail)
    return failed, detail


def _check_rules(value: Any, old: Any, schema: dict[str, Any], path: str, causes: list[Cause]) -> None:
    for rule in schema.get("x-kubernetes-validations") or []:
        text = rule.get("rule", "")
        if "oldSelf" in text and old is None:
            continue  # transition rules only apply to updates
        failed, detail = _evaluate_rule(rule, value, old)
        if failed:
            field = path + (rule.get("fieldPath") or "")
            reason = {
                "FieldValueRequired": "FieldValueRequired",
                "FieldValueForbidden": "FieldValueForbidden",
                "FieldValueDuplicate": "FieldValueDuplicate",
            }.get(rule.get("reason", ""), "FieldValueInvalid")
            causes.append(Cause(field.lstrip("."), reason, f'Invalid value: "{_cel_type_name(value)}": {detail}'))


def _walk_rules(value: Any, old: Any, schema: dict[str, Any], path: str, causes: list[Cause]) -> None:
    if value is None:
        return
    if schema.get("x-kubernetes-validations"):
        _check_rules(value, old, schema, path, causes)
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        additional = schema.get("additionalProperties")
        for key, item in value.items():
            sub = props.get(key, additional if isinstance(additional, dict) else None)
            if sub is not None and not (path == "" and key == "metadata"):
                prior = old.get(key) if isinstance(old, dict) else None
                _walk_rules(item, prior, sub, f"{path}.{key}", causes)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            _walk_rules(item, None, schema["items"], f"{path}[{index}]", causes)


def validate_rules(
    obj: dict[str, Any], schema: dict[str, Any] | None, old: dict[str, Any] | None = None
) -> list[Cause]:
    """CEL ``x-kubernetes-validations`` (with ``oldSelf`` on updates), evaluated by cel-python if installed."""
    if schema is None:
        return []
    try:
        import celpy  # noqa: F401
    except ImportError:
        return []
    causes: list[Cause] = []
    _walk_rules(obj, old, schema, "", causes)
    return causes
