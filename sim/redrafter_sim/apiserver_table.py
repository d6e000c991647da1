"""Server-side printing (meta.k8s.io/v1 Table), so ``kubectl get`` shows a CRD's printer columns.

Built-in kinds get Name and Age only (the real server prints more; kubectl shows what it receives).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

from .apiserver_resources import ResourceType
from .apiserver_selectors import jsonpath

TABLE_MEDIA = "as=Table"


def wants_table(accept: str) -> bool:
    """True when the client's first acceptable media type is a meta.k8s.io Table."""
    first = accept.split(",")[0] if accept else ""
    return TABLE_MEDIA in first.replace(" ", "")


def human_age(timestamp: str | None, now: datetime.datetime | None = None) -> str:
    """``2025-01-01T00:00:00Z`` -> ``5m`` / ``3h`` / ``2d`` like kubectl's duration printer."""
    if not timestamp:
        return "<unknown>"
    try:
        then = datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except ValueError:
        return "<invalid>"
    seconds = int(((now or datetime.datetime.now(datetime.UTC)) - then).total_seconds())
    return _human_duration(seconds)


def _human_duration(seconds: int) -> str:
    """k8s.io/apimachinery duration.HumanDuration."""
    if seconds < -1:
        return "<invalid>"
    if seconds < 0:
        return "0s"
    if seconds < 120:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 10:
        return f"{minutes}m{seconds % 60}s" if seconds % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d{hours % 24}h" if hours % 24 else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = (hours // 24) % 365
        return f"{hours // 24 // 365}y{days}d" if days else f"{hours // 24 // 365}y"
    return f"{hours // 24 // 365}y"


def _cell(obj: dict[str, Any], column: dict[str, Any]) -> Any:
    if "fn" in column:
        return column["fn"](obj)
    try:
        values = jsonpath(obj, column.get("jsonPath", ""))
    except ValueError:
        return "<error>"
    if not values:
        return None
    value = values[0] if len(values) == 1 else ",".join(str(v) for v in values)
    if column.get("type") == "date" and isinstance(value, str):
        return human_age(value)
    return value


def _conds(obj: dict[str, Any]) -> dict[str, str]:
    return {c.get("type", ""): c.get("status", "") for c in (obj.get("status") or {}).get("conditions") or []}


def _pod_ready(obj: dict[str, Any]) -> str:
    statuses = (obj.get("status") or {}).get("containerStatuses") or []
    total = len((obj.get("spec") or {}).get("containers") or []) or len(statuses)
    return f"{sum(1 for c in statuses if c.get('ready'))}/{total}"


def _job_status(obj: dict[str, Any]) -> str:
    conds = _conds(obj)
    if conds.get("Complete") == "True":
        return "Complete"
    if conds.get("Failed") == "True":
        return "Failed"
    return "Running" if (obj.get("status") or {}).get("active") else "Pending"


def _ports(obj: dict[str, Any]) -> str:
    ports = (obj.get("spec") or {}).get("ports") or []
    return ",".join(f"{p.get('port')}/{p.get('protocol', 'TCP')}" for p in ports) or "<none>"


def _endpoints(obj: dict[str, Any]) -> str:
    items = [
        f"{a.get('ip')}:{p.get('port')}"
        for s in obj.get("subsets") or []
        for a in s.get("addresses") or []
        for p in (s.get("ports") or [{}])[:1]
    ]
    return ",".join(items) or "<none>"


def _involved(obj: dict[str, Any]) -> str:
    ref = obj.get("involvedObject") or obj.get("regarding") or {}
    return f"{str(ref.get('kind', '')).lower()}/{ref.get('name', '')}"


