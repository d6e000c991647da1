"""Label selectors, field selectors and the JSONPath subset of printer columns, as pure functions.

Parsing errors raise ValueError so the server can answer 400 BadRequest like the real one.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

Matcher = Callable[[dict[str, Any]], bool]

_SET_TERM = re.compile(r"^(?P<key>[A-Za-z0-9_./-]+)\s+(?P<op>in|notin)\s*\((?P<vals>[^)]*)\)$")
_KEY = re.compile(r"^[A-Za-z0-9_./-]+$")


def _split_terms(selector: str) -> list[str]:
    """Split on commas that are not inside the parentheses of an in/notin set."""
    terms, depth, current = [], 0, []
    for ch in selector:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            terms.append("".join(current))
            current = []
        else:
            current.append(ch)
    terms.append("".join(current))
    return [t for t in (t.strip() for t in terms) if t]


def _label_check(term: str) -> Callable[[dict[str, str]], bool]:
    """One requirement of a label selector as a predicate over a labels dict."""
    m = _SET_TERM.match(term)
    if m is not None:
        values = {v.strip() for v in m["vals"].split(",") if v.strip()}
        key = m["key"]
        if m["op"] == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    for op in ("!=", "==", "="):
        if op in term:
            key, _, value = (part.strip() for part in term.partition(op))
            if not _KEY.match(key) or not re.match(r"^[A-Za-z0-9_.-]*$", value):
                raise ValueError(f"unable to parse requirement: {term!r}")
            if op == "!=":
                return lambda labels: labels.get(key) != value
            return lambda labels: labels.get(key) == value
    negated = term.startswith("!")
    key = term[1:].strip() if negated else term
    if not _KEY.match(key):
        raise ValueError(f"unable to parse requirement: {term!r}")
    if negated:
        return lambda labels: key not in labels
    return lambda labels: key in labels


def parse_label_selector(selector: str | None) -> Matcher:
    """``a=b,c!=d,e in (x,y),f notin (z),g,!h`` -> predicate over an object's metadata.labels."""
    if not selector:
        return lambda obj: True
    checks: list[Callable[[dict[str, str]], bool]] = []
    for term in _split_terms(selector):
        checks.append(_label_check(term))

    def match(obj: dict[str, Any]) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return all(check(labels) for check in checks)

    return match


def _dotted(obj: dict[str, Any], path: str) -> str | None:
    value: Any = obj
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def parse_field_selector(selector: str | None) -> Matcher:
    """``metadata.name=x,metadata.namespace!=y`` (any dotted path; missing fields compare as "")."""
    if not selector:
        return lambda obj: True
    checks: list[tuple[str, bool, str]] = []
    for term in _split_terms(selector):
        m = re.match(r"^([A-Za-z0-9_.]+)\s*(==|=|!=)\s*(.*)$", term)
        if m is None:
            raise ValueError(f"invalid field selector: {term!r}")
        checks.append((m[1], m[2] != "!=", m[3]))

    def match(obj: dict[str, Any]) -> bool:
        return all(((_dotted(obj, path) or "") == value) == equal for path, equal, value in checks)

    return match


_JP_TOKEN = re.compile(r"\.([A-Za-z0-9_-]+)|\[(\d+|\*)\]|\[\?\(@\.([A-Za-z0-9_.]+)\s*==\s*['\"]([^'\"]*)['\"]\)\]")


def jsonpath(obj: Any, path: str) -> list[Any]:
    """Evaluate the JSONPath subset CRD printer columns use: ``.a.b``, ``[0]``, ``[*]``, ``[?(@.k=="v")]``."""
    path = path.strip()
    if path.startswith("{") and path.endswith("}"):
        path = path[1:-1]
    if path.startswith("$"):
        path = path[1:]
    current = [obj]
    pos = 0
    while pos < len(path):
        m = _JP_TOKEN.match(path, pos)
        if m is None:
            raise ValueError(f"unsupported JSONPath {path!r} at {pos}")
        pos = m.end()
        nxt: list[Any] = []
        for value in current:
            if m[1] is not None:
                if isinstance(value, dict) and m[1] in value:
                    nxt.append(value[m[1]])
            elif m[2] is not None:
                if isinstance(value, list):
                    if m[2] == "*":
                        nxt.extend(value)
                    elif int(m[2]) < len(value):
                        nxt.append(value[int(m[2])])
            elif isinstance(value, list):
                nxt.extend(item for item in value if isinstance(item, dict) and _dotted(item, m[3]) == m[4])
        current = nxt
    return current
