"""`redrafter-sim demo --fast` end to end, as `make demo` runs it: every stage of the scenario happens
(asserted from its machine-readable summary, which is built from the operator's status, history and
Events), and nothing is left behind — no tritonserver or operator process, no temp dir, no shared memory
— after a normal run and after Ctrl-C.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from redrafter_sim.scenarios import DEFAULT_SCENARIO, SCENARIOS, with_training
from redrafter_sim.triton import TritonInstall, TritonUnavailable

pytestmark = [pytest.mark.slow, pytest.mark.triton, pytest.mark.timeout(700)]

CLI = Path(sys.executable).parent / "redrafter-sim"
# a whole lifecycle on a real control plane, a CPU-trained drafter with --train: minutes on a busy 2-core machine
DEMO_TIMEOUT_S = 600


@pytest.fixture(autouse=True)
def _triton_available() -> None:
    try:
        TritonInstall.find()
    except TritonUnavailable as exc:
        pytest.skip(f"tritonserver cannot run here: {exc}")


def processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes that mention ``text`` (zombies excluded)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "stat").read_text().split(") ", 1)[1].startswith("Z"):
                continue
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            env = (entry / "environ").read_bytes().decode(errors="replace")
        except (OSError, IndexError):
            continue
        if text in cmd or text in env:
            out.append(f"{entry.name}: {cmd[:200]}")
    return out


def demo_env(tmpdir: Path) -> dict[str, str]:
    """Everything the demo creates on disk lands under ``tmpdir`` (its TMPDIR), so leftovers are visible."""
    tmpdir.mkdir(parents=True, exist_ok=True)
    return {**os.environ, "TMPDIR": str(tmpdir), "PYTHONUNBUFFERED": "1"}


def assert_nothing_left(tmpdir: Path, pid: int) -> None:
    deadline = time.monotonic() + 20
    while processes_mentioning(str(tmpdir)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert processes_mentioning(str(tmpdir)) == []
    assert sorted(p.name for p in tmpdir.iterdir()) == []
    assert list(Path("/dev/shm").glob(f"rdsim{pid}x*")) == []


def test_demo_fast_train_every_stage_happens_and_nothing_is_left(tmp_path: Path):
    """`demo --fast --train`: from the base model only (the training Job trains a real head on this CPU while
    the base engine builds), through the whole lifecycle on the trained drafter's ReDrafter engine."""
    tmpdir = tmp_path / "tmp"
    summary_path = tmp_path / "summary.json"
    started = time.monotonic()
    proc = subprocess.Popen(
        [str(CLI), "demo", "--fast", "--train", "--summary-json", str(summary_path)],
        env=demo_env(tmpdir),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        output, _ = proc.communicate(timeout=DEMO_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=60)
        pytest.fail(f"demo did not finish within {DEMO_TIMEOUT_S}s:\n{output[-6000:]}")
    wall = time.monotonic() - started
    assert summary_path.exists(), output[-6000:]
    summary = json.loads(summary_path.read_text())

    expected = [s.name for s in with_training(SCENARIOS[DEFAULT_SCENARIO]).stages]
    assert [s["name"] for s in summary["stages"]] == expected, output[-6000:]
    failed = [f"{s['name']}: {s['failure']}" for s in summary["stages"] if not s["happened"]]
    assert failed == [], f"stages that did not happen: {failed}\n{output[-6000:]}"
    assert summary["ok"] is True and proc.returncode == 0
    # `redrafter-operator check` of the resource before it was applied: every check passed, none warned
    check = summary["check"]
    assert check and check[-1].endswith(" passed, 0 warning(s), 0 failed"), check
    assert all(line.startswith("✓ ") for line in check[:-1]), check
    assert {"crd", "operator", "pod-security demo-tiny", "training-gpu demo-tiny"} <= {
        line[2:].split(": ", 1)[0] for line in check[:-1]
    }, check
    assert "check: ✓ operator: runs outside the cluster" in output

    # what each stage shows comes from the operator: its history and Events
    by_name = {s["name"]: s for s in summary["stages"]}
    # the drafter: trained by the Job, measured on held-out prompts, and the ReDrafter engine built from it
    drafter = summary["final_status"]["drafter"]
    assert drafter["state"] == "Ready" and drafter["heldOutAcceptance"] > drafter["untrainedAcceptance"], drafter
    assert 0 < drafter["steps"] <= 100 and drafter["tokensPerStep"] > 1, drafter  # recipe maxSteps 100
    assert summary["drafter_progress"][0]["state"] == "Training", summary["drafter_progress"]
    assert summary["final_status"]["engines"]["redrafter"]["state"] in ("Ready", "Cached")
    assert by_name["deploy"]["observed"]["status.phase"] == "Serving"
    assert by_name["load-rise"]["observed"]["status.serving.readyReplicas"] >= 2
    assert by_name["collapse"]["observed"]["status.activeEngine"] == "base"
    assert by_name["recover"]["observed"]["status.activeEngine"] == "redrafter"
    assert by_name["load-fall"]["observed"]["status.serving.replicas"] == 1
    # each transition is backed by the operator's own record in that stage
    assert any(e["reason"] == "Scaling" for e in by_name["load-rise"]["decisions"])
    assert any(e["reason"] == "Scaling" for e in by_name["load-fall"]["decisions"])
    switches = [(h["from"], h["to"]) for h in summary["history"]]
    assert ("redrafter", "base") in switches and ("base", "redrafter") in switches
    reasons = {e["reason"] for e in summary["events"]}
    assert any(r.startswith("EngineReady") for r in reasons), reasons
    assert {"TrainingStarted", "DrafterTrained"} <= reasons, reasons
    assert summary["traffic"]["requests"] > 0 and summary["traffic"]["tokens"] > 0
    assert "RESULT: every stage happened" in output
    # one chat completion through the Service with the official OpenAI client, on the ReDrafter engine
    chat = summary["openai_chat"]
    assert chat["error"] is None and chat["service"] == "demo-tiny:9000", chat
    assert chat["usage"]["completion_tokens"] == 16 and len(chat["content"].split()) == 16
    assert 0 < chat["acceptance_rate"] <= 1
    assert "POST /v1/chat/completions via Service demo-tiny:9000" in output
    print(next(line for line in output.splitlines() if "POST /v1/chat/completions" in line))
    print(f"drafter: {drafter}")
    print(f"demo --fast --train wall time: {wall:.1f}s (summary says {summary['wall_s']}s)")

    assert_nothing_left(tmpdir, proc.pid)


def test_ctrl_c_stops_every_process_and_removes_temp_files(tmp_path: Path):
    tmpdir = tmp_path / "tmp"
    proc = subprocess.Popen(
        [str(CLI), "demo", "--fast"], env=demo_env(tmpdir), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    # interrupt once serving pods run (real tritonservers), or after the builds if they never start
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and proc.poll() is None:
        if any("tritonserver" in p for p in processes_mentioning(str(tmpdir))):
            break
        time.sleep(0.5)
    assert proc.poll() is None, proc.communicate()[0][-4000:]
    assert processes_mentioning(str(tmpdir)), "the demo started no process under its temp dir"
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, output[-4000:]
    assert "every process stopped" in output
    assert_nothing_left(tmpdir, proc.pid)


def test_demo_prometheus_scrapes_the_operator_and_the_serving_pods(tmp_path: Path):
    """`demo --prometheus` prints a Prometheus URL whose series answer the dashboard's queries, and stops it."""
    import queue
    import shutil
    import threading

    from redrafter_sim.prometheus import PrometheusServer, dashboard_queries

    if shutil.which("prometheus") is None:
        pytest.skip("prometheus not installed (Debian package `prometheus`; .ci/run installs it)")
    tmpdir = tmp_path / "tmp"
    proc = subprocess.Popen(
        [str(CLI), "demo", "--fast", "--prometheus"],
        env=demo_env(tmpdir),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()  # type: ignore[union-attr]
    seen: list[str] = []
    try:
        url = None
        deadline = time.monotonic() + 60
        while url is None and time.monotonic() < deadline:
            with contextlib.suppress(queue.Empty):
                seen.append(line := lines.get(timeout=1))
                if line.startswith("Prometheus: http://"):
                    url = line.split()[1].removesuffix("/graph")
        assert url, "".join(seen)[-4000:]
        host, port = url.removeprefix("http://").split(":")
        prom = PrometheusServer({}, host=host, port=int(port))  # a client of the demo's server
        variables = {"$__rate_interval": "30s", "$__range": "5m", "$namespace": "default", "$deployment": "demo-tiny"}
        queries = dict(dashboard_queries(variables))
        wanted = [
            "panel 'Acceptance rate per engine' A",
            "panel 'Output tokens/s' A",
            "panel 'Active engine' A",
            "panel 'In-flight and queued requests per pod' A",
            "panel 'Replicas: desired vs ready' B",
        ]
        missing = wanted
        deadline = time.monotonic() + 180  # builds, validation and the first serving pods come first
        while missing and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(2)
            missing = [w for w in wanted if not prom.query(queries[w])]
        assert not missing, f"no data for {missing}\n{''.join(seen)[-3000:]}"
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    assert_nothing_left(tmpdir, proc.pid)
