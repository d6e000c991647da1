"""``python -m engine_jobs cache ls|gc`` on a cache of real engines built by the stand-in toolchain."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from test_engine_build import LLAMA, REPO, Env, llama_pvc, write_model  # same dir

from engine_jobs.cache import CachePaths, KeyLock
from engine_jobs.cache_index import STATE_FILE, TRASH_DIR, iso
from engine_jobs.contract import MANIFEST_FILE
from engine_jobs.progress import Log, tree_size
from redrafter_sim.checkpoint import write_drafter

# key -> (fixture, pvc sources)
ENGINES = {
    "llama-rd-new": ("llama3-8b-redrafter", llama_pvc()),
    "llama-base-new": ("llama3-8b-base", llama_pvc(drafter=None)),
    "llama-rd-old": ("llama3-8b-redrafter", llama_pvc()),
    "llama-base-old": ("llama3-8b-base", llama_pvc(drafter=None)),
}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four engines built once by ``engine_jobs build``; each test copies the cache."""
    e = Env(tmp_path_factory.mktemp("built"))
    write_model(e.sources / "models" / "llama3-8b", LLAMA)
    write_drafter(e.sources / "drafters" / "llama3-8b-redrafter")
    for key, (fixture, sources) in ENGINES.items():
        result = e.run(e.spec(fixture, key=key, **sources))
        assert result.returncode == 0, result.stdout + result.stderr
    return e.cache


#: Runs the real program with shutil.rmtree replaced by a SIGKILL of the process: a crash between the
#: rename into the trash and the removal, without a test hook in the program itself.
CRASH_SHIM = (
    "import os, signal, sys, engine_jobs.cache_gc as gc; "
    "gc.shutil.rmtree = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL); "
    "from engine_jobs.__main__ import main; sys.exit(main(sys.argv[1:]))"
)


class Cache:
    def __init__(self, root: Path, built: Path) -> None:
        self.root = root
        self.dir = root / "cache"
        subprocess.run(["cp", "-a", str(built), str(self.dir)], check=True)
        self.refs = root / "references.json"
        self.termination = root / "termination-log"
        self.set_refs([])

    def set_refs(self, refs: list[tuple[str, str, str, str]]) -> None:
        self.refs.write_text(
            json.dumps(
                {"references": [{"key": k, "namespace": ns, "name": n, "role": role} for k, ns, n, role in refs]}
            )
        )

    def run(
        self, *args: str, env: dict[str, str] | None = None, crash_at_removal: bool = False
    ) -> subprocess.CompletedProcess[str]:
        """``python -m engine_jobs cache ...``; ``crash_at_removal``: the process is SIGKILLed at its first
        directory removal (from outside the program: the shim replaces shutil.rmtree before running it)."""
        entry = ["-c", CRASH_SHIM] if crash_at_removal else ["-m", "engine_jobs"]
        argv = [sys.executable, *entry, "cache", *args, "--local", str(self.dir)]
        return subprocess.run(
            argv,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
            env={"PATH": "/usr/bin:/bin", "REDRAFTER_TERMINATION_LOG": str(self.termination), **(env or {})},
        )

    def gc(
        self, *args: str, env: dict[str, str] | None = None, crash_at_removal: bool = False
    ) -> subprocess.CompletedProcess[str]:
        return self.run("gc", "--references", str(self.refs), *args, env=env, crash_at_removal=crash_at_removal)

    def ls(self) -> dict:
        result = self.run("ls", "--references", str(self.refs), "-o", "json")
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    def complete(self) -> set[str]:
        return {p.parent.name for p in self.dir.glob(f"*/{MANIFEST_FILE}")}

    def report(self) -> dict:
        return json.loads(self.termination.read_text())


@pytest.fixture
def cache(tmp_path: Path, built: Path) -> Cache:
    return Cache(tmp_path, built)


