"""A real Prometheus (Debian's ``prometheus`` package) scraping the demo's or a test's Triton pods and operator.

The scrape config gives every serving pod the ``namespace`` and ``pod`` target labels a PodMonitor gives
(the operator's PromQL metrics source and the dashboard select by them) and scrapes the operator with
``honor_labels`` as the chart's ServiceMonitor does, so its per-resource ``namespace`` label survives.
The chart's alert rules are loaded too. Scrape and rule intervals are short (1 s): a sample is queryable
about a scrape interval after Prometheus is ready, so callers poll :meth:`PrometheusServer.wait_for_targets`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .triton import free_ports, stop_session

_CHART = Path(__file__).resolve().parents[2] / "charts" / "redrafter-operator"
#: the chart's rule file (one source of truth with the PrometheusRule) and dashboard
ALERT_RULES = _CHART / "files" / "alerts.yaml"
DASHBOARD = _CHART / "dashboards" / "redrafter.json"
SERVING_JOB = "redrafter-serving"
OPERATOR_JOB = "redrafter-operator"


def dashboard_queries(variables: Mapping[str, str], path: Path = DASHBOARD) -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target and annotation of the dashboard, with Grafana's variables
    (``$namespace``, ``$__rate_interval``, ...) replaced by ``variables``; ValueError for one left over."""
    dash = json.loads(Path(path).read_text(encoding="utf-8"))
    found = [(f"panel {p['title']!r} {t['refId']}", t["expr"]) for p in dash["panels"] for t in p.get("targets", [])]
    found += [(f"annotation {a['name']!r}", a["expr"]) for a in dash["annotations"]["list"] if "expr" in a]
    out = []
    for where, expr in found:
        for var, value in sorted(variables.items(), key=lambda kv: -len(kv[0])):  # $__range before $__r...
            expr = expr.replace(var, value)
        if "$" in expr.replace('"$1"', ""):
            raise ValueError(f"{where}: a Grafana variable is not substituted in {expr!r}")
        out.append((where, expr))
    return out


class PrometheusUnavailable(RuntimeError):
    """No prometheus binary here (Debian: apt-get install prometheus)."""


@dataclass(frozen=True)
class ServingTarget:
    """One serving pod's metrics endpoint and the target labels a PodMonitor would attach."""

    address: str  # host:port of Triton's metrics endpoint
    namespace: str
    pod: str
    front: str | None = None  # host:port of the OpenAI front (its /metrics: the front's queue), as the PodMonitor


def _groups(serving: Iterable[ServingTarget]) -> list[dict]:
    return [
        {"targets": [t.address, *([t.front] if t.front else [])], "labels": {"namespace": t.namespace, "pod": t.pod}}
        for t in serving
    ]


def scrape_config(
    serving: Iterable[ServingTarget],
    operator: Iterable[str],
    interval: str = "1s",
    rules: Iterable[Path] = (ALERT_RULES,),
    serving_file: Path | None = None,
) -> dict:
    """prometheus.yml for these targets (operator: host:port of its /metrics). Serving pods that come and
    go are listed in ``serving_file`` instead (file-based discovery, see :func:`write_serving_file`)."""
    serving_job: dict = {"job_name": SERVING_JOB, "static_configs": _groups(serving)}
    if serving_file is not None:
        serving_job["file_sd_configs"] = [{"files": [str(serving_file)], "refresh_interval": "2s"}]
    return {
        "global": {"scrape_interval": interval, "scrape_timeout": interval, "evaluation_interval": interval},
        "rule_files": [str(r) for r in rules if Path(r).exists()],  # absent outside a source checkout
        "scrape_configs": [
            serving_job,
            {"job_name": OPERATOR_JOB, "honor_labels": True, "static_configs": [{"targets": list(operator)}]},
        ],
    }


def write_serving_file(path: Path, serving: Iterable[ServingTarget]) -> None:
    """Atomically replace the file-based discovery list (Prometheus never reads a half-written file)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(_groups(serving)), encoding="utf-8")
    os.replace(tmp, path)


@dataclass
class PrometheusServer:
    """One prometheus process with its own config and TSDB in ``workdir`` (removed by stop() if it made it)."""

    config: Mapping
    host: str = "127.0.0.1"
    port: int = 0
    workdir: Path | None = None
    proc: subprocess.Popen | None = None
    _own_workdir: bool = field(default=False, repr=False)

    def __post_init__(self) -> None:
        self.port = self.port or free_ports(self.host, 1)[0]

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def log_path(self) -> Path:
        assert self.workdir is not None
        return self.workdir / "prometheus.log"

    def start(self, timeout: float = 60.0) -> "PrometheusServer":
        binary = shutil.which("prometheus")
        if binary is None:
            raise PrometheusUnavailable("no prometheus binary on PATH (Debian package `prometheus`)")
        if self.workdir is None:
            self.workdir, self._own_workdir = Path(tempfile.mkdtemp(prefix="rdsim-prometheus-")), True
        self.workdir.mkdir(parents=True, exist_ok=True)
        cfg = self.workdir / "prometheus.yml"
        cfg.write_text(yaml.safe_dump(dict(self.config), sort_keys=False), encoding="utf-8")
        argv = [
            binary,
            f"--config.file={cfg}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address={self.host}:{self.port}",
            "--storage.tsdb.retention.time=1d",
            "--log.level=warn",
        ]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.proc.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(urllib.error.URLError, OSError):
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as r:
                    if r.status == 200:
                        return self
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"prometheus not ready within {timeout:.0f}s:\n{self.log_tail()}")

    def api(self, path: str, **params: str) -> dict:
        """GET /api/v1/<path>; the ``data`` of a successful answer, else RuntimeError with Prometheus' error."""
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                body = json.load(r)
        except urllib.error.HTTPError as exc:
            body = json.load(exc)
        if body.get("status") != "success":
            raise RuntimeError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        params = {"query": expr} | ({"time": f"{at:.3f}"} if at is not None else {})
        return self.api("query", **params)["result"]

    def wait_for_targets(self, count: int, timeout: float = 30.0) -> None:
        """Until ``count`` targets have been scraped successfully (the first scrape lands after ~1 interval)."""
        deadline = time.monotonic() + timeout
        while True:
            up = [r for r in self.query("up == 1")]
            if len(up) >= count:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{len(up)} of {count} targets up after {timeout:.0f}s: {self.api('targets')['activeTargets']}"
                )
            time.sleep(0.3)

    def log_tail(self, lines: int = 30) -> str:
        if self.workdir is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, timeout: float = 15.0) -> int | None:
        code = stop_session(self.proc, timeout)
        if self._own_workdir and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
        return code

    def __enter__(self) -> "PrometheusServer":
        return self.start() if self.proc is None else self

    def __exit__(self, *exc) -> None:
        self.stop()
