"""The simulated node's disk: persistent claims, and one root directory per pod that mirrors its mounts.

A pod's containers see paths such as ``/cache`` or ``/etc/redrafter/build.json``. On this machine each
pod gets ``<node>/pods/<ns>_<pod>/rootfs`` where every volume mount is a symlink to the volume's host
directory (a claim under ``<node>/pvc/<claim>[/<subPath>]``, a ConfigMap materialised as files, an
emptyDir), so a container path ``P`` is the host path ``rootfs + P``. Claims outlive pods (the engine
cache is shared by build Jobs and serving pods); everything lives under one temp directory.

The node runs host programs in place of the image's (this interpreter, its environment, this checkout's
packages and stand-in toolchain): their paths are host paths, not container paths, and the node never maps
them, wherever the checkout is — also under a path the pods mount (``/tmp`` is an emptyDir in every
rendered pod; ``/cache`` a claim). See :func:`stand_in_paths` and :meth:`PodRoot.translate`.
"""

from __future__ import annotations

import importlib.util
import os
import posixpath
import re
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .podidentity import PROVISIONED, Identity, Ownership

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def _safe(part: str) -> str:
    return _UNSAFE.sub("_", part) or "_"


#: the packages whose programs a pod's containers run on this node in place of the image's
STAND_IN_PACKAGES = ("engine_jobs", "redrafter_operator", "redrafter_sim")


def _under(value: str, prefix: str) -> bool:
    return value == prefix or value.startswith(prefix.rstrip("/") + "/")


def stand_in_paths() -> tuple[str, ...]:
    """The host directories whose files stand in for the image's: never container paths.

    The interpreter's directory (as run and resolved), its environment (the venv: ``sys.prefix``) and
    installation, the packages the containers' commands run (:data:`STAND_IN_PACKAGES`, the toolchain
    inside ``redrafter_sim``) and, for a source checkout, the checkout itself.
    """
    paths: set[str] = set()

    def add(path: str | os.PathLike[str] | None) -> None:
        if path:
            paths.add(os.path.normpath(os.path.abspath(path)))
            paths.add(os.path.realpath(path))

    add(os.path.dirname(sys.executable) if sys.executable else None)
    add(os.path.dirname(os.path.realpath(sys.executable)) if sys.executable else None)
    for prefix in (sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix):
        add(prefix)
    for name in STAND_IN_PACKAGES:
        spec = importlib.util.find_spec(name)
        for location in (spec.submodule_search_locations or []) if spec is not None else []:
            add(location)
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "pyproject.toml").is_file() and (checkout / "sim" / "redrafter_sim").is_dir():
        add(checkout)
    return tuple(sorted(p for p in paths if p != "/"))


@dataclass(frozen=True)
class Mount:
    path: str  # inside the container
    host: Path


@dataclass
class PodRoot:
    """A pod's view of its volumes on this machine."""

    root: Path  # <node>/pods/<ns>_<pod>
    mounts: list[Mount] = field(default_factory=list)
    #: host directories of the programs that stand in for the image's (:func:`stand_in_paths`)
    host_paths: tuple[str, ...] = field(default_factory=stand_in_paths)

    @property
    def rootfs(self) -> Path:
        return self.root / "rootfs"

    def to_host(self, path: str) -> str:
        """The host path of a container path (any absolute path maps under rootfs)."""
        if not path.startswith("/"):
            return path
        return str(self.rootfs) + posixpath.normpath(path)

    def tmp_env(self) -> dict[str, str]:
        """TMPDIR for the pod's processes: its own ``/tmp``, as a container has (what a library leaves there,
        torch's compile cache for one, goes with the pod)."""
        tmp = Path(self.to_host("/tmp"))
        tmp.mkdir(parents=True, exist_ok=True)
        return {"TMPDIR": str(tmp)}

    def translate(self, value: str) -> str:
        """``value`` with a container path under one of the mounts rewritten; other strings unchanged.

        A path under one of :attr:`host_paths` names a host program standing in for the image's, not a
        container path, and is kept — where that host directory is more specific than the mount (a checkout
        at ``/tmp/x`` under the ``/tmp`` emptyDir: ``/tmp/x/.venv/bin/python`` is kept, ``/tmp/w`` maps).
        The most specific prefix wins, as in a mount table; on a tie (a checkout exactly at ``/cache``) the
        mount wins, since ``/cache/...`` is then the container's.
        """
        mount = max((m.path for m in self.mounts if _under(value, m.path)), key=len, default=None)
        if mount is None:
            return value
        if any(_under(value, host) and len(host.rstrip("/")) > len(mount.rstrip("/")) for host in self.host_paths):
            return value
        return self.to_host(value)


