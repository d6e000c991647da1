"""`redrafter-sim cluster`: the development cluster to poke at with kubectl — the control plane `make controlplane`
builds, the project's CRD, and simulated GPU nodes (a kubelet each: they run the pods' real programs and real Triton)
— until interrupted. Its admin kubeconfig is written where ``--kubeconfig`` says."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from . import nodes
from .controlplane import ControlPlane, ControlPlaneError, repo_root, write_yaml
from .node import SimNode


async def serve(kubeconfig: Path, workdir: Path) -> None:
    cp = ControlPlane(workdir / "controlplane").start()
    started: list[SimNode] = []
    try:
        kubectl = Path(sys.executable).parent / "kubectl"
        crds = repo_root() / "crds"
        write_yaml(kubeconfig, cp.kubeconfig(cp.admin))
        subprocess.run(
            [str(kubectl), "--kubeconfig", str(kubeconfig), "apply", "--server-side", "-f", str(crds)],
            check=True,
            capture_output=True,
        )
        for name, product, gpus in nodes.DEFAULT_NODES:
            node = SimNode(cp.node_kubeconfig(name), name=name, product=product, gpus=gpus, node_dir=workdir / name)
            await node.start()
            started.append(node)
        print(f"control plane at {cp.url}; nodes: {', '.join(n.name for n in started)}")
        print(f"export KUBECONFIG={kubeconfig}   # Ctrl-C stops everything")
        await asyncio.Event().wait()
    finally:
        for node in started:
            await node.stop()
        cp.stop()


def main(argv: list[str], prog: str) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__)
    parser.add_argument("--kubeconfig", default="/tmp/redrafter-sim.kubeconfig", help="where to write the admin's")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="redrafter-sim-cluster-"))
    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve(Path(args.kubeconfig), workdir))
    except ControlPlaneError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0
