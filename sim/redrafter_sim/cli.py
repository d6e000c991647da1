"""`redrafter-sim`: the development entry points of the emulated cluster (the demo, a standalone API server)."""

from __future__ import annotations

import argparse
import sys

from . import demo, server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="redrafter-sim", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo.register_cli(sub)
    p = sub.add_parser("server", help="an emulated Kubernetes API server for manual kubectl sessions", add_help=False)
    p.set_defaults(func=None)
    args, rest = parser.parse_known_args(argv)
    if args.command == "server":
        return server.main(rest, prog=f"{parser.prog} server")
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
