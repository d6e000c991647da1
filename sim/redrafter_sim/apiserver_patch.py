"""Patch semantics of the API server as pure functions: JSON merge, strategic merge, JSON patch.

Strategic merge knows the merge keys of the list fields the operator and kubectl touch (containers by
name, conditions by type, ...) and the ``$patch``/``$setElementOrder``/``$deleteFromPrimitiveList``
directives kubectl sends; other lists are replaced, as with a merge patch.
"""

from __future__ import annotations

import copy
from typing import Any


class PatchError(ValueError):
    """A malformed patch (the server answers 400 BadRequest)."""


class PatchTestFailed(ValueError):
    """A JSON-patch ``test`` operation did not hold (the server answers 422 Invalid)."""


# Field name -> merge key of its list items (as in the Kubernetes Go types' patchMergeKey tags).
MERGE_KEYS: dict[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "imagePullSecrets": "name",
    "conditions": "type",
    "ownerReferences": "uid",
    "hostAliases": "ip",
    "containerStatuses": "name",
    "initContainerStatuses": "name",
    "topologySpreadConstraints": "topologyKey",
    "resourceClaims": "name",
}
# Lists of primitives that merge as sets.
SET_LISTS = {"finalizers"}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: dicts merge recursively, null deletes, everything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _item_key(item: Any, field: str) -> Any:
    if not isinstance(item, dict):
        return None
    key = MERGE_KEYS.get(field)
    if key is None and field == "ports":
        key = "containerPort" if "containerPort" in item else "port"
    return item.get(key) if key else None


def _strategic_list(field: str, current: Any, patch: list[Any]) -> list[Any]:
    if field in SET_LISTS and isinstance(current, list):
        return current + [v for v in patch if v not in current]
    has_keys = field in MERGE_KEYS or field == "ports"
    if not has_keys or not isinstance(current, list) or not all(isinstance(i, dict) for i in patch):
        if any(isinstance(i, dict) and i.get("$patch") == "replace" for i in patch):
            return [strip_directives(i) for i in patch if i.get("$patch") != "replace"]
        return [strip_directives(i) for i in patch]
    result = [copy.deepcopy(i) for i in current]
    for item in patch:
        directive = item.get("$patch")
        key = _item_key(item, field)
        index = next((n for n, old in enumerate(result) if key is not None and _item_key(old, field) == key), None)
        if directive == "delete":
            if index is not None:
                result.pop(index)
        elif index is None:
            result.append(strip_directives(item))
        else:
            result[index] = strategic_merge_patch(result[index], item)
    return result


def strip_directives(value: Any) -> Any:
    """Drop ``$``-directives from a (sub)patch that becomes content as is."""
    if isinstance(value, dict):
        return {k: strip_directives(v) for k, v in value.items() if not k.startswith("$")}
    if isinstance(value, list):
        return [strip_directives(v) for v in value]
    return value


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Kubernetes strategic merge patch for the fields in MERGE_KEYS; merge patch elsewhere."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return strip_directives(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            result[field] = [v for v in result.get(field) or [] if v not in value]
        elif key.startswith("$"):
            continue  # $setElementOrder, $retainKeys, $patch: ordering/pruning hints only
        elif value is None:
            result.pop(key, None)
        elif isinstance(value, list):
            result[key] = _strategic_list(key, result.get(key), value)
        elif isinstance(value, dict) and value.get("$patch") == "delete":
            result.pop(key, None)
        else:
            result[key] = strategic_merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _container(doc: Any, parts: list[str], path: str) -> Any:
    for part in parts:
        if isinstance(doc, dict) and part in doc:
            doc = doc[part]
        elif isinstance(doc, list) and part.isdigit() and int(part) < len(doc):
            doc = doc[int(part)]
        else:
            raise PatchError(f"path {path!r} does not exist")
    return doc


def _get(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    return _container(doc, parts, path)


def _remove(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    if not parts:
        raise PatchError("cannot remove the root")
    parent = _container(doc, parts[:-1], path)
    last = parts[-1]
    if isinstance(parent, dict) and last in parent:
        return parent.pop(last)
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent.pop(int(last))
    raise PatchError(f"path {path!r} does not exist")


def _add(doc: Any, path: str, value: Any, replace: bool = False) -> Any:
    parts = _pointer(path)
    if not parts:
        return value
    parent = _container(doc, parts[:-1], path)
    last = parts[-1]
    if isinstance(parent, dict):
        if replace and last not in parent:
            raise PatchError(f"path {path!r} does not exist")
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-" and not replace:
            parent.append(value)
        elif last.isdigit() and int(last) <= len(parent) - (1 if replace else 0):
            if replace:
                parent[int(last)] = value
            else:
                parent.insert(int(last), value)
        else:
            raise PatchError(f"path {path!r} is out of range")
    else:
        raise PatchError(f"path {path!r} does not exist")
    return doc


def json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902 on a deep copy of target; a failed ``test`` raises PatchTestFailed."""
    if not isinstance(operations, list):
        raise PatchError("a JSON patch must be a list of operations")
    doc = copy.deepcopy(target)
    for op in operations:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise PatchError(f"malformed JSON patch operation: {op!r}")
        kind, path = op["op"], op["path"]
        if kind == "add":
            doc = _add(doc, path, copy.deepcopy(op.get("value")))
        elif kind == "remove":
            _remove(doc, path)
        elif kind == "replace":
            doc = _add(doc, path, copy.deepcopy(op.get("value")), replace=True)
        elif kind == "move":
            value = _remove(doc, op["from"])
            doc = _add(doc, path, value)
        elif kind == "copy":
            doc = _add(doc, path, copy.deepcopy(_get(doc, op["from"])))
        elif kind == "test":
            try:
                actual = _get(doc, path)
            except PatchError as exc:
                raise PatchTestFailed(f"test operation failed: {exc}") from None
            if actual != op.get("value"):
                raise PatchTestFailed(f"testing value {path} failed")
        else:
            raise PatchError(f"unknown JSON patch operation {kind!r}")
    return doc
