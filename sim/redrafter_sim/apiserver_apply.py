"""Server-side apply as the API server does it: field sets, ``managedFields`` per manager, conflicts.

Pure functions over JSON objects, after sigs.k8s.io/structured-merge-diff (SMD v4, Kubernetes 1.30):

* A field set is a set of paths; a path element is ``f:<field>``, ``k:<json of the key fields>`` for an
  item of an associative list (containers by name, ports by port+protocol, ...), or ``v:<json>`` for a
  value of a set list (finalizers). Lists with no key are atomic: owned as one leaf. Scalars and list
  items are members; struct fields are only the path to their children (SMD typed/tofieldset.go).
* ``managedFields`` stores one entry per (manager, operation, subresource) with its set as fieldsV1:
  nested ``{"f:spec": {"f:replicas": {}}}``; a member with children also has ``".": {}``.
* Apply: the applied configuration's set becomes the manager's Apply entry. Fields it sets to a value
  that differs from the live one and that another manager owns are conflicts (409) unless ``force``,
  which moves them to the applier. Fields it applied before and no longer applies are removed from the
  object unless another manager still owns them. Applying a field to the value it already has shares it.
* Update (POST, PUT, merge/strategic/JSON patch): the fields the write changed move to the writer's
  Update entry; nobody else owns them any more.

The schema knowledge is a table of list keys by field name (Kubernetes' ``x-kubernetes-list-map-keys``
for the kinds the operator writes), not per-type OpenAPI: enough for the emulator, stated here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

Path = tuple[str, ...]

# Associative lists: field name -> key fields (k8s.io/api OpenAPI x-kubernetes-list-map-keys).
LIST_MAP_KEYS: dict[str, tuple[str, ...]] = {
    "containers": ("name",),
    "initContainers": ("name",),
    "ephemeralContainers": ("name",),
    "env": ("name",),
    "volumes": ("name",),
    "volumeMounts": ("mountPath",),
    "volumeDevices": ("devicePath",),
    "imagePullSecrets": ("name",),
    "hostAliases": ("ip",),
    "ownerReferences": ("uid",),
    "conditions": ("type",),
    "topologySpreadConstraints": ("topologyKey", "whenUnsatisfiable"),
    "resourceClaims": ("name",),
    "containerStatuses": ("name",),
    "initContainerStatuses": ("name",),
}
# ``ports`` is keyed by containerPort+protocol in a container and port+protocol in a Service; protocol
# has a default (TCP) that SMD fills into the key when the item leaves it out.
PORT_KEYS = (("containerPort", "protocol"), ("port", "protocol"))
SET_LISTS = {"finalizers"}  # x-kubernetes-list-type: set
# Never owned: identity and server-maintained metadata (k8s.io/apiserver fieldmanager's stripped fields).
UNOWNED_METADATA = {
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "managedFields",
    "selfLink",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
}
_MISSING = object()


class ApplyConflicts(Exception):
    """Apply would change fields other managers own (the server answers 409 Conflict)."""

    def __init__(self, conflicts: list[tuple[dict[str, Any], Path]]):
        self.conflicts = conflicts
        super().__init__(self.message())

    def message(self) -> str:
        """k8s.io/apiserver fieldmanager/internal/conflict.go getConflictMessage."""
        if len(self.conflicts) == 1:
            entry, path = self.conflicts[0]
            return f"Apply failed with 1 conflict: conflict with {describe_manager(entry)}: {path_string(path)}"
        lines: list[str] = []
        for desc in sorted({describe_manager(e) for e, _ in self.conflicts}):
            lines.append(f"conflicts with {desc}:")
            lines += [f"- {path_string(p)}" for e, p in self.conflicts if describe_manager(e) == desc]
        return f"Apply failed with {len(self.conflicts)} conflicts: " + "\n".join(lines)

    def causes(self) -> list[dict[str, str]]:
        return [
            {
                "reason": "FieldManagerConflict",
                "message": f"conflict with {describe_manager(e)}",
                "field": path_string(p),
            }
            for e, p in self.conflicts
        ]


def describe_manager(entry: dict[str, Any]) -> str:
    """conflict.go printManager: Update managers are named with the apiVersion they wrote."""
    text = json.dumps(entry.get("manager", ""))
    if entry.get("subresource"):
        text += f" with subresource {json.dumps(entry['subresource'])}"
    if entry.get("operation") == "Update":
        text += f" using {entry.get('apiVersion', '')}"
    return text


def path_string(path: Path) -> str:
    """SMD fieldpath.Path.String(): .spec.containers[name="c"].image, finalizers [="x"]."""
    out = []
    for element in path:
        kind, _, raw = element.partition(":")
        if kind == "f":
            out.append(f".{raw}")
        elif kind == "k":
            out.append("[" + ",".join(f"{k}={json.dumps(v)}" for k, v in json.loads(raw).items()) + "]")
        else:
            out.append(f"[={raw}]")
    return "".join(out)


# ---------------------------------------------------------------- field sets
def _list_keys(field: str, items: list[Any]) -> tuple[str, ...] | None:
    """The key fields of an associative list, or None (atomic list)."""
    if not items or not all(isinstance(i, dict) for i in items):
        return None
    if field == "ports":
        return next((keys for keys in PORT_KEYS if all(keys[0] in i for i in items)), None)
    keys = LIST_MAP_KEYS.get(field)
    return keys if keys and all(keys[0] in i for i in items) else None


def _item_element(keys: tuple[str, ...], item: dict[str, Any]) -> str:
    key = {k: item.get(k, "TCP" if k == "protocol" else None) for k in sorted(keys)}
    return "k:" + json.dumps(key, separators=(",", ":"), sort_keys=True)


def field_set(value: Any, prefix: Path = ()) -> set[Path]:
    """The paths a JSON object sets (SMD ToFieldSet without a schema: see the module docstring)."""
    out: set[Path] = set()
    if not isinstance(value, dict):
        return out
    for name, child in value.items():
        path = prefix + (f"f:{name}",)
        if isinstance(child, dict) and child:
            out |= field_set(child, path)
        elif isinstance(child, list) and name in SET_LISTS:
            out |= {path + ("v:" + json.dumps(v, separators=(",", ":")),) for v in child}
        elif isinstance(child, list) and (keys := _list_keys(name, child)) is not None:
            for item in child:
                item_path = path + (_item_element(keys, item),)
                out.add(item_path)
                out |= field_set(item, item_path)
        else:
            out.add(path)
    return out


def owned_view(obj: dict[str, Any], subresource: str | None, status_subresource: bool) -> dict[str, Any]:
    """The part of an object field ownership is about: no identity metadata; status only on /status."""
    if subresource == "status":
        return {"status": obj["status"]} if "status" in obj else {}
    view = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
    if status_subresource:
        view.pop("status", None)
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k not in UNOWNED_METADATA}
    if meta:
        view["metadata"] = meta
    return view


def to_fields_v1(paths: set[Path]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for path in paths:
        node = tree
        for element in path:
            node = node.setdefault(element, {})
    for path in paths:  # a member that also has children says so with "."
        node = tree
        for element in path:
            node = node[element]
        if node and "." not in node:
            node["."] = {}
    return tree


def from_fields_v1(tree: dict[str, Any], prefix: Path = ()) -> set[Path]:
    out: set[Path] = set()
    for element, child in tree.items():
        if element == ".":
            out.add(prefix)
        elif child:
            out |= from_fields_v1(child, prefix + (element,))
        else:
            out.add(prefix + (element,))
    return out


# ---------------------------------------------------------------- navigation
def _find_item(items: list[Any], element: str) -> int | None:
    kind, _, raw = element.partition(":")
    wanted = json.loads(raw)
    for n, item in enumerate(items):
        if kind == "v" and item == wanted:
            return n
        if (
            kind == "k"
            and isinstance(item, dict)
            and all(item.get(k, "TCP" if k == "protocol" else None) == v for k, v in wanted.items())
        ):
            return n
    return None


def value_at(obj: Any, path: Path) -> Any:
    node = obj
    for element in path:
        if element.startswith("f:"):
            if not isinstance(node, dict) or element[2:] not in node:
                return _MISSING
            node = node[element[2:]]
        else:
            if not isinstance(node, list) or (n := _find_item(node, element)) is None:
                return _MISSING
            node = node[n]
    return node


def _differs(old: Any, new: Any, path: Path) -> bool:
    a, b = value_at(old, path), value_at(new, path)
    if path and not path[-1].startswith("f:") and isinstance(a, dict) and isinstance(b, dict):
        return False  # a list item with children: its fields say what changed, not the item
    return a is _MISSING or b is _MISSING or a != b


def changed_paths(old: dict[str, Any], new: dict[str, Any]) -> set[Path]:
    """Fields a write set to a new value, added, or removed (SMD Compare: modified | added | removed)."""
    before, after = field_set(old), field_set(new)
    return {p for p in after if _differs(old, new, p)} | (before - after)


def remove_path(obj: Any, path: Path) -> None:
    """Delete one path (a field, a list item) and the containers the removal left empty."""
    parents: list[tuple[Any, str]] = []
    node = obj
    for element in path:
        parents.append((node, element))
        node = value_at(node, (element,))
        if node is _MISSING:
            return
    for container, element in reversed(parents):
        if element.startswith("f:"):
            container.pop(element[2:], None)
        else:
            n = _find_item(container, element)
            if n is not None:
                container.pop(n)
        if container or container is obj:
            return
        # the container is now empty: remove it from its parent too (next iteration)


def merge_applied(live: Any, config: Any, field: str = "") -> Any:
    """The applied configuration merged into the live object: maps by field, associative lists by key,
    set lists as a union, atomic lists and scalars replaced; an explicit null removes."""
    if isinstance(config, dict) and isinstance(live, dict):
        out = dict(live)
        for name, value in config.items():
            if value is None:
                out.pop(name, None)
            else:
                out[name] = merge_applied(live.get(name, _MISSING), value, name)
        return out
    if isinstance(config, list) and isinstance(live, list):
        if field in SET_LISTS:
            return live + [v for v in config if v not in live]
        keys = _list_keys(field, config)
        if keys is not None and _list_keys(field, live) == keys:
            out_items = list(live)
            for item in config:
                n = _find_item(out_items, _item_element(keys, item))
                if n is None:
                    out_items.append(item)
                else:
                    out_items[n] = merge_applied(out_items[n], item, field)
            return out_items
    return json.loads(json.dumps(config))


# ---------------------------------------------------------------- ownership
@dataclass
class Ownership:
    """The managedFields entries of one object, with their sets decoded."""

    entries: list[dict[str, Any]]
    sets: list[set[Path]]

    @classmethod
    def of(cls, obj: dict[str, Any]) -> "Ownership":
        entries = [dict(e) for e in (obj.get("metadata") or {}).get("managedFields") or [] if isinstance(e, dict)]
        return cls(entries, [from_fields_v1(e.get("fieldsV1") or {}) for e in entries])

    def index(self, manager: str, operation: str, subresource: str | None) -> int | None:
        return next(
            (
                n
                for n, e in enumerate(self.entries)
                if e.get("manager") == manager
                and e.get("operation") == operation
                and (e.get("subresource") or None) == subresource
            ),
            None,
        )

    def owned_by_others(self, mine: int | None) -> set[Path]:
        return set().union(*(s for n, s in enumerate(self.sets) if n != mine))

    def set_entry(
        self, manager: str, operation: str, subresource: str | None, api_version: str, paths: set[Path], now: str
    ) -> None:
        n = self.index(manager, operation, subresource)
        entry: dict[str, Any] = {
            "manager": manager,
            "operation": operation,
            "apiVersion": api_version,
            "time": now,
            "fieldsType": "FieldsV1",
        }
        if subresource:
            entry["subresource"] = subresource
        if n is None:
            self.entries.append(entry)
            self.sets.append(set(paths))
        else:
            self.entries[n], self.sets[n] = entry, set(paths)

    def managed_fields(self, present: set[Path]) -> list[dict[str, Any]]:
        """The entries as stored: sets limited to fields the object still has, empty entries dropped."""
        out = []
        for entry, paths in zip(self.entries, self.sets):
            kept = paths & present
            if kept:
                out.append({**entry, "fieldsV1": to_fields_v1(kept)})
        return out


def apply(
    live: dict[str, Any],
    config: dict[str, Any],
    *,
    manager: str,
    api_version: str,
    now: str,
    subresource: str | None,
    status_subresource: bool,
    force: bool,
) -> dict[str, Any]:
    """The object after ``manager`` applies ``config`` (raises ApplyConflicts), managedFields included."""
    owners = Ownership.of(live)
    mine = owners.index(manager, "Apply", subresource)
    previous = owners.sets[mine] if mine is not None else set()
    applied = owned_view(config, subresource, status_subresource)
    wanted = field_set(applied)
    live_view = owned_view(live, subresource, status_subresource)
    merged_view = merge_applied(live_view, applied)
    changed = {p for p in wanted if _differs(live_view, merged_view, p)}
    conflicts = [
        (owners.entries[n], p) for n, paths in enumerate(owners.sets) if n != mine for p in sorted(changed & paths)
    ]
    if conflicts and not force:
        raise ApplyConflicts(conflicts)
    for n in range(len(owners.sets)):
        if n != mine:
            owners.sets[n] -= changed
    others = owners.owned_by_others(mine)
    for path in sorted(previous - wanted - others, key=len):  # an item before its fields
        if not any(o[: len(path)] == path for o in others):  # a field another manager owns keeps its parents
            remove_path(merged_view, path)
    owners.set_entry(manager, "Apply", subresource, api_version, wanted, now)
    return _with_view(live, merged_view, owners, subresource, status_subresource)


def update(
    old: dict[str, Any] | None,
    new: dict[str, Any],
    *,
    manager: str,
    api_version: str,
    now: str,
    subresource: str | None,
    status_subresource: bool,
) -> list[dict[str, Any]]:
    """managedFields after an Update by ``manager``: what it changed is its own and nobody else's.

    managedFields the request itself carries (not on a subresource) are the starting point instead of
    the live ones: that is how clients move ownership (k8s.io/apiserver fieldmanager FieldManager.Update).
    """
    given = (new.get("metadata") or {}).get("managedFields")
    owners = Ownership.of(new if given and subresource is None else (old or {}))
    old_view = owned_view(old or {}, subresource, status_subresource)
    new_view = owned_view(new, subresource, status_subresource)
    changed = changed_paths(old_view, new_view)
    if changed:
        mine = owners.index(manager, "Update", subresource)
        for n in range(len(owners.sets)):
            if n != mine:
                owners.sets[n] -= changed
        owners.set_entry(
            manager,
            "Update",
            subresource,
            api_version,
            (owners.sets[mine] if mine is not None else set()) | changed,
            now,
        )
    return owners.managed_fields(_present(new, status_subresource))


def created(
    obj: dict[str, Any],
    config: dict[str, Any] | None,
    *,
    manager: str,
    api_version: str,
    now: str,
    status_subresource: bool,
) -> list[dict[str, Any]]:
    """managedFields of a new object: an Apply entry for what ``config`` set (apply creating it), or an
    Update entry owning everything the create set (POST, defaults included as on a real server)."""
    owners = Ownership([], [])
    if config is not None:
        owners.set_entry(
            manager, "Apply", None, api_version, field_set(owned_view(config, None, status_subresource)), now
        )
    else:
        owners.set_entry(manager, "Update", None, api_version, _present(obj, status_subresource), now)
    return owners.managed_fields(_present(obj, status_subresource))


def _present(obj: dict[str, Any], status_subresource: bool) -> set[Path]:
    present = field_set(owned_view(obj, None, status_subresource))
    if status_subresource:
        present |= field_set(owned_view(obj, "status", status_subresource))
    return present


def _with_view(
    live: dict[str, Any], view: dict[str, Any], owners: Ownership, subresource: str | None, status_subresource: bool
) -> dict[str, Any]:
    """``live`` with its owned part replaced by ``view`` (identity metadata and the other part kept)."""
    out = {k: v for k, v in live.items() if k in ("apiVersion", "kind")}
    if subresource == "status":
        out.update({k: v for k, v in live.items() if k != "status"})
        if "status" in view:
            out["status"] = view["status"]
    else:
        out.update(view)
        if status_subresource and "status" in live:
            out["status"] = live["status"]
        out["metadata"] = {
            **{k: v for k, v in live["metadata"].items() if k in UNOWNED_METADATA},
            **(view.get("metadata") or {}),
        }
    out.setdefault("metadata", {})["managedFields"] = owners.managed_fields(_present(out, status_subresource))
    return out


def same_ownership(a: list[dict[str, Any]] | None, b: list[dict[str, Any]] | None) -> bool:
    """Equal managedFields but for the times (a write that changes only times is a no-op)."""

    def strip(entries: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
        return [{k: v for k, v in e.items() if k != "time"} for e in entries or []]

    return strip(a) == strip(b)
