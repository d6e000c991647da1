"""The trained drafter's contract: TensorRT-LLM's converter reads every tensor it needs with the right shape,
the directory check refuses what the converter would trip on, ReDrafter drafting equals greedy decoding token
for token, prompts load from every dataset layout, and a short training run lowers the loss."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from engine_jobs.drafter import drafting  # noqa: E402
from engine_jobs.drafter.distill import Sample, attach_hidden, generate, load_base, tokenize  # noqa: E402
from engine_jobs.drafter.drafting import greedy_decode, redrafter_decode  # noqa: E402
from engine_jobs.drafter.export import check_drafter_dir, expected_tensors, load_drafter, save_drafter  # noqa: E402
from engine_jobs.drafter.model import DrafterConfig, ReDrafterHead  # noqa: E402
from engine_jobs.drafter.prompts import load_prompts  # noqa: E402
from engine_jobs.drafter.train import TrainConfig, train_head  # noqa: E402
from engine_jobs.errors import BuildError, ExitCode  # noqa: E402
from redrafter_sim.checkpoint import write_drafter  # noqa: E402
from redrafter_sim.tiny_llama import write_prompts_jsonl, write_tiny_llama  # noqa: E402

VOCAB, HIDDEN = 200, 32


def converter_reads(config: dict) -> dict[str, tuple[int, ...]]:
    """The tensors NVIDIA/TensorRT-LLM examples/redrafter/convert_checkpoint.py (hf_drafter,
    create_and_save_config) reads at the pinned release, TensorRT-LLM 1.2.1 (images/versions.env TRTLLM_VERSION; the copy
    read here is the one stored at commit 31a9cd42fb507b50df39df4e03066fa370e4683c), transcribed: input_proj
    only when hidden_size * 2 != exit_dim, lm_head.<i>.linear.{weight,bias} per draft layer, lm_head.<layers>
    without bias, rnn_u.{weight,bias} and rnn_w.weight when rnn; shapes as Drafter (tensorrt_llm/models/redrafter/
    drafter.py) builds them: ColumnLinear(in, out) holds [out, in]."""
    h, e, n, v = config["hidden_size"], config["exit_dim"], config["num_draft_layers"], config["vocab_size"]
    names: dict[str, tuple[int, ...]] = {}
    if h * 2 != e:
        names |= {"input_proj.weight": (e, 2 * h), "input_proj.bias": (e,)}
    for i in range(n):
        names |= {f"lm_head.{i}.linear.weight": (e, e), f"lm_head.{i}.linear.bias": (e,)}
    names[f"lm_head.{n}.weight"] = (v, e)
    if config["rnn"]:
        names |= {"rnn_u.weight": (h, h), "rnn_u.bias": (h,), "rnn_w.weight": (h, h)}
    return names


def head_config(rnn: bool = True, exit_dim: int | None = None, layers: int = 2) -> DrafterConfig:
    return DrafterConfig(HIDDEN, exit_dim or 2 * HIDDEN, layers, rnn, VOCAB)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    """A real (random) one-layer Llama with its tokenizer, loaded as the worker loads it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: threads only add overhead
    directory = write_tiny_llama(tmp_path_factory.mktemp("tiny") / "base", vocab_size=VOCAB, hidden=HIDDEN, layers=1)
    yield load_base(directory, torch.device("cpu"))
    torch.set_num_threads(threads)


# ---- (a) the converter's contract -----------------------------------------------------------------------


@pytest.mark.parametrize("rnn", [True, False])
@pytest.mark.parametrize("exit_dim", [None, 48])
def test_head_tensors_are_what_the_converter_reads(rnn: bool, exit_dim: int | None) -> None:
    config = head_config(rnn, exit_dim)
    state = ReDrafterHead(config).state_dict()
    shapes = {name: tuple(t.shape) for name, t in state.items()}
    assert shapes == converter_reads(config.to_json())
    assert expected_tensors(config.to_json()) == converter_reads(config.to_json())


# ---- (b) the directory: save, check, load --------------------------------------------------------------


def test_save_check_load_round_trip(tmp_path: Path) -> None:
    torch.manual_seed(0)
    head = ReDrafterHead(head_config(exit_dim=48))
    save_drafter(head, head.config.to_json(), tmp_path)
    assert check_drafter_dir(tmp_path) == head.config.to_json()
    loaded = load_drafter(tmp_path)
    for name, tensor in head.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name


def test_check_accepts_the_sims_drafter(tmp_path: Path) -> None:
    config = check_drafter_dir(write_drafter(tmp_path / "drafter"))
    assert (config["hidden_size"], config["exit_dim"], config["num_draft_layers"]) == (64, 128, 2)


def _saved(tmp_path: Path) -> Path:
    head = ReDrafterHead(head_config())
    save_drafter(head, head.config.to_json(), tmp_path)
    return tmp_path


def _rewrite_tensors(directory: Path, edit) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(directory / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(directory / "model.safetensors"))


