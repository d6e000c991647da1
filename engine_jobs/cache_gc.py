"""Collection of unreferenced engines: plan by retention, then delete each one safely.

Safety rules (an engine is only ever removed when all hold *at deletion time*, not only when planned):
- no ReDrafterDeployment references it (the references file is re-read after taking the key's lock);
- no build holds its lock with a fresh heartbeat: the collector takes the same lock a builder takes,
  so a builder arriving meanwhile waits, then finds no manifest and builds anew;
- serving keys are references too (the operator lists them), so a served engine is never a candidate.

Deletion order: remove manifest.json first (the directory stops looking complete), rename the directory
into ``<cache>/.trash/``, release the lock, then remove the trash entry. A crash at any point leaves
nothing that looks complete; the next run finishes whatever is in the trash.

Abandoned partial builds (:func:`collect_partials`) are removed too, whatever the retention: nothing
references a partial build, only a running build's lock protects it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .cache import CachePaths, KeyLock, fsync_dir, read_manifest
from .cache_index import (
    TRASH_DIR,
    Engine,
    Partial,
    Reference,
    cache_roots,
    find_partials,
    iso,
    load_references,
    parse_iso,
    save_state,
    scan,
)
from .contract import MANIFEST_FILE, VARIANTS
from .errors import TERMINATION_MESSAGE_LIMIT, bad_input
from .manifest import UNKNOWN
from .progress import Log, human_bytes, tree_size
from .trtllm_backend import ENGINE_TRTLLM_VERSION

#: set to "after-rename" in tests only: the process SIGKILLs itself between the rename into the trash and
#: the removal, to prove a rerun finishes the job

PARTIAL = "partial"  # the variant of a removed partial build in the report (its model is unknown)

_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


def parse_duration(text: str) -> float:
    """``30d``, ``12h``, ``1h30m``, ``90s`` (the units of Kubernetes-style durations users know)."""
    match = _DURATION.fullmatch(text.strip())
    if not text.strip() or match is None or not any(match.groups()):
        raise bad_input(f"duration {text!r} is not like 30d, 12h, 1h30m or 90s")
    d, h, m, s = (int(g or 0) for g in match.groups())
    return float(((d * 24 + h) * 60 + m) * 60 + s)


@dataclass(frozen=True)
class Retention:
    """Unreferenced engines kept: the ``keep`` most recent per model and variant, and/or those younger than max_age.

    Per model *and variant* so that ``keep: 1`` keeps a usable previous pair (ReDrafter and its base).
    """

    keep: int | None = None
    max_age_seconds: float | None = None

    def __post_init__(self) -> None:
        if self.keep is None and self.max_age_seconds is None:
            raise bad_input("a retention needs --keep N and/or --max-age DURATION")
        if self.keep is not None and self.keep < 0:
            raise bad_input(f"--keep {self.keep} must not be negative")


@dataclass
class Decision:
    engine: Engine
    remove: bool
    reason: str


_RELEASE = re.compile(r"^(\d+)\.(\d+)\.(\d+)")


def unloadable(engine: Engine, runtime: str = ENGINE_TRTLLM_VERSION) -> bool:
    """A TensorRT engine built by another TensorRT-LLM release than the runtime's: it can no longer load.

    Only the engine variants are TensorRT plans; prepared checkpoints (PyTorch path) and trained drafters load
    in any release. An unknown or unparsable version is not judged (the retention decides, as before).
    """
    if engine.variant not in VARIANTS:
        return False
    built, pinned = _RELEASE.match(engine.tensorrt_llm_version), _RELEASE.match(runtime)
    return built is not None and pinned is not None and built.groups() != pinned.groups()


def plan(
    engines: list[Engine], retention: Retention, now: float, runtime: str = ENGINE_TRTLLM_VERSION
) -> list[Decision]:
    """What the retention keeps and what it would remove, with the reason for each (pure).

    Unreferenced engines that ``runtime`` (the pinned TensorRT-LLM) cannot load go whatever the retention:
    keeping them would only hold disk, and they do not count among the ``keep`` most recent of their model.
    """
    decisions: list[Decision] = []
    groups: dict[tuple[str, str], list[Engine]] = {}
    for engine in engines:
        if engine.referenced_by:
            decisions.append(
                Decision(engine, False, "referenced by " + ", ".join(r.describe() for r in engine.referenced_by))
            )
        elif engine.locked_by:
            decisions.append(Decision(engine, False, f"locked by a running build ({engine.locked_by})"))
        elif not engine.complete:
            decisions.append(
                Decision(engine, True, "its manifest is unreadable or not this key's, and no live build lock")
            )
        elif unloadable(engine, runtime):
            decisions.append(
                Decision(
                    engine,
                    True,
                    f"built by TensorRT-LLM {engine.tensorrt_llm_version}, which the pinned runtime "
                    f"({runtime}) cannot load",
                )
            )
        else:
            groups.setdefault((engine.model, engine.variant), []).append(engine)
    for group in groups.values():
        # most recently referenced first, then most recently built (second resolution), then by key: deterministic
        group.sort(
            key=lambda e: (parse_iso(e.unreferenced_since) or now, parse_iso(e.built_at) or 0.0, e.key), reverse=True
        )
        for rank, engine in enumerate(group):
            age = now - (parse_iso(engine.unreferenced_since) or now)
            if retention.keep is not None and rank < retention.keep:
                decisions.append(Decision(engine, False, f"among the {retention.keep} most recent of its model"))
            elif retention.max_age_seconds is not None and age < retention.max_age_seconds:
                decisions.append(Decision(engine, False, "unreferenced for less than the maximum age"))
            else:
                decisions.append(Decision(engine, True, f"unreferenced since {engine.unreferenced_since}"))
    return sorted(decisions, key=lambda d: d.engine.key)


@dataclass
class Report:
    dry_run: bool
    removed: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)
    kept: int = 0
    cache_bytes: int = 0

    @property
    def freed_bytes(self) -> int:
        return sum(r["bytes"] for r in self.removed)

    @property
    def removed_partials(self) -> int:
        return sum(1 for r in self.removed if r.get("variant") == PARTIAL)

    def to_json(self) -> dict[str, Any]:
        return {
            "dryRun": self.dry_run,
            "removed": self.removed,
            "freedBytes": self.freed_bytes,
            "cacheBytes": self.cache_bytes,
            "kept": self.kept,
            "skipped": self.skipped,
            "removedPartials": self.removed_partials,
        }

    def termination_message(self, limit: int = TERMINATION_MESSAGE_LIMIT) -> str:
        """JSON the operator parses; lists are shortened (counts kept exact) to fit Kubernetes' 4096 bytes."""
        doc = self.to_json()
        doc["removedCount"] = len(self.removed)
        while len(json.dumps(doc, separators=(",", ":")).encode()) > limit:
            if doc["skipped"]:
                doc["skipped"] = doc["skipped"][:-1]
            elif doc["removed"]:
                doc["removed"] = doc["removed"][:-1]
            else:
                break
        return json.dumps(doc, separators=(",", ":"))