Column = tuple[str, str, int, Callable[[dict[str, Any]], Any]]
_S = "string"
BUILTIN_COLUMNS: dict[tuple[str, str], list[Column]] = {
    ("", "pods"): [
        ("Ready", _S, 0, _pod_ready),
        ("Status", _S, 0, lambda o: (o.get("status") or {}).get("phase")),
        (
            "Restarts",
            "integer",
            0,
            lambda o: sum(c.get("restartCount", 0) for c in (o.get("status") or {}).get("containerStatuses") or []),
        ),
        ("IP", _S, 1, lambda o: (o.get("status") or {}).get("podIP") or "<none>"),
    ],
    ("apps", "deployments"): [
        (
            "Ready",
            _S,
            0,
            lambda o: f"{(o.get('status') or {}).get('readyReplicas', 0)}/{(o.get('spec') or {}).get('replicas', 1)}",
        ),
        ("Up-to-date", "integer", 0, lambda o: (o.get("status") or {}).get("updatedReplicas", 0)),
        ("Available", "integer", 0, lambda o: (o.get("status") or {}).get("availableReplicas", 0)),
    ],
    ("batch", "jobs"): [
        ("Status", _S, 0, _job_status),
        (
            "Completions",
            _S,
            0,
            lambda o: f"{(o.get('status') or {}).get('succeeded', 0)}/{(o.get('spec') or {}).get('completions', 1)}",
        ),
    ],
    ("", "services"): [
        ("Type", _S, 0, lambda o: (o.get("spec") or {}).get("type", "ClusterIP")),
        ("Cluster-IP", _S, 0, lambda o: (o.get("spec") or {}).get("clusterIP", "<none>")),
        ("Port(s)", _S, 0, _ports),
    ],
    ("", "endpoints"): [("Endpoints", _S, 0, _endpoints)],
    ("coordination.k8s.io", "leases"): [("Holder", _S, 0, lambda o: (o.get("spec") or {}).get("holderIdentity") or "")],
    ("", "events"): [
        ("Type", _S, 0, lambda o: o.get("type")),
        ("Reason", _S, 0, lambda o: o.get("reason")),
        ("Object", _S, 0, _involved),
        ("Message", _S, 0, lambda o: o.get("message") or o.get("note")),
    ],
}


def columns_for(rtype: ResourceType) -> list[dict[str, Any]]:
    """Column definitions: Name, then the CRD's additionalPrinterColumns (or Age if it has none)."""
    name = {
        "name": "Name",
        "type": "string",
        "format": "name",
        "priority": 0,
        "description": "Name must be unique within a namespace.",
    }
    age = {
        "name": "Age",
        "type": "date",
        "format": "",
        "priority": 0,
        "jsonPath": ".metadata.creationTimestamp",
        "description": "CreationTimestamp is a timestamp representing the server time when this object was created.",
    }
    extra = [
        {
            "name": c["name"],
            "type": c.get("type", "string"),
            "format": c.get("format", ""),
            "priority": c.get("priority", 0),
            "description": c.get("description", ""),
            "jsonPath": c["jsonPath"],
        }
        for c in rtype.printer_columns
    ]
    builtin = [
        {"name": n, "type": t, "format": "", "priority": p, "description": n, "fn": fn}
        for n, t, p, fn in BUILTIN_COLUMNS.get(rtype.storage_key, [])
    ]
    return [name, *(extra or [*builtin, age])]


def table(
    rtype: ResourceType, objects: list[dict[str, Any]], resource_version: str, include_object: str = "Metadata"
) -> dict[str, Any]:
    """A meta.k8s.io/v1 Table of the objects (rows carry PartialObjectMetadata or the full object)."""
    columns = columns_for(rtype)
    rows = []
    for obj in objects:
        cells = [obj["metadata"]["name"], *(_cell(obj, c) for c in columns[1:])]
        if include_object == "Object":
            embedded: dict[str, Any] | None = obj
        elif include_object == "None":
            embedded = None
        else:
            embedded = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]}
        rows.append({"cells": cells, "object": embedded})
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": [{k: v for k, v in c.items() if k not in ("jsonPath", "fn")} for c in columns],
        "rows": rows,
    }
