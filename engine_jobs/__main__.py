"""``python -m engine_jobs COMMAND``: the entry point of build Jobs and serving pods."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from .cache_cmd import add_cache_parser
from .commands import add_build_parser, add_plan_parser, add_train_parser
from .serve import add_openai_parser, add_serve_parser


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine_jobs")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_plan_parser(sub)
    add_build_parser(sub)
    add_train_parser(sub)
    add_serve_parser(sub)
    add_openai_parser(sub)
    add_cache_parser(sub)
    args = parser.parse_args(argv)
    command: Callable[[argparse.Namespace], int] = args.func
    return command(args)


if __name__ == "__main__":
    sys.exit(main())