REFS = [
    ("llama-rd-new", "team-a", "llama", "spec.engines.redrafter"),
    ("llama-rd-new", "team-b", "llama-canary", "status.promoted.redrafter"),
    ("llama-base-new", "team-b", "llama-canary", "serving"),
]


def test_ls_lists_every_engine_with_its_facts_and_references(cache: Cache):
    cache.set_refs(REFS)
    doc = cache.ls()
    engines = {e["key"]: e for e in doc["engines"]}
    assert sorted(engines) == sorted(ENGINES)
    for key, engine in engines.items():
        manifest = json.loads((cache.dir / key / MANIFEST_FILE).read_text())
        assert engine["variant"] == manifest["variant"]
        assert engine["model"] == manifest["inputs"]["base"]["source"]
        assert engine["tensorrtLlmVersion"] == "unknown"  # not installed here: recorded honestly
        assert engine["gpuProduct"] == manifest["inputs"]["gpuProduct"]  # no nvidia-smi: the targeted product
        assert engine["builtAt"] == manifest["builder"]["built_at"]
        assert engine["sizeBytes"] == tree_size(cache.dir / key) > 0
    assert [(r["namespace"], r["name"]) for r in engines["llama-rd-new"]["referencedBy"]] == [
        ("team-a", "llama"),
        ("team-b", "llama-canary"),
    ]
    assert engines["llama-rd-old"]["referencedBy"] == [] and engines["llama-rd-old"]["unreferencedSince"] is None
    assert doc["totalBytes"] == sum(e["sizeBytes"] for e in engines.values())
    table = cache.run("ls", "--references", str(cache.refs)).stdout
    assert "team-b/llama-canary (serving)" in table and "unreferenced (since before any collection saw it)" in table
    assert table.splitlines()[0].split()[:3] == ["KEY", "VARIANT", "MODEL"]
    assert cache.complete() == set(ENGINES), "ls must not change anything"
    assert not (cache.dir / STATE_FILE).exists()
    # a collection that removes nothing records since when each engine is unreferenced
    before = iso(time.time())
    assert cache.gc("--max-age", "1000h").returncode == 0 and cache.complete() == set(ENGINES)
    since = {e["key"]: e["unreferencedSince"] for e in cache.ls()["engines"]}
    assert since["llama-rd-new"] is None and before <= since["llama-rd-old"] <= iso(time.time())
    assert f"unreferenced since {since['llama-rd-old']}" in cache.run("ls", "--references", str(cache.refs)).stdout


def test_gc_removes_only_unreferenced_unlocked_engines(cache: Cache):
    cache.set_refs(REFS)
    holder = KeyLock(CachePaths(cache.dir, "llama-base-old").lock, stale_seconds=180, heartbeat_seconds=0.2, log=Log())
    assert holder.try_acquire()
    holder.start_heartbeat()  # a running build holds this key
    try:
        size = tree_size(cache.dir / "llama-rd-old")
        result = cache.gc("--keep", "0")
    finally:
        holder.release()
    assert result.returncode == 0, result.stderr
    assert cache.complete() == {"llama-rd-new", "llama-base-new", "llama-base-old"}
    assert not (cache.dir / "llama-rd-old").exists()
    assert list((cache.dir / TRASH_DIR).iterdir()) == []
    report = cache.report()
    assert [r["key"] for r in report["removed"]] == ["llama-rd-old"]
    assert report["freedBytes"] == report["removed"][0]["bytes"] == size
    assert report["cacheBytes"] == sum(tree_size(cache.dir / k) for k in cache.complete())
    assert "locked by a running build" in result.stdout and "referenced by team-a/llama" in result.stdout


