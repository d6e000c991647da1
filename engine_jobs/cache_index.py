"""What is in an engine cache, who references each engine, and since when it is unreferenced.

Read-only except for :func:`save_state`: ``cache ls`` runs in a pod that mounts the cache read-only.

References come from the operator (a JSON file it writes into a ConfigMap): the program cannot see
ReDrafterDeployments or serving pods itself, so the operator lists every key that any resource names in
its spec or status, serving keys included. Document::

    {"references": [{"key": "...", "namespace": "team-a", "name": "llama", "role": "status.promoted"}]}

The time an engine became unreferenced is recorded by the collection in ``<cache>/.gc-state.json``
when it first sees the engine unreferenced (conservative: never earlier than the truth), and cleared
when it sees it referenced again.

Partial builds (``.tmp-<key>-<host>-<pid>/`` and ``<key>/`` without manifest.json) are not engines: they
are listed apart, with the live build holding them if any (:func:`find_partials`).
"""

from __future__ import annotations

import calendar
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .cache import TMP_PREFIX, CachePaths, KeyLock, read_manifest, tmp_key_candidates, write_json_atomic
from .contract import DRAFTERS_DIR, LOCK_FILE, MANIFEST_FILE
from .errors import bad_input
from .manifest import UNKNOWN
from .plan import KEY_PATTERN
from .progress import Log, tree_size

STATE_FILE = ".gc-state.json"
HEX_KEY = re.compile(r"^[0-9a-f]{16,64}$")  # the shape of the operator's keys (a prefix of a sha256)
TRASH_DIR = ".trash"


@dataclass(frozen=True)
class Reference:
    key: str
    namespace: str
    name: str
    role: str

    def describe(self) -> str:
        return f"{self.namespace}/{self.name} ({self.role})"


@dataclass
class Engine:
    """One ``<cache>/<key>/`` directory as found on the volume."""

    key: str
    complete: bool  # manifest.json readable and for this key (one without manifest.json is a Partial)
    variant: str = UNKNOWN
    model: str = UNKNOWN
    tensorrt_llm_version: str = UNKNOWN
    gpu_product: str = UNKNOWN
    size_bytes: int = 0
    built_at: str | None = None
    locked_by: str | None = None  # owner of a lock with a fresh heartbeat
    referenced_by: list[Reference] = field(default_factory=list)
    unreferenced_since: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "complete": self.complete,
            "variant": self.variant,
            "model": self.model,
            "tensorrtLlmVersion": self.tensorrt_llm_version,
            "gpuProduct": self.gpu_product,
            "sizeBytes": self.size_bytes,
            "builtAt": self.built_at,
            "lockedBy": self.locked_by,
            "referencedBy": [{"namespace": r.namespace, "name": r.name, "role": r.role} for r in self.referenced_by],
            "unreferencedSince": self.unreferenced_since,
        }

    @classmethod
    def from_json(cls, item: dict[str, Any]) -> Engine:
        """The inverse of :meth:`to_json` (a listing read back from a listing pod)."""
        return cls(
            key=item["key"],
            complete=item["complete"],
            variant=item["variant"],
            model=item["model"],
            tensorrt_llm_version=item["tensorrtLlmVersion"],
            gpu_product=item["gpuProduct"],
            size_bytes=item["sizeBytes"],
            built_at=item["builtAt"],
            locked_by=item["lockedBy"],
            referenced_by=[Reference(item["key"], r["namespace"], r["name"], r["role"]) for r in item["referencedBy"]],
            unreferenced_since=item["unreferencedSince"],
        )


@dataclass
class Partial:
    """A partial build on the volume: a builder's temp directory, or ``<key>/`` without manifest.json.

    ``candidates``: every key it may belong to (a temp name is ambiguous when keys and hosts contain '-');
    ``key``: the likeliest of them, for people. Whoever removes it must hold the lock of every candidate.
    """

    entry: str  # its name under the cache root
    key: str
    candidates: tuple[str, ...]
    size_bytes: int = 0
    locked_by: str | None = None  # owner of a fresh lock of any candidate: a build is running

    def to_json(self) -> dict[str, Any]:
        return {"entry": self.entry, "key": self.key, "sizeBytes": self.size_bytes, "lockedBy": self.locked_by}


def iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def parse_iso(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return float(calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%SZ")))
    except (ValueError, OverflowError):
        return None


def load_references(path: str | os.PathLike[str]) -> list[Reference]:
    """The operator's reference list; a malformed file is bad input (collecting on it could delete in-use engines)."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise bad_input(f"cannot read references file {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise bad_input(f"references file {path} is not JSON: {exc}") from None
    items = doc.get("references") if isinstance(doc, dict) else None
    if not isinstance(items, list):
        raise bad_input(f"references file {path} must be an object with a 'references' list")
    refs = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not all(
            isinstance(item.get(f), str) and item.get(f) for f in ("key", "namespace", "name", "role")
        ):
            raise bad_input(f"references file {path}: entry {i} needs non-empty string key, namespace, name, role")
        refs.append(Reference(item["key"], item["namespace"], item["name"], item["role"]))
    return refs


def load_state(root: Path) -> dict[str, str]:
    """key -> when the collection first saw it unreferenced (a lost or torn file only makes ages younger)."""
    try:
        doc = json.loads((root / STATE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    since = doc.get("unreferencedSince") if isinstance(doc, dict) else None
    return {k: v for k, v in since.items() if isinstance(v, str)} if isinstance(since, dict) else {}


def save_state(root: Path, engines: list[Engine]) -> None:
    write_json_atomic(
        root / STATE_FILE,
        {"unreferencedSince": {e.key: e.unreferenced_since for e in engines if e.unreferenced_since is not None}},
    )


def live_lock_owner(root: Path, key: str, stale_seconds: float) -> str | None:
    """Who holds the key's lock with a fresh heartbeat, or None (no lock, or its owner died)."""
    lock = KeyLock(CachePaths(root, key).lock, stale_seconds=stale_seconds, heartbeat_seconds=0, log=Log())
    record = lock.holder()
    if record is None or lock.is_stale(record):
        return None
    return f"{record.get('owner', '?')} pid {record.get('pid', '?')}"


def _section(doc: dict[str, Any], key: str) -> dict[str, Any]:
    """``doc[key]`` where it is an object, else empty (a manifest of another version may lack it)."""
    value = doc.get(key)
    return value if isinstance(value, dict) else {}


def _describe_manifest(engine: Engine, manifest: dict[str, Any]) -> None:
    inputs = _section(manifest, "inputs")
    base = _section(inputs, "base")
    sources = _section(manifest, "sources")
    gpu = _section(manifest, "gpu")
    builder = _section(manifest, "builder")
    engine.variant = str(manifest.get("variant") or UNKNOWN)
    engine.model = str(base.get("source") or (sources.get("base") or {}).get("uri") or UNKNOWN)
    engine.tensorrt_llm_version = str(manifest.get("tensorrt_llm_version") or UNKNOWN)
    # the GPU the Job ran on; without nvidia-smi, the product the operator targeted (part of the key)
    product = gpu.get("product")
    engine.gpu_product = str(product if product and product != UNKNOWN else inputs.get("gpuProduct") or UNKNOWN)
    engine.built_at = builder.get("built_at") if isinstance(builder.get("built_at"), str) else None


def cache_roots(root: Path) -> list[Path]:
    """The directories holding content-addressed artifacts: the engines at the root, trained drafters under
    ``drafters/`` (the same layout, locks and partials, one level down)."""
    drafters = root / DRAFTERS_DIR
    return [root, drafters] if drafters.is_dir() and not drafters.is_symlink() else [root]


def _reserved(root: Path, entry: Path) -> bool:
    """The drafters' directory at the cache root: no engine and no partial build."""
    return entry.name == DRAFTERS_DIR and entry.parent == root and not (entry / MANIFEST_FILE).exists()


def scan(
    root: Path, references: list[Reference], *, stale_seconds: float, first_seen: str | None = None
) -> list[Engine]:
    """Every engine directory in the cache, sorted by key, with references and unreferenced-since joined.

    ``first_seen``: the unreferenced-since of an engine no collection has recorded yet (a collection passes
    its start time and records it; a listing passes None and says so).
    """
    state = load_state(root)
    by_key: dict[str, list[Reference]] = {}
    for ref in references:
        by_key.setdefault(ref.key, []).append(ref)
    engines = []
    for entry in sorted(root.iterdir()) if root.is_dir() else []:
        if (
            not entry.is_dir()
            or entry.is_symlink()
            or not KEY_PATTERN.fullmatch(entry.name)
            or entry.name.endswith(LOCK_FILE)
            or not (entry / MANIFEST_FILE).is_file()
        ):
            continue  # a directory without manifest.json is a partial build (find_partials)
        manifest = read_manifest(CachePaths(root, entry.name))
        engine = Engine(key=entry.name, complete=manifest is not None, size_bytes=tree_size(entry))
        if manifest is not None:
            _describe_manifest(engine, manifest)
        engine.locked_by = live_lock_owner(root, entry.name, stale_seconds)
        engine.referenced_by = sorted(by_key.get(entry.name, []), key=lambda r: (r.namespace, r.name, r.role))
        if not engine.referenced_by:
            engine.unreferenced_since = state.get(entry.name) or first_seen
        engines.append(engine)
    return engines


def _likeliest_key(root: Path, candidates: list[str]) -> str:
    """For people only: a candidate with a lock or directory on the volume, else a hash-like one, else the shortest."""
    for candidate in candidates:
        if (root / f"{candidate}{LOCK_FILE}").exists() or (root / candidate).is_dir():
            return candidate
    return next((c for c in candidates if HEX_KEY.fullmatch(c)), candidates[0])


def find_partials(root: Path, *, stale_seconds: float, log: Log | None = None) -> list[Partial]:
    """Every partial build under ``root``, sorted by name (read-only).

    A ``.tmp-`` entry whose name does not parse (or that is not a plain directory) is no builder's: it is
    logged and left out, so nothing ever removes it.
    """
    partials = []
    for entry in sorted(root.iterdir()) if root.is_dir() else []:
        if entry.name.startswith(TMP_PREFIX):
            candidates = tmp_key_candidates(entry.name)
            if not candidates or not entry.is_dir() or entry.is_symlink():
                if log is not None:
                    log(f"cache: {entry.name} is not a builder's temp directory (.tmp-<key>-<host>-<pid>/); left alone")
                continue
        elif (
            entry.is_dir()
            and not entry.is_symlink()
            and not _reserved(root, entry)
            and KEY_PATTERN.fullmatch(entry.name)
            and not entry.name.endswith(LOCK_FILE)
            and not (entry / MANIFEST_FILE).is_file()
        ):
            candidates = [entry.name]
        else:
            continue
        partial = Partial(
            entry=entry.name,
            key=_likeliest_key(root, candidates),
            candidates=tuple(candidates),
            size_bytes=tree_size(entry),
        )
        partial.locked_by = next(
            (owner for c in candidates if (owner := live_lock_owner(root, c, stale_seconds)) is not None), None
        )
        partials.append(partial)
    return partials


def engine_dirs_bytes(engines: list[Engine]) -> int:
    return sum(e.size_bytes for e in engines)
