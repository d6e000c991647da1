"""`make lint` holds: the tree is clean, and a planted violation of each kind fails it.

The planted files go into a temporary copy of the project's lint configuration (pyproject.toml), never into the
tree, and are checked with the same commands `make lint` runs.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

pytestmark = pytest.mark.skipif(
    not (BIN / "ruff").exists() or not (BIN / "mypy").exists(), reason="ruff and mypy come with requirements-dev.lock"
)


def run(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / argv[0]), *argv[1:]], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_make_test_runs_make_lint_with_each_check() -> None:
    """``make test`` runs ``make lint`` first (the tree's cleanliness is checked there, once, not again here)."""
    make = (ROOT / "Makefile").read_text()
    assert "\ntest: install lint\n" in make
    lint = make.split("\nlint: ", 1)[1].split("\n\n", 1)[0]
    for command in ("ruff check .", "ruff format --check .", "mypy"):
        assert f"$(VENV)/bin/{command}" in lint, command


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """An empty project with the repository's lint configuration and a package that mypy checks strictly."""
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    pkg = tmp_path / "operator" / "redrafter_operator"
    (pkg / "api").mkdir(parents=True)
    for d in ("render", "policy", "metrics"):
        (pkg / d).mkdir()
        (pkg / d / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "api" / "__init__.py").write_text("")
    (tmp_path / "engine_jobs").mkdir()  # the other strictly checked package
    (tmp_path / "engine_jobs" / "__init__.py").write_text("")
    return tmp_path


def test_a_planted_lint_finding_fails(project: Path) -> None:
    (project / "planted.py").write_text("import os\n")
    done = run("ruff", "check", ".", cwd=project)
    assert done.returncode == 1 and "F401" in done.stdout


def test_a_planted_format_difference_fails(project: Path) -> None:
    (project / "planted.py").write_text("x = {  'a':1 }\n")
    done = run("ruff", "format", "--check", ".", cwd=project)
    assert done.returncode == 1 and "planted.py" in done.stdout


def test_a_planted_untyped_function_in_a_strict_package_fails(project: Path) -> None:
    (project / "operator" / "redrafter_operator" / "api" / "planted.py").write_text("def f(x):\n    return x\n")
    done = run("mypy", cwd=project)
    assert done.returncode == 1 and "planted.py:1: error: Function is missing a type annotation" in done.stdout