def test_check_refuses_a_missing_tensor(tmp_path: Path) -> None:
    _rewrite_tensors(_saved(tmp_path), lambda t: t.pop("lm_head.2.weight"))
    with pytest.raises(ValueError, match=r"lacks lm_head\.2\.weight \(convert_checkpoint\.py reads it\)"):
        check_drafter_dir(tmp_path)


def test_check_refuses_a_wrong_shape(tmp_path: Path) -> None:
    _rewrite_tensors(_saved(tmp_path), lambda t: t.update({"rnn_w.weight": torch.zeros(HIDDEN, 2 * HIDDEN)}))
    with pytest.raises(ValueError, match=r"rnn_w\.weight has shape \[32, 64\].*needs \[32, 32\]"):
        check_drafter_dir(tmp_path)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda c: c.pop("exit_dim"), r"lacks exit_dim"),
        (lambda c: c.update(rnn="yes"), r"rnn must be true or false"),
        (lambda c: c.update(num_draft_layers=0), r"num_draft_layers must be a positive integer"),
    ],
)
def test_check_refuses_a_bad_config(tmp_path: Path, edit, message: str) -> None:
    _saved(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    edit(config)
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=message):
        check_drafter_dir(tmp_path)


def test_check_accepts_a_head_without_vocab_size(tmp_path: Path) -> None:
    """The converter does not read vocab_size: a head trained elsewhere may omit it."""
    _saved(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["vocab_size"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert "vocab_size" not in check_drafter_dir(tmp_path)
    _rewrite_tensors(tmp_path, lambda t: t.update({"lm_head.2.weight": torch.zeros(VOCAB, HIDDEN)}))
    with pytest.raises(ValueError, match=r"lm_head\.2\.weight has shape .* vocab_size unset"):
        check_drafter_dir(tmp_path)


def test_check_refuses_missing_files_and_garbage(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"config\.json is missing"):
        check_drafter_dir(tmp_path)
    (tmp_path / "config.json").write_text("[1]")
    with pytest.raises(ValueError, match=r"must hold a JSON object"):
        check_drafter_dir(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(head_config().to_json()))
    with pytest.raises(ValueError, match=r"model\.safetensors is missing"):
        check_drafter_dir(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", 5) + b"{nope")
    with pytest.raises(ValueError, match=r"not a safetensors file"):
        check_drafter_dir(tmp_path)


# ---- (c) drafting equals greedy decoding ----------------------------------------------------------------


def _prompts(n: int, seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(3, VOCAB, (int(torch.randint(2, 9, (1,), generator=g)),), generator=g).tolist() for _ in range(n)
    ]


@pytest.mark.parametrize("batch", [1, 3])
def test_drafting_with_an_untrained_head_equals_greedy(tiny, batch: int) -> None:
    base, _ = tiny
    torch.manual_seed(0)
    head = ReDrafterHead(head_config(layers=1)).eval()
    prompts = _prompts(batch)
    drafted, stats = redrafter_decode(base, head, prompts, 12, draft_len=3, beams=2)
    assert drafted == greedy_decode(base, prompts, 12)
    assert stats.steps >= batch and stats.drafted == 3 * stats.steps
    assert stats.committed == stats.steps + stats.accepted


def test_drafting_accepts_and_rejects_like_greedy(tiny, monkeypatch: pytest.MonkeyPatch) -> None:
    """An oracle drafter proposes the greedy continuation with its first ``j`` tokens right (j cycling
    0..draft_len, in a different beam each step): many tokens are accepted per step, sequences of a batch
    accept different counts, and the output is still greedy decoding's."""
    base, _ = tiny
    draft_len, beams, new = 4, 3, 20
    prompts = _prompts(3, seed=7)
    truth = greedy_decode(base, prompts, new + draft_len + 2)
    position = [0] * len(prompts)
    calls = [0]

    def oracle(head, embeddings, context, init_token, n_beams, length):
        out = torch.zeros((len(prompts), n_beams, 1 + length), dtype=torch.long)
        for row in range(len(prompts)):
            k = position[row]
            out[row, :, 0] = init_token[row]
            if k >= new:  # this sequence is complete; the batch goes on for the others
                continue
            assert int(init_token[row]) == truth[row][k], "the guaranteed token is greedy's"
            right = (calls[0] + row) % (length + 1)
            good = truth[row][k : k + 1 + length]
            wrong = [good[0]] + [(t + 1) % VOCAB or 3 for t in good[1:]]
            out[row, :] = torch.tensor(wrong)
            out[row, (calls[0] + row) % n_beams] = torch.tensor(good[: 1 + right] + wrong[1 + right :])
            position[row] = k + 1 + right
        calls[0] += 1
        return out

    monkeypatch.setattr(drafting, "beam_search", oracle)
    drafted, stats = redrafter_decode(base, None, prompts, new, draft_len, beams)
    assert drafted == [t[:new] for t in truth]
    assert stats.accepted > stats.steps  # more than one draft token accepted per step on average
    # the last step's run is cut at the token limit: only the tokens the responses keep are counted
    assert stats.committed == sum(stats.per_step) == sum(len(t) for t in drafted) == 3 * new
    assert stats.committed == stats.steps + stats.accepted


def test_tokens_per_step_count_only_what_a_response_keeps(tiny, monkeypatch: pytest.MonkeyPatch) -> None:
    """A perfect drafter (draft_len 4) on a 7-token limit: the first step commits 5 tokens, the second's run
    of 5 is cut to 2; tokens per step is 3.5, not 5."""
    base, _ = tiny
    prompts = _prompts(1, seed=5)
    truth = greedy_decode(base, prompts, 20)
    done = [0]

    def perfect(head, embeddings, context, init_token, n_beams, length):
        out = torch.tensor(truth[0][done[0] : done[0] + 1 + length])[None, None, :].expand(1, n_beams, 1 + length)
        done[0] += 1 + length
        return out.clone()

    monkeypatch.setattr(drafting, "beam_search", perfect)
    drafted, stats = redrafter_decode(base, None, prompts, 7, 4, 2)
    assert drafted == [truth[0][:7]]
    assert (stats.steps, stats.committed, stats.accepted, stats.per_step) == (2, 7, 5, [5, 2])
    assert stats.tokens_per_step == 3.5


def test_drafting_stops_at_eos(tiny) -> None:
    base, _ = tiny
    prompts = _prompts(2, seed=3)
    plain = greedy_decode(base, prompts, 10)
    eos = plain[0][4]
    head = ReDrafterHead(head_config(layers=1)).eval()
    stopped = greedy_decode(base, prompts, 10, eos_token_id=eos)
    assert stopped[0] == plain[0][: plain[0].index(eos) + 1]
    assert redrafter_decode(base, head, prompts, 10, 2, 2, eos_token_id=eos)[0] == stopped


# ---- (d) prompts --------------------------------------------------------------------------------------


def test_load_prompts_from_each_layout(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"q": "one"}\n\n{"q": ""}\n{"q": "two"}\n')
    (tmp_path / "b.json").write_text(json.dumps({"rows": [{"q": "three"}]}))
    (tmp_path / "c.csv").write_text("q,other\nfour,x\n")
    (tmp_path / ".cache").mkdir()
    (tmp_path / ".cache" / "z.jsonl").write_text('{"nope": 1}\n')
    (tmp_path / "dataset_info.json").write_text("{}")
    assert load_prompts(tmp_path, "q", 100) == ["one", "two", "three", "four"]
    assert load_prompts(tmp_path, "q", 3) == ["one", "two", "three"]
    assert load_prompts(tmp_path / "b.json", "q", 5) == ["three"]
    (tmp_path / "d.json").write_text(json.dumps([{"q": "five"}]))
    assert load_prompts(tmp_path / "d.json", "q", 5) == ["five"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"text": "a"}\n', r"has no column 'q' \(keys: text\)"),
        ('["a"]\n', r"record 0 is not an object"),
        ('{"q": 3}\n', r"column 'q' is a int, not a string"),
        ('{"q": ""}\n', r"has no prompts in column 'q'"),
    ],
)
def test_load_prompts_refuses(tmp_path: Path, content: str, message: str) -> None:
    (tmp_path / "p.jsonl").write_text(content)
    with pytest.raises(BuildError, match=message) as info:
        load_prompts(tmp_path / "p.jsonl", "q", 10)
    assert info.value.code == ExitCode.BAD_INPUT


def test_load_prompts_needs_data_files(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("x")
    with pytest.raises(BuildError, match="holds no data files"):
        load_prompts(tmp_path, "text", 10)


# ---- (e) training -------------------------------------------------------------------------------------


def test_a_short_training_run_lowers_the_loss(tiny, tmp_path: Path) -> None:
    base, tokenizer = tiny
    path = write_prompts_jsonl(tmp_path / "p.jsonl", 16, vocab_size=VOCAB)
    texts = load_prompts(path, "text", 16)
    samples = generate(base, tokenize(tokenizer, texts), 12, tokenizer.eos_token_id, 0, batch_size=16)
    attach_hidden(base, samples)
    assert all(
        isinstance(s, Sample) and s.hidden.shape == (13, HIDDEN) for s in samples if len(s.ids) - s.prompt_len == 12
    )
    torch.manual_seed(0)
    head = ReDrafterHead(head_config(layers=1))
    seen: list[tuple[int, int, float]] = []
    config = TrainConfig(draft_len=3, learning_rate=1e-2, batch_size=4, epochs=5, max_steps=None, seed=0)
    curve = train_head(
        head, samples, base.get_input_embeddings().weight.detach(), config, progress=lambda *a: seen.append(a)
    )
    assert [p["step"] for p in curve] == list(range(1, 21))
    assert seen[-1][:2] == (20, 20)
    first, last = curve[0]["loss"], sum(p["loss"] for p in curve[-4:]) / 4
    assert last < first - 0.5, f"loss {first:.3f} -> {last:.3f}"
