"""Nothing referenced or locked is ever collected, over random caches, references, locks, ages and retentions.

Engines are published with the cache module's own path (temp dir, manifest last, atomic rename); locks
are real lock files with fresh or stale heartbeats. References and locks may also appear *after*
planning, as when the operator updates the ConfigMap or a build starts during the collection.

Partial builds (temp directories named as builders name them, hosts with '-' included, and ``<key>/``
without manifest) are mixed in, with fresh, stale or no locks, on their own key or on another key their
name may belong to, and locks that appear after the scan: a partial build is removed exactly when no key
it may belong to has a live lock.
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
from engine_jobs.cache import CachePaths, publish, tmp_key_candidates, write_json_atomic
from engine_jobs.cache_index import STATE_FILE, iso
from engine_jobs.contract import MANIFEST_FILE
from engine_jobs.progress import Log

STALE = 180.0

engine_st = st.fixed_dictionaries(
    {
        "model": st.sampled_from(["hf://a/llama", "hf://b/qwen"]),
        "variant": st.sampled_from(["redrafter", "base"]),
        "referenced": st.booleans(),
        "late_reference": st.booleans(),
        "lock": st.sampled_from([None, "fresh", "stale"]),
        "late_lock": st.booleans(),
        "unreferenced_age": st.one_of(st.none(), st.floats(min_value=0, max_value=90 * 86400)),
        "built_age": st.floats(min_value=0, max_value=90 * 86400),
    }
)

partial_st = st.fixed_dictionaries(
    {
        "kind": st.sampled_from(["tmp", "tmp", "final"]),
        "owner": st.sampled_from(["own", "own", "engine"]),  # tmp only: a dead builder of an engine's key
        "host": st.sampled_from(["node", "build-pod-x7k", "k0-node"]),  # hosts with '-' make names ambiguous
        "lock": st.sampled_from([None, "fresh", "stale"]),
        "lock_on": st.sampled_from(["own", "other"]),  # another key the temp name may belong to
        "late_lock": st.booleans(),  # a build of that key starts after the scan
    }
)


def publish_engine(root: Path, key: str, spec: dict, now: float) -> None:
    paths = CachePaths(root, key)
    tmp = paths.new_tmp()
    (tmp / "engine").mkdir(parents=True)
    (tmp / "engine" / "rank0.engine").write_bytes(b"\0" * 100)
    write_json_atomic(
        tmp / MANIFEST_FILE,
        {
            "key": key,
            "variant": spec["variant"],
            "inputs": {"base": {"source": spec["model"]}},
            "builder": {"built_at": iso(now - spec["built_age"])},
        },
    )
    publish(tmp, paths.final)


def write_lock(root: Path, key: str, heartbeat: float) -> None:
    CachePaths(root, key).lock.write_text(
        json.dumps({"owner": "build-x", "pid": 1, "token": key, "heartbeat": heartbeat})
    )


def refs_doc(keys: list[str]) -> str:
    return json.dumps(
        {
            "references": [
                {"key": k, "namespace": f"ns-{i % 3}", "name": f"rd-{i}", "role": "spec"} for i, k in enumerate(keys)
            ]
        }
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    engines=st.lists(engine_st, min_size=1, max_size=8),
    partials=st.lists(partial_st, max_size=5),
    keep=st.one_of(st.none(), st.integers(min_value=0, max_value=3)),
    max_age=st.one_of(st.none(), st.floats(min_value=0, max_value=60 * 86400)),
)
def test_nothing_referenced_or_locked_is_ever_removed(
    engines: list[dict], partials: list[dict], keep: int | None, max_age: float | None
) -> None:
    if keep is None and max_age is None:
        keep = 0
    now = time.time()  # per example: lock staleness is judged against the clock, not against import time
    with tempfile.TemporaryDirectory() as d:
        root = Path(d) / "cache"
        root.mkdir()
        keys = [f"k{i}" for i in range(len(engines))]
        for key, spec in zip(keys, engines):
            publish_engine(root, key, spec, now)
            if spec["lock"]:
                write_lock(root, key, now - (1 if spec["lock"] == "fresh" else STALE * 10))
        partial_names, fresh_partial_locks, late_partial_locks = make_partials(root, partials, keys, now)
        (root / STATE_FILE).write_text(
            json.dumps(
                {
                    "unreferencedSince": {
                        k: iso(now - s["unreferenced_age"])
                        for k, s in zip(keys, engines)
                        if s["unreferenced_age"] is not None
                    }
                }
            )
        )
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

        real_find = cache_gc.find_partials

        def find_then_lock(*args, **kwargs):
            found = real_find(*args, **kwargs)
            for key in late_partial_locks:  # builds that started after the partial builds were listed
                write_lock(root, key, time.time())
            return found

        with (
            mock.patch.object(cache_gc, "plan", plan_then_change),
            mock.patch.object(cache_gc, "find_partials", find_then_lock),
        ):
            report = cache_gc.collect(
                root,
                str(refs),
                cache_gc.Retention(keep=keep, max_age_seconds=max_age),
                stale_seconds=STALE,
                dry_run=False,
                log=Log(stream=io.StringIO()),
                now=now,
            )
        complete = {p.parent.name for p in root.glob(f"*/{MANIFEST_FILE}")}
        removed = {r["key"] for r in report.removed if r["variant"] != "partial"}
        # partial builds: exactly those no key they may belong to had a live lock for when they were collected
        # (the engines' late locks come later: at planning)
        live = {k for k, s in zip(keys, engines) if s["lock"] == "fresh"} | fresh_partial_locks | late_partial_locks
        for name in partial_names:
            protected_partial = bool(set(candidates(name)) & live)
            assert (root / name).is_dir() == protected_partial, (
                f"{name}: {'removed although locked' if protected_partial else 'abandoned but kept'}"
            )
        removed_partials = sorted(r["note"].rsplit(" ", 1)[1] for r in report.removed if r["variant"] == "partial")
        assert removed_partials == sorted(n for n in partial_names if not (root / n).exists())
        protected = {
            k
            for k, s in zip(keys, engines)
            if s["referenced"] or s["late_reference"] or s["lock"] == "fresh" or s["late_lock"]
        }
        assert protected <= complete, f"removed protected engines: {protected - complete}"
        assert removed.isdisjoint(protected)
        assert complete | removed == set(keys) and not complete & removed
        assert not any((root / ".trash").glob("*")), "the trash is emptied"
        if keep == 0 and max_age is None:  # no retention: exactly the unprotected engines go
            assert removed == set(keys) - protected
        for key, spec in zip(keys, engines):  # a live lock is never taken; one the collector took is released
            live_lock = spec["lock"] == "fresh" or key in late_locks or key in late_partial_locks
            assert CachePaths(root, key).lock.exists() == live_lock or (spec["lock"] == "stale" and key not in removed)


def candidates(name: str) -> list[str]:
    return tmp_key_candidates(name) if name.startswith(".tmp-") else [name]


def make_partials(
    root: Path, partials: list[dict], engine_keys: list[str], now: float
) -> tuple[list[str], set[str], set[str]]:
    """The partial builds on the volume (their names), the keys with a fresh lock, those whose builds start
    after the partial builds were listed.

    Locks go only on keys no engine has (an engine's own lock is its spec's), so both sets of rules stay readable.
    """
    names, fresh, late = [], set(), set()
    for i, spec in enumerate(partials):
        if spec["kind"] == "final":
            name = own = f"p{i}"
        else:
            own = engine_keys[i % len(engine_keys)] if spec["owner"] == "engine" else f"p{i}"
            name = f".tmp-{own}-{spec['host']}-{100 + i}"
        (root / name / "engine").mkdir(parents=True)
        (root / name / "engine" / "rank0.engine").write_bytes(b"\0" * (10 + i))
        names.append(name)
        others = [c for c in candidates(name) if c != own and c not in engine_keys]
        target = others[-1] if spec["lock_on"] == "other" and others else own
        if target in engine_keys:
            continue
        if spec["lock"] and not (target in fresh and spec["lock"] == "stale"):  # a stale one never hides a live
            write_lock(root, target, now - (1 if spec["lock"] == "fresh" else STALE * 10))
            if spec["lock"] == "fresh":
                fresh.add(target)
        if spec["late_lock"]:
            late.add(target)
    return names, fresh, late
