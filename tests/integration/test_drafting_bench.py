"""``bench/drafting_gpu.py --toy`` runs every stage on the CPU: the corpus of local Python sources and its
tokenizer, the pretrained base and its gate, the head distilled on code chunks, the drafting figures against
their baselines and the operator's drafter gate, and the tokens/s table. It checks the plumbing the GPU run
relies on, not the figures (a toy base on a loaded CPU learns little)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]


def test_the_toy_bench_runs_every_stage() -> None:
    argv = [sys.executable, str(ROOT / "bench" / "drafting_gpu.py"), "--toy", "--device", "cpu"]
    result = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=580)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    print("\n".join(lines[:-1]))  # shown with pytest -rP
    for stage in ("1 corpus:", "2 base:", "3 base gate:", "4 head:", "5 drafting", "6 tokens/s"):
        assert any(line.startswith(stage) for line in lines), f"no stage {stage!r} in:\n{result.stdout}"
    assert any("the operator's drafter gate: PASS" in x or "REJECT" in x for x in lines)
    summary = json.loads(lines[-1])
    assert summary["toy"] is True and summary["held_out_loss"] > 0
    assert {"distinct", "repeats"} <= set(summary["base_output"]) and summary["text"]["distinct"] > 0
    for key in ("heldOutAcceptance", "untrainedAcceptance", "promptLookupAcceptance", "heldOutTop1", "trainTop1"):
        assert 0 <= summary[key] <= 1, key
    assert summary["head_steps"] >= 30 and summary["base"]["pretrain_steps"] >= 30
    assert [r["batch"] for r in summary["rows"]] == [1, 4, 16, 64]
    assert all(r["same_tokens"] for r in summary["rows"])  # drafting commits greedy's tokens at every batch
    assert summary["crossover"] in (1, 4, 16, 64, "none")
