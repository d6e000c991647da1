"""The collection knows which engines the pinned runtime can no longer load (a TensorRT plan loads only in the
TensorRT-LLM release that built it): unreferenced ones go whatever the retention, referenced ones stay."""

from __future__ import annotations

from engine_jobs import trtllm_backend
from engine_jobs.cache_gc import Retention, plan, unloadable
from engine_jobs.cache_index import Engine, Reference
from engine_jobs.manifest import UNKNOWN

NOW = 1_800_000_000.0
OLD = "1.0.0"  # the release the previous pair (Triton 25.09) built with


def engine(key: str, version: str, *, variant: str = "redrafter", since: str = "2026-01-01T00:00:00Z") -> Engine:
    return Engine(
        key=key,
        complete=True,
        variant=variant,
        model="hf://org/model",
        tensorrt_llm_version=version,
        built_at="2026-01-01T00:00:00Z",
        unreferenced_since=since,
    )


def test_the_runtime_release_is_the_pinned_one():
    assert trtllm_backend.ENGINE_TRTLLM_VERSION == "1.2.1"


def test_engines_of_another_release_are_unloadable_only_as_tensorrt_plans():
    assert unloadable(engine("a", OLD))
    assert unloadable(engine("a", OLD, variant="base"))
    assert not unloadable(engine("a", "1.2.1"))
    assert not unloadable(engine("a", "1.2.1.post1"))  # the same release, a packaging suffix
    assert not unloadable(engine("a", UNKNOWN))  # not recorded: not judged
    # prepared checkpoints (PyTorch path) and trained drafters are no TensorRT plans
    assert not unloadable(engine("a", OLD, variant="both"))
    assert not unloadable(engine("a", OLD, variant="drafter"))


def test_unreferenced_old_engines_go_whatever_the_retention_and_do_not_take_a_keep_slot():
    old, new = engine("old", OLD, since="2026-06-01T00:00:00Z"), engine("new", "1.2.1", since="2026-01-01T00:00:00Z")
    decisions = {d.engine.key: d for d in plan([old, new], Retention(keep=1), NOW)}
    assert decisions["old"].remove
    assert decisions["old"].reason == "built by TensorRT-LLM 1.0.0, which the pinned runtime (1.2.1) cannot load"
    # the older-but-loadable engine is the one kept: the unloadable one did not count among the 1 most recent
    assert not decisions["new"].remove and "most recent" in decisions["new"].reason
    # the same engine is kept while the runtime is its release
    assert not {d.engine.key: d for d in plan([old], Retention(keep=1), NOW, runtime=OLD)}["old"].remove


def test_a_referenced_old_engine_is_never_removed():
    old = engine("old", OLD)
    old.referenced_by = [Reference("old", "team", "chat", "serving")]
    (decision,) = plan([old], Retention(keep=0), NOW)
    assert not decision.remove and decision.reason.startswith("referenced by team/chat")
