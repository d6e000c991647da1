"""The OpenAI front's pure parts: chat templates with transformers' semantics, stop sequences, request
validation, and the launcher that runs Triton and the front as one."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from engine_jobs.chat_template import ChatTemplate, ChatTemplateError, NoChatTemplate, load_template
from engine_jobs.openai_protocol import ChatCompletionRequest, CompletionRequest, validation_error
from engine_jobs.serve import LaunchSettings, front_argv, run_together
from engine_jobs.triton_bridge import Outcome, Sampling, StopMatcher, entry_inputs

# Llama-2's chat template as its tokenizer_config.json ships it (meta-llama/Llama-2-7b-chat-hf).
LLAMA2 = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"
)


def tokenizer_dir(tmp_path: Path, **config) -> Path:
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return tmp_path


def test_llama2_template_renders_as_transformers_does(tmp_path):
    d = tokenizer_dir(tmp_path, chat_template=LLAMA2, bos_token={"content": "<s>", "special": True}, eos_token="</s>")
    t = ChatTemplate(d)
    out = t.render(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": " Hi "},
            {"role": "assistant", "content": "Hello"},
            {"role": "user", "content": "Bye"},
        ]
    )
    # strip() applies to system + first user message together: the user's leading space stays
    assert out == "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\n Hi [/INST] Hello </s><s>[INST] Bye [/INST]"
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        t.render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])


def test_block_trimming_generation_tag_tojson_and_generation_prompt(tmp_path):
    template = (
        "{% for m in messages %}\n"
        "    <{{ m.role }}>{% generation %}{{ m.content }}{% endgeneration %}\n"
        "    {% endfor %}\n"
        "{{ {'t': '<&>'} | tojson }}{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    t = ChatTemplate(tokenizer_dir(tmp_path, chat_template=template))
    # trim_blocks drops the newline after a block tag, lstrip_blocks the indentation before one
    # (not before text); tojson does not HTML-escape
    assert t.render([{"role": "user", "content": "x"}]) == '    <user>x{"t": "<&>"}<assistant>'
    assert t.render([{"role": "user", "content": "x"}], add_generation_prompt=False).endswith('"<&>"}')


def test_template_sources(tmp_path):
    named = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]
    assert load_template(tokenizer_dir(tmp_path, chat_template=named))[0] == "D"
    (tmp_path / "chat_template.jinja").write_text("J{{ eos_token }}")
    source, tokens = load_template(tokenizer_dir(tmp_path, chat_template="C", eos_token="</s>"))
    assert source == "J{{ eos_token }}" and tokens["eos_token"] == "</s>"
    (tmp_path / "special_tokens_map.json").write_text(json.dumps({"bos_token": {"content": "<s>"}}))
    assert load_template(tmp_path)[1]["bos_token"] == "<s>"


def test_no_template_is_a_clear_error(tmp_path):
    t = ChatTemplate(tokenizer_dir(tmp_path, eos_token="</s>"))
    assert not t.available
    with pytest.raises(NoChatTemplate, match="no chat template"):
        t.render([{"role": "user", "content": "x"}])
    assert not ChatTemplate(tmp_path / "missing").available


@pytest.mark.parametrize(
    ("stops", "pieces", "emitted", "hit"),
    [
        (("END",), ["ab", "cE", "N", "D tail"], ["ab", "c", "", ""], True),
        (("END",), ["ab", "cE", "Nx"], ["ab", "c", "ENx"], False),  # a prefix that did not complete is released
        (("xy", "b"), ["ab"], ["a"], True),
        ((), ["a", "b"], ["a", "b"], False),
    ],
)
def test_stop_matcher(stops, pieces, emitted, hit):
    m = StopMatcher(stops)
    assert [m.feed(p) for p in pieces] == emitted
    assert m.hit == hit
    if not hit:
        assert "".join(emitted) + m.flush() == "".join(pieces)


def test_entry_inputs_map_openai_sampling():
    names = {t.name(): t for t in entry_inputs("p", Sampling(max_tokens=5, stop=("a",), temperature=0, seed=3))}
    assert {"text_input", "max_tokens", "stream", "return_perf_metrics", "stop_words", "top_k", "seed"} == set(names)
    assert names["seed"].datatype() == "UINT64"
    names = {t.name() for t in entry_inputs("p", Sampling(max_tokens=5, temperature=0.7, top_p=0.9))}
    assert {"temperature", "top_p"} <= names and "top_k" not in names


def test_outcome_acceptance_only_where_drafted():
    assert Outcome(accepted_draft_tokens=3, draft_tokens=4).acceptance_rate == 0.75
    assert Outcome(accepted_draft_tokens=0, draft_tokens=0).acceptance_rate is None


@pytest.mark.parametrize(
    ("model", "body", "param"),
    [
        (CompletionRequest, {"prompt": "x", "n": 3}, "n"),
        (CompletionRequest, {"prompt": ["a", "b"]}, "prompt"),
        (CompletionRequest, {"prompt": "x", "echo": True}, "echo"),
        (CompletionRequest, {"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
        (CompletionRequest, {"prompt": "x", "stop": [""]}, "stop"),
        (CompletionRequest, {"prompt": "x", "top_p": 0}, "top_p"),
        (ChatCompletionRequest, {"messages": []}, "messages"),
        (ChatCompletionRequest, {"messages": [{"role": "robot", "content": "x"}]}, "messages.0.role"),
        (ChatCompletionRequest, {"messages": [{"role": "user", "content": "x"}], "logprobs": True}, "logprobs"),
        (
            ChatCompletionRequest,
            {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
            "tools",
        ),
    ],
)
def test_invalid_requests_name_their_param(model, body, param):
    with pytest.raises(ValidationError) as exc:
        model.model_validate({"model": "m", **body})
    err = validation_error(exc.value)
    assert err.status == 400 and err.param == param and err.body()["error"]["type"] == "invalid_request_error"


def test_valid_requests():
    c = CompletionRequest.model_validate({"model": "m", "prompt": ["one"], "stop": "s", "n": 1, "extra": 1})
    assert c.text == "one" and c.stop_list == ["s"] and c.output_limit is None
    chat = ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "max_tokens": 5,
            "max_completion_tokens": 7,
            "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {"role": "assistant", "content": None, "name": "bot"},
            ],
        }
    )
    assert chat.output_limit == 7 and chat.include_usage
    assert [m.for_template() for m in chat.messages] == [
        {"role": "user", "content": "ab"},
        {"role": "assistant", "content": "", "name": "bot"},
    ]


def test_front_argv_targets_rank0_grpc_on_localhost():
    argv = front_argv(LaunchSettings(grpc_port=8001, openai_port=9000, exit_timeout_secs=45), "/etc/s.json")
    assert argv[1:5] == ["-m", "engine_jobs", "openai", "--config"]
    assert {"--port", "9000", "--grpc-url", "127.0.0.1:8001", "45"} <= set(argv)


def test_run_together_stops_the_rest_when_one_exits_unasked():
    start = time.monotonic()
    code = run_together(
        [[sys.executable, "-c", "import sys; sys.exit(3)"], [sys.executable, "-c", "import time; time.sleep(60)"]]
    )
    assert code == 3 and time.monotonic() - start < 30
    # a component that exits 0 unasked is still a failure of the pod
    assert run_together([[sys.executable, "-c", "pass"], [sys.executable, "-c", "import time; time.sleep(60)"]]) == 1


async def test_chat_prompt_keeps_one_bos_when_the_tokenizer_adds_it(tmp_path):
    """A template that writes BOS itself plus a tokenizer that adds BOS would give the engine two."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    from engine_jobs.openai_front import Front
    from engine_jobs.openai_settings import FrontSettings

    vocab = {"<s>": 0, "</s>": 1, "[UNK]": 2, "hi": 3, "[INST]": 4}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<s>", "</s>", "[UNK]"])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    tok.save(str(tmp_path / "tokenizer.json"))
    tokenizer_dir(
        tmp_path,
        chat_template="{{ bos_token }}[INST] {{ messages[0]['content'] }}",
        bos_token="<s>",
        eos_token="</s>",
        tokenizer_class="PreTrainedTokenizerFast",
    )
    front = Front(FrontSettings("m", 64, 128, 0), tmp_path, "127.0.0.1:1")
    req = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    prompt = front.chat_prompt(req)
    assert prompt == "[INST] hi"
    assert front.tokenizer.encode(prompt) == [0, 4, 3]  # exactly one BOS, added by the tokenizer
    assert await front.prompt_tokens(prompt, "messages") == 3
    # a tokenizer that adds nothing keeps the template's BOS
    tok.post_processor = None
    tok.save(str(tmp_path / "tokenizer.json"))
    assert Front(FrontSettings("m", 64, 128, 0), tmp_path, "127.0.0.1:1").chat_prompt(req) == "<s>[INST] hi"


