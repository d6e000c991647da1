"""Moving ReDrafter to the Triton 26.07 / TensorRT-LLM 1.2.1 pair changes the rendered manifests of every example
only in the images and in the engine keys that follow from the builder image (and the names made of them).

``tests/fixtures/render_before/`` holds ``make render``'s output of each example at the commit before the move
(images 0.1.0-trtllm1.0.0 / 0.1.0-25.09-trtllm-python-py3), captured before the pins changed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from redrafter_operator.cli import main

ROOT = Path(__file__).resolve().parents[2]
BEFORE = ROOT / "tests" / "fixtures" / "render_before"
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))

OLD_IMAGES = (
    "ghcr.io/redrafter/engine-builder:0.1.0-trtllm1.0.0",
    "ghcr.io/redrafter/triton-runtime:0.1.0-25.09-trtllm-python-py3",
)
NEW_IMAGES = (
    "ghcr.io/redrafter/engine-builder:0.1.0-trtllm1.2.1",
    "ghcr.io/redrafter/triton-runtime:0.1.0-26.07-trtllm-python-py3",
)
KEY = re.compile(r"\b[0-9a-f]{20}\b")
#: hashes computed over content that holds the engine key or the image: the serving pods' config hash and the
#: validation Job's name (key prefix + hash of the pair it validates)
DERIVED = (
    (re.compile(r"(redrafter\.dev/serving-config-hash: )[0-9a-f]{16}\b"), r"\1<hash>"),
    (re.compile(r"(-validate-)<k8-\d+>-[0-9a-f]{8}\b"), r"\1<k8>-<hash>"),
)


def render(path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["render", "-f", str(path)]) == 0
    return capsys.readouterr().out


def normalise(text: str) -> str:
    """Images become placeholders; each engine key (and the 10- and 8-character prefixes names use) becomes the
    placeholder of its order of first appearance, so one key maps to one key throughout; hashes over them too."""
    for i, (old, new) in enumerate(zip(OLD_IMAGES, NEW_IMAGES, strict=True)):
        text = text.replace(old, f"<image-{i}>").replace(new, f"<image-{i}>")
    keys = list(dict.fromkeys(KEY.findall(text)))
    for i, key in enumerate(keys):
        text = text.replace(key, f"<key-{i}>").replace(key[:10], f"<k10-{i}>").replace(key[:8], f"<k8-{i}>")
    for pattern, placeholder in DERIVED:
        text = pattern.sub(placeholder, text)
    return text


def test_every_example_has_its_capture():
    assert {p.stem for p in EXAMPLES} == {p.stem for p in BEFORE.glob("*.yaml")}


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_render_differs_only_in_images_and_engine_keys(example: Path, capsys: pytest.CaptureFixture[str]):
    before = (BEFORE / f"{example.stem}.yaml").read_text()
    after = render(example, capsys)
    assert not any(image in after for image in OLD_IMAGES)
    assert normalise(after) == normalise(before)
    if "trtllm1.0.0" in before:  # a ReDrafter example: its engine keys follow the new builder image
        assert set(KEY.findall(after)).isdisjoint(KEY.findall(before))
    else:  # the PyTorch-path examples were on 26.07 / 1.2.1 already: nothing changes at all
        assert after == before
