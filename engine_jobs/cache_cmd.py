"""``python -m engine_jobs cache ls|gc``: list an engine cache, collect unreferenced engines.

``ls`` only reads (it runs in a pod mounting the cache read-only); ``gc`` runs as the operator's
collection Job and writes what it removed as JSON to the termination message.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import time
import zlib
from pathlib import Path
from typing import Any

from .cache_gc import Retention, collect, parse_duration
from .cache_index import Engine, Partial, cache_roots, find_partials, load_references, scan
from .contract import CACHE_MOUNT
from .errors import (
    TERMINATION_MESSAGE_LIMIT,
    BuildError,
    ExitCode,
    format_termination_message,
    write_termination_message,
)
from .progress import Log, human_bytes
from .settings import Settings

COMPRESSED_PREFIX = "zlib+base64:"
COLUMNS = ("KEY", "VARIANT", "MODEL", "TRTLLM", "GPU", "SIZE", "BUILT", "REFERENCED BY")


def _cache_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--local",
        "--cache",
        dest="cache",
        default=CACHE_MOUNT,
        metavar="DIR",
        help=f"the mounted cache directory (default {CACHE_MOUNT})",
    )


def add_cache_parser(sub: Any) -> None:
    cache = sub.add_parser("cache", help="list or collect the engine cache")
    verbs = cache.add_subparsers(dest="verb", required=True, metavar="VERB")
    ls = verbs.add_parser("ls", help="list every engine in the cache (read-only)")
    _cache_argument(ls)
    ls.add_argument("--references", metavar="FILE", help="the operator's references JSON (who uses each key)")
    ls.add_argument("-o", "--output", choices=["table", "json"], default="table")
    ls.add_argument(
        "--termination-log",
        metavar="FILE",
        help="also write the listing there, compressed to fit Kubernetes' 4096 bytes (listing pods)",
    )
    ls.set_defaults(func=cmd_ls)
    gc = verbs.add_parser("gc", help="remove unreferenced engines beyond the retention")
    _cache_argument(gc)
    gc.add_argument(
        "--references",
        required=True,
        metavar="FILE",
        help="the operator's references JSON; re-read before every deletion",
    )
    gc.add_argument("--keep", type=int, metavar="N", help="keep the N most recent unreferenced per model and variant")
    gc.add_argument("--max-age", metavar="DURATION", help="keep unreferenced engines younger than this (30d, 12h)")
    gc.add_argument("--dry-run", action="store_true", help="print what would be removed; remove nothing")
    gc.add_argument("--termination-log", help="termination-message file (default REDRAFTER_TERMINATION_LOG)")
    gc.add_argument("-o", "--output", choices=["text", "json"], default="text")
    gc.set_defaults(func=cmd_gc)


def referenced_text(engine: Engine) -> str:
    if engine.referenced_by:
        return ", ".join(r.describe() for r in engine.referenced_by)
    text = (
        f"unreferenced since {engine.unreferenced_since}"
        if engine.unreferenced_since
        else "unreferenced (since before any collection saw it)"
    )
    if engine.locked_by:
        text += f"; being built by {engine.locked_by}"
    return text if engine.complete else f"incomplete; {text}"


def table(engines: list[Engine]) -> str:
    rows = [COLUMNS] + [
        (
            e.key,
            e.variant,
            e.model,
            e.tensorrt_llm_version,
            e.gpu_product,
            human_bytes(e.size_bytes),
            e.built_at or "-",
            referenced_text(e),
        )
        for e in engines
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r[:-1], widths)) + "  " + r[-1] for r in rows)


def partials_text(partials: list[dict[str, Any]], total: int | None = None) -> str:
    """The partial builds of a listing (``partials`` items of :func:`listing_document`): a summary, then one
    line each; "" when there are none."""
    total = sum(int(p.get("sizeBytes") or 0) for p in partials) if total is None else total
    if not partials and not total:
        return ""
    abandoned = [p for p in partials if not p.get("lockedBy")]
    lines = [
        f"{len(partials)} partial build(s), {human_bytes(total)}; {len(abandoned)} abandoned "
        f"({human_bytes(sum(int(p.get('sizeBytes') or 0) for p in abandoned))}): the collection removes those"
    ]
    for p in partials:
        state = f"being built by {p['lockedBy']}" if p.get("lockedBy") else "abandoned (no live build lock)"
        lines.append(f"  {p['entry']}  key {p['key']}  {human_bytes(int(p.get('sizeBytes') or 0))}  {state}")
    return "\n".join(lines)


def listing_document(root: Path, engines: list[Engine], partials: list[Partial] | None = None) -> dict[str, Any]:
    """The ``-o json`` listing, also what the operator CLI reads back from the listing pod.

    ``totalBytes`` counts the engines; ``partialBytes`` the partial builds (temp directories of builds,
    running or abandoned, and ``<key>/`` without manifest).
    """
    partials = partials or []
    return {
        "cache": str(root),
        "engines": [e.to_json() for e in engines],
        "totalBytes": sum(e.size_bytes for e in engines),
        "partials": [p.to_json() for p in partials],
        "partialBytes": sum(p.size_bytes for p in partials),
    }


def encode_message(doc: dict[str, Any], limit: int = TERMINATION_MESSAGE_LIMIT) -> str:
    """JSON if it fits, else zlib+base64 of it; engines dropped from the end (``truncated`` counts them) as a last resort.

    The listing pod's only channel back is its termination message (readable with ``get pods`` alone,
    and kept after the logs are gone), which Kubernetes cuts at 4096 bytes.
    """
    doc = dict(doc)
    engines = list(doc.get("engines") or [])
    partials = list(doc.get("partials") or [])
    while True:
        text = json.dumps(doc, separators=(",", ":"))
        if len(text.encode()) <= limit:
            return text
        packed = COMPRESSED_PREFIX + base64.b64encode(zlib.compress(text.encode(), 9)).decode()
        if len(packed) <= limit or not (engines or partials):
            return packed[:limit]
        if partials:  # partial builds go first: partialBytes stays exact
            drop = max(1, len(partials) // 10)
            del partials[-drop:]
            doc["partials"] = partials
            doc["partialsTruncated"] = int(doc.get("partialsTruncated", 0)) + drop
            continue
        drop = max(1, len(engines) // 10)  # few compressions even for thousands of engines
        del engines[-drop:]
        doc["engines"] = engines
        doc["truncated"] = int(doc.get("truncated", 0)) + drop


def decode_message(text: str) -> dict[str, Any]:
    """The document :func:`encode_message` wrote (raises ValueError on anything else)."""
    text = text.strip()
    if text.startswith(COMPRESSED_PREFIX):
        try:
            text = zlib.decompress(base64.b64decode(text[len(COMPRESSED_PREFIX) :])).decode()
        except (zlib.error, ValueError) as exc:
            raise ValueError(f"corrupt compressed message: {exc}") from None
    doc = json.loads(text)
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    return doc


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
        engines, partials = [], []
        for where in cache_roots(root):  # the engines, then the trained drafters (variant "drafter")
            engines += scan(where, refs, stale_seconds=settings.lock_stale_seconds)
            for p in find_partials(where, stale_seconds=settings.lock_stale_seconds, log=Log(stream=sys.stderr)):
                p.entry = str(where.relative_to(root) / p.entry) if where != root else p.entry
                partials.append(p)
    except BuildError as exc:
        return _fail(exc)
    except ValueError as exc:  # a malformed setting
        print(f"error (BAD_INPUT): {exc}", file=sys.stderr)
        return int(ExitCode.BAD_INPUT)
    doc = listing_document(root, engines, partials)
    if args.termination_log:
        write_termination_message(args.termination_log, encode_message(doc))
    if args.output == "json":
        print(json.dumps(doc, indent=2))
    else:
        print(table(engines))
        print(f"\n{len(engines)} engine(s), {human_bytes(sum(e.size_bytes for e in engines))}")
        if partials:
            print(partials_text(doc["partials"], doc["partialBytes"]))
    return 0


def cmd_gc(args: argparse.Namespace) -> int:
    log = Log(stream=sys.stderr if args.output == "json" else None)
    termination_log = args.termination_log
    try:
        settings = Settings.from_env()
        termination_log = termination_log or settings.termination_log
        retention = Retention(keep=args.keep, max_age_seconds=parse_duration(args.max_age) if args.max_age else None)
        report = collect(
            Path(args.cache),
            args.references,
            retention,
            stale_seconds=settings.lock_stale_seconds,
            dry_run=args.dry_run,
            log=log,
            now=time.time(),
        )
    except BuildError as exc:
        write_termination_message(
            termination_log or Settings.from_env({}).termination_log, format_termination_message(exc.code, exc.reason)
        )
        return _fail(exc)
    except ValueError as exc:  # a malformed setting
        print(f"error (BAD_INPUT): {exc}", file=sys.stderr)
        return int(ExitCode.BAD_INPUT)
    write_termination_message(termination_log, report.termination_message())
    if args.output == "json":
        print(json.dumps(report.to_json(), indent=2))
    return 0