def test_run_together_forwards_sigterm_to_every_process_and_waits_for_their_drain(tmp_path):
    import os
    import signal
    import threading

    drain = (
        "import signal, sys, time, pathlib\n"
        "signal.signal(signal.SIGTERM, lambda *a: (time.sleep(0.5), pathlib.Path(sys.argv[1]).write_text('drained'),"
        " sys.exit(0)))\n"
        "pathlib.Path(sys.argv[1] + '.up').touch()\n"
        "time.sleep(60)\n"
    )
    marks = [tmp_path / "triton", tmp_path / "front"]

    def terminate_when_up():
        deadline = time.monotonic() + 30
        while not all(Path(f"{m}.up").exists() for m in marks) and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)  # what the kubelet sends after the preStop hook

    before = signal.getsignal(signal.SIGTERM)
    threading.Thread(target=terminate_when_up, daemon=True).start()
    assert run_together([[sys.executable, "-c", drain, str(m)] for m in marks]) == 0
    assert [m.read_text() for m in marks] == ["drained", "drained"]
    assert signal.getsignal(signal.SIGTERM) == before  # the previous handler is back


async def test_an_unreachable_triton_is_reported_as_unavailable(tmp_path):
    """What a request meets when Triton went away between two readiness polls: the front answers 503."""
    import tritonclient.grpc.aio as grpcaio

    from engine_jobs.openai_front import Front
    from engine_jobs.openai_settings import FrontSettings
    from engine_jobs.triton_bridge import UpstreamError, generate
    from redrafter_sim.checkpoint import write_tokenizer
    from redrafter_sim.triton import free_ports

    (port,) = free_ports(count=1)
    async with grpcaio.InferenceServerClient(f"127.0.0.1:{port}") as client:
        outcome = Outcome()
        with pytest.raises(UpstreamError) as exc:
            async for _ in generate(client, "w5", Sampling(max_tokens=4), outcome, len):
                pass
    assert exc.value.unavailable, str(exc.value)
    front = Front(FrontSettings("m", 64, 128, 0), write_tokenizer(tmp_path), f"127.0.0.1:{port}")
    front.ready = True  # as it was at the last poll
    err = front.failure(exc.value)
    assert (err.status, err.code, front.ready) == (503, "service_unavailable", False)
    assert front.failure(UpstreamError("tensorrt_llm: boom")).status == 500
