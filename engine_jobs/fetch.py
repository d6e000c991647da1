"""Bring a model source to a local directory and record exactly which version arrived.

``hf://org/name``   huggingface_hub.snapshot_download; token from <credentials_dir>/token; the
                    revision (branch/tag) is recorded with the commit it resolved to.
``pvc://claim/path`` the claim is mounted read-only at <sources_mount>/<claim>; used in place.
``s3://bucket/pfx`` boto3, credentials from the Secret files AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY
                    (optional AWS_ENDPOINT_URL, AWS_REGION); recorded as a digest of (key, ETag, size).

Credentials are read from files, handed to the client libraries in memory and registered with the log
for redaction; they never reach argv, the environment of subprocesses, the manifest or any message.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .contract import SourceRef
from .errors import BuildError, ExitCode, bad_input
from .progress import Log, human_bytes, tree_size

_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
SCHEMES = ("hf", "pvc", "s3")

#: never needed by the converters, often huge (Llama repos ship original/*.pth next to safetensors)
HF_IGNORE = ["original/*", "*.pth", "*.gguf", "*.h5", "*.msgpack", "*.onnx", "*.ot", "*.tflite"]
#: what pre/post-processing needs from a tokenizer repository
TOKENIZER_PATTERNS = ["*.json", "*.model", "*.txt", "*.tiktoken"]
DATASET_PATTERNS = ["*.jsonl", "*.json", "*.parquet", "**/*.jsonl", "**/*.json", "**/*.parquet"]


@dataclass(frozen=True)
class ParsedUri:
    scheme: str
    authority: str  # HF org (with name in path) | claim | bucket
    path: str  # may be empty


@dataclass(frozen=True)
class Fetched:
    """A source available locally."""

    role: str
    uri: str
    local_dir: Path
    revision: str | None  # what the spec asked for
    resolved: str | None  # commit (hf) / listing digest (s3) / None (pvc, read in place)
    bytes: int

    def record(self) -> dict[str, Any]:
        """For the manifest (no local paths of credentials, no secrets)."""
        return {"uri": self.uri, "revision": self.revision, "resolved": self.resolved, "bytes": self.bytes}


def parse_uri(uri: str) -> ParsedUri:
    """Strict parse; the operator validated already, but the Job must not trust a ConfigMap blindly."""
    scheme, sep, rest = uri.partition("://")
    if not sep or scheme not in SCHEMES:
        raise bad_input(f"unknown source scheme in {uri!r}: use hf://, pvc:// or s3://")
    parts = [p for p in rest.rstrip("/").split("/")]
    if not parts or any(not _SEGMENT.fullmatch(p) for p in parts):
        raise bad_input(f"source {uri!r} has an empty, absolute or unsafe path segment")
    return ParsedUri(scheme, parts[0], "/".join(parts[1:]))


def read_secret(credentials_dir: str | None, name: str, log: Log) -> str | None:
    """One key of a mounted Secret (a file), registered for redaction; None when absent."""
    if not credentials_dir:
        return None
    path = Path(credentials_dir, name)
    try:
        value = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise BuildError(
            ExitCode.SOURCE_UNAVAILABLE, f"cannot read credentials key {name} in {credentials_dir}: {exc.strerror}"
        ) from None
    log.add_secret(value)
    return value or None


# ---- pvc:// ------------------------------------------------------------------------------------


def fetch_pvc(role: str, ref: SourceRef, uri: ParsedUri, sources_mount: str, log: Log) -> Fetched:
    mount = Path(sources_mount, uri.authority)
    local = mount / uri.path if uri.path else mount
    if not mount.is_dir():
        raise BuildError(
            ExitCode.SOURCE_UNAVAILABLE, f"{role} source {ref.uri}: claim {uri.authority} is not mounted at {mount}"
        )
    if not (local.is_dir() or (role == "dataset" and local.is_file())):  # a dataset may be one JSONL file
        raise BuildError(
            ExitCode.SOURCE_UNAVAILABLE,
            f"{role} source {ref.uri}: path {uri.path or '/'} does not exist in claim {uri.authority}",
        )
    size = tree_size(local)
    log(f"fetch {role}: {ref.uri} is mounted at {local} ({human_bytes(size)})")
    return Fetched(role, ref.uri, local, ref.revision, None, size)


# ---- hf:// -------------------------------------------------------------------------------------


def fetch_hf(role: str, ref: SourceRef, uri: ParsedUri, download_dir: str | None, log: Log) -> Fetched:
    from huggingface_hub import snapshot_download  # lazily: only the builder image needs it
    from huggingface_hub.errors import RevisionNotFoundError

    repo_id = f"{uri.authority}/{uri.path}" if uri.path else uri.authority
    revision = ref.revision or "main"
    token = read_secret(ref.credentials_dir, "token", log)
    patterns: dict[str, Any] = {"ignore_patterns": HF_IGNORE}
    if role == "tokenizer":
        patterns = {"allow_patterns": TOKENIZER_PATTERNS}
    elif role == "dataset":  # a dataset repository on the Hub, not a model
        patterns = {"allow_patterns": DATASET_PATTERNS, "repo_type": "dataset"}
    log(f"fetch {role}: downloading {repo_id}@{revision} from the Hugging Face Hub{' (with token)' if token else ''}")
    try:
        path = snapshot_download(repo_id, revision=revision, cache_dir=download_dir, token=token or False, **patterns)
    except RevisionNotFoundError:
        raise bad_input(f"{role} source {ref.uri}: revision {revision!r} does not exist") from None
    except Exception as exc:  # network, auth, offline mode: all "cannot get it now"
        raise BuildError(
            ExitCode.SOURCE_UNAVAILABLE,
            f"{role} source {ref.uri}@{revision} is unreachable: {type(exc).__name__}: {log.redact(_first_line(exc))}",
        ) from None
    local = Path(str(path))
    commit = local.name  # snapshot_download returns .../snapshots/<commit>
    size = tree_size(local)
    log(f"fetch {role}: {repo_id}@{revision} resolved to commit {commit} ({human_bytes(size)})")
    return Fetched(role, ref.uri, local, revision, commit, size)


# ---- s3:// -------------------------------------------------------------------------------------

S3ClientFactory = Callable[..., Any]


def _boto3_client(**kwargs: Any) -> Any:
    import boto3  # lazily: only the builder image needs it

    return boto3.client("s3", **kwargs)


def fetch_s3(
    role: str,
    ref: SourceRef,
    uri: ParsedUri,
    download_root: str,
    log: Log,
    client_factory: S3ClientFactory = _boto3_client,
) -> Fetched:
    key_id = read_secret(ref.credentials_dir, "AWS_ACCESS_KEY_ID", log)
    secret = read_secret(ref.credentials_dir, "AWS_SECRET_ACCESS_KEY", log)
    endpoint = read_secret(ref.credentials_dir, "AWS_ENDPOINT_URL", log)
    region = read_secret(ref.credentials_dir, "AWS_REGION", log)
    kwargs: dict[str, Any] = {}
    if key_id and secret:
        kwargs.update(aws_access_key_id=key_id, aws_secret_access_key=secret)
    if endpoint:
        kwargs["endpoint_url"] = endpoint
    if region:
        kwargs["region_name"] = region
    prefix = uri.path.rstrip("/") + "/" if uri.path else ""
    local = Path(download_root, "s3", uri.authority, uri.path)
    log(f"fetch {role}: listing {ref.uri}")
    try:
        client = client_factory(**kwargs)
        objects: list[tuple[str, str, int]] = []
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=uri.authority, Prefix=prefix):
            for obj in page.get("Contents", []):
                if not obj["Key"].endswith("/"):
                    objects.append((obj["Key"], obj.get("ETag", "").strip('"'), int(obj["Size"])))
        if not objects:
            raise BuildError(ExitCode.SOURCE_UNAVAILABLE, f"{role} source {ref.uri}: no objects under this prefix")
        objects.sort()
        for key, _etag, size in objects:
            rel = key[len(prefix) :]
            if any(part in ("", ".", "..") for part in rel.split("/")):
                raise bad_input(f"{role} source {ref.uri}: object key {key!r} is not a safe relative path")
            dest = local / rel
            if dest.is_file() and dest.stat().st_size == size:
                continue  # already downloaded by an earlier (or the other variant's) build
            dest.parent.mkdir(parents=True, exist_ok=True)
            part = dest.with_name(f".{dest.name}.part-{os.getpid()}")
            client.download_file(uri.authority, key, str(part))
            os.replace(part, dest)  # atomic: a concurrent builder never sees half a file
    except BuildError:
        raise
    except Exception as exc:
        raise BuildError(
            ExitCode.SOURCE_UNAVAILABLE,
            f"{role} source {ref.uri} is unreachable: {type(exc).__name__}: {log.redact(_first_line(exc))}",
        ) from None
    digest = hashlib.sha256("\n".join(f"{k}\t{e}\t{s}" for k, e, s in objects).encode()).hexdigest()
    total = sum(s for _k, _e, s in objects)
    log(f"fetch {role}: {len(objects)} objects from {ref.uri} ({human_bytes(total)}), listing sha256:{digest[:16]}")
    return Fetched(role, ref.uri, local, None, f"sha256:{digest}", total)


# ---- dispatch ----------------------------------------------------------------------------------


def fetch(
    role: str, ref: SourceRef, *, sources_mount: str, download_dir: str | None, cache_dir: str, log: Log
) -> Fetched:
    uri = parse_uri(ref.uri)
    if uri.scheme == "pvc":
        return fetch_pvc(role, ref, uri, sources_mount, log)
    if uri.scheme == "hf":
        if not uri.path:
            raise bad_input(f"{role} source {ref.uri}: expected hf://org/name")
        return fetch_hf(role, ref, uri, download_dir, log)
    return fetch_s3(role, ref, uri, download_dir or os.path.join(cache_dir, ".s3-downloads"), log)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else ""


def planned_location(role: str, ref: SourceRef, *, sources_mount: str, download_dir: str | None, cache_dir: str) -> str:
    """Where ``fetch`` will put (or find) a source, without touching anything: for printing plans."""
    uri = parse_uri(ref.uri)
    if uri.scheme == "pvc":
        return (
            str(Path(sources_mount, uri.authority, uri.path)) if uri.path else str(Path(sources_mount, uri.authority))
        )
    if uri.scheme == "hf":
        hub = download_dir or hf_hub_cache()
        name = f"{uri.authority}/{uri.path}".replace("/", "--")
        return f"{hub}/models--{name}/snapshots/<commit of {ref.revision or 'main'}>"
    return str(Path(download_dir or os.path.join(cache_dir, ".s3-downloads"), "s3", uri.authority, uri.path))


def hf_hub_cache() -> str:
    """huggingface_hub's default cache directory, from the same environment variables it reads."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return os.path.join(home, "hub")
