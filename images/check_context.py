"""Prove what an image can contain: its Docker build context and the wheel built from it.

`images/build.sh --dry-run` runs this. For each image it selects the files Docker would send (the image's
`<name>.Dockerfile.dockerignore`, read with the Docker SDK's matcher), builds the `redrafter-operator` wheel from exactly those files as the Dockerfiles do
(`pip wheel --no-deps .`), and fails if either holds the emulated cluster (`redrafter_sim`) or a stand-in
TensorRT-LLM tool: those are development doubles and must never reach a production image.
Exit status: 0 clean, 1 a double would ship.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from docker.utils.build import exclude_paths

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ("operator", "engine-builder", "triton-runtime")
#: Path parts that only the development doubles have (the sim package and its stand-in toolchain).
FORBIDDEN_PARTS = ("redrafter_sim", "toolchain", "fakelib.py", "trtllm-build")


def context_files(image: str, root: Path = ROOT) -> list[str]:
    """The files in `image`'s build context: the Docker SDK's own `.dockerignore` matcher over the directory."""
    lines = (root / "images" / f"{image}.Dockerfile.dockerignore").read_text(encoding="utf-8").splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    return sorted(p for p in exclude_paths(str(root), patterns) if (root / p).is_file())


def forbidden(paths: list[str]) -> list[str]:
    return [p for p in paths if any(part in FORBIDDEN_PARTS for part in Path(p).parts)]


def wheel_files(context: list[str], root: Path = ROOT) -> tuple[str, list[str]]:
    """Build the distribution's wheel from a copy of the context only; return its name and file list."""
    with tempfile.TemporaryDirectory(prefix="image-context-") as tmp:
        src, out = Path(tmp) / "src", Path(tmp) / "wheels"
        for rel in context:
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / rel, src / rel)
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--wheel-dir", str(out), str(src)],
            check=True,
            capture_output=True,
        )
        (wheel,) = out.glob("*.whl")
        with zipfile.ZipFile(wheel) as zf:
            return wheel.name, zf.namelist()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("images", nargs="*", metavar="IMAGE", help=f"any of {', '.join(IMAGES)} (default: all)")
    args = parser.parse_args(argv)
    unknown = set(args.images) - set(IMAGES)
    if unknown:
        parser.error(f"unknown image(s): {', '.join(sorted(unknown))}")
    ok, wheels = True, {}
    for image in args.images or IMAGES:
        context = context_files(image)
        key = tuple(context)
        if key not in wheels:  # the images share one context today: build its wheel once
            wheels[key] = wheel_files(context)
        name, wheel = wheels[key]
        bad = forbidden(context) + forbidden(wheel)
        ok = ok and not bad
        verdict = "no emulated cluster, no stand-in TensorRT-LLM tool" if not bad else f"SHIPS DOUBLES: {bad[:5]}"
        print(f"# {image}: build context {len(context)} files, {name} {len(wheel)} files: {verdict}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
