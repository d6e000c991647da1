"""How the operator decides a child needs an apply: the local drift check against a dry-run apply.

    python bench/apply_check.py             # the children of examples/llama3-8b.yaml, 2000 rounds
    python bench/apply_check.py 500         # rounds

Server-side apply leaves two ways to keep an idle operator at zero writes while still repairing drift:
- local: compare the desired manifest's hash with the one last applied, and the operator's own
  ``managedFields`` entry (seen on the watch) with the one the last apply returned (``Applier.in_sync``).
  The API server moves a field out of that entry when anyone else changes or removes it.
- dry-run: send every child as a server-side apply with ``dryRun=All`` at every resync and compare what
  the server would store with what is stored.

Both are run here on the same children on a real control plane (etcd, kube-apiserver, the controller manager
and the scheduler from ``make controlplane``; no node, so the children's pods stay Pending), after a hand edit of
an owned field, and timed. Prints per child: local check time, dry-run round-trip time (kube-apiserver's
admission chain and etcd's dry-run path included), and the API requests an idle operator would make per resync
interval for 1,000 resources. Figures, not assertions.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import requests
import yaml

from redrafter_operator.api import API_VERSION, PLURAL
from redrafter_operator.api.crd import crd_yaml
from redrafter_operator.controller.apply import APPLY_PATCH, MERGE_PATCH, object_path
from redrafter_operator.controller.fingerprints import FIELD_MANAGER, manifest_hash, owned_fields
from redrafter_sim.controlplane import ControlPlane

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "llama3-8b.yaml"
RESOURCES = 1000
NAMESPACE = "apply-check"


def admin_session(cp: ControlPlane) -> requests.Session:
    """HTTP as the cluster's admin (its client certificate), trusting the cluster's CA."""
    session = requests.Session()
    session.trust_env = False  # REQUESTS_CA_BUNDLE or a proxy from the environment would win over these
    session.cert = (str(cp.admin.cert), str(cp.admin.key))
    session.verify = str(cp.pki.ca.cert)
    return session


def owner(session: requests.Session, cp: ControlPlane, tmp: Path) -> Path:
    """The CRD installed and the example created in ``NAMESPACE``: written back with its uid, the children's
    ownerReferences name a real owner (the garbage collector deletes children of an owner that does not exist)."""
    url, crd = cp.url, f"{PLURAL}.{API_VERSION.split('/')[0]}"
    r = session.patch(
        f"{url}/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}",
        params={"fieldManager": "apply-check", "force": "true"},
        data=json.dumps(yaml.safe_load(crd_yaml())),
        headers={"Content-Type": APPLY_PATCH},
    )
    r.raise_for_status()
    cp.wait_established(crd)
    session.post(f"{url}/api/v1/namespaces", json={"metadata": {"name": NAMESPACE}}).raise_for_status()
    body = yaml.safe_load(EXAMPLE.read_text())
    body["metadata"]["namespace"] = NAMESPACE
    r = session.post(f"{url}/apis/{API_VERSION}/namespaces/{NAMESPACE}/{PLURAL}", json=body)
    r.raise_for_status()
    stored = tmp / EXAMPLE.name
    stored.write_text(yaml.safe_dump(r.json()))
    return stored


def children(example: Path) -> list[dict[str, Any]]:
    """What the operator renders for the example (its own CLI, so the manifests are the real ones)."""
    exe = Path(sys.executable).parent / "redrafter-operator"
    out = subprocess.run([str(exe), "render", "-f", str(example)], check=True, capture_output=True, text=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def settled(session: requests.Session, url: str, paths: list[str]) -> dict[str, dict[str, Any]]:
    """The children once the controllers are done with them (a Deployment's new ReplicaSet and revision after the
    edit, the Jobs' and Deployments' status): what an up-to-date watch shows an idle operator."""
    last: dict[str, str] = {}
    while True:
        seen = {p: session.get(url + p).json() for p in paths}
        versions = {p: o["metadata"]["resourceVersion"] for p, o in seen.items()}
        rolled = all(
            o["kind"] != "Deployment" or o.get("status", {}).get("observedGeneration") == o["metadata"]["generation"]
            for o in seen.values()
        )
        if rolled and versions == last:
            return seen
        last = versions
        time.sleep(1.0)  # quiet for a second: nothing is still changing them


def apply(session: requests.Session, url: str, manifest: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
    params = {"fieldManager": FIELD_MANAGER, "force": "true"}
    if dry_run:
        params["dryRun"] = "All"
    r = session.patch(
        url + object_path(manifest), params=params, data=json.dumps(manifest), headers={"Content-Type": APPLY_PATCH}
    )
    r.raise_for_status()
    return r.json()


def comparable(obj: dict[str, Any]) -> dict[str, Any]:
    """An object without what every write changes (resourceVersion, managedFields times)."""
    meta = {k: v for k, v in obj.get("metadata", {}).items() if k not in ("resourceVersion", "managedFields")}
    return {**obj, "metadata": meta}


def main(argv: list[str]) -> int:
    rounds = int(argv[0]) if argv else 2000
    with tempfile.TemporaryDirectory(prefix="redrafter-apply-check-") as tmp_name:
        tmp = Path(tmp_name)
        with ControlPlane(tmp / "controlplane") as cp, admin_session(cp) as session:
            return measure(session, cp.url, children(owner(session, cp, tmp)), rounds)


def measure(session: requests.Session, url: str, docs: list[dict[str, Any]], rounds: int) -> int:
    applied = {object_path(d): apply(session, url, d) for d in docs}
    memory = {p: (manifest_hash(d), owned_fields(applied[p])) for p, d in zip(applied, docs)}
    # A hand edit of an owned field of the Deployment (another manager takes it), as kubectl edit does.
    dep = next(d for d in docs if d["kind"] == "Deployment")
    path = object_path(dep)
    r = session.patch(
        url + path,
        params={"fieldManager": "kubectl-edit"},
        data=json.dumps(
            {"spec": {"template": {"spec": {"nodeSelector": {"nvidia.com/gpu.product": "edited-by-hand"}}}}}
        ),
        headers={"Content-Type": MERGE_PATCH},
    )
    r.raise_for_status()
    observed = settled(session, url, list(applied))

    def local(d: dict[str, Any]) -> bool:
        digest, owned = memory[object_path(d)]
        return digest == manifest_hash(d) and owned == owned_fields(observed[object_path(d)])

    def dry(d: dict[str, Any]) -> bool:
        return comparable(apply(session, url, d, dry_run=True)) == comparable(observed[object_path(d)])

    drift_local = [d["metadata"]["name"] for d in docs if not local(d)]
    drift_dry = [d["metadata"]["name"] for d in docs if not dry(d)]
    start = time.perf_counter()
    for _ in range(rounds):
        for d in docs:
            local(d)
    local_us = (time.perf_counter() - start) / (rounds * len(docs)) * 1e6
    dry_rounds = max(1, rounds // 20)
    start = time.perf_counter()
    for _ in range(dry_rounds):
        for d in docs:
            dry(d)
    dry_ms = (time.perf_counter() - start) / (dry_rounds * len(docs)) * 1e3
    print(f"children of {EXAMPLE.name}: {len(docs)}; after a hand edit of {dep['metadata']['name']}'s nodeSelector")
    print(
        f"{'check':>8} {'drift seen in':>28} {'per child':>12} {'requests per resync, ' + str(RESOURCES) + ' resources':>38}"
    )
    print(f"{'local':>8} {', '.join(drift_local) or '-':>28} {local_us:>9.1f} us {0:>38}")
    print(f"{'dry-run':>8} {', '.join(drift_dry) or '-':>28} {dry_ms:>9.2f} ms {RESOURCES * len(docs):>38}")
    return 0 if drift_local == drift_dry == [dep["metadata"]["name"]] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
