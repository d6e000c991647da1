"""Run-time controls of the simulated engine: a small JSON file, re-read when its mtime changes.

Tests and the demo change the target acceptance rate or inject faults while a server runs by
rewriting the file (atomically). The file path comes from the model parameter ``control_file`` or the
environment variable ``REDRAFTER_SIM_CONTROL``. Keys (all optional):

- ``acceptance_rate`` (0..1): probability that each draft token of a step is accepted.
- ``error`` (string): every request still running fails with this message, and new ones too.
- ``diverge`` (bool): generate tokens different from the base variant's greedy output.
- ``fail_on_empty_batch`` (bool): a step whose batch has no request in the generation phase (only
  new requests in their context phase, e.g. one lone request) fails those requests, the way an engine
  with a broken generation-batch path would.
- ``step_ms`` (float): base latency of one engine step.

Standalone on purpose (stdlib only): it is copied next to the model file inside Triton.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path

ENV_CONTROL = "REDRAFTER_SIM_CONTROL"


@dataclass(frozen=True)
class SimControl:
    acceptance_rate: float = 0.7
    error: str | None = None
    diverge: bool = False
    fail_on_empty_batch: bool = False
    step_ms: float | None = None

    @classmethod
    def from_dict(cls, raw: dict) -> "SimControl":
        unknown = set(raw) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown simulated-engine controls: {sorted(unknown)}")
        ctl = cls(**raw)
        if not 0.0 <= float(ctl.acceptance_rate) <= 1.0:
            raise ValueError("acceptance_rate must be within [0, 1]")
        return ctl


def write_control(path: str | os.PathLike, control: SimControl | None = None, **changes) -> SimControl:
    """Atomically write ``control`` (or the current file's values with ``changes``) to ``path``."""
    path = Path(path)
    base = control if control is not None else (read_control(path) or SimControl())
    new = replace(base, **changes)
    SimControl.from_dict(asdict(new))
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(asdict(new)), encoding="utf-8")
    os.replace(tmp, path)
    return new


def read_control(path: str | os.PathLike) -> SimControl | None:
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    return SimControl.from_dict(raw)


class ControlWatcher:
    """Returns the current controls, re-reading the file only when its (mtime, size) changed."""

    def __init__(self, path: str | None, default: SimControl):
        self.path = path
        self.default = default
        self._stamp: tuple[int, int] | None = None
        self._current = default
        self.last_error: str | None = None

    def get(self) -> SimControl:
        if not self.path:
            return self._current
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._stamp, self._current = None, self.default
            return self._current
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            self._stamp = stamp
            try:
                merged = {**asdict(self.default), **json.loads(Path(self.path).read_text(encoding="utf-8"))}
                self._current = SimControl.from_dict(merged)
                self.last_error = None
            except (ValueError, TypeError, OSError) as exc:  # keep the last good controls
                self.last_error = str(exc)
        return self._current