class HostFS:
    """The node's directories (``node_dir``) and the claim provisioner."""

    def __init__(self, node_dir: Path, host_paths: tuple[str, ...] | None = None) -> None:
        self.node_dir = Path(node_dir)
        #: host directories of the programs standing in for the image's; never mapped into a pod's root
        self.host_paths = stand_in_paths() if host_paths is None else tuple(host_paths)
        (self.node_dir / "pvc").mkdir(parents=True, exist_ok=True)
        (self.node_dir / "pods").mkdir(parents=True, exist_ok=True)
        #: how each claim's root was provisioned (owner, group, mode) where not root:root 0755
        self.claim_ownership: dict[str, Ownership] = {}
        #: volumes a node laid out itself, by pod root and volume name (a claim resolved through its bound
        #: PersistentVolume, a projected service-account token): mounted as they are
        self.prepared: dict[Path, dict[str, Path]] = {}

    def claims_of(self, pod: PodRoot, pod_spec: Mapping[str, Any]) -> dict[str, Path]:
        """claim name -> host directory, for the pod's claims the node resolved itself."""
        prepared = self.prepared.get(pod.root, {})
        return {
            v["persistentVolumeClaim"]["claimName"]: prepared[v["name"]]
            for v in pod_spec.get("volumes") or []
            if "persistentVolumeClaim" in v and v["name"] in prepared
        }

    def claim_dir(self, claim: str, sub_path: str = "") -> Path:
        path = self.node_dir / "pvc" / _safe(claim)
        if sub_path:
            path = path.joinpath(*(_safe(p) for p in sub_path.strip("/").split("/") if p))
        path.mkdir(parents=True, exist_ok=True)
        return path

    def pod_root(self, namespace: str, name: str) -> PodRoot:
        root = self.node_dir / "pods" / f"{_safe(namespace)}_{_safe(name)}"
        (root / "rootfs").mkdir(parents=True, exist_ok=True)
        return PodRoot(root, host_paths=self.host_paths)

    def remove_pod(self, namespace: str, name: str) -> None:
        self.prepared.pop(self.node_dir / "pods" / f"{_safe(namespace)}_{_safe(name)}", None)
        shutil.rmtree(self.node_dir / "pods" / f"{_safe(namespace)}_{_safe(name)}", ignore_errors=True)

    def mount_volumes(
        self,
        pod: PodRoot,
        pod_spec: Mapping[str, Any],
        container: Mapping[str, Any],
        configmaps: Mapping[str, Mapping[str, str]],
        secrets: Mapping[str, Mapping[str, bytes]] | None = None,
        identity: Identity | None = None,
    ) -> PodRoot:
        """Lay out the container's volume mounts under the pod's rootfs.

        ``configmaps`` / ``secrets`` map a name to its (decoded) data, already fetched by the caller; a
        ConfigMap volume becomes a read-only-by-convention directory of files. With ``identity`` (the
        container's user and groups, :mod:`.podidentity`) Secret files and writable claims get the access
        a node's kubelet would give that identity, so an unreadable token or cache fails the same way.
        """
        volumes = {v["name"]: v for v in pod_spec.get("volumes") or []}
        for vm in container.get("volumeMounts") or []:
            vol = volumes.get(vm["name"])
            if vol is None:
                raise ValueError(f"volumeMount {vm['name']!r} has no volume")
            host = self._volume_dir(pod, vol, configmaps, secrets or {}, identity)
            if vm.get("subPath"):
                host = host.joinpath(*(_safe(p) for p in vm["subPath"].strip("/").split("/") if p))
                host.mkdir(parents=True, exist_ok=True)
            claim = vol.get("persistentVolumeClaim")
            if identity is not None and claim is not None and not vm.get("readOnly") and not claim.get("readOnly"):
                identity.apply(host, identity.claim_root(self.claim_ownership.get(claim["claimName"], PROVISIONED)))
            link = Path(pod.to_host(vm["mountPath"]))
            link.parent.mkdir(parents=True, exist_ok=True)
            if link.is_symlink() or link.exists():
                if link.is_symlink() or link.is_file():
                    link.unlink()
                else:
                    shutil.rmtree(link)
            os.symlink(host, link, target_is_directory=True)
            pod.mounts.append(Mount(vm["mountPath"], host))
        return pod

    def _volume_dir(
        self,
        pod: PodRoot,
        vol: Mapping[str, Any],
        configmaps: Mapping[str, Mapping[str, str]],
        secrets: Mapping[str, Mapping[str, bytes]],
        identity: Identity | None,
    ) -> Path:
        name = _safe(vol["name"])
        prepared = self.prepared.get(pod.root, {}).get(vol["name"])
        if prepared is not None:
            return prepared
        if "persistentVolumeClaim" in vol:
            return self.claim_dir(vol["persistentVolumeClaim"]["claimName"])
        if "configMap" in vol:
            cm = vol["configMap"]["name"]
            if cm not in configmaps:
                raise FileNotFoundError(f"configmap {cm!r} not found")
            target = pod.root / "volumes" / "configmap" / name
            target.mkdir(parents=True, exist_ok=True)
            for key, text in configmaps[cm].items():
                (target / _safe(key)).write_text(text, encoding="utf-8")
                if identity is not None:  # same ownership rules as a Secret volume
                    identity.apply(target / _safe(key), identity.secret_file(vol["configMap"].get("defaultMode")))
            return target
        if "secret" in vol:
            return self._secret_dir(pod, vol, secrets, identity)
        if "emptyDir" in vol:
            target = pod.root / "volumes" / "empty" / name
            target.mkdir(parents=True, exist_ok=True)
            return target
        raise ValueError(f"volume {vol['name']!r}: unsupported volume type {sorted(vol)}")

    @staticmethod
    def _secret_dir(
        pod: PodRoot, vol: Mapping[str, Any], secrets: Mapping[str, Mapping[str, bytes]], identity: Identity | None
    ) -> Path:
        """The Secret's keys as files (``items`` select and rename them), each with its mode's access."""
        src = vol["secret"]
        name = src["secretName"]
        if name not in secrets:
            if src.get("optional"):
                secrets = {name: {}}
            else:
                raise FileNotFoundError(f"secret {name!r} not found")
        target = pod.root / "volumes" / "secret" / _safe(vol["name"])
        target.mkdir(parents=True, exist_ok=True)
        data = secrets[name]
        items = src.get("items") or [{"key": k, "path": k} for k in data]
        for item in items:
            if item["key"] not in data:
                raise FileNotFoundError(f"secret {name!r} has no key {item['key']!r}")
            path = target.joinpath(*(_safe(p) for p in item["path"].split("/")))
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data[item["key"]])
            if identity is not None:
                identity.apply(path, identity.secret_file(item.get("mode", src.get("defaultMode"))))
        return target


def secret_names(pod_spec: Mapping[str, Any]) -> list[str]:
    return [v["secret"]["secretName"] for v in pod_spec.get("volumes") or [] if "secret" in v]


def configmap_names(pod_spec: Mapping[str, Any]) -> list[str]:
    return [v["configMap"]["name"] for v in pod_spec.get("volumes") or [] if "configMap" in v]
