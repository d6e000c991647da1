"""Run the emulated API server on 127.0.0.1 (asyncio or a background thread) and write a kubeconfig for it.

``async with serve_emulator() as handle`` suits async tests and the demo; ``EmulatorThread`` suits sync
pytest fixtures and CLIs (kubectl subprocesses, a kopf operator in another loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import kmock
import yaml

from .apiserver import ApiServerEmulator


@dataclass(frozen=True)
class EmulatorHandle:
    """A running emulator: its URL and the emulator object (request log, faults, direct object access)."""

    url: str
    emulator: ApiServerEmulator


@contextlib.asynccontextmanager
async def serve_emulator(emulator: ApiServerEmulator | None = None, port: int = 0) -> AsyncIterator[EmulatorHandle]:
    """Serve ``emulator`` (a fresh one by default) on 127.0.0.1:port (0 = a free port) in this loop."""
    emulator = emulator if emulator is not None else ApiServerEmulator()
    async with emulator, kmock.Server(emulator, host="127.0.0.1", port=port or None, user_agent="") as server:
        yield EmulatorHandle(url=str(server.url).rstrip("/"), emulator=emulator)


class EmulatorThread:
    """The emulator served from its own event loop in a daemon thread (start/stop or ``with``)."""

    def __init__(self, emulator: ApiServerEmulator | None = None, port: int = 0) -> None:
        self.emulator = emulator if emulator is not None else ApiServerEmulator()
        self._port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self.url = ""

    def start(self, timeout: float = 10.0) -> EmulatorHandle:
        self._thread = threading.Thread(target=self._run, name="apiserver-emulator", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError("the API server emulator did not start in time")
        if self._error is not None:
            raise RuntimeError(f"the API server emulator failed to start: {self._error}") from self._error
        return EmulatorHandle(self.url, self.emulator)

    def stop(self, timeout: float = 10.0) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout)

    def __enter__(self) -> EmulatorHandle:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        try:
            async with serve_emulator(self.emulator, self._port) as handle:
                self.url = handle.url
                self._ready.set()
                await self._stop.wait()
                self.emulator.drop_watches()
                await asyncio.sleep(0)
        except BaseException as exc:  # reported to start(); the thread must not die silently
            self._error = exc
            self._ready.set()


def kubeconfig_dict(
    url: str, namespace: str = "default", context: str = "redrafter-sim", token: str | None = None
) -> dict[str, object]:
    """A kubeconfig for an insecure loopback server; ``token`` (see ApiServerEmulator.add_token) names the caller."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": context, "cluster": {"server": url}}],
        "users": [{"name": context, "user": {"token": token} if token else {}}],
        "contexts": [{"name": context, "context": {"cluster": context, "user": context, "namespace": namespace}}],
        "current-context": context,
        "preferences": {},
    }


def write_kubeconfig(url: str, path: str | Path, namespace: str = "default", token: str | None = None) -> Path:
    """Write a kubeconfig for ``url`` so kubectl, Helm and kubernetes-asyncio can talk to the emulator."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(yaml.safe_dump(kubeconfig_dict(url, namespace, token=token), sort_keys=False))
    target.chmod(0o600)
    return target


async def _serve_forever(port: int, kubeconfig: Path | None, manifests: list[Path], controllers: bool) -> None:
    from .controllers import run_controllers

    async with serve_emulator(port=port) as handle:
        for manifest in manifests:
            for doc in yaml.safe_load_all(manifest.read_text()):
                if doc:
                    handle.emulator.create_object(doc)
        if kubeconfig is not None:
            write_kubeconfig(handle.url, kubeconfig)
            print(f"export KUBECONFIG={kubeconfig}", flush=True)
        print(f"emulated Kubernetes API server listening on {handle.url} (Ctrl-C to stop)", flush=True)
        stop = asyncio.Event()
        if controllers:
            await run_controllers(handle.emulator, stop)
        else:
            await stop.wait()


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """``redrafter-sim server`` (or ``python -m redrafter_sim.server``): an emulated cluster for manual kubectl sessions."""
    import argparse

    parser = argparse.ArgumentParser(prog=prog, description=main.__doc__)
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: a free one)")
    parser.add_argument("--kubeconfig", type=Path, help="write a kubeconfig for the server here")
    parser.add_argument("--load", type=Path, action="append", default=[], help="YAML manifests to create first")
    parser.add_argument(
        "--controllers",
        action="store_true",
        help="play the Deployment/Endpoints controllers (Pods become Ready) and the CronJob controller",
    )
    args = parser.parse_args(argv)
    try:
        asyncio.run(_serve_forever(args.port, args.kubeconfig, args.load, args.controllers))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
