"""The PyTorch path's build Job: cache check -> lock -> fetch -> verify -> lay out -> publish.

There is no engine: TensorRT-LLM's PyTorch backend loads Hugging Face checkpoints as they are. The Job
fetches the base, its tokenizer and the drafter (an EAGLE-3 head or a draft model), verifies what the chosen
method needs before any GPU pod waits on it, and publishes one artifact that both variants serve:

    <cache>/<key>/checkpoint/   the base checkpoint
    <cache>/<key>/draft/        the EAGLE-3 head or draft model (eagle3, draftModel)
    <cache>/<key>/tokenizer/    the tokenizer the serving pods load
    <cache>/<key>/model_repo/   a servable Triton repository (llmapi model.yaml), the speculative variant's
    <cache>/<key>/manifest.json written last

Checkpoints downloaded onto the cache volume (hf://, s3://) are renamed into place, not copied: a base can be
hundreds of GiB, and the download cache is never collected, so the artifact becomes the only copy. pvc://
sources are read-only mounts and are copied. The cache protocol (lock, partials, atomic publish) is
:func:`engine_jobs.build.produce`, shared with the ReDrafter build.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import manifest as facts
from .build import Record, copy_tokenizer, fetch_source, fetch_tokenizer, produce, require_free_space, serving_config
from .cache import CachePaths, KeyLock, owner_identity, write_json_atomic
from .contract import (
    CHECKPOINT_DIR,
    DRAFT_DIR,
    MANIFEST_FILE,
    MODEL_REPO_DIR,
    TOKENIZER_DIR,
    BuildSpec,
)
from .errors import BuildError, ExitCode, bad_input
from .fetch import HF_IGNORE, Fetched, parse_uri
from .plan import estimate_prepared_bytes, validate_location
from .progress import Log, format_seconds, human_bytes, tree_size
from .settings import Settings
from .validate import (
    eagle3_hidden_size,
    model_architecture,
    mtp_layers,
    read_config,
    same_vocabulary,
    validate_tokenizer,
    validate_weights,
    vocabularies,
)

#: methods whose drafter is a checkpoint of its own (the others draft from the base or the prompt)
DRAFTER_METHODS = frozenset({"eagle3", "draftModel"})
#: sources fetched onto the cache volume, which may be renamed into place
DOWNLOADED_SCHEMES = frozenset({"hf", "s3"})
#: the manifest's variant: one artifact serves the speculative and the base variant
SHARED_VARIANT = "both"


def validate_prepare_spec(spec: BuildSpec) -> str:
    """The PyTorch path's cross-field rules; returns the method."""
    validate_location(spec)
    if spec.speculative is None:
        raise bad_input("a PyTorch-backend build spec needs speculative (the method and its draft length)")
    method = spec.speculative.method
    if method in DRAFTER_METHODS and spec.drafter is None:
        raise bad_input(f"method {method} needs a drafter in the build spec")
    if method not in DRAFTER_METHODS and spec.drafter is not None:
        raise bad_input(f"method {method} drafts without a drafter checkpoint; the build spec names one")
    if spec.tensor_parallel < 1:
        raise bad_input(f"tensor_parallel must be at least 1, got {spec.tensor_parallel}")
    return method


def prepare(spec: BuildSpec, settings: Settings, log: Log) -> dict[str, Any]:
    """Publish ``<cache>/<key>/`` for a PyTorch-backend method (or find it there); returns its manifest."""
    method = validate_prepare_spec(spec)  # before the key becomes a path
    return produce(
        Path(spec.cache_dir),
        spec.key,
        f"checkpoints {spec.key} ({method}, for both variants; this Job is the {spec.variant} variant's)",
        settings,
        log,
        lambda paths, tmp, lock: assemble(spec, settings, paths, tmp, lock, log),
    )


@dataclass
class Verified:
    """What the checks found; recorded in the manifest."""

    method: str
    architecture: str
    base_config: dict[str, Any]
    tokenizer_files: list[str]
    weights: dict[str, dict[str, Any]] = field(default_factory=dict)
    mtp_layers_declared: int | None = None
    draft_architecture: str | None = None
    eagle3_target_hidden_size: int | None = None
    tokenizer_match: dict[str, Any] | None = None

    def record(self, spec: BuildSpec) -> dict[str, Any]:
        assert spec.speculative is not None
        return {
            "method": self.method,
            "architecture": self.architecture,
            "weights": self.weights,
            "tokenizer_files": self.tokenizer_files,
            "mtp_layers_requested": spec.speculative.max_draft_len if self.method == "mtp" else None,
            "mtp_layers_declared": self.mtp_layers_declared,
            "draft_architecture": self.draft_architecture,
            "eagle3_target_hidden_size": self.eagle3_target_hidden_size,
            "tokenizer_match": self.tokenizer_match,
        }


