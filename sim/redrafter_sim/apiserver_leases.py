"""coordination.k8s.io/v1 Lease admission, as the real API server does it: decode, then validate.

Decoding (a 400 BadRequest when it fails, before any validation): ``acquireTime``/``renewTime`` are
metav1.MicroTime, parsed with the layout ``RFC3339Micro`` = ``2006-01-02T15:04:05.000000Z07:00``
(exactly six fractional digits) and served back in UTC in that layout (apimachinery
``pkg/apis/meta/v1/micro_time.go``); the integer and string fields must have those JSON types;
unknown spec fields are dropped. Validation (a 422 Invalid): ``ValidateLeaseSpec`` in kubernetes
``pkg/apis/coordination/validation/validation.go`` (leaseDurationSeconds > 0, leaseTransitions >= 0,
strategy from the known set, preferredHolder only with a strategy).
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from .apiserver_schema import Cause

MICRO_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}(Z|[+-]\d{2}:\d{2})$")
RFC3339_MICRO = "2006-01-02T15:04:05.000000Z07:00"
STRINGS = ("holderIdentity", "strategy", "preferredHolder")
INT32S = ("leaseDurationSeconds", "leaseTransitions")
MICRO_TIMES = ("acquireTime", "renewTime")
STRATEGIES = ("OldestEmulationVersion",)


class LeaseDecodeError(ValueError):
    """The body is not a Lease the server can decode (answered 400 BadRequest)."""


def _micro_time(value: str) -> str:
    if not MICRO_TIME.match(value):
        raise LeaseDecodeError(f'parsing time "{value}" as "{RFC3339_MICRO}": cannot parse as "{RFC3339_MICRO}"')
    parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    return parsed.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def decode_lease(obj: dict[str, Any]) -> None:
    """Normalize ``obj['spec']`` in place as the server's decoder would, or raise LeaseDecodeError."""
    spec = obj.get("spec")
    if spec is None:
        obj["spec"] = {}
        return
    if not isinstance(spec, dict):
        raise LeaseDecodeError("json: cannot unmarshal into Go struct field Lease.spec of type v1.LeaseSpec")
    out: dict[str, Any] = {}
    for key, value in spec.items():
        if value is None:
            continue  # a nil pointer: omitted when served
        where = f"Go struct field LeaseSpec.spec.{key}"
        if key in STRINGS:
            if not isinstance(value, str):
                raise LeaseDecodeError(f"json: cannot unmarshal {type(value).__name__} into {where} of type string")
            out[key] = value
        elif key in INT32S:
            if isinstance(value, bool) or not isinstance(value, int) or not -(2**31) <= value < 2**31:
                raise LeaseDecodeError(f"json: cannot unmarshal {value!r} into {where} of type int32")
            out[key] = value
        elif key in MICRO_TIMES:
            if not isinstance(value, str):
                raise LeaseDecodeError(f"json: cannot unmarshal {type(value).__name__} into {where} of type string")
            out[key] = _micro_time(value)
        # anything else is an unknown field: the decoder drops it
    obj["spec"] = out


def lease_causes(obj: dict[str, Any]) -> list[Cause]:
    """ValidateLeaseSpec on a decoded Lease."""
    spec = obj.get("spec") or {}
    causes = []
    if "leaseDurationSeconds" in spec and spec["leaseDurationSeconds"] <= 0:
        causes.append(
            Cause(
                "spec.leaseDurationSeconds",
                "FieldValueInvalid",
                f"Invalid value: {spec['leaseDurationSeconds']}: must be greater than 0",
            )
        )
    if "leaseTransitions" in spec and spec["leaseTransitions"] < 0:
        causes.append(
            Cause(
                "spec.leaseTransitions",
                "FieldValueInvalid",
                f"Invalid value: {spec['leaseTransitions']}: must be greater than or equal to 0",
            )
        )
    if "strategy" in spec and spec["strategy"] not in STRATEGIES:
        causes.append(
            Cause(
                "spec.strategy",
                "FieldValueNotSupported",
                f'Unsupported value: "{spec["strategy"]}": supported values: '
                + ", ".join(f'"{s}"' for s in STRATEGIES),
            )
        )
    if spec.get("preferredHolder") and not spec.get("strategy"):
        causes.append(
            Cause(
                "spec.preferredHolder",
                "FieldValueForbidden",
                "Forbidden: may only be specified if `strategy` is defined",
            )
        )
    return causes
