"""A simulated node: kubelet + the controllers a cluster would run, against any Kubernetes API URL.

* build and validation Jobs (:mod:`.buildjobs`): the real ``python -m engine_jobs build`` with the
  stand-in toolchain, ``redrafter-operator evaluate validate`` against the serving pods;
* serving Deployments (:mod:`.servingpods`): real tritonservers on 127.0.0.N with the simulated engine;
* Endpoints (:mod:`.endpoints`) for every Service with a selector, which the router (:mod:`.router`) reads.

Everything it creates on disk lives under one temp directory (engine cache and source claims, pod
roots, the simulated engines' control files), removed on exit; every process it starts is stopped on
exit, including on Ctrl-C and errors. ``async with SimKubelet(url) as node: ...``
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
from pathlib import Path

from .buildjobs import TOOLCHAIN_DIR, JobRunner
from .endpoints import EndpointsController
from .engine import SimControl, SimEngineSettings, write_control
from .hostfs import HostFS
from .kubeapi import KubeApi
from .servingpods import ServingController, control_file_name

log = logging.getLogger("redrafter.sim.kubelet")

TEMP_PREFIX = "redrafter-sim-node-"


class SimKubelet:
    def __init__(
        self,
        api_url: str,
        *,
        sync_period: float = 0.5,
        sim: SimEngineSettings | None = None,
        toolchain: Path = TOOLCHAIN_DIR,
        node_dir: Path | None = None,
        build_parallelism: int = 2,
        exit_timeout_secs: int = 3,
        gpus: int | None = None,
        openai_front: bool = False,
    ) -> None:
        """``openai_front``: serving pods also run the OpenAI-compatible front (one more process each)."""
        self.api_url = api_url
        self.sync_period = sync_period
        self._own_dir = node_dir is None
        self.node_dir = Path(node_dir or tempfile.mkdtemp(prefix=TEMP_PREFIX))
        self.fs = HostFS(self.node_dir)
        self.control_dir = self.node_dir / "sim-control"
        self.api = KubeApi(api_url)
        self.jobs = JobRunner(self.api, self.fs, toolchain=toolchain, parallel=build_parallelism)
        self.serving = ServingController(
            self.api,
            self.fs,
            self.control_dir,
            sim=sim,
            exit_timeout_secs=exit_timeout_secs,
            gpus=gpus,  # gpus: nvidia.com/gpu
            openai_front=openai_front,
        )
        self.endpoints = EndpointsController(self.api)
        self._task: asyncio.Task[None] | None = None
        self.sync_errors = 0
        self.last_error = ""

    async def __aenter__(self) -> "SimKubelet":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        await self.api.__aenter__()
        self._task = asyncio.create_task(self._loop(), name="sim-kubelet")

    async def stop(self) -> None:
        """Stop every process it started, then remove its directories. Safe to call twice."""
        try:
            if self._task is not None:
                self._task.cancel()
                await asyncio.gather(self._task, return_exceptions=True)
                self._task = None
            await asyncio.shield(self._shutdown())
        finally:
            if self._own_dir:
                shutil.rmtree(self.node_dir, ignore_errors=True)

    async def _shutdown(self) -> None:
        await asyncio.gather(self.jobs.shutdown(), self.serving.shutdown(), return_exceptions=True)
        await self.api.close()

    async def sync_once(self) -> None:
        await self.jobs.sync()
        await self.serving.sync()
        await self.endpoints.sync()

    async def _loop(self) -> None:
        while True:
            try:
                await self.sync_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the API may be briefly unavailable; a node keeps going
                self.sync_errors += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("sync failed: %s", self.last_error)
            await asyncio.sleep(self.sync_period)

    # ------------------------------------------------------------------ simulated-engine controls
    def control_file(self, namespace: str, deployment: str, variant: str) -> Path:
        return self.control_dir / control_file_name(namespace, deployment, variant)

    def set_engine(self, namespace: str, deployment: str, variant: str, **changes: object) -> SimControl:
        """Change the simulated engine of every pod (present and future) of (resource, variant)."""
        self.control_dir.mkdir(parents=True, exist_ok=True)
        path = self.control_file(namespace, deployment, variant)
        return write_control(path, **changes)
