"""One YAML style for everything we print: no anchors, multi-line strings as readable blocks."""

from __future__ import annotations

from typing import Any, Iterable

import yaml


class _Dumper(yaml.SafeDumper):  # type: ignore[misc]  # PyYAML ships no types
    def ignore_aliases(self, data: Any) -> bool:  # anchors make manifests hard to review
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump(doc: Any) -> str:
    return str(yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=120))


def dump_all(docs: Iterable[Any]) -> str:
    return str(yaml.dump_all(list(docs), Dumper=_Dumper, sort_keys=False, width=120))
