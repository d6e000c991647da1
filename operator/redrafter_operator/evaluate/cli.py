"""``redrafter-operator evaluate`` (A/B concurrency sweep + report) and ``evaluate validate``.

redrafter-operator evaluate --redrafter HOST:8001 --base HOST:8001 [--prompts FILE]
    [--concurrency 1,2,4,8] [--max-tokens N] [--out DIR]
redrafter-operator evaluate validate --redrafter HOST:8001 --base HOST:8001 [...]
    [--termination-log /dev/termination-log]
redrafter-operator evaluate --protocol openai --redrafter http://HOST:9000 --base http://HOST:9000
    (the OpenAI-compatible API of the serving pods, as applications call it)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import TYPE_CHECKING

from engine_jobs.contract import TERMINATION_LOG

from . import outcome as oc

if TYPE_CHECKING:
    from .stats import LevelStats
    from .tokens import TokenCounter
    from .validate import ValidationConfig

DEFAULT_CONCURRENCY = "1,2,4,8"


def _common(p: argparse.ArgumentParser, required: bool) -> None:
    p.add_argument(
        "--redrafter",
        required=required,
        metavar="URL",
        help="endpoint of the ReDrafter engine: gRPC host:port (port defaults to 8001), or with "
        "--protocol openai http://host:port (port defaults to 9000)",
    )
    p.add_argument("--base", required=required, metavar="URL", help="endpoint of the base engine")
    p.add_argument(
        "--protocol",
        choices=("grpc", "openai"),
        default="grpc",
        help="grpc: Triton's entry model; openai: the OpenAI-compatible API (streaming /v1/completions)",
    )
    p.add_argument("--prompts", metavar="FILE", help="prompt set (JSON or YAML); default: a built-in set")
    p.add_argument(
        "--tokenizer",
        metavar="DIR",
        help="directory with tokenizer.json to count output tokens exactly (default: count words)",
    )
    p.add_argument("--request-timeout", type=float, default=300.0, metavar="S", help="per-request timeout")
    p.add_argument(
        "--api-key-file",
        metavar="PATH",
        help="--protocol openai: the API key, in a file or a mounted Secret directory (its first entry by name)",
    )


def _api_key(args: argparse.Namespace) -> str | None:
    if not args.api_key_file:
        return None
    from .channel import load_api_key

    return load_api_key(args.api_key_file)


def register_cli(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "evaluate",
        help="A/B concurrency sweep of ReDrafter vs base with a report; "
        "`evaluate validate` checks an engine pair before promotion",
    )
    _common(p, required=False)
    p.add_argument(
        "--concurrency",
        default=None,
        metavar="LIST",
        help=f"concurrency levels (default {DEFAULT_CONCURRENCY}, or 1,2,4..--max-batch-size)",
    )
    p.add_argument("--max-batch-size", type=int, metavar="N", help="sweep 1, 2, 4, ..., N")
    p.add_argument("--max-tokens", type=int, default=64, metavar="N", help="output tokens per request (fixed)")
    p.add_argument(
        "--requests-per-worker",
        type=int,
        default=3,
        metavar="N",
        help="requests each concurrent worker sends per level",
    )
    p.add_argument("--warmup", type=int, default=2, metavar="N", help="warm-up requests per endpoint")
    p.add_argument(
        "--max-level-seconds", type=float, default=120.0, metavar="S", help="no request of a level starts after this"
    )
    p.add_argument("--redrafter-metrics", metavar="URL", help="DCGM metrics URL of the ReDrafter pod (GPU util)")
    p.add_argument("--base-metrics", metavar="URL", help="DCGM metrics URL of the base pod (GPU util)")
    p.add_argument("--label", help="source label carried into every title (e.g. 'simulated engine on CPU')")
    p.add_argument("--out", default="evaluation", metavar="DIR", help="report directory (default ./evaluation)")
    p.set_defaults(func=_cmd_sweep)

    vsub = p.add_subparsers(dest="evaluate_command")
    v = vsub.add_parser("validate", help="validate a ReDrafter/base engine pair before promotion")
    _common(v, required=True)
    v.add_argument("--max-tokens", type=int, default=32, metavar="N", help="output tokens of normal requests")
    v.add_argument("--long-max-tokens", type=int, default=128, metavar="N", help="output tokens of long requests")
    v.add_argument("--batch-size", type=int, default=8, metavar="N", help="requests arriving together (maxBatchSize)")
    v.add_argument("--single-requests", type=int, default=4, metavar="N", help="requests sent one at a time")
    v.add_argument("--max-input-len", type=int, metavar="N", help="enables the max-length-input scenario")
    v.add_argument("--max-seq-len", type=int, metavar="N", help="bounds output tokens of max-length inputs")
    v.add_argument("--max-divergences", type=int, default=0, metavar="N", help="differing outputs tolerated")
    v.add_argument(
        "--no-fixed-length",
        dest="fixed_length",
        action="store_false",
        help="send no min_tokens (engines without it: TensorRT-LLM's PyTorch backend); compare up to the end token",
    )
    v.add_argument("--ready-timeout", type=float, default=300.0, metavar="S", help="wait for both endpoints")
    v.add_argument(
        "--sweep-concurrency",
        metavar="LIST",
        help="after a pass, measure the crossover concurrency with a short sweep at these levels",
    )
    v.add_argument("--sweep-requests-per-worker", type=int, default=2, metavar="N")
    v.add_argument(
        "--termination-log",
        default=TERMINATION_LOG,
        metavar="FILE",
        help=f"where the one-line verdict is written (default {TERMINATION_LOG})",
    )
    v.add_argument("--out", metavar="FILE", help="write the detailed JSON result here (default: stdout)")
    v.set_defaults(func=_cmd_validate)


def _cmd_sweep(args: argparse.Namespace) -> int:
    from .prompts import load_prompts
    from .report import build_report, write_report
    from .stats import default_concurrencies, parse_concurrencies
    from .stream import RequestOptions
    from .sweep import SweepConfig, report_config, run_sweep
    from .tokens import make_counter

    endpoints = {v: u for v, u in (("redrafter", args.redrafter), ("base", args.base)) if u}
    if not endpoints:
        print("error: give --redrafter and/or --base", file=sys.stderr)
        return 2
    try:
        levels = (
            parse_concurrencies(args.concurrency)
            if args.concurrency
            else default_concurrencies(args.max_batch_size)
            if args.max_batch_size
            else parse_concurrencies(DEFAULT_CONCURRENCY)
        )
        prompts = load_prompts(args.prompts)
        counter = make_counter(args.tokenizer)
        api_key = _api_key(args)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    metrics = {v: u for v, u in (("redrafter", args.redrafter_metrics), ("base", args.base_metrics)) if u}
    config = SweepConfig(
        endpoints,
        levels,
        RequestOptions(
            max_tokens=args.max_tokens,
            timeout_s=args.request_timeout,
            protocol=args.protocol,
            api_key=api_key,
        ),
        requests_per_worker=args.requests_per_worker,
        max_level_s=args.max_level_seconds,
        warmup_requests=args.warmup,
        metrics_urls=metrics,
    )

    def progress(variant: str, lv: LevelStats) -> None:
        print(f"{variant:>9} c={lv.concurrency:<4} {lv.tokens_per_s:9.1f} tok/s  errors={lv.errors}", file=sys.stderr)

    result = asyncio.run(run_sweep(config, prompts, counter, progress))
    report = build_report(result.levels, report_config(result, len(prompts)), label=args.label)
    paths = write_report(report, args.out)
    cross = report["crossover"]
    print(
        json.dumps(
            {"crossover": cross, "speedup": report["speedup"], "report": {k: str(v) for k, v in paths.items()}},
            indent=2,
        )
    )
    errors = sum(lv.errors for lvs in result.levels.values() for lv in lvs)
    return 1 if errors else 0


def _cmd_validate(args: argparse.Namespace) -> int:
    from .prompts import load_prompts
    from .tokens import make_counter
    from .validate import ValidationConfig, validate

    try:
        prompts = load_prompts(args.prompts)
        counter = make_counter(args.tokenizer)
        for name in ("max_tokens", "long_max_tokens", "batch_size"):
            if getattr(args, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
        sweep_levels = None
        if args.sweep_concurrency:
            from .stats import parse_concurrencies

            sweep_levels = parse_concurrencies(args.sweep_concurrency)
        api_key = _api_key(args)
    except (ValueError, OSError) as exc:
        outcome = oc.ValidationOutcome(oc.INVALID_INPUT, str(exc))
        oc.write_termination_message(args.termination_log, outcome)
        print(oc.format_termination_message(outcome), file=sys.stderr)
        return outcome.exit_code
    cfg = ValidationConfig(
        redrafter=args.redrafter,
        base=args.base,
        prompts=prompts,
        max_tokens=args.max_tokens,
        long_max_tokens=args.long_max_tokens,
        batch_size=args.batch_size,
        single_requests=args.single_requests,
        max_input_len=args.max_input_len,
        max_seq_len=args.max_seq_len,
        max_divergences=args.max_divergences,
        request_timeout_s=args.request_timeout,
        ready_timeout_s=args.ready_timeout,
        protocol=args.protocol,
        api_key=api_key,
        fixed_length=args.fixed_length,
    )
    report = asyncio.run(validate(cfg, counter))
    if report.outcome.passed and sweep_levels:
        report.outcome = asyncio.run(
            _with_crossover(report.outcome, cfg, sweep_levels, args.sweep_requests_per_worker, counter)
        )
    oc.write_termination_message(args.termination_log, report.outcome)
    text = json.dumps(report.to_dict(), indent=2)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
    else:
        print(text)
    print(oc.format_termination_message(report.outcome), file=sys.stderr)
    return report.outcome.exit_code


async def _with_crossover(
    outcome: oc.ValidationOutcome, cfg: ValidationConfig, levels: list[int], per_worker: int, counter: TokenCounter
) -> oc.ValidationOutcome:
    """The passed outcome plus the crossover a short sweep measured (unchanged when it could not)."""
    from dataclasses import replace

    from .stats import crossover, speedups
    from .stream import RequestOptions
    from .sweep import SweepConfig, run_sweep

    sweep = SweepConfig(
        {"redrafter": cfg.redrafter, "base": cfg.base},
        levels,
        RequestOptions(
            max_tokens=cfg.max_tokens,
            timeout_s=cfg.request_timeout_s,
            protocol=cfg.protocol,
            fixed_length=cfg.fixed_length,
            api_key=cfg.api_key,
        ),
        requests_per_worker=per_worker,
        warmup_requests=1,
    )
    result = await run_sweep(sweep, cfg.prompts, counter)
    if any(lv.errors for lvs in result.levels.values() for lv in lvs):
        return replace(outcome, message=outcome.message + "; crossover not measured (sweep requests failed)")
    cross = crossover(speedups(result.levels["redrafter"], result.levels["base"]))
    if cross.concurrency is None:  # faster everywhere measured: no crossover within the tested range
        return replace(outcome, message=outcome.message + f"; ReDrafter faster up to concurrency {cross.at_least:g}")
    return replace(outcome, crossover_concurrency=cross.concurrency)
