"""Apply-ownership fingerprints (pure): what the operator's server-side apply owns of a child, hashed.

The applier compares these to decide whether an apply would change anything; the facts carry them, so the
watch alone tells a restarted operator which children already hold what it wants.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping

from ..render import names

FIELD_MANAGER = names.MANAGED_BY  # the operator's server-side apply field manager
# Managers earlier versions of the operator wrote children as: kubernetes-asyncio's User-Agent prefix.
PREVIOUS_MANAGERS = ("OpenAPI-Generator", FIELD_MANAGER)


def manifest_hash(manifest: Mapping[str, Any]) -> str:
    """Stable hash of what the operator wants an object to be (labels, annotations, spec, data)."""
    meta = manifest.get("metadata", {})
    relevant = {
        "labels": meta.get("labels") or {},
        "annotations": meta.get("annotations") or {},
        "ownerReferences": meta.get("ownerReferences") or [],
        **{k: v for k, v in manifest.items() if k not in ("metadata", "status", "apiVersion", "kind")},
    }
    text = json.dumps(relevant, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def owned_fields(body: Mapping[str, Any]) -> str:
    """Fingerprint of the fields the operator's server-side apply owns on an object ("" if none).

    The API server moves a field out of this set when anyone else changes or removes it (an Update
    takes the fields it changes), so a changed fingerprint is drift of exactly the fields the operator
    manages, seen from the watch without comparing whole objects.
    """
    entry = _our_apply_entry(body)
    if entry is None:
        return ""
    text = json.dumps(entry.get("fieldsV1") or {}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def previous_entries(body: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The managedFields entries an earlier operator version left (its create/merge patch: an Update), which
    the operator's apply has not taken over yet."""
    return [
        e
        for e in body.get("metadata", {}).get("managedFields") or []
        if e.get("manager") in PREVIOUS_MANAGERS and e.get("operation") == "Update" and not e.get("subresource")
    ]


def _our_apply_entry(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for entry in body.get("metadata", {}).get("managedFields") or []:
        if entry.get("manager") == FIELD_MANAGER and entry.get("operation") == "Apply" and not entry.get("subresource"):
            return dict(entry)
    return None


def owned_content(body: Mapping[str, Any]) -> str:
    """:func:`manifest_hash` of the object as far as the operator's apply owns it ("" if it owns nothing).

    The live object cut down to the fields of the operator's Apply entry in ``managedFields`` is what its
    last apply set, as long as nobody took a field since (an Update moves the fields it changes to its
    manager, so they drop out of the cut). Equal to the hash of a desired manifest: applying that manifest
    would change nothing, which a restarted operator knows from the watch without having applied anything.
    "" too while an earlier version's entry is not taken over (:func:`previous_entries`): the fields it owns
    but the apply no longer sets are still there, so the child needs an apply and the hand-over.
    """
    entry = _our_apply_entry(body)
    if entry is None or previous_entries(body):
        return ""
    fields = entry.get("fieldsV1") or {}
    cut = _project(dict(body), fields)
    meta = cut.get("metadata") if isinstance(cut, dict) else None
    if not isinstance(cut, dict) or (meta is not None and not isinstance(meta, dict)):
        return ""
    return manifest_hash(cut)


def _project(value: Any, fields: Mapping[str, Any]) -> Any:
    """``value`` cut down to a fieldsV1 tree (``f:`` fields, ``k:`` items of keyed lists, ``v:`` set members);
    a leaf (no children but ``.``) keeps its whole value, as an atomic field or list is owned whole."""
    children = {k: v for k, v in fields.items() if k != "."}
    if not children:
        return value
    if isinstance(value, dict):
        return {
            key[2:]: _project(value[key[2:]], sub or {})
            for key, sub in children.items()
            if key.startswith("f:") and key[2:] in value
        }
    if isinstance(value, list):
        out = []
        for item in value:
            for key, sub in children.items():
                if key.startswith("k:") and isinstance(item, dict):
                    try:
                        ident = json.loads(key[2:])
                    except ValueError:
                        continue
                    if all(item.get(k, "TCP" if k == "protocol" else None) == v for k, v in ident.items()):
                        out.append(_project(item, sub or {}))  # key fields the apply set are f: fields too
                        break
                elif key.startswith("v:"):
                    try:
                        member = json.loads(key[2:])
                    except ValueError:
                        continue
                    if item == member:
                        out.append(item)
                        break
        return out
    return value
