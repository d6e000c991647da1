"""Module-scoped real tritonservers for the integration tests, started and stopped one way.

Each test module wraps a server in its own object (control file, ledger, ...) that has ``.server``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol, TypeVar

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from redrafter_sim.triton import TritonServer, TritonUnavailable

VARIANTS = ("redrafter", "base")
TOKENIZER_VOCAB = 1000


def make_tokenizer(directory: Path, vocab_size: int = TOKENIZER_VOCAB) -> Path:
    """A word-level tokenizer ("w<id>" words) saved as tokenizer.json, as a HF tokenizer dir holds."""
    vocab = {"[PAD]": 0, "</s>": 1, "[UNK]": 2} | {f"w{i}": i for i in range(3, vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["[PAD]", "</s>", "[UNK]"])
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    return directory


class HasServer(Protocol):
    server: TritonServer


S = TypeVar("S", bound=HasServer)


def start_servers(make: Callable[[str], S], variants: Iterable[str] = VARIANTS, timeout: float = 300) -> dict[str, S]:
    """``make(variant)`` started for each variant. Skips where Triton cannot run; on any other failure
    stops the ones already started first (they run in their own sessions and would outlive pytest)."""
    started: dict[str, S] = {}
    try:
        for variant in variants:
            served = make(variant)
            served.server.start(timeout=timeout)
            started[variant] = served
    except TritonUnavailable as exc:
        stop_servers(started)
        pytest.skip(f"tritonserver cannot run on this machine: {exc}")
    except BaseException:
        stop_servers(started)
        raise
    return started


#: what tritonserver's gRPC frontend logs before it aborts (SIGABRT) on a race between a client's cancellation and a
#: response it is writing: an upstream crash (the class of triton-inference-server/server#7368), which tests whose
#: clients cancel streams on purpose can meet
GRPC_CANCEL_ABORT = "API misuse of type GRPC_CALL_ERROR_TOO_MANY_OPERATIONS"


def restart_after_grpc_abort(started: dict[str, S]) -> list[str]:
    """Start again each server that died of :data:`GRPC_CANCEL_ABORT` (reported on stderr); a server that died
    of anything else fails the test with its log. The variants restarted."""
    restarted = []
    for variant, served in started.items():
        server = served.server
        if server.alive():
            continue
        tail = server.log_tail()
        if GRPC_CANCEL_ABORT not in tail:
            pytest.fail(f"the {variant} tritonserver died:\n{tail}")
        print(f"the {variant} tritonserver aborted in its gRPC frontend (upstream crash); restarting it")
        server.stop()
        server.start()
        restarted.append(variant)
    return restarted


def stop_servers(started: dict[str, S]) -> dict[str, int | None]:
    """Stop all in parallel (each drains for its exit timeout); their exit codes by variant."""
    codes: dict[str, int | None] = {}
    stoppers = [
        threading.Thread(target=lambda v=v, s=s: codes.__setitem__(v, s.server.stop())) for v, s in started.items()
    ]
    for t in stoppers:
        t.start()
    for t in stoppers:
        t.join()
    return codes