def verify(spec: BuildSpec, base: Fetched, tokenizer: Fetched, drafter: Fetched | None) -> Verified:
    """Everything the method needs from the fetched files; each failure is bad input naming what is wrong."""
    assert spec.speculative is not None
    method = spec.speculative.method
    config = read_config(base.local_dir, "base")
    found = Verified(
        method=method,
        architecture=model_architecture(config, "base"),
        base_config=config,
        tokenizer_files=validate_tokenizer(tokenizer.local_dir),
    )
    found.weights["checkpoint"] = validate_weights(base.local_dir, "base")
    if method == "mtp":
        found.mtp_layers_declared = mtp_layers(config, spec.speculative.max_draft_len)
    if drafter is None:
        return found
    role = "EAGLE-3 head" if method == "eagle3" else "draft model"
    draft_config = read_config(drafter.local_dir, role)
    found.weights["draft"] = validate_weights(drafter.local_dir, role)
    if method == "eagle3":
        found.eagle3_target_hidden_size = eagle3_hidden_size(draft_config, config)
    else:  # draftModel: a full checkpoint of its own, speaking the target's vocabulary
        found.draft_architecture = model_architecture(draft_config, role)
        vocab = same_vocabulary(
            vocabularies(drafter.local_dir, draft_config),
            vocabularies(tokenizer.local_dir, config),  # the target's vocab_size is the base's
            f"draft model {drafter.uri}",
            f"tokenizer {tokenizer.uri}",
        )
        found.tokenizer_match = {"compared": vocab.source, "size": vocab.size, "digest": vocab.digest}
    return found


# ---- laying the checkpoints out --------------------------------------------------------------------


def movable(src: Fetched, dest_parent: Path) -> bool:
    """A download on the cache volume itself (same filesystem as the artifact): renamed, never copied."""
    if parse_uri(src.uri).scheme not in DOWNLOADED_SCHEMES:
        return False
    try:
        return os.stat(src.local_dir).st_dev == os.stat(dest_parent).st_dev
    except OSError:
        return False


def ignored(rel: str) -> bool:
    """Files the serving pods never read (original/*.pth next to safetensors and the like)."""
    return any(fnmatch.fnmatch(rel, pattern) for pattern in HF_IGNORE)


def _files(root: Path) -> list[Path]:
    """Regular files and links to them under ``root`` (relative), sorted; hidden entries (partial downloads,
    lock files) skipped."""
    out: list[Path] = []
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        rel_dir = Path(dirpath).relative_to(root)
        out.extend(rel_dir / name for name in sorted(files) if not name.startswith("."))
    return out


def copy_tree(src: Path, dest: Path) -> int:
    """Copy a checkpoint (following links) without what serving never reads; bytes copied."""
    total = 0
    for rel in _files(src):
        if ignored(rel.as_posix()):
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / rel, target)
        total += target.stat().st_size
    return total


def move_tree(src: Path, dest: Path) -> int:
    """Rename every file of a download into ``dest``; bytes moved.

    A Hugging Face snapshot holds links into its blob store: the blob is renamed into place and the link
    removed, so the download cache never points at a file it lost (huggingface_hub fetches it again when
    asked). Emptied directories are removed. A file that vanished meanwhile (another builder moved the same
    download) fails the attempt retryably: the next one fetches it again.
    """
    total = 0
    placed: dict[Path, Path] = {}  # blob -> where it went (two snapshot names may share one blob)
    for rel in _files(src):
        path, target = src / rel, dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            if path.is_symlink():
                blob = path.resolve()  # not strict: a blob already placed under another name is gone from here
                if blob in placed:
                    shutil.copy2(placed[blob], target)
                else:
                    os.rename(blob, target)
                    placed[blob] = target
                path.unlink()
            else:
                os.rename(path, target)
        except FileNotFoundError:
            raise BuildError(
                ExitCode.TOOL_FAILURE,
                f"fetched file {rel} vanished from {src} while moving it into place (another builder of the same "
                "source moved it?); a new attempt fetches it again",
            ) from None
        total += target.stat().st_size
    for dirpath, _dirs, _files_ in sorted(os.walk(src), key=lambda e: len(e[0]), reverse=True):
        try:
            os.rmdir(dirpath)
        except OSError:
            pass  # not empty: ignored or hidden files stay with the download
    return total


def place(src: Fetched, dest: Path, move: bool, log: Log) -> int:
    t0 = time.monotonic()
    size = move_tree(src.local_dir, dest) if move else copy_tree(src.local_dir, dest)
    how = "moved" if move else "copied"
    log(f"{src.role}: {how} {human_bytes(size)} into {dest.name}/ in {format_seconds(time.monotonic() - t0)}")
    return size


