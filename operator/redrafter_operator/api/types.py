"""Small shared types of the API: durations, model sources, Kubernetes pass-through objects."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any, Self

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, model_validator
from pydantic.alias_generators import to_camel

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
DURATION_PATTERN = r"^(\d+(\.\d+)?(ms|s|m|h))+$"
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """Seconds in a Go-style duration such as ``30s``, ``10m`` or ``1h30m``."""
    if not re.fullmatch(DURATION_PATTERN, text or ""):
        raise ValueError(f"{text!r} is not a duration such as 30s, 10m or 1h30m")
    return sum(float(n) * _UNITS[u] for n, u in _DURATION_PART.findall(text))


# resource.Quantity suffixes (k8s.io/apimachinery/pkg/api/resource): binary, decimal, and milli
_QUANTITY = re.compile(r"^([+-]?\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?$")
_QUANTITY_SUFFIX = {
    **{s: 1024.0**i for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"), start=1)},
    **{s: 1000.0**i for i, s in enumerate(("k", "M", "G", "T", "P", "E"), start=1)},
    "m": 0.001,
}


def parse_quantity(text: str) -> float:
    """The value of a Kubernetes quantity such as ``8``, ``500Gi``, ``1.5T`` or ``250m`` (no exponent form)."""
    found = _QUANTITY.fullmatch(str(text).strip())
    if not found:
        raise ValueError(f"{text!r} is not a quantity such as 8, 500Gi or 250m")
    return float(found.group(1)) * _QUANTITY_SUFFIX.get(found.group(2) or "", 1.0)


Duration = Annotated[
    str,
    Field(pattern=DURATION_PATTERN, max_length=32),
]


class ApiModel(BaseModel):
    """Base of every API object: camelCase on the wire, unknown fields rejected.

    Python code constructs models by field name (``Engine(max_batch_size=8)``); what comes off the wire or from a
    user's YAML is read with :meth:`from_wire`, camelCase only, as the CRD's schema has it: a snake_case key there
    is an unknown field, refused here as a strict API server refuses it (and one without strict field validation
    drops it). Types are strict, as the API server's schema is: ``"8"`` is no integer and ``"true"`` no boolean."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        extra="forbid",
        validate_default=True,
        strict=True,
    )

    @model_validator(mode="before")
    @classmethod
    def _as_the_api_server_decodes(cls, data: Any) -> Any:
        """A null field is absent (the API server prunes nulls of non-nullable fields, and none here is nullable),
        and a whole float such as ``8.0`` is the integer the API server's schema accepts it as."""
        if not isinstance(data, dict):
            return data
        return {k: int(v) if isinstance(v, float) and v.is_integer() else v for k, v in data.items() if v is not None}

    @classmethod
    def from_wire(cls, raw: Any) -> Self:
        """Parse an object as the API server stores it: camelCase field names only."""
        return cls.model_validate(raw, by_alias=True, by_name=False)

    def wire(self) -> dict[str, Any]:
        """The object as the API server stores it (camelCase, no unset optionals)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")

    def overlay(self, other: Self) -> Self:
        """This object with the fields ``other`` holds replaced by its own: how a part built on its own (a
        monitor's report, a merged measurement) is folded into the whole without a detour through the wire."""
        return self.model_copy(update={name: getattr(other, name) for name in other.model_fields_set})


# Kubernetes objects the operator passes through untouched (validated by the API server's own
# schemas for Pods when the children are created, and by kubernetes-validate in the tests).
_PRESERVE = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
ResourceRequirements = Annotated[dict[str, Any], WithJsonSchema(_PRESERVE)]
Toleration = Annotated[dict[str, Any], WithJsonSchema(_PRESERVE)]
NetworkPolicyPeer = Annotated[dict[str, Any], WithJsonSchema(_PRESERVE)]
StringMap = Annotated[dict[str, str], WithJsonSchema({"type": "object", "additionalProperties": {"type": "string"}})]


# ---- model sources -----------------------------------------------------------------------------
SCHEMES = ("hf", "pvc", "s3")
# The CRD's pattern for a source, as strict as parse_source (CEL refuses '.' and '..' segments): an hf:// repo
# id has at most two segments, a pvc:// claim is a DNS-1123 label, an s3:// bucket a bucket name, and no
# segment is empty or starts with '-'.
_SEGMENT = r"[A-Za-z0-9._][A-Za-z0-9._-]*"
SOURCE_PATTERN = (
    r"^(hf://[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?"
    rf"|pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?(/{_SEGMENT})*"
    rf"|s3://[a-z0-9][a-z0-9.-]{{1,61}}[a-z0-9](/{_SEGMENT})*)/*$"
)
_SAFE = re.compile(r"^[A-Za-z0-9._/-]+$")
_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_S3_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_HF_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


@dataclass(frozen=True)
class ParsedSource:
    """A model source split into parts; every part is safe to put on a command line."""

    scheme: str
    authority: str  # hf repo id | PVC claim name | S3 bucket
    path: str  # sub-path inside the claim / key prefix ('' when none)

    @property
    def uri(self) -> str:
        return f"{self.scheme}://{self.authority}" + (f"/{self.path}" if self.path else "")


def parse_source(uri: str) -> ParsedSource:
    """Strictly parse ``hf://org/name``, ``pvc://claim/sub/path`` or ``s3://bucket/prefix``.

    Rejects unknown schemes, ``..`` or empty segments, absolute sub-paths and any character a shell
    or a path could misread, so the parts can reach argv lists and volume mounts as they are.
    """
    scheme, sep, rest = uri.partition("://")
    if not sep or scheme not in SCHEMES:
        raise ValueError(f"unknown scheme in {uri!r}: use hf://, pvc:// or s3://")
    if not rest or rest.startswith("/"):
        raise ValueError(f"{uri!r} has an empty or absolute path after {scheme}://")
    if not _SAFE.fullmatch(rest):
        raise ValueError(f"{uri!r} contains characters outside [A-Za-z0-9._/-]")
    segments = rest.rstrip("/").split("/")
    if any(s in ("", ".", "..") for s in segments):
        raise ValueError(f"{uri!r} contains an empty, '.' or '..' path segment")
    if any(s.startswith("-") for s in segments):
        raise ValueError(f"{uri!r} has a segment starting with '-'")
    if scheme == "hf":
        repo = "/".join(segments)
        if len(segments) > 2 or not _HF_REPO.fullmatch(repo):
            raise ValueError(f"{uri!r} is not a Hugging Face repo id (hf://org/name)")
        return ParsedSource("hf", repo, "")
    authority, path = segments[0], "/".join(segments[1:])
    if scheme == "pvc" and (len(authority) > 253 or not _DNS1123.fullmatch(authority)):
        raise ValueError(f"{uri!r}: {authority!r} is not a valid PersistentVolumeClaim name")
    if scheme == "s3" and not _S3_BUCKET.fullmatch(authority):
        raise ValueError(f"{uri!r}: {authority!r} is not a valid S3 bucket name")
    return ParsedSource(scheme, authority, path)
