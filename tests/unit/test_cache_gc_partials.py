"""The collection reclaims abandoned partial builds: temp directories and ``<key>/`` without manifest.

Only a live build lock protects a partial build (nothing references one); a temp name that could belong
to several keys is protected by the live lock of any of them; a ``.tmp-`` entry that is no builder's is
left alone; ``ls`` shows partial builds apart from engines.
"""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest

from engine_jobs import cache_gc
from engine_jobs.__main__ import main
from engine_jobs.cache import CachePaths, publish, tmp_key_candidates, write_json_atomic
from engine_jobs.cache_index import TRASH_DIR, find_partials, iso
from engine_jobs.contract import MANIFEST_FILE
from engine_jobs.progress import Log, tree_size
from redrafter_operator.controller.retention import report_event

STALE = 180.0
KEY = "0123456789abcdef0123"  # the operator's key shape


@pytest.fixture
def root(tmp_path: Path) -> Path:
    cache = tmp_path / "cache"
    cache.mkdir()
    return cache


def refs_file(tmp_path: Path, keys: list[str] = []) -> str:  # noqa: B006 (never mutated)
    path = tmp_path / "refs.json"
    path.write_text(
        json.dumps(
            {
                "references": [
                    {"key": k, "namespace": "ns", "name": f"rd-{i}", "role": "spec"} for i, k in enumerate(keys)
                ]
            }
        )
    )
    return str(path)


def partial(root: Path, name: str, size: int = 1000) -> Path:
    """A builder's half-written output: some bytes, no manifest."""
    path = root / name
    (path / "engine").mkdir(parents=True)
    (path / "engine" / "rank0.engine").write_bytes(b"\0" * size)
    return path


def lock(root: Path, key: str, age: float) -> None:
    CachePaths(root, key).lock.write_text(
        json.dumps({"owner": f"build-{key}", "pid": 7, "token": f"t-{key}", "heartbeat": time.time() - age})
    )


def engine(root: Path, key: str) -> None:
    paths = CachePaths(root, key)
    tmp = paths.new_tmp()
    (tmp / "engine").mkdir(parents=True)
    (tmp / "engine" / "rank0.engine").write_bytes(b"\0" * 100)
    write_json_atomic(
        tmp / MANIFEST_FILE,
        {
            "key": key,
            "variant": "base",
            "inputs": {"base": {"source": "hf://m"}},
            "builder": {"built_at": iso(time.time())},
        },
    )
    publish(tmp, paths.final)


def collect(root: Path, refs: str, *, dry_run: bool = False, keep: int = 5) -> tuple[cache_gc.Report, str]:
    out = io.StringIO()
    report = cache_gc.collect(
        root, refs, cache_gc.Retention(keep=keep), stale_seconds=STALE, dry_run=dry_run, log=Log(stream=out)
    )
    return report, out.getvalue()


@pytest.mark.parametrize(
    ("name", "candidates"),
    [
        (f".tmp-{KEY}-redrafter-build-x7k2p-1", [KEY, f"{KEY}-redrafter", f"{KEY}-redrafter-build"]),
        (".tmp-abc-host-12", ["abc"]),
        (".tmp-llama-rd-new-node-3-42", ["llama", "llama-rd", "llama-rd-new", "llama-rd-new-node"]),
        (".tmp-abc-host", []),  # no pid
        (".tmp-abc-host-1x", []),
        (".tmp-abc--1", []),  # no host
        (".tmp--host-1", []),  # no key
        (".tmp-_bad-host-1", []),  # not a key
        ("abc-host-1", []),
    ],
)
def test_temp_names_parse_into_every_key_they_may_belong_to(name: str, candidates: list[str]):
    assert tmp_key_candidates(name) == candidates


def test_a_partial_build_with_a_live_lock_is_never_removed(tmp_path: Path, root: Path):
    tmp = partial(root, f".tmp-{KEY}-build-pod-1")
    final = partial(root, "k2")  # <key>/ without manifest, its build running
    lock(root, KEY, 1)
    lock(root, "k2", 1)
    report, out = collect(root, refs_file(tmp_path))
    assert tmp.is_dir() and final.is_dir()
    assert report.removed == [] and report.freed_bytes == 0
    assert {s["key"] for s in report.skipped} == {KEY, "k2"}
    assert all("locked by a running build" in s["reason"] for s in report.skipped)
    assert "keep partial build" in out
    assert CachePaths(root, KEY).lock.exists() and CachePaths(root, "k2").lock.exists()