# ---- the Job ---------------------------------------------------------------------------------------


def assemble(
    spec: BuildSpec, settings: Settings, paths: CachePaths, tmp: Path, lock: KeyLock, log: Log
) -> dict[str, Any]:
    """Everything between owning the lock and publishing; returns the manifest written into ``tmp``."""
    assert spec.speculative is not None
    record = Record()
    t0 = time.monotonic()
    base = fetch_source("base", spec.base, spec, settings, log)
    tokenizer = fetch_tokenizer(spec, base, settings, log)
    drafter = fetch_source("drafter", spec.drafter, spec, settings, log) if spec.drafter is not None else None
    record.add("fetch", time.monotonic() - t0)

    t1 = time.monotonic()
    found = verify(spec, base, tokenizer, drafter)
    record.add("verify", time.monotonic() - t1)
    log(
        f"inputs valid: {found.architecture} base, method {found.method}"
        + (f", {found.mtp_layers_declared} MTP layer(s) declared" if found.mtp_layers_declared else "")
        + (f", tokenizer matches ({found.tokenizer_match['compared']})" if found.tokenizer_match else "")
    )

    moves = {src.role: movable(src, tmp) for src in (base, drafter) if src is not None}
    tokenizer_bytes = sum((tokenizer.local_dir / f).stat().st_size for f in found.tokenizer_files)
    need = estimate_prepared_bytes(
        base.bytes,
        drafter.bytes if drafter else 0,
        tokenizer_bytes,
        frozenset(role for role, move in moves.items() if move),
    )
    require_free_space(spec, need + settings.disk_reserve_bytes, "checkpoint copies, tokenizer", settings, log)
    if lock.lost.is_set():  # before anything irreversible: the downloads are moved next
        raise BuildError(ExitCode.LOCK_TIMEOUT, "another builder took over this artifact's lock; stopping")

    t2 = time.monotonic()
    copy_tokenizer(tokenizer.local_dir, found.tokenizer_files, tmp / TOKENIZER_DIR)  # before base moves
    sizes = {"checkpoint_bytes": place(base, tmp / CHECKPOINT_DIR, moves["base"], log)}
    if drafter is not None:
        sizes["draft_bytes"] = place(drafter, tmp / DRAFT_DIR, moves["drafter"], log)
    sizes["tokenizer_bytes"] = tree_size(tmp / TOKENIZER_DIR)
    record.add("place", time.monotonic() - t2, output_bytes=sum(sizes.values()))

    t3 = time.monotonic()
    final = str(paths.final)
    from .model_repo import write_model_repository  # lazily: the serving half of engine_jobs

    write_model_repository(
        tmp / MODEL_REPO_DIR,
        serving_config(spec, final),
        engine_dir=f"{final}/{CHECKPOINT_DIR}",
        tokenizer_dir=f"{final}/{TOKENIZER_DIR}",
    )
    record.add("model-repository", time.monotonic() - t3)
    log(f"model repository written ({MODEL_REPO_DIR}/, llmapi model.yaml for {found.method})")

    tools = facts.tool_versions(settings.trtllm_build, settings.python)
    manifest = {
        "key": spec.key,
        "variant": SHARED_VARIANT,
        "variants": ["redrafter", "base"],
        "prepared_by": spec.variant,
        "backend": "pytorch",
        "method": found.method,
        "speculative": spec.speculative.model_dump(),
        "inputs": spec.inputs,
        "sources": {src.role: src.record() for src in (base, drafter, tokenizer) if src is not None},
        "verified": found.record(spec),
        "dtype": spec.dtype,
        "tensor_parallel": spec.tensor_parallel,
        "limits": spec.limits.model_dump(),
        "tensorrt_llm_version": facts.tensorrt_llm_version(),
        "gpu": facts.gpu_info(settings.nvidia_smi),
        "tools": {k: v for k, v in tools.items() if k not in ("trtllm_build", "converter_python")},
        "builder": {**owner_identity(), "built_at": facts.utc_now()},
        "steps": record.steps,
        "sizes": {
            **sizes,
            "moved": sorted(role for role, move in moves.items() if move),
            "artifact_bytes": tree_size(tmp),
        },
        "layout": {
            "checkpoint": CHECKPOINT_DIR,
            **({"draft": DRAFT_DIR} if drafter is not None else {}),
            "tokenizer": TOKENIZER_DIR,
            "model_repository": MODEL_REPO_DIR,
        },
        "contract_version": spec.contract_version,
    }
    write_json_atomic(tmp / MANIFEST_FILE, manifest)  # last: its presence means "complete"
    return manifest
