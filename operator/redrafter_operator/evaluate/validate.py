"""Validation of a new engine pair before the Service points at it.

Against each endpoint (ReDrafter and base) it runs the batch shapes that exercise ReDrafter's split
of a batch into context and generation sub-batches (and the empty-tensor paths in between):

* ``single``: requests one at a time (a batch with only a context request, then only generation);
* ``context_only``: ``batch_size`` requests arriving together;
* ``generation_only``: ``batch_size`` long outputs in flight, no new prompts;
* ``mixed``: new prompts arriving while long outputs are being generated;
* ``max_length``: an input of about ``max_input_len`` tokens, alone and next to a short one.

Every request is greedy (top_k 1) with a fixed output length. It passes when no request failed and
the ReDrafter outputs equal the base outputs (at most ``max_divergences`` may differ). Optionally a
short concurrency sweep then measures the crossover concurrency for the policy.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Sequence

from . import outcome as oc
from .channel import Channel, endpoint_for, open_channel
from .compare import Divergence, compare_outputs
from .prompts import Prompt, max_length_prompt
from .stream import RequestOptions, RequestResult, WireProtocol
from .tokens import TokenCounter, WordCounter

VARIANTS = ("redrafter", "base")


@dataclass(frozen=True)
class ValidationConfig:
    redrafter: str
    base: str
    prompts: Sequence[Prompt]
    max_tokens: int = 32
    long_max_tokens: int = 128
    batch_size: int = 8  # requests arriving together (the engines' maxBatchSize)
    single_requests: int = 4
    max_input_len: int | None = None  # enables the max_length scenario
    max_seq_len: int | None = None
    max_divergences: int = 0
    request_timeout_s: float = 300.0
    ready_timeout_s: float = 300.0
    protocol: WireProtocol = "grpc"  # see .channel
    api_key: str | None = field(default=None, repr=False)  # openai: the pods' API key, when they require one
    #: every request generates exactly its max tokens (min_tokens); off for engines without min_tokens (the
    #: PyTorch backend's llmapi model): outputs are compared up to the end token, which both variants share
    fixed_length: bool = True

    def endpoint(self, variant: str) -> str:
        return self.redrafter if variant == "redrafter" else self.base


@dataclass(frozen=True)
class Item:
    key: str  # "<scenario>#<n>": the same request on both engines
    prompt: str
    result: RequestResult


@dataclass
class ValidationReport:
    outcome: oc.ValidationOutcome
    requests: dict[str, int] = field(default_factory=dict)  # per variant
    failures: list[dict[str, Any]] = field(default_factory=list)
    divergences: list[Divergence] = field(default_factory=list)
    scenarios: list[str] = field(default_factory=list)
    duration_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "reason": self.outcome.reason,
            "message": self.outcome.message,
            "crossover_concurrency": self.outcome.crossover_concurrency,
            "requests": self.requests,
            "scenarios": self.scenarios,
            "failures": self.failures,
            "divergences": [d.__dict__ for d in self.divergences],
            "duration_s": round(self.duration_s, 3),
        }


class _Runner:
    """Sends the scenario requests of one endpoint."""

    def __init__(self, client: Channel, cfg: ValidationConfig, counter: TokenCounter):
        self.client, self.cfg, self.counter = client, cfg, counter
        self.opts = RequestOptions(
            max_tokens=cfg.max_tokens,
            greedy=True,
            fixed_length=cfg.fixed_length,
            want_perf=True,
            timeout_s=cfg.request_timeout_s,
            protocol=cfg.protocol,
            api_key=cfg.api_key,
        )

    async def one(
        self,
        key: str,
        prompt: Prompt,
        max_tokens: int | None = None,
        on_first_token: Callable[[], None] | None = None,
    ) -> Item:
        r = await self.client.send(
            prompt.text,
            self.opts,
            self.counter,
            max_tokens=max_tokens or prompt.max_tokens,
            on_first_token=on_first_token,
        )
        return Item(key, prompt.text, r)

    def prompt(self, i: int) -> Prompt:
        return self.cfg.prompts[i % len(self.cfg.prompts)]

    async def single(self) -> list[Item]:
        return [await self.one(f"single#{i}", self.prompt(i)) for i in range(self.cfg.single_requests)]

    async def context_only(self) -> list[Item]:
        return list(
            await asyncio.gather(*(self.one(f"context_only#{i}", self.prompt(i)) for i in range(self.cfg.batch_size)))
        )

    async def generation_only(self) -> list[Item]:
        n = self.cfg.long_max_tokens
        return list(
            await asyncio.gather(
                *(self.one(f"generation_only#{i}", self.prompt(i), n) for i in range(self.cfg.batch_size))
            )
        )

    async def mixed(self) -> list[Item]:
        """Long requests first; once each is generating, a wave of new prompts joins the batch."""
        n_long = max(self.cfg.batch_size // 2, 1)
        n_short = max(self.cfg.batch_size - n_long, 1)
        generating = asyncio.Semaphore(0)
        longs = [
            asyncio.ensure_future(
                self.one(f"mixed#long-{i}", self.prompt(i), self.cfg.long_max_tokens, on_first_token=generating.release)
            )
            for i in range(n_long)
        ]

        async def all_generating() -> None:
            for _ in range(n_long):
                await generating.acquire()

        waiter = asyncio.ensure_future(all_generating())
        all_longs = asyncio.gather(*longs)
        # wait until every long request generates, or until they all ended (e.g. failed)
        either: list[asyncio.Future[Any]] = [waiter, all_longs]
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        shorts = await asyncio.gather(*(self.one(f"mixed#short-{i}", self.prompt(n_long + i)) for i in range(n_short)))
        return list(await all_longs) + list(shorts)

    async def max_length(self) -> list[Item]:
        cfg = self.cfg
        assert cfg.max_input_len is not None
        long_prompt = max_length_prompt(cfg.max_input_len)
        n = cfg.max_tokens
        if cfg.max_seq_len is not None:
            n = max(min(n, cfg.max_seq_len - cfg.max_input_len), 1)
        alone = await self.one("max_length#0", long_prompt, n)
        together = await asyncio.gather(
            self.one("max_length#1", long_prompt, n), self.one("max_length#2", self.prompt(0))
        )
        return [alone, *together]

    def scenarios(self) -> list[tuple[str, Callable[[], Awaitable[list[Item]]]]]:
        out: list[tuple[str, Callable[[], Awaitable[list[Item]]]]] = [
            ("single", self.single),
            ("context_only", self.context_only),
            ("generation_only", self.generation_only),
            ("mixed", self.mixed),
        ]
        if self.cfg.max_input_len is not None:
            out.append(("max_length", self.max_length))
        return out


async def wait_ready(target: str, timeout_s: float, poll_s: float = 2.0, protocol: WireProtocol = "grpc") -> str | None:
    """None once ``target`` serves (its entry model, or its OpenAI API, is ready); else the last error
    after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        channel = open_channel(target, protocol)
        try:
            last = await channel.not_ready()
        finally:
            await channel.close()
        if last is None:
            return None
        if time.monotonic() >= deadline:
            return last
        await asyncio.sleep(poll_s)


