"""``python -m engine_jobs cache ls|gc``: list an engine cache, collect unreferenced engines.

``ls`` only reads (it runs in a pod mounting the cache read-only); ``gc`` runs as the operator's
collection Job and writes what it removed as JSON to the termination message.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from .cache_gc import Retention, collect, parse_duration
from .cache_index import Engine, load_references, scan
from .contract import CACHE_MOUNT
from .errors import BuildError, ExitCode, format_termination_message, write_termination_message
from .progress import Log, human_bytes
from .settings import Settings

COLUMNS = ("KEY", "VARIANT", "MODEL", "TRTLLM", "GPU", "SIZE", "BUILT", "REFERENCED BY")


def _cache_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--local", "--cache", dest="cache", default=CACHE_MOUNT, metavar="DIR",
                   help=f"the mounted cache directory (default {CACHE_MOUNT})")


def add_cache_parser(sub: Any) -> None:
    cache = sub.add_parser("cache", help="list or collect the engine cache")
    verbs = cache.add_subparsers(dest="verb", required=True, metavar="VERB")
    ls = verbs.add_parser("ls", help="list every engine in the cache (read-only)")
    _cache_argument(ls)
    ls.add_argument("--references", metavar="FILE", help="the operator's references JSON (who uses each key)")
    ls.add_argument("-o", "--output", choices=["table", "json"], default="table")
    ls.set_defaults(func=cmd_ls)
    gc = verbs.add_parser("gc", help="remove unreferenced engines beyond the retention")
    _cache_argument(gc)
    gc.add_argument("--references", required=True, metavar="FILE",
                    help="the operator's references JSON; re-read before every deletion")
    gc.add_argument("--keep", type=int, metavar="N", help="keep the N most recent unreferenced per model and variant")
    gc.add_argument("--max-age", metavar="DURATION", help="keep unreferenced engines younger than this (30d, 12h)")
    gc.add_argument("--dry-run", action="store_true", help="print what would be removed; remove nothing")
    gc.add_argument("--termination-log", help="termination-message file (default REDRAFTER_TERMINATION_LOG)")
    gc.add_argument("-o", "--output", choices=["text", "json"], default="text")
    gc.set_defaults(func=cmd_gc)


def referenced_text(engine: Engine) -> str:
    if engine.referenced_by:
        return ", ".join(r.describe() for r in engine.referenced_by)
    text = f"unreferenced since {engine.unreferenced_since}"
    if engine.locked_by:
        text += f"; being built by {engine.locked_by}"
    return text if engine.complete else f"incomplete; {text}"


def table(engines: list[Engine]) -> str:
    rows = [COLUMNS] + [(e.key, e.variant, e.model, e.tensorrt_llm_version, e.gpu_product,
                         human_bytes(e.size_bytes), e.built_at or "-", referenced_text(e)) for e in engines]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r[:-1], widths)) + "  " + r[-1] for r in rows)


def listing_document(root: Path, engines: list[Engine]) -> dict[str, Any]:
    """The ``-o json`` listing, also what the operator CLI reads back from the listing pod."""
    return {"cache": str(root), "engines": [e.to_json() for e in engines],
            "totalBytes": sum(e.size_bytes for e in engines)}


def _fail(exc: BuildError) -> int:
    print(f"error ({exc.code.name}): {exc.reason}", file=sys.stderr)
    return int(exc.code)


def cmd_ls(args: argparse.Namespace) -> int:
    try:
        settings = Settings.from_env()
        root = Path(args.cache)
        if not root.is_dir():
            raise BuildError(ExitCode.SOURCE_UNAVAILABLE, f"cache directory {root} does not exist")
        refs = load_references(args.references) if args.references else []
        engines = scan(root, refs, stale_seconds=settings.lock_stale_seconds)
    except BuildError as exc:
        return _fail(exc)
    except ValueError as exc:  # a malformed setting
        print(f"error (BAD_INPUT): {exc}", file=sys.stderr)
        return int(ExitCode.BAD_INPUT)
    if args.output == "json":
        print(json.dumps(listing_document(root, engines), indent=2))
    else:
        print(table(engines))
        print(f"\n{len(engines)} engine(s), {human_bytes(sum(e.size_bytes for e in engines))}")
    return 0


def cmd_gc(args: argparse.Namespace) -> int:
    log = Log(stream=sys.stderr if args.output == "json" else None)
    termination_log = args.termination_log
    try:
        settings = Settings.from_env()
        termination_log = termination_log or settings.termination_log
        retention = Retention(keep=args.keep,
                              max_age_seconds=parse_duration(args.max_age) if args.max_age else None)
        report = collect(Path(args.cache), args.references, retention, stale_seconds=settings.lock_stale_seconds,
                         dry_run=args.dry_run, log=log, now=time.time())
    except BuildError as exc:
        write_termination_message(termination_log or Settings.from_env({}).termination_log,
                                  format_termination_message(exc.code, exc.reason))
        return _fail(exc)
    except ValueError as exc:  # a malformed setting
        print(f"error (BAD_INPUT): {exc}", file=sys.stderr)
        return int(ExitCode.BAD_INPUT)
    if not args.dry_run:
        write_termination_message(termination_log, report.termination_message())
    if args.output == "json":
        print(json.dumps(report.to_json(), indent=2))
    return 0
