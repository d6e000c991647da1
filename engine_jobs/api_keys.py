"""API keys of the OpenAI front, read from a mounted Secret volume and re-read when the kubelet rotates it.

Format: every data entry of the Secret is one key (its value, surrounding whitespace stripped; the entry's
name is free, e.g. one entry per client). Empty values are ignored. The kubelet writes a Secret volume as
a timestamped directory behind the ``..data`` symlink and swaps that link atomically on an update, so the
link's inode and mtime change exactly when the keys do: one ``lstat`` per request finds out, and the keys
are read again only then. Keys are compared with ``hmac.compare_digest`` against every key (no early exit
on the first match), so the time taken does not tell which key, or how much of one, matched. A key is
never logged; a configured directory with no key in it refuses every request (fails closed).
"""

from __future__ import annotations

import hmac
import logging
import os
from pathlib import Path

log = logging.getLogger("redrafter.openai")

#: the symlink the kubelet swaps when it updates a Secret or ConfigMap volume
KUBELET_DATA_LINK = "..data"


def read_keys(directory: Path) -> tuple[bytes, ...]:
    """Every key in ``directory``: one per regular file (hidden kubelet entries skipped)."""
    keys: list[bytes] = []
    try:
        entries = sorted(directory.iterdir())
    except OSError as exc:
        log.warning("API keys: cannot list %s (%s); every request is refused", directory, exc.strerror)
        return ()
    for entry in entries:
        if entry.name.startswith(".") or not entry.is_file():
            continue
        try:
            key = entry.read_bytes().strip()
        except OSError:
            continue
        if key:
            keys.append(key)
    if not keys:
        log.warning("API keys: %s holds no key; every request is refused", directory)
    return tuple(keys)


class ApiKeys:
    """The keys in a mounted Secret directory, reloaded when the directory changes."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self._signature: tuple[int, int, int] | None = None
        self._keys: tuple[bytes, ...] = ()
        self.reloads = 0

    def _current_signature(self) -> tuple[int, int, int] | None:
        """What changes when the kubelet swaps the volume's contents (or someone edits the directory)."""
        for path in (self.directory / KUBELET_DATA_LINK, self.directory):
            try:
                st = os.lstat(path)
            except OSError:
                continue
            return (st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
        return None

    def keys(self) -> tuple[bytes, ...]:
        sig = self._current_signature()
        if sig != self._signature or not self.reloads:
            self._signature = sig
            self.reloads += 1
            if sig is None:
                log.warning("API keys: %s does not exist; every request is refused", self.directory)
                self._keys = ()
            else:
                self._keys = read_keys(self.directory)
                log.info("API keys: loaded %d key(s) from %s", len(self._keys), self.directory)
        return self._keys

    def check(self, presented: str | None) -> bool:
        """True when ``presented`` equals one of the keys (constant time in the presented key's content)."""
        keys = self.keys()
        if presented is None:
            return False
        candidate = presented.encode("utf-8", "surrogateescape")
        ok = False
        for key in keys:
            ok |= hmac.compare_digest(candidate, key)
        return ok


def bearer(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or None."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token
