"""Text (one line per check, a fix line under each failure and warning) and JSON renderings."""

from __future__ import annotations

import json

from .checks import CheckResult

SYMBOL = {"ok": "✓", "fail": "✗", "warn": "!"}


def passed(results: list[CheckResult]) -> bool:
    """Warnings do not fail the check."""
    return all(r.status != "fail" for r in results)


def text(results: list[CheckResult]) -> str:
    lines = []
    for r in results:
        lines.append(f"{SYMBOL[r.status]} {r.name}: {r.message}")
        if r.status != "ok" and r.fix:
            lines.append(f"    fix: {r.fix}")
    counts = {s: sum(1 for r in results if r.status == s) for s in SYMBOL}
    lines.append("")
    lines.append(f"{counts['ok']} passed, {counts['warn']} warning(s), {counts['fail']} failed")
    return "\n".join(lines) + "\n"


def as_json(results: list[CheckResult]) -> str:
    doc = {
        "checks": [{"name": r.name, "status": r.status, "message": r.message, "fix": r.fix} for r in results],
        "ok": passed(results),
    }
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