def finish_trash(root: Path, report: Report, log: Log) -> None:
    """Remove what an interrupted run left in the trash (it was renamed there, so nothing uses it)."""
    trash = root / TRASH_DIR
    if not trash.is_dir():
        return
    for entry in sorted(trash.iterdir()):
        size = tree_size(entry)
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        key, _, rest = entry.name.partition(".")
        partial = rest.startswith(f"{PARTIAL}-")
        log(
            f"gc: finished removing {key}{' (a partial build)' if partial else ''} left in the trash by an "
            f"interrupted collection ({human_bytes(size)})"
        )
        report.removed.append(
            {
                "key": key,
                "variant": PARTIAL if partial else UNKNOWN,
                "model": UNKNOWN,
                "bytes": size,
                "note": "interrupted earlier",
            }
        )


def _still_referenced(references_path: str, key: str) -> list[Reference]:
    return [r for r in load_references(references_path) if r.key == key]


def _take_lock(paths: CachePaths, stale_seconds: float, log: Log) -> tuple[KeyLock | None, str]:
    lock = KeyLock(paths.lock, stale_seconds=stale_seconds, heartbeat_seconds=stale_seconds, log=log)
    if lock.try_acquire():
        return lock, ""
    record = lock.holder()
    if record is None:
        return (lock, "") if lock.try_acquire() else (None, "lock appeared while looking")
    if not lock.is_stale(record):
        return None, f"locked by a running build ({record.get('owner', '?')} pid {record.get('pid', '?')})"
    if lock.take_over(record):
        log(f"gc: {paths.key}: took over a stale build lock (no heartbeat)")
        return lock, ""
    return None, "another process took its stale lock"


