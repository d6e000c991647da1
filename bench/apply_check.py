"""How the operator decides a child needs an apply: the local drift check against a dry-run apply.

    python bench/apply_check.py             # the children of examples/llama3-8b.yaml, 2000 rounds
    python bench/apply_check.py 500         # rounds

Server-side apply leaves two ways to keep an idle operator at zero writes while still repairing drift:
- local: compare the desired manifest's hash with the one last applied, and the operator's own
  ``managedFields`` entry (seen on the watch) with the one the last apply returned (``Applier.in_sync``).
  The API server moves a field out of that entry when anyone else changes or removes it.
- dry-run: send every child as a server-side apply with ``dryRun=All`` at every resync and compare what
  the server would store with what is stored.

Both are run here on the same children in the emulated API server, after a hand edit of an owned field,
and timed. Prints per child: local check time, dry-run round-trip time, and the API requests an idle
operator would make per resync interval for 1,000 resources. Figures, not assertions; the dry-run's time
is the emulator's, a real API server's admission chain costs more.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import requests
import yaml

from redrafter_operator.controller.apply import APPLY_PATCH, MERGE_PATCH, object_path
from redrafter_operator.controller.fingerprints import FIELD_MANAGER, manifest_hash, owned_fields
from redrafter_sim.server import EmulatorThread

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "llama3-8b.yaml"
RESOURCES = 1000


def children() -> list[dict[str, Any]]:
    """What the operator renders for the example (its own CLI, so the manifests are the real ones)."""
    exe = Path(sys.executable).parent / "redrafter-operator"
    out = subprocess.run([str(exe), "render", "-f", str(EXAMPLE)], check=True, capture_output=True, text=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


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
    docs = children()
    with EmulatorThread() as handle, requests.Session() as session:
        url = handle.url
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
        observed = {p: session.get(url + p).json() for p in applied}

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
