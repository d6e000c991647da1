"""Who a simulated container runs as, and what that identity may do with the files the kubelet mounts.

This machine cannot give each container its own UID, so the node models ownership instead: each mounted
Secret file and each writable claim gets the owner, group and mode a real kubelet would leave
(``pkg/volume/volume_linux.go`` SetVolumeOwnership: with ``fsGroup`` a volume is chowned to that group,
files get mode | 0440 on read-only volumes (Secret, ConfigMap) or | 0660 and directories the setgid bit;
without it a Secret file is root:root with ``defaultMode``, a fresh claim root:root 0755). The host file
then carries, in its owner bits, exactly the access that model grants the container's identity, and the
container process runs without the capabilities that bypass file modes (a non-root user has none; root
keeps the runtime's defaults minus what the container drops). The program's own open() therefore fails
with the real EACCES where a node would refuse it, and succeeds where a node would allow it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: the USER of the images this node emulates (images/*.Dockerfile): the operator's runs as 65532,
#: the engine builder and Triton runtime as 10001
IMAGE_USERS = {"redrafter-operator": 65532}
DEFAULT_IMAGE_USER = 10001
#: what containerd/CRI-O grant a container by default (capability numbers, linux/capability.h)
DEFAULT_CAPABILITIES = {
    "CHOWN": 0,
    "DAC_OVERRIDE": 1,
    "FOWNER": 3,
    "FSETID": 4,
    "KILL": 5,
    "SETGID": 6,
    "SETUID": 7,
    "SETPCAP": 8,
    "NET_BIND_SERVICE": 10,
    "NET_RAW": 13,
    "SYS_CHROOT": 18,
    "MKNOD": 27,
    "AUDIT_WRITE": 29,
    "SETFCAP": 31,
}
PR_CAPBSET_DROP = 24
RO_MASK, RW_MASK = 0o440, 0o660
DEFAULT_SECRET_MODE = 0o644  # Secret/ConfigMapVolumeSource.defaultMode when unset


@dataclass(frozen=True)
class Ownership:
    uid: int
    gid: int
    mode: int


#: a freshly provisioned volume's root as most provisioners leave it
PROVISIONED = Ownership(0, 0, 0o755)


@dataclass(frozen=True)
class Identity:
    """The container's user, primary group and supplementary groups (fsGroup, supplementalGroups)."""

    uid: int
    gid: int
    groups: frozenset[int]
    fs_group: int | None
    capabilities: frozenset[int]  # what the process keeps (bounding set after exec)

    @classmethod
    def of(cls, pod_spec: Mapping[str, Any], container: Mapping[str, Any]) -> "Identity":
        pod = pod_spec.get("securityContext") or {}
        ctx = container.get("securityContext") or {}
        image = str(container.get("image", ""))
        image_user = next((u for name, u in IMAGE_USERS.items() if name in image), DEFAULT_IMAGE_USER)
        uid = ctx.get("runAsUser", pod.get("runAsUser", image_user))
        gid = ctx.get("runAsGroup", pod.get("runAsGroup", uid if uid == image_user else 0))
        fs_group = pod.get("fsGroup")
        groups = {gid, *(pod.get("supplementalGroups") or [])} | ({fs_group} if fs_group is not None else set())
        drop = set((ctx.get("capabilities") or {}).get("drop") or [])
        add = set((ctx.get("capabilities") or {}).get("add") or [])
        if uid != 0 or "ALL" in drop:  # a non-root process has no effective capabilities after exec
            caps: set[int] = set()
        else:
            caps = {n for name, n in DEFAULT_CAPABILITIES.items() if name not in drop}
        if uid == 0:
            caps |= {DEFAULT_CAPABILITIES[a] for a in add if a in DEFAULT_CAPABILITIES}
        return cls(int(uid), int(gid), frozenset(int(g) for g in groups), fs_group, frozenset(caps))

    def bits(self, owner: Ownership) -> int:
        """The rwx bits POSIX grants this identity on a file with ``owner`` (root with DAC_OVERRIDE: all)."""
        if self.uid == 0 and DEFAULT_CAPABILITIES["DAC_OVERRIDE"] in self.capabilities:
            return 0o7
        if owner.uid == self.uid:
            return (owner.mode >> 6) & 0o7
        if owner.gid in self.groups:
            return (owner.mode >> 3) & 0o7
        return owner.mode & 0o7

    def secret_file(self, mode: int | None) -> Ownership:
        """A Secret (or ConfigMap) file as the kubelet leaves it for this pod."""
        mode = DEFAULT_SECRET_MODE if mode is None else mode
        if self.fs_group is None:
            return Ownership(0, 0, mode)
        return Ownership(0, self.fs_group, mode | RO_MASK)

    def claim_root(self, provisioned: Ownership) -> Ownership:
        """A writable claim's directory: as provisioned, or chowned to fsGroup and group-writable."""
        if self.fs_group is None:
            return provisioned
        return Ownership(provisioned.uid, self.fs_group, provisioned.mode | 0o2000 | RW_MASK)

    def apply(self, path: Path, owner: Ownership) -> None:
        """Give the host file, in its owner bits, what ``owner`` grants this identity (see module doc)."""
        os.chmod(path, self.bits(owner) << 6)

    def preexec(self) -> None:
        """In the child before exec: drop the capabilities this container does not have from the bounding
        set (needs CAP_SETPCAP, i.e. a root runner; a non-root runner's children have none to drop)."""
        libc = ctypes.CDLL(None, use_errno=True)
        last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
        for cap in range(last + 1):
            if cap not in self.capabilities:
                with contextlib.suppress(Exception):
                    libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
