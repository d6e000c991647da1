"""The in-flight batching loop both simulated engines share (copied next to them as ``_sim_batching.py``).

:class:`BatchingEngine` owns the request queue, the step loop over the active requests (at most
``max_batch``; the rest wait), the run-time controls (_sim_control.py: ``error`` and
``fail_on_empty_batch`` are handled here, the others by the engine's ``_step``), failing requests and
the ledger. An engine subclass parses requests into :class:`SimRequest`, decides each step's draft work
(:meth:`BatchingEngine._draft_tokens`, for the step latency) and runs one step of one request
(:meth:`BatchingEngine._step`). ``redrafter_sim.engine.load`` wraps either engine and relies on
``incoming``, ``max_batch`` and ``_ledger``.
"""

from __future__ import annotations

import json
import os
import queue
import random
import threading
import time
from dataclasses import dataclass, field

import triton_python_backend_utils as pb_utils  # type: ignore[import-not-found]
from _sim_control import ENV_CONTROL, ControlWatcher, SimControl

ENV_LEDGER = "REDRAFTER_SIM_LEDGER"
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


@dataclass
class SimRequest:
    request: object
    sender: object
    prompt_crc: int
    max_tokens: int
    end_id: int
    stop: list[list[int]]
    streaming: bool
    want_perf: bool
    rng: random.Random
    arrival_ns: int
    prompt: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    steps: int = 0
    emitting_steps: int = 0  # steps that produced at least one token (what output - accepted counts)
    drafted: int = 0
    accepted: int = 0
    first_token_ns: int = 0
    done: bool = False
    finish_reason: str = ""  # PyTorch-path simulator: "stop" | "length" once finished
    want_finish_reason: bool = False


class BatchingEngine:
    """Subclasses call :meth:`_start` at the end of their ``initialize``."""

    variant = "redrafter"
    max_batch = 8
    load_factor = 0.05  # step latency grows by this fraction per extra request in the batch
    draft_ms_per_token = 0.02  # extra latency per unit of draft work (see _draft_tokens)

    def _start(self, sim: dict[str, str]) -> None:
        """The token space, step costs, controls, ledger and the loop thread, from the simulator's ``sim_``
        parameters (the same for every engine it stands in for)."""
        self.vocab = int(sim.get("vocab_size", "1000"))
        self.first_id = int(sim.get("first_token_id", "3"))
        self.load_factor = float(sim.get("load_factor", "0.05"))
        self.draft_ms_per_token = float(sim.get("draft_ms_per_token", "0.02"))
        default = SimControl(
            acceptance_rate=float(sim.get("acceptance_rate", "0.7")), step_ms=float(sim.get("step_ms", "2.0"))
        )
        self.controls = ControlWatcher(sim.get("control_file") or os.environ.get(ENV_CONTROL), default)
        self.ledger_path = sim.get("ledger_file") or os.environ.get(ENV_LEDGER)
        self.ledger_lock = threading.Lock()
        self.incoming: queue.Queue = queue.Queue()
        self.running = True
        self.loop = threading.Thread(target=self._run, name="sim-engine", daemon=True)
        self.loop.start()

    def finalize(self):
        self.running = False
        self.loop.join(timeout=5)

    # ---- what an engine defines ---------------------------------------------------------------------
    def _draft_tokens(self, active: list[SimRequest]) -> float:
        """Draft-work units of this step (its latency grows by draft_ms_per_token per unit)."""
        return 0.0

    def _step(self, r: SimRequest, ctl: SimControl, batch: int) -> None:
        raise NotImplementedError

    def _ledger_extra(self) -> dict:
        return {}

    # ---- the in-flight batching loop ----------------------------------------------------------------
    def _run(self) -> None:
        active: list[SimRequest] = []
        while self.running:
            try:
                if not active:
                    active.append(self.incoming.get(timeout=0.05))
                while len(active) < self.max_batch:
                    active.append(self.incoming.get_nowait())
            except queue.Empty:
                pass
            if not active:
                continue
            ctl = self.controls.get()
            if ctl.error:
                self._fail(active, ctl.error)
                active = []
                continue
            if ctl.fail_on_empty_batch and all(r.steps == 0 for r in active):
                self._fail(active, "empty generation batch: no request in the generation phase")
                active = []
                continue
            n = len(active)
            latency_ms = (ctl.step_ms or 0.0) * (1.0 + self.load_factor * (n - 1))
            latency_ms += self.draft_ms_per_token * self._draft_tokens(active)
            time.sleep(latency_ms / 1000.0)
            for r in active:
                try:
                    self._step(r, ctl, n)
                except Exception as exc:  # a broken client connection must not stop the loop
                    r.done = True
                    self._ledger(r, error=str(exc))
            active = [r for r in active if not r.done]

    def _fail(self, requests: list[SimRequest], message: str) -> None:
        for r in requests:
            r.done = True
            self._ledger(r, error=message)
            try:
                r.sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(message)), flags=FINAL)
            except Exception:
                pass

    def _ledger(self, r: SimRequest, cancelled: bool = False, error: str | None = None) -> None:
        if not self.ledger_path:
            return
        line = json.dumps(
            {
                "variant": self.variant,
                "output_tokens": len(r.tokens),
                "draft_tokens": r.drafted,
                "accepted_draft_tokens": r.accepted,
                "steps": r.steps,
                "emitting_steps": r.emitting_steps,
                "cancelled": cancelled,
                "error": error,
                **self._ledger_extra(),
            }
        )
        with self.ledger_lock, open(self.ledger_path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
