"""checkov (a scanner nobody here wrote) over everything a user deploys: each example as
``redrafter-operator render`` prints it, and the chart with its default and its everything values.

No failed check is allowed except the entries of tests/checkov-allowlist.yaml, each with its reason; an
entry that matches nothing is stale and fails too. checkov lives in its own venv (``make install``
creates .venv-checkov from requirements-checkov.lock: its pins conflict with requirements-dev.lock).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_chart import COMBOS, manifests, render

ROOT = Path(__file__).resolve().parents[2]
CHECKOV = Path(os.environ.get("CHECKOV", ROOT / ".venv-checkov" / "bin" / "checkov"))
ALLOWLIST = ROOT / "tests" / "checkov-allowlist.yaml"
CHART_VALUES = ("default", "everything")

pytestmark = pytest.mark.timeout(600)


def write_inputs(out: Path) -> list[str]:
    """Every example rendered by the CLI, and the chart rendered per values set; the file names."""
    files = []
    for example in sorted((ROOT / "examples").glob("*.yaml")):
        rendered = subprocess.run(
            [sys.executable, "-m", "redrafter_operator.cli", "render", "-f", str(example)],
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
        )
        (out / example.name).write_text(rendered.stdout)
        files.append(example.name)
    for combo in CHART_VALUES:
        name = f"chart-{combo}.yaml"
        (out / name).write_text(yaml.safe_dump_all(manifests(render(COMBOS[combo][0]), tests=True)))
        files.append(name)
    return files


def scan(directory: Path) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """checkov's summary and failed checks for the Kubernetes manifests under ``directory``."""
    if not CHECKOV.is_file():
        pytest.fail(f"{CHECKOV} is missing: run `make install` (it creates .venv-checkov)")
    proc = subprocess.run(
        [
            str(CHECKOV),
            "--directory",
            str(directory),
            "--framework",
            "kubernetes",
            "--output",
            "json",
            "--quiet",
            "--compact",
            "--skip-download",
        ],
        capture_output=True,
        text=True,
        timeout=500,
    )
    assert proc.returncode in (0, 1), proc.stderr[-2000:]  # 1: some check failed
    reports = json.loads(proc.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    (report,) = [r for r in reports if r["check_type"] == "kubernetes"]
    return report["summary"], report["results"]["failed_checks"]


def allowed(finding: dict[str, Any], entry: dict[str, str]) -> bool:
    return (
        finding["check_id"] == entry["check"]
        and re.search(entry["file"], finding["file_path"].lstrip("/")) is not None
        and re.search(entry["resource"], finding["resource"]) is not None
    )


def test_allowlist_is_short_and_every_entry_has_a_reason():
    entries = yaml.safe_load(ALLOWLIST.read_text())
    assert len(entries) <= 8, "fix findings rather than allow-listing them"
    for entry in entries:
        assert set(entry) == {"check", "file", "resource", "reason"}, entry
        assert re.fullmatch(r"CKV2?_K8S_\d+", entry["check"]) and len(entry["reason"]) >= 20, entry
        re.compile(entry["file"]), re.compile(entry["resource"])
    assert len({e["check"] for e in entries}) == len(entries), "one entry per check"


def test_rendered_examples_and_chart_pass_checkov(tmp_path: Path):
    files = write_inputs(tmp_path)
    summary, failed = scan(tmp_path)
    assert summary["parsing_errors"] == 0
    scanned = {f["file_path"].lstrip("/") for f in failed}
    assert scanned <= set(files)
    entries = yaml.safe_load(ALLOWLIST.read_text())
    unexpected = [
        f"{f['check_id']} {f['check_name']}: {f['file_path']} {f['resource']}"
        for f in failed
        if not any(allowed(f, e) for e in entries)
    ]
    assert not unexpected, "checkov findings (fix them, or allow-list with a reason):\n" + "\n".join(unexpected)
    stale = [e["check"] for e in entries if not any(allowed(f, e) for f in failed)]
    assert not stale, f"allow-list entries that match no finding any more: {stale}"
    # the closing note's figures
    print(
        f"checkov: {summary['passed']} passed, {summary['failed']} failed, all {len(failed)} allow-listed "
        f"({len(entries)} entries) over {len(files)} files"
    )
    assert summary["passed"] > 1000  # the scan really covered the manifests
