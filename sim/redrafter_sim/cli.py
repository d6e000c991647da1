"""`redrafter-sim`: the development entry points (the demo, a development cluster to poke at with kubectl)."""

from __future__ import annotations

import argparse
import sys

from . import demo, devcluster


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="redrafter-sim", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo.register_cli(sub)
    p = sub.add_parser(
        "cluster", help="the control plane and simulated GPU nodes, for kubectl sessions, until Ctrl-C", add_help=False
    )
    p.set_defaults(func=None)
    args, rest = parser.parse_known_args(argv)
    if args.command == "cluster":
        return devcluster.main(rest, prog=f"{parser.prog} cluster")
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
