"""Build log lines (what users watch with ``kubectl logs``): elapsed time, sizes, secrets redacted."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import TextIO

REDACTED = "***"


class Log:
    """Prefixes every line with the elapsed time and replaces registered secret values."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream
        self._start = time.monotonic()
        self._secrets: list[str] = []
        self._lock = threading.Lock()

    def add_secret(self, value: str | None) -> None:
        if value and len(value) >= 4 and value not in self._secrets:
            self._secrets.append(value)

    def redact(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, REDACTED)
        return text

    def elapsed(self) -> float:
        return time.monotonic() - self._start

    def __call__(self, message: str, stream: TextIO | None = None) -> None:
        out = stream or self._stream or sys.stdout
        line = f"[{format_seconds(self.elapsed()):>8}] {self.redact(message)}"
        with self._lock:
            print(line, file=out, flush=True)


def format_seconds(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def tree_size(path: str | os.PathLike[str]) -> int:
    """Bytes of regular files under ``path`` (symlinks followed once: HF snapshots are symlinks)."""
    root = Path(path)
    if root.is_file():
        return root.stat().st_size
    total = 0
    for dirpath, _dirs, files in os.walk(root, followlinks=False):
        for name in files:
            try:
                total += (Path(dirpath) / name).stat().st_size
            except OSError:
                continue
    return total