@pytest.mark.parametrize("lock_age", [None, STALE * 10], ids=["no-lock", "stale-lock"])
def test_a_dead_builders_partial_build_is_removed_and_reported(tmp_path: Path, root: Path, lock_age: float | None):
    engine(root, "kept-engine")
    tmp = partial(root, f".tmp-{KEY}-build-pod-1", size=5000)
    other = partial(root, f".tmp-{KEY}-build-pod-2", size=3000)  # a second dead attempt of the same key
    if lock_age is not None:
        lock(root, KEY, lock_age)
    report, out = collect(root, refs_file(tmp_path), keep=5)
    assert not tmp.exists() and not other.exists()
    assert sorted((r["key"], r["variant"], r["bytes"]) for r in report.removed) == [
        (KEY, "partial", 3000),
        (KEY, "partial", 5000),
    ]
    assert all(r["note"].startswith("abandoned partial build .tmp-") for r in report.removed)
    assert report.freed_bytes == 8000 and report.to_json()["removedPartials"] == 2
    assert json.loads(report.termination_message())["freedBytes"] == 8000
    assert not CachePaths(root, KEY).lock.exists(), "the stale lock is taken over and released"
    assert not list((root / TRASH_DIR).iterdir())
    assert (root / "kept-engine" / MANIFEST_FILE).is_file(), "retention still keeps engines"
    assert "removed abandoned partial build" in out and "1 abandoned partial build" not in out
    assert "2 abandoned partial build(s)" in out
    # the operator's Event tells them apart from engines
    event = report_event(json.loads(report.termination_message()), "engine-cache")
    reason, message = event.reason, event.message
    assert reason == "EngineCacheCollected"
    assert "removed 0 engine(s) and 2 abandoned partial build(s)" in message and f"{KEY} (partial)" in message


def test_a_final_directory_without_manifest_is_a_partial_build(tmp_path: Path, root: Path):
    """Nothing serves a directory without manifest: a reference does not keep it, a retention does not either."""
    final = partial(root, "half-done", size=2000)
    lock(root, "half-done", STALE * 10)
    report, _ = collect(root, refs_file(tmp_path, ["half-done"]), keep=5)
    assert not final.exists()
    assert [(r["key"], r["variant"], r["bytes"]) for r in report.removed] == [("half-done", "partial", 2000)]


def test_dry_run_lists_partial_builds_and_touches_nothing(tmp_path: Path, root: Path):
    dead = partial(root, f".tmp-{KEY}-build-pod-1", size=4000)
    live = partial(root, ".tmp-live-build-pod-1")
    final = partial(root, "nomanifest", size=10)
    lock(root, KEY, STALE * 10)
    lock(root, "live", 1)
    before = sorted(p.name for p in root.iterdir())
    report, out = collect(root, refs_file(tmp_path), dry_run=True)
    assert sorted(p.name for p in root.iterdir()) == before
    assert dead.is_dir() and live.is_dir() and final.is_dir()
    assert sorted((r["key"], r["bytes"]) for r in report.removed) == [(KEY, 4000), ("nomanifest", 10)]
    assert report.freed_bytes == 4010 and report.dry_run
    assert [s["key"] for s in report.skipped] == ["live"]
    assert "would remove abandoned partial build" in out


def test_entries_that_are_no_builders_temp_directory_are_left_alone(tmp_path: Path, root: Path):
    junk = [partial(root, ".tmp-junk"), partial(root, ".tmp-abc-host-notapid"), partial(root, ".tmp--x-1")]
    (root / ".tmp-file-host-1").write_text("a file, not a build")  # e.g. a heartbeat write of a key 'tmp-...'
    report, out = collect(root, refs_file(tmp_path))
    assert all(p.is_dir() for p in junk) and (root / ".tmp-file-host-1").is_file()
    assert report.removed == []
    for name in (".tmp-junk", ".tmp-abc-host-notapid", ".tmp--x-1", ".tmp-file-host-1"):
        assert f"cache: {name} is not a builder's temp directory" in out


def test_an_ambiguous_temp_name_is_kept_while_any_key_it_may_belong_to_is_building(tmp_path: Path, root: Path):
    """``.tmp-a-b-h-1`` is key ``a`` on host ``b-h`` or key ``a-b`` on host ``h``: a live ``a-b`` build keeps it."""
    tmp = partial(root, ".tmp-a-b-h-1")
    lock(root, "a-b", 1)
    report, _ = collect(root, refs_file(tmp_path))
    assert tmp.is_dir() and report.removed == []
    assert "on key a-b, which it may belong to" in report.skipped[0]["reason"]
    assert not CachePaths(root, "a").lock.exists(), "the locks taken before the refusal are released"
    assert CachePaths(root, "a").partials() == [], "a builder of 'a' leaves it to the collection too"
    assert [p.key for p in find_partials(root, stale_seconds=STALE)] == ["a-b"], "shown with the likeliest key"
    lock(root, "a-b", STALE * 10)  # that build died
    report, _ = collect(root, refs_file(tmp_path))
    assert not tmp.exists() and [r["key"] for r in report.removed] == ["a-b"]
    assert not CachePaths(root, "a").lock.exists() and not CachePaths(root, "a-b").lock.exists()


