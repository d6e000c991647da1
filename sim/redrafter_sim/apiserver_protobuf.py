"""Decode the few protobuf request bodies typed Go clients send (Helm's release Secrets, ``kubectl create``).

Kubernetes wraps protobuf objects in a ``k8s\\0`` envelope holding a runtime.Unknown (apiVersion, kind,
raw bytes). Only the kinds listed in DECODERS are understood (field numbers from k8s.io/api generated.proto);
anything else raises ValueError so the server answers 415 and the client can retry with JSON.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

MAGIC = b"k8s\x00"

Field = tuple[int, int, Any]  # (number, wire type, value: int or bytes)


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result, shift = 0, 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def fields(buf: bytes) -> list[Field]:
    """Split a protobuf message into (field number, wire type, raw value)."""
    out: list[Field] = []
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
            out.append((number, wire, value))
        elif wire == 2:
            length, pos = _varint(buf, pos)
            out.append((number, wire, buf[pos : pos + length]))
            pos += length
        elif wire == 1:
            out.append((number, wire, buf[pos : pos + 8]))
            pos += 8
        elif wire == 5:
            out.append((number, wire, buf[pos : pos + 4]))
            pos += 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
    return out


def _str(value: bytes) -> str:
    return value.decode()


def _map_entry(value: bytes, decode_value: Callable[[bytes], Any]) -> tuple[str, Any]:
    key, val = "", decode_value(b"")
    for number, _, raw in fields(value):
        if number == 1:
            key = _str(raw)
        elif number == 2:
            val = decode_value(raw)
    return key, val


def _b64(value: bytes) -> str:
    return base64.b64encode(value).decode()


def _owner_reference(buf: bytes) -> dict[str, Any]:
    names = {1: "kind", 3: "name", 4: "uid", 5: "apiVersion"}
    ref: dict[str, Any] = {}
    for number, _, raw in fields(buf):
        if number in names:
            ref[names[number]] = _str(raw)
        elif number == 6:
            ref["controller"] = bool(raw)
        elif number == 7:
            ref["blockOwnerDeletion"] = bool(raw)
    return ref


def object_meta(buf: bytes) -> dict[str, Any]:
    """metav1.ObjectMeta: the fields a client may set on create/update (server-owned ones are ignored)."""
    strings = {1: "name", 2: "generateName", 3: "namespace", 5: "uid", 6: "resourceVersion"}
    meta: dict[str, Any] = {}
    for number, _, raw in fields(buf):
        if number in strings:
            meta[strings[number]] = _str(raw)
        elif number in (11, 12):
            key, val = _map_entry(raw, _str)
            meta.setdefault("labels" if number == 11 else "annotations", {})[key] = val
        elif number == 13:
            meta.setdefault("ownerReferences", []).append(_owner_reference(raw))
        elif number == 14:
            meta.setdefault("finalizers", []).append(_str(raw))
    return meta


def _message(spec: dict[int, tuple[str, str]]) -> Callable[[bytes], dict[str, Any]]:
    """A decoder for a message whose fields are meta | string | bool | map<string,string> | map<string,bytes>."""

    def decode(buf: bytes) -> dict[str, Any]:
        obj: dict[str, Any] = {}
        for number, _, raw in fields(buf):
            if number not in spec:
                continue
            name, kind = spec[number]
            if kind == "meta":
                obj[name] = object_meta(raw)
            elif kind == "string":
                obj[name] = _str(raw)
            elif kind == "bool":
                obj[name] = bool(raw)
            elif kind in ("map-string", "map-bytes"):
                key, val = _map_entry(raw, _str if kind == "map-string" else _b64)
                obj.setdefault(name, {})[key] = val
        return obj

    return decode


def _delete_options(buf: bytes) -> dict[str, Any]:
    """metav1.DeleteOptions (Helm's uninstall sends them protobuf-encoded)."""
    opts: dict[str, Any] = {}
    for number, _, raw in fields(buf):
        if number == 1:
            opts["gracePeriodSeconds"] = raw
        elif number == 2:
            pre = {({1: "uid", 2: "resourceVersion"}[n]): _str(v) for n, _, v in fields(raw) if n in (1, 2)}
            opts["preconditions"] = pre
        elif number == 3:
            opts["orphanDependents"] = bool(raw)
        elif number == 4:
            opts["propagationPolicy"] = _str(raw)
        elif number == 5:
            opts.setdefault("dryRun", []).append(_str(raw))
    return opts


DECODERS: dict[tuple[str, str], Callable[[bytes], dict[str, Any]]] = {
    ("v1", "DeleteOptions"): _delete_options,
    ("meta.k8s.io/v1", "DeleteOptions"): _delete_options,
    ("v1", "Secret"): _message(
        {
            1: ("metadata", "meta"),
            2: ("data", "map-bytes"),
            3: ("type", "string"),
            4: ("stringData", "map-string"),
            5: ("immutable", "bool"),
        }
    ),
    ("v1", "ConfigMap"): _message(
        {1: ("metadata", "meta"), 2: ("data", "map-string"), 3: ("binaryData", "map-bytes"), 4: ("immutable", "bool")}
    ),
    ("v1", "Namespace"): _message({1: ("metadata", "meta")}),
    ("v1", "ServiceAccount"): _message({1: ("metadata", "meta")}),
}


def decode(body: bytes) -> dict[str, Any]:
    """A protobuf-encoded Kubernetes object as its JSON form (ValueError for kinds not in DECODERS)."""
    if not body.startswith(MAGIC):
        raise ValueError("not a Kubernetes protobuf envelope")
    api_version = kind = ""
    raw = b""
    for number, _, value in fields(body[len(MAGIC) :]):
        if number == 1:
            for sub, _, text in fields(value):
                if sub == 1:
                    api_version = _str(text)
                elif sub == 2:
                    kind = _str(text)
        elif number == 2:
            raw = value
    decoder = DECODERS.get((api_version, kind))
    if decoder is None:
        raise ValueError(f"protobuf bodies of {api_version}/{kind} are not supported; send JSON")
    return {"apiVersion": api_version, "kind": kind, **decoder(raw)}
