"""A head exported by the recipe drafts in the engine what it drafted in training: the engine's recurrence and
beam search, transcribed as an oracle from TensorRT-LLM's source, reproduce the recipe's draft tokens exactly;
and the build refuses a head whose files show a trainer with another recurrence.

Sources read (NVIDIA/TensorRT-LLM; the pinned release is tag v1.0.0, images/versions.env, whose tree the index
does not store; these are the copies it stores, and the only stored version of drafter.py):

- ``tensorrt_llm/models/redrafter/drafter.py`` at commit 8fcf9fc21589b366c3f79da100e289b78b7d118c:
  ``Drafter.rnn_embed`` (lines 114-117) is ``w_embd = self.rnn_w(x)``; ``return w_embd if prev is None else
  w_embd + self.rnn_u(prev)``: no silu, and no bias at the first step (``rnn_w`` has none, ``rnn_u``'s is only
  added with ``prev``). ``ResBlock.forward`` (lines 28-29) is ``x + silu(self.linear(x))``;
  ``Drafter.forward`` (lines 107-112) is ``input_proj`` when present, the blocks, then ``lm_head``.
- ``tensorrt_llm/models/redrafter/redrafter_helper.py`` at commit 20709ce96a6b1df903ed5d28d041661167b86baa:
  ``_beam_search_candidates``: scores ``[0, NEG_INF, ...]`` with NEG_INF -50000; ``prev_embs`` zeros; per draft
  step ``i``: ``rnn_embed(embedding(last_tokens), None if i == 0 else prev_embs)``, ``drafter(concat([x,
  prev_embs]))``, log_softmax, add the scores, top-k over ``beams x vocab``, beam = index // vocab, token =
  index - beam x vocab, gather the tokens and ``prev_embs`` by beam.

Apple's apple/ml-recurrent-drafter computes ``silu(rnn_w(e) + rnn_u(s))`` from ``s = 0`` at every tag
(v0.1 583c70d3, v1.0 8e074c43, v1.1 32330d5f): ``recurrent_drafting/modeling_drafter.py`` line 194 and
``recurrent_drafting/train/model.py`` line 131, unchanged since the first public commit d4f4a72.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from safetensors.torch import load_file  # noqa: E402

from engine_jobs.contract import APPLE_MODEL_TYPE, ENGINE_RECURRENCE  # noqa: E402
from engine_jobs.drafter.drafting import beam_search  # noqa: E402
from engine_jobs.drafter.export import load_drafter, recurrence_warning, save_drafter  # noqa: E402
from engine_jobs.drafter.model import DrafterConfig, ReDrafterHead  # noqa: E402
from engine_jobs.errors import BuildError  # noqa: E402
from engine_jobs.validate import validate_drafter  # noqa: E402

NEG_INF = -50000.0
HIDDEN, VOCAB = 16, 97


def silu(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(x)


def engine_drafts(
    tensors: dict[str, torch.Tensor],
    config: dict,
    table: torch.Tensor,
    context: torch.Tensor,
    init_token: torch.Tensor,
    beams: int,
    draft_len: int,
    apple_recurrence: bool = False,
) -> torch.Tensor:
    """``_beam_search_candidates`` with ``Drafter.forward`` and ``Drafter.rnn_embed``, from the converter's
    tensor names (``apple_recurrence``: Apple's ``silu(W e + U s + b)`` from ``s = 0`` instead)."""
    layers = config["num_draft_layers"]

    def drafter(h: torch.Tensor) -> torch.Tensor:  # Drafter.forward
        if "input_proj.weight" in tensors:
            h = h @ tensors["input_proj.weight"].T + tensors["input_proj.bias"]
        for i in range(layers):  # ResBlock.forward
            h = h + silu(h @ tensors[f"lm_head.{i}.linear.weight"].T + tensors[f"lm_head.{i}.linear.bias"])
        return h @ tensors[f"lm_head.{layers}.weight"].T

    def rnn_embed(x: torch.Tensor, prev: torch.Tensor | None) -> torch.Tensor:  # drafter.py lines 114-117
        w_embd = x @ tensors["rnn_w.weight"].T
        if apple_recurrence:
            prev = torch.zeros_like(w_embd) if prev is None else prev
            return silu(w_embd + prev @ tensors["rnn_u.weight"].T + tensors["rnn_u.bias"])
        return w_embd if prev is None else w_embd + prev @ tensors["rnn_u.weight"].T + tensors["rnn_u.bias"]

    batch = context.shape[0]
    scores = torch.tensor([0.0] + [NEG_INF] * (beams - 1)).expand(batch, beams)
    x = context[:, None, :].expand(batch, beams, HIDDEN)
    draft_tokens = init_token[:, None, None].expand(batch, beams, 1)
    last_tokens = draft_tokens[..., 0]
    prev_embs = torch.zeros(batch, beams, HIDDEN)
    for i in range(draft_len):
        cur_embs = table[last_tokens]
        prev_embs = rnn_embed(cur_embs, None if i == 0 else prev_embs) if config["rnn"] else cur_embs + prev_embs
        log_probs = drafter(torch.cat([x, prev_embs], dim=-1)).log_softmax(-1) + scores[..., None]
        top, index = log_probs.reshape(batch, beams * VOCAB).topk(beams, dim=-1)
        beam = index // VOCAB
        token = index - beam * VOCAB
        rows = torch.arange(batch)[:, None]
        draft_tokens = torch.cat([draft_tokens[rows, beam], token[..., None]], dim=-1)
        prev_embs = prev_embs[rows, beam]
        scores = top
        last_tokens = token
    return draft_tokens


def trained_head(exit_dim: int, rnn: bool = True) -> ReDrafterHead:
    """A head whose recurrence matters: a few steps of training push rnn_u's bias and weights off zero."""
    torch.manual_seed(0)
    head = ReDrafterHead(DrafterConfig(HIDDEN, exit_dim, 2, rnn, VOCAB))
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0, 0.4)
    return head.eval()


