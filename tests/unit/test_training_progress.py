"""The training pod's progress endpoint and the monitor that reads it: a real HTTP server on loopback, read by
the operator's monitor into a TrainingReport; a pod that is not up yet, or answers garbage, is a report with an
error, never a crash."""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from engine_jobs.contract import TrainingProgress
from engine_jobs.progress import Log
from engine_jobs.train import ProgressServer
from redrafter_operator.api.engine_key import engine_keys
from redrafter_operator.api.spec import parse_spec
from redrafter_operator.controller.facts import JobFact, PodFact
from redrafter_operator.controller.reports import TrainingReport
from redrafter_operator.controller.training import MAX_BODY_BYTES, TrainingMonitor
from redrafter_operator.render import names
from redrafter_sim.clock import FakeClock

ROOT = Path(__file__).resolve().parents[2]
NS, NAME = "default", "llama3-8b-train"
IP = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((IP, 0))
        return int(s.getsockname()[1])


class Host:
    """What the monitor sees of the controller: the resource, its training Job and Pod in the indexes."""

    def __init__(self, job_state: str = "Running", pod_ip: str = IP) -> None:
        body = yaml.safe_load((ROOT / "examples" / "llama3-8b-train.yaml").read_text())
        self.bodies = {(NS, NAME): body}
        self.written: dict[Any, Any] = {}
        self.clock = FakeClock(epoch=1_800_000_000)
        self.spec = parse_spec(body["spec"])[0]
        self.keys = engine_keys(self.spec)
        job = JobFact(
            name=names.training_job_name(NAME, self.keys["drafter"]),
            namespace=NS,
            owner=NAME,
            variant="drafter",
            key=self.keys["drafter"],
            attempt=0,
            retry_token="",
            claim="engine-cache",
            artifact="",
            state=job_state,  # type: ignore[arg-type]
        )
        self.indexes = {
            "rdd_jobs": {("owner", NS, NAME): [job]},
            "rdd_build_pods": {(NS, job.name): [PodFact(job.name, "Running", "", "2026-01-01T00:00:00Z", pod_ip)]},
        }
        self.reports: list[TrainingReport] = []

    def spec_of(self, key: Any) -> Any:
        return self.spec

    def engine_keys_of(self, key: Any) -> dict[str, str]:
        return self.keys

    def hand_over(self, key: Any, report: Any) -> None:
        self.reports.append(report)


@pytest.fixture
def progress(tmp_path: Path) -> Iterator[tuple[ProgressServer, Path, int]]:
    port = free_port()
    file = tmp_path / "progress.json"
    with ProgressServer(file, IP, port) as server:
        yield server, file, port


async def test_the_monitor_reads_the_phase_then_the_workers_progress(progress: tuple[ProgressServer, Path, int]):
    server, file, port = progress
    host = Host()
    monitor = TrainingMonitor(port=port)
    await monitor.run(host, (NS, NAME))
    assert host.reports[-1].progress == TrainingProgress(phase="fetching")  # before the worker writes anything
    file.write_text(
        TrainingProgress(phase="training", step=12, total_steps=60, loss=3.5).model_dump_json(by_alias=True)
    )
    await monitor.run(host, (NS, NAME))
    report = host.reports[-1]
    assert (report.key, report.job, report.error) == (
        host.keys["drafter"],
        host.indexes["rdd_jobs"][("owner", NS, NAME)][0].name,
        "",
    )
    assert report.progress == TrainingProgress(phase="training", step=12, total_steps=60, loss=3.5)
    assert report.at == "2027-01-15T08:00:00Z"
    file.write_text("{half a document")  # torn: the server falls back to its own phase
    await monitor.run(host, (NS, NAME))
    assert host.reports[-1].progress == TrainingProgress(phase="fetching")
    # at least every 30 s (the speculation interval when shorter), only while the spec trains a drafter
    assert monitor.interval(host, (NS, NAME)) == 30.0


async def test_no_running_job_no_report_and_a_silent_pod_is_an_error_not_a_crash() -> None:
    host = Host(job_state="Succeeded")
    await TrainingMonitor(port=free_port()).run(host, (NS, NAME))
    assert host.reports == []
    host = Host(pod_ip="")
    await TrainingMonitor(port=free_port()).run(host, (NS, NAME))
    assert host.reports[-1].error == "the training pod is not running yet"
    host = Host()
    await TrainingMonitor(port=free_port(), timeout=0.5).run(host, (NS, NAME))  # nothing listens there
    assert host.reports[-1].progress is None and "ClientConnectorError" in host.reports[-1].error


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b"<html>hello</html>", "not a progress document"),
        (b'{"step": -3}', "not a progress document"),
        (b"x" * (MAX_BODY_BYTES + 10), f"exceeds {MAX_BODY_BYTES} bytes"),
    ],
)
async def test_a_hostile_answer_is_bounded_and_reported(body: bytes, error: str) -> None:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    port = free_port()
    server = ThreadingHTTPServer((IP, port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        host = Host()
        await TrainingMonitor(port=port).run(host, (NS, NAME))
        assert host.reports[-1].progress is None and error in host.reports[-1].error
    finally:
        server.shutdown()
        server.server_close()


def test_a_taken_port_means_training_without_a_progress_endpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from engine_jobs.train import progress_server

    with socket.socket() as taken:
        taken.bind((IP, 0))
        taken.listen()
        monkeypatch.setenv("POD_IP", IP)
        monkeypatch.setenv("REDRAFTER_PROGRESS_PORT", str(taken.getsockname()[1]))
        assert progress_server(tmp_path / "p.json", Log()) is None
