"""GPU utilisation from a pod's DCGM exporter (``DCGM_FI_DEV_GPU_UTIL``), when one is exposed.

Optional: the sweep samples a metrics URL per endpoint while a level runs and reports the mean.
"""

from __future__ import annotations

import asyncio

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

DCGM_GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"


def gpu_utilization(exposition: str, metric: str = DCGM_GPU_UTIL) -> float | None:
    """Mean utilisation (percent) over every GPU reported in a Prometheus text exposition."""
    values = [s.value for fam in text_string_to_metric_families(exposition) for s in fam.samples if s.name == metric]
    return sum(values) / len(values) if values else None


class GpuSampler:
    """Polls ``url`` every ``interval_s`` between start() and stop(); mean of what it read (or None)."""

    def __init__(self, url: str, interval_s: float = 1.0, timeout_s: float = 2.0):
        self.url = url
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.values: list[float] = []
        self.errors = 0
        self._task: asyncio.Task[None] | None = None

    async def _poll(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                try:
                    async with session.get(self.url) as resp:
                        value = gpu_utilization(await resp.text())
                    if value is not None:
                        self.values.append(value)
                except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
                    self.errors += 1
                await asyncio.sleep(self.interval_s)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._poll())

    async def stop(self) -> float | None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        return sum(self.values) / len(self.values) if self.values else None
