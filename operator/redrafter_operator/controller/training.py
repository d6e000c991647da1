"""The training monitor: reads a running training pod's progress and hands it to the reconciler.

The pod serves :class:`~engine_jobs.contract.TrainingProgress` as JSON on ``TRAINING_PROGRESS_PORT``; this
monitor reads it every ``speculation.interval`` (at most every 30 s, so ``status.drafter`` moves at least once
a minute while training) and hands a :class:`~.reports.TrainingReport` over. It writes nothing. A pod that
does not answer yet (still fetching the model) or answers garbage is a report with an error, never a crash.
"""

from __future__ import annotations

import aiohttp
from pydantic import ValidationError

from engine_jobs.contract import TRAINING_PROGRESS_PATH, TRAINING_PROGRESS_PORT, TrainingProgress

from ..metrics.scraper import read_body
from ..render import names
from ..render.training import STAGE
from .reports import TrainingReport
from .resource_io import Host, index_entries, interval_of, now_rfc3339
from .workqueue import ResourceKey

PROGRESS_INTERVAL_SECONDS = 30.0
IDLE_INTERVAL_SECONDS = 30.0
TIMEOUT_SECONDS = 2.0
MAX_BODY_BYTES = 64 * 1024  # a progress document is a few hundred bytes; anything larger is not one


class TrainingMonitor:
    """Per resource: the progress of its running training Job, if any."""

    per_resource = True

    def __init__(self, *, timeout: float = TIMEOUT_SECONDS, port: int = TRAINING_PROGRESS_PORT) -> None:
        self.timeout = timeout
        self.port = port

    def interval(self, host: Host, key: ResourceKey | None) -> float:
        if key is None or "drafter" not in host.engine_keys_of(key):
            return IDLE_INTERVAL_SECONDS
        return min(PROGRESS_INTERVAL_SECONDS, interval_of(host.spec_of(key)))

    def forget(self, key: ResourceKey) -> None:
        pass

    async def run(self, host: Host, key: ResourceKey | None) -> None:
        if key is None:
            return
        drafter_key = host.engine_keys_of(key).get("drafter")
        if not drafter_key:
            return
        ns, name = key
        jobs = [
            j
            for j in index_entries(host.indexes, "rdd_jobs", ("owner", ns, names.label_value(name)))
            if j.variant == STAGE and j.key == drafter_key and j.state == "Running"
        ]
        if not jobs:
            return
        job = max(jobs, key=lambda j: j.attempt)
        pods = [p for p in index_entries(host.indexes, "rdd_build_pods", (ns, job.name)) if p.phase == "Running"]
        pod = max(pods, key=lambda p: p.started) if pods else None
        at = now_rfc3339(host.clock)
        if pod is None or not pod.ip:
            host.hand_over(key, TrainingReport(drafter_key, job.name, error="the training pod is not running yet"))
            return
        progress, error = await self._read(pod.ip)
        host.hand_over(key, TrainingReport(drafter_key, job.name, progress=progress, error=error, at=at))

    async def _read(self, ip: str) -> tuple[TrainingProgress | None, str]:
        url = f"http://{ip}:{self.port}{TRAINING_PROGRESS_PATH}"
        try:
            async with aiohttp.ClientSession() as session:
                async with session.get(url, timeout=aiohttp.ClientTimeout(total=self.timeout)) as resp:
                    if resp.status != 200:
                        return None, f"GET {url}: HTTP {resp.status}"
                    body = await read_body(resp, MAX_BODY_BYTES)
        except TimeoutError:
            return None, f"GET {url}: timed out after {self.timeout}s"
        except aiohttp.ClientError as exc:
            return None, f"GET {url}: {type(exc).__name__}: {exc}"
        if body is None:
            return None, f"GET {url}: the answer exceeds {MAX_BODY_BYTES} bytes"
        try:
            return TrainingProgress.model_validate_json(body), ""
        except ValidationError as exc:
            return None, f"GET {url}: not a progress document ({exc.error_count()} errors)"
