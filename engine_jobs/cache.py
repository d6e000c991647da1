"""The content-addressed engine cache: ``<cache>/<key>/`` published atomically, guarded by a lock.

Layout on the cache volume (one directory per engine key):

    <cache>/<key>/                 the published artifact; complete iff manifest.json is in it
    <cache>/<key>.lock             JSON: owner (pod/host, pid), random token, heartbeat (epoch s)
    <cache>/.tmp-<key>-<host>-<pid>/  the artifact being assembled (same volume => rename is atomic)

A builder creates its temp directory only after taking the key's lock, and publishes or removes it before
releasing the lock; so a temp directory (or a ``<key>/`` without manifest) whose key's lock is free or stale
is an abandoned partial build. The next builder of the key removes it; the collection removes it otherwise.

The lock is created with O_EXCL (atomic on local filesystems and NFSv3+). Its owner rewrites the
heartbeat every few seconds; a builder that finds a heartbeat older than the stale threshold assumes
the owner died (kill -9, node loss), renames the lock away (only one renamer wins), removes the
partial outputs and builds. Clocks of different nodes are compared, so the threshold must be much
larger than clock skew (minutes, by default).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .contract import LOCK_FILE, MANIFEST_FILE
from .errors import BuildError, ExitCode
from .plan import KEY_PATTERN
from .progress import Log, format_seconds

TMP_PREFIX = ".tmp-"


def tmp_key_candidates(name: str) -> list[str]:
    """Every key a ``.tmp-<key>-<host>-<pid>`` name may belong to, shortest first; [] when it does not parse.

    Keys (KEY_PATTERN) and host names may both contain '-', so the split between them is ambiguous
    (``.tmp-a-b-host-7`` is key ``a`` on host ``b-host`` or key ``a-b`` on host ``host``); the pid is the
    last field and all digits. Callers that delete must account for every candidate, not a guess.
    """
    if not name.startswith(TMP_PREFIX):
        return []
    stem, sep, pid = name[len(TMP_PREFIX) :].rpartition("-")
    if not sep or not (pid.isascii() and pid.isdigit()):
        return []
    return [
        stem[:i] for i, ch in enumerate(stem) if ch == "-" and i + 1 < len(stem) and KEY_PATTERN.fullmatch(stem[:i])
    ]


@dataclass(frozen=True)
class CachePaths:
    root: Path
    key: str

    @property
    def final(self) -> Path:
        return self.root / self.key

    @property
    def lock(self) -> Path:
        return self.root / f"{self.key}{LOCK_FILE}"

    @property
    def manifest(self) -> Path:
        return self.final / MANIFEST_FILE

    def new_tmp(self) -> Path:
        return self.root / f"{TMP_PREFIX}{self.key}-{socket.gethostname()}-{os.getpid()}"

    def partials(self) -> list[Path]:
        """Leftovers of builders of this key that died (only the lock holder may call this).

        A temp directory whose name may also belong to another key with a lock file (``.tmp-a-b-h-1`` when
        ``a-b.lock`` exists, seen by the builder of ``a``) is left alone: it may be that build's; the
        collection, which takes every candidate key's lock, removes it once abandoned.
        """
        found = [
            p
            for p in sorted(self.root.glob(f"{TMP_PREFIX}{self.key}-*"))
            if self.key in (candidates := tmp_key_candidates(p.name))
            and not any((self.root / f"{c}{LOCK_FILE}").exists() for c in candidates if c != self.key)
        ]
        if self.final.exists() and not self.manifest.is_file():
            found.append(self.final)
        return found


def read_manifest(paths: CachePaths) -> dict[str, Any] | None:
    """The manifest of a complete artifact for this key, or None (absent, unreadable or foreign)."""
    try:
        manifest = json.loads(paths.manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("key") != paths.key:
        return None
    return manifest


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2, sort_keys=True)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def publish(tmp: Path, final: Path) -> None:
    """Atomically make ``tmp`` (manifest already inside) visible as ``final``."""
    if final.exists():  # a partial directory without manifest (checked by the caller holding the lock)
        shutil.rmtree(final)
    os.rename(tmp, final)
    fsync_dir(final.parent)  # persist the rename itself


def fsync_dir(path: Path) -> None:
    """Persist renames and unlinks in ``path`` (best effort: some filesystems refuse a directory fsync)."""
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def remove_partials(paths: CachePaths, log: Log) -> None:
    for partial in paths.partials():
        log(f"cache: removing partial output {partial.name} of an earlier builder")
        shutil.rmtree(partial, ignore_errors=True)


def free_bytes(path: Path) -> int:
    return shutil.disk_usage(path).free


# ---- lock --------------------------------------------------------------------------------------


def owner_identity() -> dict[str, Any]:
    host = socket.gethostname()
    return {"owner": os.environ.get("POD_NAME") or host, "host": host, "pid": os.getpid()}


class KeyLock:
    """Exclusive, heartbeating ownership of one engine key."""

    def __init__(self, path: Path, *, stale_seconds: float, heartbeat_seconds: float, log: Log) -> None:
        self.path = path
        self.stale_seconds = stale_seconds
        self.heartbeat_seconds = heartbeat_seconds
        self.log = log
        self.token = uuid.uuid4().hex
        self.lost = threading.Event()  # set when someone took the lock over from us
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._held = False

    def _record(self) -> dict[str, Any]:
        return {**owner_identity(), "token": self.token, "heartbeat": time.time()}

    def try_acquire(self) -> bool:
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump({**self._record(), "started": time.time()}, fh)
            fh.flush()
            os.fsync(fh.fileno())
        self._held = True
        return True

    def holder(self) -> dict[str, Any] | None:
        """The current lock record; a torn or empty file counts with its mtime as heartbeat."""
        try:
            text = self.path.read_text(encoding="utf-8")
            mtime = self.path.stat().st_mtime
        except FileNotFoundError:
            return None
        try:
            record = json.loads(text)
            if not isinstance(record, dict):
                raise ValueError
        except ValueError:
            record = {}
        record.setdefault("heartbeat", mtime)
        return record

    def age(self, record: dict[str, Any]) -> float:
        try:
            return time.time() - float(record["heartbeat"])
        except (TypeError, ValueError):
            return float("inf")

    def is_stale(self, record: dict[str, Any]) -> bool:
        return self.age(record) > self.stale_seconds

    def take_over(self, observed: dict[str, Any]) -> bool:
        """Move a stale lock away and acquire; False if someone else was faster."""
        moved = self.path.with_name(f"{self.path.name}.stale-{self.token}")
        try:
            os.rename(self.path, moved)
        except FileNotFoundError:
            return False
        try:
            current = json.loads(moved.read_text(encoding="utf-8") or "{}")
        except (OSError, ValueError):
            current = {}
        if current.get("token") != observed.get("token"):
            # We moved a lock someone acquired after we looked: put it back unless replaced already.
            try:
                os.link(moved, self.path)
            except OSError:
                pass
            moved.unlink(missing_ok=True)
            return False
        moved.unlink(missing_ok=True)
        return self.try_acquire()

    def start_heartbeat(self) -> None:
        self._thread = threading.Thread(target=self._beat, name="lock-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_seconds):
            record = self.holder()
            if record is None or record.get("token") != self.token:
                self.lost.set()
                self.log("cache: lost the build lock to another builder (our heartbeat was too old)")
                return
            try:
                write_json_atomic(self.path, {**record, "heartbeat": time.time()})
            except OSError as exc:
                self.log(f"cache: heartbeat write failed: {exc.strerror}")

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._held and not self.lost.is_set():
            record = self.holder()
            if record is not None and record.get("token") == self.token:
                self.path.unlink(missing_ok=True)
        self._held = False


def acquire_or_wait(
    paths: CachePaths, lock: KeyLock, *, wait_seconds: float, poll_seconds: float, log: Log
) -> dict[str, Any] | None:
    """Own the key (returns None) or find its manifest (returns it: a cache hit).

    A live owner is waited for up to ``wait_seconds``; a stale one is taken over at once.
    """
    deadline = time.monotonic() + wait_seconds
    last_report = 0.0
    while True:
        manifest = read_manifest(paths)
        if manifest is not None:
            return manifest
        if lock.try_acquire():
            manifest = read_manifest(paths)  # finished between our two looks
            if manifest is not None:
                lock.release()
                return manifest
            log(f"cache: acquired build lock {paths.lock.name}")
            return None
        record = lock.holder()
        if record is None:
            continue  # released between our two looks
        who = f"{record.get('owner', '?')} pid {record.get('pid', '?')}"
        if lock.is_stale(record):
            log(
                f"cache: lock held by {who} is stale (no heartbeat for {format_seconds(lock.age(record))}); taking over"
            )
            if lock.take_over(record):
                log(f"cache: took over build lock {paths.lock.name}")
                return None
            continue
        if time.monotonic() >= deadline:
            raise BuildError(
                ExitCode.LOCK_TIMEOUT,
                f"engine {paths.key} is still being built by {who} after waiting "
                f"{format_seconds(wait_seconds)}; its heartbeat is live, so it was not taken over",
            )
        now = time.monotonic()
        if now - last_report >= 30 or last_report == 0.0:
            log(f"cache: engine {paths.key} is being built by {who}; waiting for it")
            last_report = now
        time.sleep(poll_seconds)
