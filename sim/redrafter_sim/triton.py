"""A real tritonserver on the CPU (the binary inside nvidia-pytriton's wheel) for tests and the demo.

It serves the generated repository with the simulated engine in place of tensorrt_llm, on loopback
host/ports given by the caller (the demo runs several servers on 127.0.0.N). Set-up facts (docs/development.md):
the Python backend directory is assembled from the wheel (libtriton_python.so, its utils module and
the stub of this interpreter's version); the stub needs the base interpreter's LIBDIR on
LD_LIBRARY_PATH and this venv's bin first on PATH (its numpy<2 and tokenizers); each server gets its
own shared-memory prefix, removed after it stops (a crash leaves regions behind).
"""

from __future__ import annotations

import contextlib
import glob
import os
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from engine_jobs.contract import ENGINE_MODEL, ServingConfig
from engine_jobs.model_repo import write_model_repository
from engine_jobs.serve import LaunchSettings, rank_argv

from .engine import SimEngineSettings, install_sim_engine_for

SHM_DIR = Path("/dev/shm")
#: A Python-backend stub start-up timeout for servers started several at once. Triton's default (30 s)
#: is too short when several servers start their ~6 stubs each at once on a busy 2-core machine: the
#: server aborts with boost::interprocess::lock_exception. With 120 s, four parallel starts under load
#: average ~15 pass.
STUB_TIMEOUT_SECONDS = 120


class TritonUnavailable(RuntimeError):
    """tritonserver cannot run on this machine (tests skip on this, visibly)."""


class TritonStartError(RuntimeError):
    """tritonserver started but did not become ready."""


@dataclass(frozen=True)
class TritonInstall:
    binary: Path
    backend_source: Path  # wheel dir with backends/python
    stub: Path

    @classmethod
    def find(cls) -> "TritonInstall":
        try:
            import pytriton
        except ImportError as exc:
            raise TritonUnavailable("nvidia-pytriton is not installed") from exc
        root = Path(pytriton.__file__).parent / "tritonserver"
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        inst = cls(
            root / "bin" / "tritonserver",
            root / "backends" / "python",
            root / "python_backend_stubs" / version / "triton_python_backend_stub",
        )
        for path in (inst.binary, inst.backend_source / "libtriton_python.so", inst.stub):
            if not path.exists():
                raise TritonUnavailable(f"{path} missing from the nvidia-pytriton wheel")
        return inst

    def backend_dir(self, into: Path) -> Path:
        """``<into>/python`` laid out as Triton expects (symlinks into the wheel)."""
        py = into / "python"
        py.mkdir(parents=True, exist_ok=True)
        for src in (
            self.backend_source / "libtriton_python.so",
            self.backend_source / "triton_python_backend_utils.py",
            self.stub,
        ):
            link = py / src.name
            if not link.exists():
                link.symlink_to(src)
        return into

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ)
        libdir = sysconfig.get_config_var("LIBDIR") or ""
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (libdir, env.get("LD_LIBRARY_PATH", "")) if p)
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        env.update(extra or {})
        return env


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_ports(host: str = "127.0.0.1", count: int = 3) -> list[int]:
    """``count`` distinct ports that are free on ``host`` right now."""
    socks, ports = [], []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def stop_session(proc: subprocess.Popen | None, timeout: float) -> int | None:
    """SIGTERM a server started in its own session, SIGKILL its group if it outlives ``timeout``, and in any
    case SIGKILL what is left of the group (children such as Triton's backend stubs must not outlive it)."""
    if proc is None:
        return None
    code = proc.returncode if proc.poll() is not None else None
    if code is None:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            code = proc.wait(timeout=5)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    return code


def build_sim_repository(out_dir: Path, cfg: ServingConfig, tokenizer_dir: str, sim: SimEngineSettings) -> Path:
    """The generated repository for ``cfg`` with the simulated engine in place of tensorrt_llm (on the
    PyTorch path, the simulated llmapi model next to the generated model.yaml, which names the artifact's
    checkpoint and tokenizer under ``cfg.artifact_dir``)."""
    write_model_repository(out_dir, cfg, engine_dir="/nonexistent/sim-engine", tokenizer_dir=tokenizer_dir)
    install_sim_engine_for(cfg, out_dir / ENGINE_MODEL, sim)
    return out_dir


