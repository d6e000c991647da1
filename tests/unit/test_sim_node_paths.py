"""The emulated node maps container paths into a pod's root and never the host programs that stand in for
the image's (this interpreter, its venv, this checkout), wherever the checkout is: also under a path the
pods mount (``/tmp`` is an emptyDir in every rendered pod, ``/cache`` a claim)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from redrafter_operator.render.security import tmp_volume
from redrafter_sim.buildjobs import ProgramRunner
from redrafter_sim.hostfs import HostFS, PodRoot, stand_in_paths


def _as_if_checkout_at(monkeypatch: pytest.MonkeyPatch, checkout: str) -> str:
    """This interpreter as if it were ``<checkout>/.venv/bin/python`` (a venv in a fresh clone)."""
    venv = f"{checkout}/.venv"
    monkeypatch.setattr(sys, "executable", f"{venv}/bin/python")
    monkeypatch.setattr(sys, "prefix", venv)
    monkeypatch.setattr(sys, "exec_prefix", venv)
    return venv


def _mounted(tmp_path: Path, mount_path: str, volume: dict) -> PodRoot:
    fs = HostFS(tmp_path / "node")
    pod = fs.pod_root("default", "build-x")
    fs.mount_volumes(
        pod, {"volumes": [{"name": "v", **volume}]}, {"volumeMounts": [{"name": "v", "mountPath": mount_path}]}, {}
    )
    return pod


@pytest.mark.parametrize(
    ("mount_path", "volume"),
    [
        ("/tmp", {"emptyDir": {}}),
        ("/cache", {"persistentVolumeClaim": {"claimName": "engine-cache"}}),
        ("/models", {"emptyDir": {}}),
    ],
)
def test_a_checkout_under_a_mount_keeps_its_host_paths_and_container_paths_still_map(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mount_path: str, volume: dict
):
    venv = _as_if_checkout_at(monkeypatch, f"{mount_path}/a-clone")
    pod = _mounted(tmp_path, mount_path, volume)

    for host in (f"{venv}/bin/python", f"{venv}/bin/redrafter-operator", f"{venv}/lib/python3.11/site-packages"):
        assert pod.translate(host) == host
    for container in (
        mount_path,
        f"{mount_path}/w",
        f"{mount_path}/a-clone2/.venv/bin/python",
        f"{mount_path}/a-clone/.venvs",
    ):
        assert pod.translate(container) == pod.to_host(container)
    assert pod.to_host(f"{mount_path}/w").startswith(str(pod.rootfs))


def test_a_checkout_exactly_at_a_mount_path_keeps_its_venv_and_the_mount_stays_the_containers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    venv = _as_if_checkout_at(monkeypatch, "/cache")
    pod = _mounted(tmp_path, "/cache", {"persistentVolumeClaim": {"claimName": "engine-cache"}})
    assert pod.translate(f"{venv}/bin/python") == f"{venv}/bin/python"
    assert pod.translate("/cache/engines/k1") == pod.to_host("/cache/engines/k1")
    assert pod.translate("/cache") == pod.to_host("/cache")


def test_the_most_specific_prefix_wins_so_a_mount_inside_a_host_directory_is_still_mapped(tmp_path: Path):
    """A host directory that holds a mount path (an interpreter installed under ``/etc``, say) takes nothing
    from the mount: the mount is more specific."""
    fs = HostFS(tmp_path / "node", host_paths=("/etc", "/tmp/x/.venv"))
    pod = fs.pod_root("default", "build-x")
    fs.mount_volumes(
        pod,
        {"volumes": [{"name": "cfg", "configMap": {"name": "cm"}}, {"name": "t", "emptyDir": {}}]},
        {"volumeMounts": [{"name": "cfg", "mountPath": "/etc/redrafter"}, {"name": "t", "mountPath": "/tmp"}]},
        {"cm": {"build.json": "{}"}},
    )
    assert pod.translate("/etc/redrafter/build.json") == pod.to_host("/etc/redrafter/build.json")
    assert Path(pod.translate("/etc/redrafter/build.json")).read_text() == "{}"
    assert pod.translate("/etc/hosts") == "/etc/hosts"  # under no mount: as is
    assert pod.translate("/tmp/x/.venv/bin/python") == "/tmp/x/.venv/bin/python"
    assert pod.translate("/tmp/x") == pod.to_host("/tmp/x")  # not under the venv: the container's


def test_the_stand_in_paths_name_this_interpreter_its_venv_and_this_checkouts_packages(monkeypatch: pytest.MonkeyPatch):
    import engine_jobs
    import redrafter_operator
    import redrafter_sim

    venv = _as_if_checkout_at(monkeypatch, "/tmp/x")
    paths = stand_in_paths()
    assert f"{venv}/bin" in paths and venv in paths and "/" not in paths
    for package in (engine_jobs, redrafter_operator, redrafter_sim):
        assert str(Path(package.__file__).resolve().parent) in paths


async def test_a_job_pod_of_a_checkout_under_tmp_runs_the_host_interpreter_and_maps_its_tmp_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The kubelet's preparation end to end: the rendered ``/tmp`` emptyDir, the interpreter under ``/tmp``;
    the container's own ``/tmp`` arguments and env move into the pod's root, the host program does not."""
    venv = _as_if_checkout_at(monkeypatch, "/tmp/x")
    fs = HostFS(tmp_path / "node")
    root = fs.pod_root("default", "build-x")
    volume, mount = tmp_volume()
    assert mount["mountPath"] == "/tmp"
    container = {
        "name": "build",
        "command": ["python"],
        "args": ["-m", "engine_jobs", "build", "--workdir", "/tmp/w", "--python", f"{venv}/bin/python"],
        "env": [{"name": "TMPDIR", "value": "/tmp"}, {"name": "HOST_BIN", "value": f"{venv}/bin"}],
        "volumeMounts": [mount],
    }
    manifest = {"metadata": {"name": "build-x"}, "spec": {"volumes": [volume], "containers": [container]}}

    argv, env, _ = await ProgramRunner(api=None, fs=fs)._prepare("default", manifest, container, root, "127.244.0.9")  # type: ignore[arg-type]

    assert argv == [
        f"{venv}/bin/python",
        "-m",
        "engine_jobs",
        "build",
        "--workdir",
        root.to_host("/tmp/w"),
        "--python",
        f"{venv}/bin/python",
    ]
    assert env["TMPDIR"] == root.to_host("/tmp") and env["HOST_BIN"] == f"{venv}/bin"
    assert env["REDRAFTER_PYTHON"] == f"{venv}/bin/python"