def _take_locks(root: Path, keys: tuple[str, ...], stale_seconds: float, log: Log) -> tuple[list[KeyLock], str]:
    """The locks of all ``keys`` (in key order, none waited for), or none and the reason."""
    taken: list[KeyLock] = []
    for key in sorted(keys):
        lock, why = _take_lock(CachePaths(root, key), stale_seconds, log)
        if lock is None:
            for held in taken:
                held.release()
            return [], why if len(keys) == 1 else f"{why} on key {key}, which it may belong to"
        taken.append(lock)
    return taken, ""


def _partial_entry(partial: Partial, size: int) -> dict[str, Any]:
    return {
        "key": partial.key,
        "variant": PARTIAL,
        "model": UNKNOWN,
        "bytes": size,
        "note": f"abandoned partial build {partial.entry}",
    }


def collect_partials(root: Path, report: Report, *, stale_seconds: float, dry_run: bool, log: Log) -> None:
    """Remove the partial builds no live build owns: temp directories and ``<key>/`` without manifest.

    Only the lock decides, no minimum age: a builder takes its key's lock before it creates its temp
    directory (build.build: acquire_or_wait, then new_tmp().mkdir()) and publishes or removes it before
    releasing the lock, so while the collection holds the lock no live builder writes there. A builder whose
    heartbeat stopped for the stale threshold has lost the lock to anyone, as when another builder takes it
    over and removes the same partials. A temp name may belong to several keys ('-' in keys and hosts): the
    lock of every candidate key is taken, so whichever it really is, its builder is not running.
    """
    groups: dict[tuple[str, ...], list[Partial]] = {}
    for partial in find_partials(root, stale_seconds=stale_seconds, log=log):
        groups.setdefault(partial.candidates, []).append(partial)
    for candidates, members in groups.items():
        if dry_run:
            for partial in members:
                if partial.locked_by:
                    log(f"gc: keep partial build {partial.entry}: being built by {partial.locked_by}")
                    report.skipped.append(
                        {
                            "key": partial.key,
                            "reason": f"partial build {partial.entry} being built by {partial.locked_by}",
                        }
                    )
                else:
                    log(f"gc: would remove abandoned partial build {partial.entry} ({human_bytes(partial.size_bytes)})")
                    report.removed.append(_partial_entry(partial, partial.size_bytes))
            continue
        locks, why = _take_locks(root, candidates, stale_seconds, log)
        if not locks:
            for partial in members:
                log(f"gc: keep partial build {partial.entry}: {why} (checked at deletion time)")
                report.skipped.append({"key": partial.key, "reason": f"partial build {partial.entry}: {why}"})
            continue
        moved: list[tuple[Partial, Path]] = []
        try:
            trash = root / TRASH_DIR
            trash.mkdir(exist_ok=True)
            for i, partial in enumerate(members):
                path = root / partial.entry
                if not path.is_dir() or path.is_symlink() or (path / MANIFEST_FILE).is_file():
                    continue  # gone, or completed (by a builder that had the lock before us) since the scan
                target = trash / f"{partial.key}.{PARTIAL}-{locks[0].token}-{i}"
                os.rename(path, target)
                moved.append((partial, target))
            fsync_dir(root)
        finally:
            for lock in locks:
                lock.release()
        for partial, target in moved:
            size = tree_size(target)
            shutil.rmtree(target, ignore_errors=True)
            log(f"gc: removed abandoned partial build {partial.entry} ({human_bytes(size)})")
            report.removed.append(_partial_entry(partial, size))