def test_an_interrupted_partial_removal_is_finished_and_reported_as_partial(tmp_path: Path, root: Path):
    (root / TRASH_DIR).mkdir()
    partial(root / TRASH_DIR, f"{KEY}.partial-abc-0", size=700)
    report, _ = collect(root, refs_file(tmp_path))
    assert [(r["key"], r["variant"], r["bytes"]) for r in report.removed] == [(KEY, "partial", 700)]


def test_ls_shows_partial_builds_apart_from_engines(tmp_path: Path, root: Path, capsys: pytest.CaptureFixture[str]):
    engine(root, "eng")
    partial(root, f".tmp-{KEY}-build-pod-1", size=3 * 1024 * 1024)
    partial(root, ".tmp-live-build-pod-1", size=1024)
    lock(root, "live", 1)
    assert main(["cache", "ls", "--local", str(root), "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [e["key"] for e in doc["engines"]] == ["eng"]
    assert doc["totalBytes"] == tree_size(root / "eng") and doc["partialBytes"] == 3 * 1024 * 1024 + 1024
    assert [(p["entry"], p["key"], p["lockedBy"]) for p in doc["partials"]] == [
        (f".tmp-{KEY}-build-pod-1", KEY, None),
        (".tmp-live-build-pod-1", "live", "build-live pid 7"),
    ]
    assert main(["cache", "ls", "--local", str(root)]) == 0
    text = capsys.readouterr().out
    assert "1 engine(s)" in text
    assert "2 partial build(s), 3.0 MiB; 1 abandoned (3.0 MiB): the collection removes those" in text
    assert f".tmp-{KEY}-build-pod-1  key {KEY}  3.0 MiB  abandoned (no live build lock)" in text
    assert "being built by build-live pid 7" in text


# ---- trained drafters: <cache>/drafters/<key>/, the same rules one level down --------------------------
def drafter(root: Path, key: str, base: str = "hf://org/m", size: int = 100) -> Path:
    path = root / "drafters" / key
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(b"\0" * size)
    write_json_atomic(
        path / MANIFEST_FILE,
        {"key": key, "variant": "drafter", "inputs": {"base": {"source": base}}, "builder": {"built_at": iso(0)}},
    )
    return path


def test_the_drafters_directory_is_no_partial_build_and_its_own_partials_are_collected(root: Path, tmp_path: Path):
    kept = drafter(root, KEY)
    abandoned = partial(root / "drafters", f".tmp-{KEY[:-1]}9-host-7")
    assert [p.entry for p in find_partials(root, stale_seconds=STALE)] == []  # drafters/ itself is not one
    report = cache_gc.collect(
        root,
        refs_file(tmp_path, [KEY]),
        cache_gc.Retention(keep=0, max_age_seconds=None),
        stale_seconds=STALE,
        dry_run=False,
        log=Log(io.StringIO()),
    )
    assert kept.is_dir() and not abandoned.exists()
    assert [r["variant"] for r in report.removed] == [cache_gc.PARTIAL]


def test_unreferenced_drafters_are_collected_by_retention_and_referenced_ones_kept(root: Path, tmp_path: Path):
    used, unused = "a" * 20, "b" * 20
    drafter(root, used)
    drafter(root, unused)
    report = cache_gc.collect(
        root,
        refs_file(tmp_path, [used]),
        cache_gc.Retention(keep=0, max_age_seconds=None),
        stale_seconds=STALE,
        dry_run=False,
        log=Log(io.StringIO()),
    )
    assert (root / "drafters" / used).is_dir() and not (root / "drafters" / unused).exists()
    assert [(r["key"], r["variant"]) for r in report.removed] == [(unused, "drafter")]


def test_ls_lists_drafters_beside_engines(root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    drafter(root, KEY)
    partial(root / "drafters", f".tmp-{KEY}-host-7")
    assert main(["cache", "ls", "--cache", str(root), "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(e["key"], e["variant"]) for e in doc["engines"]] == [(KEY, "drafter")]
    assert [p["entry"] for p in doc["partials"]] == [f"drafters/.tmp-{KEY}-host-7"]
