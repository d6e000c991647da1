"""What a container runtime gives a container that this node's host processes otherwise lack: the fixed
in-cluster paths, and a network namespace's view of ``0.0.0.0``.

* **The service-account directory.** Kubernetes clients find their in-cluster identity at fixed paths,
  ``/var/run/secrets/kubernetes.io/serviceaccount/{token,ca.crt,namespace}`` (client-go's ``rest.InClusterConfig``,
  kubernetes-asyncio's ``load_incluster_config``), which no path mapping can redirect. A container that mounts
  that directory therefore runs in a private mount namespace (``unshare(CLONE_NEWNS)``, propagation private), in
  which a tmpfs covers ``/run`` (``/var/run`` links there) and the pod's token volume is bind-mounted read-only
  at the fixed path, as the kubelet mounts it. The tmpfs keeps the host's ``/run`` untouched and unseen, as it
  is from inside a container. Done in the child between fork and exec (root's capabilities are still there);
  the container's own capability set is dropped after it.
* **Listen addresses.** A pod binds ``0.0.0.0`` inside its own network namespace, where it means the pod's IP.
  This node runs pods on the host's loopback with an address each (127.244.x.y, :func:`.objects.pod_ip`) and
  this machine allows servers only on loopback, so an ``0.0.0.0`` in a container's arguments becomes the pod's
  IP (:func:`pod_listen_args`): the same ports in two pods then do not collide, and nothing listens beyond
  loopback.
"""

from __future__ import annotations

import ctypes
import os
import re
from collections.abc import Callable
from pathlib import Path

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
ANY_ADDRESS = "0.0.0.0"
ANY_ADDRESS_ARG = re.compile(r"(?<![\d.])0\.0\.0\.0(?![\d./])")

CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 32, 4096, 16384, 1 << 18


class MountNamespaceError(OSError):
    """The private mount namespace could not be set up (this node must run as root)."""


def pod_listen_args(argv: list[str], pod_ip: str) -> list[str]:
    """The container's arguments with ``0.0.0.0`` (listen on every address of the pod) made the pod's IP; an
    address that merely ends in it (``10.0.0.0``) or a CIDR (``0.0.0.0/0``) is no listen address."""
    return [ANY_ADDRESS_ARG.sub(pod_ip, arg) for arg in argv]


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise MountNamespaceError(errno, f"{what}: {os.strerror(errno)}")


def service_account_mount(token_dir: Path, then: Callable[[], None]) -> Callable[[], None]:
    """A ``preexec_fn``: a private mount namespace with ``token_dir`` at :data:`SERVICE_ACCOUNT_DIR`, then
    ``then()`` (the container identity's capability drop)."""
    source = os.fsencode(token_dir)
    run = os.path.realpath(os.path.dirname(os.path.dirname(os.path.dirname(SERVICE_ACCOUNT_DIR))))  # /var/run
    target = os.path.join(run, os.path.relpath(SERVICE_ACCOUNT_DIR, "/var/run"))

    def preexec() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
        _check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
        _check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
        _check(libc.mount(b"tmpfs", os.fsencode(run), b"tmpfs", 0, b"mode=0755"), f"tmpfs on {run}")
        os.makedirs(target, exist_ok=True)
        _check(libc.mount(source, os.fsencode(target), None, MS_BIND, None), f"bind {token_dir} on {target}")
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        _check(libc.mount(None, os.fsencode(target), None, flags, None), f"read-only {target}")
        then()

    return preexec
