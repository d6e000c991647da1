"""The volumes a kubelet lays out itself from the API, for the node (:mod:`.node`) on a real control plane.

* A PersistentVolumeClaim is followed to the PersistentVolume bound to it (``spec.volumeName``) and mounted from
  that volume's ``hostPath``/``local`` directory, as the kubelet's volume manager mounts what the PV names.
  :func:`claim_objects` makes a PV under the node's directory and a claim bound to it (what a provisioner does).
* A projected volume (the ``kube-api-access-*`` volume the ServiceAccount admission plugin adds) gets a bound
  service-account token from the TokenRequest API, made as the node for this Pod (NodeRestriction allows no
  other), plus its ConfigMap, Secret and downward-API items (``ca.crt``, ``namespace``).

ConfigMap, Secret and emptyDir volumes stay with :class:`~.hostfs.HostFS`; what this module lays out is handed
to it through ``HostFS.prepared``, by pod root and volume name.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .hostfs import HostFS, PodRoot
from .kubeapi import CONFIGMAPS, PVCS, PVS, SECRETS, SERVICE_ACCOUNTS, KubeApi

TOKEN_SECONDS = 3607  # what the ServiceAccount admission plugin writes for kube-api-access-* volumes


class VolumeNotReady(RuntimeError):
    """The volume cannot be mounted yet (an unbound claim, a PV this node cannot use): the kubelet retries."""


def claim_objects(
    namespace: str,
    claim: str,
    host_dir: Path,
    size: str = "100Gi",
    modes: tuple[str, ...] = ("ReadWriteMany",),
    pv_name: str | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A hostPath PersistentVolume at ``host_dir`` pre-bound to the claim, and the claim naming it (ReadWriteMany
    unless ``modes`` says otherwise): the PV binder binds the pair at once. ``pv_name``: the volume's, where a
    namespace makes the same claim more than once."""
    pv_name = pv_name or f"{namespace}-{claim}"[:253]
    pv = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": pv_name},
        "spec": {
            "capacity": {"storage": size},
            "accessModes": list(modes),
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "hostPath": {"path": str(host_dir), "type": "DirectoryOrCreate"},
            "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": namespace, "name": claim},
        },
    }
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": claim, "namespace": namespace},
        "spec": {
            "accessModes": list(modes),
            "storageClassName": "",
            "volumeName": pv_name,
            "resources": {"requests": {"storage": size}},
        },
    }
    return pv, pvc


async def claim_host_dir(api: KubeApi, namespace: str, claim: str, node_dir: Path) -> Path:
    """The directory of the PersistentVolume bound to ``claim`` (it must lie under ``node_dir``)."""
    pvc = await api.get(PVCS, claim, namespace)
    if pvc is None:
        raise VolumeNotReady(f'persistentvolumeclaim "{claim}" not found')
    volume = (pvc.get("spec") or {}).get("volumeName")
    if not volume or (pvc.get("status") or {}).get("phase") != "Bound":
        raise VolumeNotReady(f'persistentvolumeclaim "{claim}" is not bound')
    pv = await api.get(PVS, volume, None)
    spec = (pv or {}).get("spec") or {}
    path = (spec.get("hostPath") or spec.get("local") or {}).get("path")
    if not path:
        raise VolumeNotReady(f'persistentvolume "{volume}" has no hostPath or local path this node can mount')
    host = Path(path)
    if not host.resolve().is_relative_to(node_dir.resolve()):
        raise VolumeNotReady(f'persistentvolume "{volume}": {host} is not under this node\'s directory')
    host.mkdir(parents=True, exist_ok=True)
    return host


def _field(pod: Mapping[str, Any], path: str) -> str:
    meta = pod.get("metadata") or {}
    simple = {"metadata.namespace": "namespace", "metadata.name": "name", "metadata.uid": "uid"}
    if path in simple:
        return str(meta.get(simple[path], ""))
    if path in ("metadata.labels", "metadata.annotations"):
        items = meta.get(path.split(".")[1]) or {}
        return "\n".join(f'{k}="{v}"' for k, v in sorted(items.items()))
    if path == "spec.serviceAccountName":
        return str((pod.get("spec") or {}).get("serviceAccountName", "default"))
    if path == "spec.nodeName":
        return str((pod.get("spec") or {}).get("nodeName", ""))
    raise VolumeNotReady(f"downwardAPI fieldRef {path!r} is not supported by this node")


async def projected_files(api: KubeApi, pod: Mapping[str, Any], volume: Mapping[str, Any]) -> dict[str, bytes]:
    """path -> content of a projected volume, fetched as the node."""
    meta, spec = pod["metadata"], pod.get("spec") or {}
    ns = meta["namespace"]
    files: dict[str, bytes] = {}
    for source in (volume.get("projected") or {}).get("sources") or []:
        if "serviceAccountToken" in source:
            src = source["serviceAccountToken"]
            request = {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {
                    "audiences": [src["audience"]] if src.get("audience") else [],
                    "expirationSeconds": int(src.get("expirationSeconds") or TOKEN_SECONDS),
                    "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]},
                },
            }
            account = spec.get("serviceAccountName") or "default"
            answer = await api.create(SERVICE_ACCOUNTS, request, ns, subresource="token", name=account)
            files[src["path"]] = str(answer["status"]["token"]).encode()
        for key, kind in (("configMap", CONFIGMAPS), ("secret", SECRETS)):
            if key not in source:
                continue
            src = source[key]
            obj = await api.get(kind, src["name"], ns)
            if obj is None:
                if src.get("optional"):
                    continue
                raise VolumeNotReady(f'{key.lower()} "{src["name"]}" not found')
            if key == "secret":
                data = {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
            else:
                data = {k: str(v).encode() for k, v in (obj.get("data") or {}).items()}
            for item in src.get("items") or [{"key": k, "path": k} for k in data]:
                if item["key"] not in data:
                    raise VolumeNotReady(f'{key.lower()} "{src["name"]}" has no key {item["key"]!r}')
                files[item["path"]] = data[item["key"]]
        for item in (source.get("downwardAPI") or {}).get("items") or []:
            files[item["path"]] = _field(pod, (item.get("fieldRef") or {}).get("fieldPath", "")).encode()
    return files


async def prepare_volumes(api: KubeApi, fs: HostFS, pod: Mapping[str, Any]) -> PodRoot:
    """Resolve the Pod's claims and write its projected volumes; registered in ``fs.prepared`` for its mounts."""
    meta = pod["metadata"]
    root = fs.pod_root(meta["namespace"], meta["name"])
    prepared: dict[str, Path] = {}
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        if "persistentVolumeClaim" in volume:
            claim = volume["persistentVolumeClaim"]["claimName"]
            prepared[volume["name"]] = await claim_host_dir(api, meta["namespace"], claim, fs.node_dir)
        elif "projected" in volume:
            target = root.root / "volumes" / "projected" / volume["name"]
            target.mkdir(parents=True, exist_ok=True)
            for rel, content in (await projected_files(api, pod, volume)).items():
                path = target.joinpath(*(p for p in rel.split("/") if p not in ("", ".", "..")))
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(content)
                path.chmod(0o644)
            prepared[volume["name"]] = target
    fs.prepared[root.root] = prepared
    return root