@pytest.mark.parametrize(("exit_dim", "rnn"), [(2 * HIDDEN, True), (24, True), (2 * HIDDEN, False)])
def test_an_exported_head_drafts_the_engines_tokens(tmp_path: Path, exit_dim: int, rnn: bool) -> None:
    save_drafter(trained_head(exit_dim, rnn), trained_head(exit_dim, rnn).config.to_json(), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config.get("recurrence") == ENGINE_RECURRENCE and recurrence_warning(config) is None
    tensors = load_file(str(tmp_path / "model.safetensors"))
    head = load_drafter(tmp_path)
    g = torch.Generator().manual_seed(1)
    table = torch.randn(VOCAB, HIDDEN, generator=g)
    context = torch.randn(6, HIDDEN, generator=g)
    init = torch.randint(0, VOCAB, (6,), generator=g)
    with torch.no_grad():
        ours = beam_search(head, torch.nn.Embedding.from_pretrained(table), context, init, 4, 5)
        oracle = engine_drafts(tensors, config, table, context, init, 4, 5)
        apple = engine_drafts(tensors, config, table, context, init, 4, 5, apple_recurrence=True)
    assert torch.equal(ours, oracle)
    if rnn:  # the oracle tells the recurrences apart: Apple's draft other tokens from the same weights
        assert not torch.equal(apple[..., 1:], oracle[..., 1:])


def write_head(path: Path, **extra: object) -> Path:
    save_drafter(trained_head(2 * HIDDEN), {**trained_head(2 * HIDDEN).config.to_json(), **extra}, path)
    return path


def test_the_build_refuses_a_head_from_apples_trainer(tmp_path: Path) -> None:
    config = {k: v for k, v in trained_head(2 * HIDDEN).config.to_json().items() if k != "recurrence"}
    path = tmp_path / "apple"
    write_head(path)
    (path / "config.json").write_text(json.dumps({**config, "model_type": APPLE_MODEL_TYPE, "num_lookback_tokens": 1}))
    with pytest.raises(BuildError, match="Apple's ml-recurrent-drafter.*silu"):
        validate_drafter(path)


def test_the_build_warns_when_the_files_cannot_tell(tmp_path: Path) -> None:
    path = write_head(tmp_path / "unknown")
    config = json.loads((path / "config.json").read_text())
    del config["recurrence"]
    (path / "config.json").write_text(json.dumps(config))
    said: list[str] = []
    validate_drafter(path, said.append)
    assert len(said) == 1 and "does not say which recurrence" in said[0]
    said.clear()
    (path / "config.json").write_text(json.dumps({**config, "rnn": False}))
    validate_drafter(path, said.append)  # a running sum: every trainer computes it as the engine does
    assert said == []


def test_the_build_refuses_an_unknown_recurrence_and_accepts_its_own(tmp_path: Path) -> None:
    with pytest.raises(BuildError, match="names recurrence 'silu'"):
        validate_drafter(write_head(tmp_path / "silu", recurrence="silu"))
    said: list[str] = []
    validate_drafter(write_head(tmp_path / "ours"), said.append)
    assert said == []