def judge(
    items: dict[str, list[Item]], cfg: ValidationConfig, counter: TokenCounter | None = None
) -> tuple[oc.ValidationOutcome, list[dict[str, Any]], list[Divergence]]:
    """The verdict from every request's result on both engines (pure)."""
    failures: list[dict[str, Any]] = [
        {"variant": v, "key": it.key, "prompt": it.prompt[:80], "error": it.result.error}
        for v in VARIANTS
        for it in items.get(v, [])
        if not it.result.ok
    ]
    prompts = {it.key: it.prompt for it in items.get("redrafter", [])}
    outputs = {v: {it.key: it.result.text for it in items.get(v, []) if it.result.ok} for v in VARIANTS}
    divergences = compare_outputs(prompts, outputs["redrafter"], outputs["base"], counter)
    total = len(items.get("redrafter", []))
    if failures:
        f = failures[0]
        more = f" (and {len(failures) - 1} more failed requests)" if len(failures) > 1 else ""
        return (
            oc.ValidationOutcome(
                oc.REQUEST_FAILED,
                f"{f['variant']} engine failed request {f['key']} (prompt {f['prompt'][:40]!r}): {f['error']}{more}",
            ),
            failures,
            divergences,
        )
    if len(divergences) > cfg.max_divergences:
        return (
            oc.ValidationOutcome(
                oc.DIVERGED,
                f"{len(divergences)} of {total} greedy outputs differ between redrafter and base "
                f"(allowed {cfg.max_divergences}); first: {divergences[0].describe()}",
            ),
            failures,
            divergences,
        )
    scen = sorted({it.key.split("#")[0] for it in items.get("redrafter", [])})
    same = total - len(divergences)
    return (
        oc.ValidationOutcome(
            oc.PASSED,
            f"{total} requests per engine ({', '.join(scen)}): {same} greedy outputs identical, no errors",
        ),
        failures,
        divergences,
    )


async def validate(cfg: ValidationConfig, counter: TokenCounter | None = None) -> ValidationReport:
    counter = counter or WordCounter()
    t0 = time.monotonic()
    targets = {v: endpoint_for(cfg.endpoint(v), cfg.protocol) for v in VARIANTS}
    for v, target in targets.items():
        err = await wait_ready(target, cfg.ready_timeout_s, protocol=cfg.protocol)
        if err is not None:
            return ValidationReport(
                oc.ValidationOutcome(
                    oc.ENDPOINT_UNAVAILABLE, f"{v} endpoint {target} not ready after {cfg.ready_timeout_s:g}s: {err}"
                )
            )
    items: dict[str, list[Item]] = {}
    names: list[str] = []
    for v, target in targets.items():
        client = open_channel(target, cfg.protocol, cfg.api_key)
        try:
            runner = _Runner(client, cfg, counter)
            items[v] = []
            for name, scenario in runner.scenarios():
                items[v] += await scenario()
                if name not in names:
                    names.append(name)
        finally:
            await client.close()
    outcome, failures, divergences = judge(items, cfg, counter)
    return ValidationReport(
        outcome, {v: len(x) for v, x in items.items()}, failures, divergences, names, time.monotonic() - t0
    )
