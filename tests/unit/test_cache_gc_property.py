"""Nothing referenced or locked is ever collected, over random caches, references, locks, ages and retentions.

Engines are published with the cache module's own path (temp dir, manifest last, atomic rename); locks
are real lock files with fresh or stale heartbeats. References and locks may also appear *after*
planning, as when the operator updates the ConfigMap or a build starts during the collection.
"""

from __future__ import annotations

import io
import json
import tempfile
import time
from pathlib import Path
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine_jobs import cache_gc
from engine_jobs.cache import CachePaths, publish, write_json_atomic
from engine_jobs.cache_index import STATE_FILE, iso
from engine_jobs.contract import MANIFEST_FILE
from engine_jobs.progress import Log

STALE = 180.0
NOW = time.time()

engine_st = st.fixed_dictionaries({
    "model": st.sampled_from(["hf://a/llama", "hf://b/qwen"]),
    "variant": st.sampled_from(["redrafter", "base"]),
    "referenced": st.booleans(),
    "late_reference": st.booleans(),
    "lock": st.sampled_from([None, "fresh", "stale"]),
    "late_lock": st.booleans(),
    "unreferenced_age": st.one_of(st.none(), st.floats(min_value=0, max_value=90 * 86400)),
    "built_age": st.floats(min_value=0, max_value=90 * 86400),
})


def publish_engine(root: Path, key: str, spec: dict) -> None:
    paths = CachePaths(root, key)
    tmp = paths.new_tmp()
    (tmp / "engine").mkdir(parents=True)
    (tmp / "engine" / "rank0.engine").write_bytes(b"\0" * 100)
    write_json_atomic(tmp / MANIFEST_FILE, {
        "key": key, "variant": spec["variant"], "inputs": {"base": {"source": spec["model"]}},
        "builder": {"built_at": iso(NOW - spec["built_age"])}})
    publish(tmp, paths.final)


def write_lock(root: Path, key: str, heartbeat: float) -> None:
    CachePaths(root, key).lock.write_text(json.dumps({"owner": "build-x", "pid": 1, "token": key,
                                                      "heartbeat": heartbeat}))


def refs_doc(keys: list[str]) -> str:
    return json.dumps({"references": [{"key": k, "namespace": f"ns-{i % 3}", "name": f"rd-{i}", "role": "spec"}
                                      for i, k in enumerate(keys)]})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(engines=st.lists(engine_st, min_size=1, max_size=8),
       keep=st.one_of(st.none(), st.integers(min_value=0, max_value=3)),
       max_age=st.one_of(st.none(), st.floats(min_value=0, max_value=60 * 86400)))
def test_nothing_referenced_or_locked_is_ever_removed(engines: list[dict], keep: int | None,
                                                      max_age: float | None) -> None:
    if keep is None and max_age is None:
        keep = 0
    with tempfile.TemporaryDirectory() as d:
        root = Path(d) / "cache"
        root.mkdir()
        keys = [f"k{i}" for i in range(len(engines))]
        for key, spec in zip(keys, engines):
            publish_engine(root, key, spec)
            if spec["lock"]:
                write_lock(root, key, NOW - (1 if spec["lock"] == "fresh" else STALE * 10))
        (root / STATE_FILE).write_text(json.dumps({"unreferencedSince": {
            k: iso(NOW - s["unreferenced_age"]) for k, s in zip(keys, engines) if s["unreferenced_age"] is not None}}))
        refs = Path(d) / "refs.json"
        referenced = [k for k, s in zip(keys, engines) if s["referenced"]]
        refs.write_text(refs_doc(referenced))
        late_refs = [k for k, s in zip(keys, engines) if s["late_reference"]]
        late_locks = [k for k, s in zip(keys, engines) if s["late_lock"]]
        real_plan = cache_gc.plan

        def plan_then_change(*args, **kwargs):
            decisions = real_plan(*args, **kwargs)
            refs.write_text(refs_doc(referenced + late_refs))  # the operator's update after planning
            for key in late_locks:  # builds that started (or took a stale lock over) after planning
                write_lock(root, key, time.time())
            return decisions

        with mock.patch.object(cache_gc, "plan", plan_then_change):
            report = cache_gc.collect(root, str(refs), cache_gc.Retention(keep=keep, max_age_seconds=max_age),
                                      stale_seconds=STALE, dry_run=False, log=Log(stream=io.StringIO()),
                                      now=NOW)
        complete = {p.parent.name for p in root.glob(f"*/{MANIFEST_FILE}")}
        removed = {r["key"] for r in report.removed}
        protected = {k for k, s in zip(keys, engines)
                     if s["referenced"] or s["late_reference"] or s["lock"] == "fresh" or s["late_lock"]}
        assert protected <= complete, f"removed protected engines: {protected - complete}"
        assert removed.isdisjoint(protected)
        assert complete | removed == set(keys) and not complete & removed
        assert not any((root / ".trash").glob("*")), "the trash is emptied"
        if keep == 0 and max_age is None:  # no retention: exactly the unprotected engines go
            assert removed == set(keys) - protected
        for key, spec in zip(keys, engines):  # a live lock is never taken; one the collector took is released
            live = spec["lock"] == "fresh" or key in late_locks
            assert CachePaths(root, key).lock.exists() == live or (spec["lock"] == "stale" and key not in removed)