@dataclass
class TritonServer:
    """One tritonserver process serving ``repo`` on ``host`` (a loopback address)."""

    repo: Path
    host: str = "127.0.0.1"
    http_port: int = 0
    grpc_port: int = 0
    metrics_port: int = 0
    workdir: Path | None = None
    env: dict[str, str] = field(default_factory=dict)
    exit_timeout_secs: int = 3
    #: the Python backend's stub start-up timeout; None keeps Triton's default (30 s)
    stub_timeout_secs: int | None = None
    #: shared-memory region prefix; "" derives one from pid + HTTP port (unique only while ports are)
    shm_prefix: str = ""
    proc: subprocess.Popen | None = None
    log_path: Path | None = None

    def __post_init__(self) -> None:
        if not (self.http_port and self.grpc_port and self.metrics_port):
            self.http_port, self.grpc_port, self.metrics_port = free_ports(self.host, 3)
        self.shm_prefix = self.shm_prefix or f"rdsim{os.getpid()}x{self.http_port}r"

    @property
    def http_url(self) -> str:
        return f"{self.host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"

    def argv(self, install: TritonInstall, backend_dir: Path) -> list[str]:
        settings = LaunchSettings(
            tritonserver=str(install.binary),
            backend_dir=str(backend_dir),
            host=self.host,
            http_port=self.http_port,
            grpc_port=self.grpc_port,
            metrics_port=self.metrics_port,
            exit_timeout_secs=self.exit_timeout_secs,
        )
        argv = rank_argv(settings, str(self.repo), 0, shm_prefix=self.shm_prefix)
        if self.stub_timeout_secs is not None:
            argv.append(f"--backend-config=python,stub-timeout-seconds={self.stub_timeout_secs}")
        return argv

    def start(self, timeout: float = 300.0) -> "TritonServer":
        install = TritonInstall.find()
        for port in (self.http_port, self.grpc_port, self.metrics_port):
            if not port_is_free(self.host, port):
                raise TritonStartError(f"port {self.host}:{port} is already in use")
        self.workdir = Path(self.workdir or tempfile.mkdtemp(prefix="rdsim-triton-"))
        backend_dir = install.backend_dir(self.workdir / "backends")
        self.log_path = self.workdir / "tritonserver.log"
        log = open(self.log_path, "wb")
        try:
            self.proc = subprocess.Popen(
                self.argv(install, backend_dir),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=install.env(self.env),
                cwd=self.workdir,
                start_new_session=True,
            )
        except OSError as exc:
            raise TritonUnavailable(f"cannot execute {install.binary}: {exc}") from exc
        finally:
            log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log_tail()
                self._cleanup_shm()
                if "error while loading shared libraries" in tail or self.proc.returncode == 127:
                    # e.g. no libpython3.11.so.1.0 for the Python backend stub (Debian: libpython3.11)
                    raise TritonUnavailable(f"tritonserver cannot run here:\n{tail}")
                raise TritonStartError(f"tritonserver exited with {self.proc.returncode}:\n{tail}")
            if self.ready():
                return self
            time.sleep(0.2)
        self.stop()
        raise TritonStartError(f"tritonserver not ready within {timeout:.0f}s:\n{self.log_tail()}")

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.http_url}/v2/health/ready", timeout=1) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def scrape(self) -> str:
        with urllib.request.urlopen(self.metrics_url, timeout=5) as r:
            return r.read().decode()

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM (Triton drains for --exit-timeout-secs), then SIGKILL the group; clean shm."""
        code = stop_session(self.proc, timeout)
        self._cleanup_shm()
        return code

    def _cleanup_shm(self) -> None:
        for path in glob.glob(str(SHM_DIR / f"{self.shm_prefix}*")):
            with contextlib.suppress(OSError):
                os.unlink(path)

    def __enter__(self) -> "TritonServer":
        return self.start() if self.proc is None else self

    def __exit__(self, *exc) -> None:
        self.stop()