def remove_engine(
    root: Path, engine: Engine, references_path: str, stale_seconds: float, log: Log
) -> tuple[int | None, str]:
    """Delete one engine if it is still safe; returns (bytes freed or None, reason when skipped)."""
    paths = CachePaths(root, engine.key)
    lock, why = _take_lock(paths, stale_seconds, log)
    if lock is None:
        return None, why
    try:
        refs = _still_referenced(references_path, engine.key)  # the live references, at deletion time
        if refs:
            return None, "referenced by " + ", ".join(r.describe() for r in refs)
        if engine.complete and read_manifest(paths) is None:
            return None, "its manifest changed or vanished since planning"
        if not paths.final.is_dir():
            return None, "already gone"
        size = tree_size(paths.final)
        paths.manifest.unlink(missing_ok=True)  # first: from here on nothing takes it for complete
        fsync_dir(paths.final)
        trash = root / TRASH_DIR
        trash.mkdir(exist_ok=True)
        target = trash / f"{engine.key}.{lock.token}"
        os.rename(paths.final, target)
        fsync_dir(root)
    finally:
        lock.release()
    shutil.rmtree(target, ignore_errors=True)
    return size, ""


def collect(
    root: Path,
    references_path: str,
    retention: Retention,
    *,
    stale_seconds: float,
    dry_run: bool,
    log: Log,
    now: float | None = None,
) -> Report:
    """Plan by retention over the live cache (engines, then trained drafters), then remove each candidate under
    the rules above. Drafters follow the same rules: the operator lists the drafter keys its resources name."""
    now = time.time() if now is None else now
    if not root.is_dir():
        raise bad_input(f"cache directory {root} does not exist")
    report = Report(dry_run=dry_run)
    for where in cache_roots(root):
        one = collect_root(
            where, references_path, retention, stale_seconds=stale_seconds, dry_run=dry_run, log=log, now=now
        )
        report.removed += one.removed
        report.skipped += one.skipped
        report.kept += one.kept
        report.cache_bytes += one.cache_bytes
    return report


def collect_root(
    root: Path,
    references_path: str,
    retention: Retention,
    *,
    stale_seconds: float,
    dry_run: bool,
    log: Log,
    now: float,
) -> Report:
    """One directory of artifacts: its trash, its partial builds, its complete artifacts by retention."""
    report = Report(dry_run=dry_run)
    if not dry_run:
        finish_trash(root, report, log)
    collect_partials(root, report, stale_seconds=stale_seconds, dry_run=dry_run, log=log)
    engines = scan(root, load_references(references_path), stale_seconds=stale_seconds, first_seen=iso(now))
    if not dry_run:
        save_state(root, engines)  # record first-seen-unreferenced times even if we remove nothing
    gone: set[str] = set()
    for decision in plan(engines, retention, now):
        engine = decision.engine
        if not decision.remove:
            report.kept += 1
            log(f"gc: keep {engine.key}: {decision.reason}")
            continue
        entry = {"key": engine.key, "variant": engine.variant, "model": engine.model, "bytes": engine.size_bytes}
        if dry_run:
            log(f"gc: would remove {engine.key} ({human_bytes(engine.size_bytes)}): {decision.reason}")
            report.removed.append(entry)
            gone.add(engine.key)
            continue
        freed, why = remove_engine(root, engine, references_path, stale_seconds, log)
        if freed is None:
            report.kept += 1
            report.skipped.append({"key": engine.key, "reason": why})
            log(f"gc: keep {engine.key}: {why} (checked at deletion time)")
            continue
        log(f"gc: removed {engine.key} ({human_bytes(freed)}): {decision.reason}")
        report.removed.append({**entry, "bytes": freed})
        gone.add(engine.key)
    remaining = [e for e in engines if e.key not in gone]
    report.cache_bytes = sum(e.size_bytes for e in remaining)
    if not dry_run:
        save_state(root, remaining)
    partials = report.removed_partials
    log(
        f"gc: {'would free' if dry_run else 'freed'} {human_bytes(report.freed_bytes)} "
        f"({len(report.removed) - partials} engine(s), {partials} abandoned partial build(s)); "
        f"{len(remaining)} kept, {human_bytes(report.cache_bytes)} at {iso(now)}"
    )
    return report
