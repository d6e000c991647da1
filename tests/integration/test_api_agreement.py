"""The CRD on the real kube-apiserver, and the operator's own validation, agree.

The API server is the judge: its structural schema, strict field validation and CEL (cel-go) decide what a cluster
accepts. ``render`` and ``check -f`` run where no API server does, so the operator validates the same spec with
pydantic (``parse_spec``). Every example is accepted by ``kubectl apply --server-side``, and a corpus of bad specs
gets the same verdict from both.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.cluster import Kube, status_message
from redrafter_operator.api.spec import parse_spec

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))

pytestmark = pytest.mark.timeout(300)


def load(name: str) -> dict[str, Any]:
    return yaml.safe_load((ROOT / "examples" / name).read_text())


def at(doc: dict[str, Any], dotted: str) -> tuple[dict[str, Any], str]:
    node = doc
    *parents, leaf = dotted.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    return node, leaf


def setting(dotted: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(doc: dict[str, Any]) -> None:
        node, leaf = at(doc, dotted)
        node[leaf] = value

    return change


def removing(dotted: str) -> Callable[[dict[str, Any]], None]:
    def change(doc: dict[str, Any]) -> None:
        node, leaf = at(doc, dotted)
        node.pop(leaf, None)

    return change


# (example, change of its spec, whether a cluster must accept it): each a mistake a user makes, or an edge that
# must stay accepted. The verdicts of both validators are compared, and with this expectation.
CORPUS: list[tuple[str, str, Callable[[dict[str, Any]], None], bool]] = [
    ("snake-case field", "llama3.1-8b-eagle3.yaml", setting("spec.eagle3", {"max_draft_len": 6}), False),
    ("snake-case top field", "llama3-8b.yaml", setting("spec.engine.max_batch_size", 4), False),
    ("unknown field", "llama3-8b.yaml", setting("spec.engine.turbo", True), False),
    (
        "hf datasets/ prefix",
        "llama3-8b-train.yaml",
        setting("spec.model.drafter.train.dataset.source", "hf://datasets/tatsu-lab/alpaca"),
        False,
    ),
    ("three-segment hf base", "llama3-8b.yaml", setting("spec.model.base.source", "hf://a/b/c"), False),
    ("dot-dot segment", "llama3-8b.yaml", setting("spec.model.drafter.source", "pvc://drafters/../etc"), False),
    ("dash segment", "llama3-8b.yaml", setting("spec.model.drafter.source", "pvc://drafters/-rf"), False),
    ("upper-case claim", "llama3-8b.yaml", setting("spec.model.drafter.source", "pvc://Drafters/x"), False),
    ("unknown scheme", "llama3-8b.yaml", setting("spec.model.base.source", "http://example.com/model"), False),
    ("revision on pvc", "llama3-8b.yaml", setting("spec.model.drafter.revision", "main"), False),
    ("zero batch", "llama3-8b.yaml", setting("spec.engine.maxBatchSize", 0), False),
    ("string batch", "llama3-8b.yaml", setting("spec.engine.maxBatchSize", "eight"), False),
    ("bad interval", "llama3-8b.yaml", setting("spec.speculation.interval", "30 seconds"), False),
    ("unknown method", "llama3-8b.yaml", setting("spec.method", "medusa"), False),
    (
        "mtp with a drafter",
        "deepseek-v3-mtp.yaml",
        setting("spec.model.drafter", {"source": "pvc://drafters/x"}),
        False,
    ),
    (
        "ngram with a drafter",
        "qwen2.5-coder-7b-ngram.yaml",
        setting("spec.model.drafter", {"source": "pvc://d/x"}),
        False,
    ),
    ("redrafter without drafter", "llama3-8b.yaml", removing("spec.model.drafter"), False),
    ("eagle3 block on redrafter", "llama3-8b.yaml", setting("spec.eagle3", {"maxDraftLen": 3}), False),
    ("source and train", "llama3-8b-train.yaml", setting("spec.model.drafter.source", "pvc://drafters/x"), False),
    ("draft length over trained", "llama3-8b-train.yaml", setting("spec.redrafter.draftLenPerBeam", 6), False),
    # edges that stay accepted
    ("mtp without optional blocks", "deepseek-v3-mtp.yaml", removing("spec.speculation"), True),
    # redrafter is defaulted for every method (the CRD fills it), so another method carries it and ignores it
    ("redrafter block on mtp", "deepseek-v3-mtp.yaml", setting("spec.redrafter", {"numBeams": 2}), True),
    ("ngram defaults", "qwen2.5-coder-7b-ngram.yaml", removing("spec.ngram"), True),
    ("one-segment hf repo", "llama3-8b.yaml", setting("spec.model.base.source", "hf://gpt2"), True),
    ("trailing slash", "llama3-8b.yaml", setting("spec.model.drafter.source", "pvc://drafters/llama3/"), True),
    ("s3 prefix", "llama3-8b.yaml", setting("spec.model.drafter.source", "s3://my-bucket/heads/llama3"), True),
    ("train without recipe", "llama3-8b-train.yaml", removing("spec.model.drafter.train.recipe"), True),
    # the API server prunes a null field and reads a whole float as an integer; so does the operator
    ("null field", "llama3-8b.yaml", setting("spec.speculation", None), True),
    ("whole float", "llama3-8b.yaml", setting("spec.engine.maxBatchSize", 8.0), True),
    ("whole number in a number field", "llama3-8b.yaml", setting("spec.speculation.minAcceptanceRate", 0), True),
    # lax coercion the API server's schema does not do
    ("string bool", "llama3-8b.yaml", setting("spec.validation.enabled", "true"), False),
    ("zero interval", "llama3-8b.yaml", setting("spec.speculation.interval", "0s"), False),
]


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_example_is_accepted_by_the_api_server(kube: Kube, path: Path) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        doc["metadata"]["namespace"] = kube.namespace
        result = kube.apply(doc, check=False)
        assert result.returncode == 0, f"{path.name}: {status_message(result)}"
        assert parse_spec(doc["spec"])[1] == [], f"{path.name}: the operator refuses what the API server accepts"
        stored = kube.get(
            f"/apis/redrafter.dev/v1alpha1/namespaces/{{ns}}/redrafterdeployments/{doc['metadata']['name']}"
        )
        assert stored is not None and stored["spec"]["method"] == doc["spec"].get("method", "redrafter")


@pytest.mark.parametrize("case", CORPUS, ids=[c[0] for c in CORPUS])
def test_the_operator_and_the_api_server_give_the_same_verdict(
    kube: Kube, case: tuple[str, str, Callable[[dict[str, Any]], None], bool]
) -> None:
    what, example, change, accepted = case
    doc = copy.deepcopy(load(example))
    doc["metadata"]["namespace"] = kube.namespace
    change(doc)
    server = kube.apply(doc, dry_run=True, check=False)
    errors = parse_spec(doc["spec"])[1]
    server_ok, operator_ok = server.returncode == 0, not errors
    assert server_ok == accepted, (
        f"{what}: the API server {'refused' if accepted else 'accepted'} it: {status_message(server)}"
    )
    assert operator_ok == accepted, f"{what}: the operator {'refused' if accepted else 'accepted'} it: {errors}"
