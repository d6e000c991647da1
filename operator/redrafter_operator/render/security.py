"""The securityContext of every pod the operator creates: Pod Security Standards "restricted".

Each pod runs as its image's own non-root user (the ``USER`` of images/*.Dockerfile, checked by
tests/unit/test_images.py), set explicitly so admission and reviewers need not trust the image.
``fsGroup`` is what makes the mounts usable by that user: the kubelet gives Secret and ConfigMap files
that group (so a 0440 token is readable) and, for volume drivers that support it, makes the engine
cache claim group-writable with the setgid bit, so engines written by a build pod are readable by the
serving pods of the same group. ``OnRootMismatch`` skips the recursive chown of a cache that is
already owned by that group (a full walk of a multi-TB cache would delay every pod start).

Restricted profile, Kubernetes 1.30+ (kubernetes/pod-security-admission policy/check_*.go): no
privilege escalation, capabilities drop ALL, runAsNonRoot, runAsUser != 0, seccomp RuntimeDefault,
only configMap/secret/emptyDir/persistentVolumeClaim (among others) volumes. The root filesystem is
read-only; every pod mounts an emptyDir where its programs write (:data:`TMP_MOUNT`).
"""

from __future__ import annotations

from typing import Any

#: ``USER 10001:10001`` of engine-builder.Dockerfile and triton-runtime.Dockerfile
IMAGE_USER = 10001
#: ``USER 65532:65532`` of operator.Dockerfile (the image the validation Job runs by default)
OPERATOR_USER = 65532
#: Secret files: owner and fsGroup may read, nobody else (0400 would be root-only: unreadable)
SECRET_MODE = 0o440
#: HOME and TMPDIR of every image: Python, huggingface_hub, MPI's session directory, Triton's
#: Python-backend stubs and the serving model repository (engine_jobs serve) all write below it
TMP_MOUNT = "/tmp"
TMP_VOLUME = "tmp"


def pod_security_context(uid: int) -> dict[str, Any]:
    """Pod level: the image user as user, group and fsGroup."""
    return {
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": uid,
        "fsGroup": uid,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context(uid: int) -> dict[str, Any]:
    """Container level (repeats the identity: scanners and some admission policies read only this)."""
    return {
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": uid,
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def tmp_volume() -> tuple[dict[str, Any], dict[str, Any]]:
    """(volume, mount) of the writable scratch directory that a read-only root filesystem needs."""
    return {"name": TMP_VOLUME, "emptyDir": {}}, {"name": TMP_VOLUME, "mountPath": TMP_MOUNT}
