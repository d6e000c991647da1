"""Server-side printing (meta.k8s.io/v1 Table), so ``kubectl get`` shows a CRD's printer columns.

Built-in kinds get Name and Age only (the real server prints more; kubectl shows what it receives).
"""

from __future__ import annotations

import datetime
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
    if seconds < 0:
        return "0s"
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m"
    if seconds < 86400 * 2:
        hours, minutes = divmod(seconds // 60, 60)
        return f"{hours}h{minutes}m" if hours < 8 and minutes else f"{hours}h"
    return f"{seconds // 86400}d"


def _cell(obj: dict[str, Any], column: dict[str, Any]) -> Any:
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


def columns_for(rtype: ResourceType) -> list[dict[str, Any]]:
    """Column definitions: Name, then the CRD's additionalPrinterColumns (or Age if it has none)."""
    name = {"name": "Name", "type": "string", "format": "name", "priority": 0,
            "description": "Name must be unique within a namespace."}
    age = {"name": "Age", "type": "date", "format": "", "priority": 0, "jsonPath": ".metadata.creationTimestamp",
           "description": "CreationTimestamp is a timestamp representing the server time when this object was "
                          "created."}
    extra = [
        {"name": c["name"], "type": c.get("type", "string"), "format": c.get("format", ""),
         "priority": c.get("priority", 0), "description": c.get("description", ""), "jsonPath": c["jsonPath"]}
        for c in rtype.printer_columns
    ]
    return [name, *(extra or [age])]


def table(rtype: ResourceType, objects: list[dict[str, Any]], resource_version: str,
          include_object: str = "Metadata") -> dict[str, Any]:
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
        "kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": [{k: v for k, v in c.items() if k != "jsonPath"} for c in columns],
        "rows": rows,
    }