def test_dry_run_removes_nothing(cache: Cache):
    state = {
        "unreferencedSince": {
            "llama-rd-new": iso(time.time() - 3600),
            "llama-base-new": iso(time.time() - 3600),
            "llama-rd-old": iso(time.time() - 60),
            "llama-base-old": iso(time.time() - 60),
        }
    }
    (cache.dir / STATE_FILE).write_text(json.dumps(state))
    result = cache.gc("--keep", "1", "--dry-run", "-o", "json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    # one per model and variant is kept: the most recently referenced
    assert sorted(r["key"] for r in doc["removed"]) == ["llama-base-new", "llama-rd-new"]
    assert doc["dryRun"] is True and cache.complete() == set(ENGINES)
    assert cache.report()["dryRun"] is True
    assert json.loads((cache.dir / STATE_FILE).read_text()) == state, "a dry run writes nothing"


def test_max_age_counts_from_when_a_collection_first_saw_it_unreferenced(cache: Cache):
    cache.set_refs(REFS)
    assert cache.gc("--max-age", "1h").returncode == 0
    assert cache.complete() == set(ENGINES), "first seen unreferenced now: younger than an hour"
    state = json.loads((cache.dir / STATE_FILE).read_text())
    assert sorted(state["unreferencedSince"]) == ["llama-base-old", "llama-rd-old"]
    state["unreferencedSince"]["llama-rd-old"] = iso(time.time() - 7200)
    (cache.dir / STATE_FILE).write_text(json.dumps(state))
    assert cache.gc("--max-age", "1h").returncode == 0
    assert cache.complete() == {"llama-rd-new", "llama-base-new", "llama-base-old"}


def test_crash_between_rename_and_removal_is_finished_by_the_rerun(cache: Cache):
    cache.set_refs(REFS)
    size = tree_size(cache.dir / "llama-base-old")
    manifest_bytes = (cache.dir / "llama-base-old" / MANIFEST_FILE).stat().st_size
    result = cache.gc("--keep", "0", crash_at_removal=True)
    assert result.returncode == -9  # killed at the first removal (keys in order)
    assert not (cache.dir / "llama-base-old").exists(), "renamed away before the crash"
    trash = list((cache.dir / TRASH_DIR).iterdir())
    assert [p.name.split(".")[0] for p in trash] == ["llama-base-old"]
    assert not (trash[0] / MANIFEST_FILE).exists(), "the manifest goes first"
    assert not list(cache.dir.glob("*.lock")), "the key's lock was released before the crash point"
    assert "llama-base-old" not in {e["key"] for e in cache.ls()["engines"]}
    assert "llama-rd-old" in cache.complete(), "not reached before the crash"
    rerun = cache.gc("--keep", "0")
    assert rerun.returncode == 0, rerun.stderr
    assert list((cache.dir / TRASH_DIR).iterdir()) == []
    removed = {r["key"]: r for r in cache.report()["removed"]}
    assert removed["llama-base-old"]["bytes"] == size - manifest_bytes  # what was left in the trash
    assert removed["llama-base-old"]["note"] == "interrupted earlier"
    assert set(removed) == {"llama-rd-old", "llama-base-old"}
    assert cache.complete() == {"llama-rd-new", "llama-base-new"}


def test_a_reference_added_after_planning_is_honoured(cache: Cache):
    """The references file is re-read at deletion time: the operator's update in between wins."""
    cache.set_refs(REFS)
    from engine_jobs import cache_gc

    real_plan = cache_gc.plan
    added = threading.Event()

    def plan_then_reference(*args, **kwargs):
        decisions = real_plan(*args, **kwargs)
        cache.set_refs([*REFS, ("llama-rd-old", "team-c", "late", "spec.engines.redrafter")])
        added.set()
        return decisions

    cache_gc.plan = plan_then_reference
    try:
        report = cache_gc.collect(
            cache.dir, str(cache.refs), cache_gc.Retention(keep=0), stale_seconds=180, dry_run=False, log=Log()
        )
    finally:
        cache_gc.plan = real_plan
    assert added.is_set()
    assert [r["key"] for r in report.removed] == ["llama-base-old"]
    assert report.skipped == [{"key": "llama-rd-old", "reason": "referenced by team-c/late (spec.engines.redrafter)"}]
    assert "llama-rd-old" in cache.complete()


@pytest.mark.parametrize("content", ["{not json", '{"references": [{"key": "x"}]}', '["x"]'])
def test_bad_references_remove_nothing(cache: Cache, content: str):
    cache.refs.write_text(content)
    result = cache.gc("--keep", "0")
    assert result.returncode == 2
    assert "references file" in result.stderr
    assert cache.termination.read_text().startswith("BAD_INPUT: references file")
    assert cache.complete() == set(ENGINES)


def test_gc_needs_a_retention(cache: Cache):
    result = cache.gc()
    assert result.returncode == 2 and "--keep N and/or --max-age" in result.stderr
    assert cache.gc("--max-age", "3 days").returncode == 2
    assert cache.complete() == set(ENGINES)


def test_a_removed_engine_is_rebuilt_not_found_half(tmp_path: Path, cache: Cache):
    """After a collection, a builder of the same key finds no manifest and builds it again."""
    assert cache.gc("--keep", "0").returncode == 0
    assert cache.complete() == set()
    e = Env(tmp_path / "rebuild")
    write_model(e.sources / "models" / "llama3-8b", LLAMA)
    write_drafter(e.sources / "drafters" / "llama3-8b-redrafter")
    e.cache = cache.dir
    fixture, sources = ENGINES["llama-rd-old"]
    result = e.run(e.spec(fixture, key="llama-rd-old", **sources))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "cache hit" not in result.stdout and cache.complete() == {"llama-rd-old"}


def test_gc_reclaims_abandoned_partial_builds_not_running_ones(cache: Cache):
    """Temp directories and manifest-less directories of dead builders go, whatever the retention; a running
    build's stays; ``ls`` shows them apart from the engines."""

    def half_built(name: str, size: int) -> Path:
        (cache.dir / name / "engine").mkdir(parents=True)
        (cache.dir / name / "engine" / "rank0.engine").write_bytes(b"\0" * size)
        return cache.dir / name

    dead = half_built(".tmp-llama-rd-new-build-pod-1-77", 5000)  # its key has '-', so has its host
    (cache.dir / "llama-rd-new.lock").write_text(
        json.dumps({"owner": "build-pod-1", "pid": 77, "token": "t", "heartbeat": time.time() - 3600})
    )
    no_manifest = half_built("llama-half", 3000)
    running = half_built(".tmp-llama-next-node-5", 1000)
    holder = KeyLock(CachePaths(cache.dir, "llama-next").lock, stale_seconds=180, heartbeat_seconds=0.2, log=Log())
    assert holder.try_acquire()
    holder.start_heartbeat()
    try:
        listing = cache.ls()
        assert [(p["entry"], p["key"], p["lockedBy"] is not None) for p in listing["partials"]] == [
            (running.name, "llama-next", True),
            (dead.name, "llama-rd-new", False),
            ("llama-half", "llama-half", False),
        ]
        assert "3 partial build(s)" in cache.run("ls").stdout
        result = cache.gc("--keep", "5")
    finally:
        holder.release()
    assert result.returncode == 0, result.stderr
    assert not dead.exists() and not no_manifest.exists() and running.is_dir()
    assert cache.complete() == set(ENGINES), "the retention keeps every engine"
    report = cache.report()
    assert sorted((r["key"], r["variant"], r["bytes"]) for r in report["removed"]) == [
        ("llama-half", "partial", 3000),
        ("llama-rd-new", "partial", 5000),
    ]
    assert report["freedBytes"] == 8000 and report["removedPartials"] == 2
    assert any(s["key"] == "llama-next" and "locked by a running build" in s["reason"] for s in report["skipped"])
    assert not list(cache.dir.glob("*.lock*")), "the stale lock taken over, and the locks taken, are released"
