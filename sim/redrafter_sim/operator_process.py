"""``redrafter-operator run`` as a subprocess against the control plane: exactly the production entry
point, in its own session so a stop or a kill reaches everything it started. The demo runs one; the fault
campaign runs replicas of it and kills and restarts them as a kubelet would."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from pathlib import Path

BIN = Path(sys.executable).parent


class OperatorProcess:
    """One operator process; ``args`` follow ``run --kubeconfig K --namespace N``, ``env`` adds to ours."""

    def __init__(
        self,
        kubeconfig: Path,
        namespace: str,
        log_path: Path,
        args: list[str] | tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.argv = [str(BIN / "redrafter-operator"), "run", "--kubeconfig", str(kubeconfig), "--namespace", namespace]
        self.argv += list(args)
        self.env = {**os.environ, **(env or {})}
        self.log_path = log_path
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        """Start it, appending to its log (a restart keeps what the previous process wrote)."""
        with open(self.log_path, "ab") as out:
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv, stdout=out, stderr=asyncio.subprocess.STDOUT, env=self.env, start_new_session=True
            )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    def kill(self) -> None:
        """SIGKILL to its whole session (no cleanup, as an OOM kill or a node loss)."""
        if self.alive():
            assert self.proc is not None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)

    async def stop(self, grace: float = 10.0) -> None:
        """SIGTERM, as the kubelet stops a container; SIGKILL after ``grace`` seconds."""
        if not self.alive():
            return
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(self.proc.wait(), grace)
        except TimeoutError:
            self.kill()
            await self.proc.wait()

    def log_tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""
