"""`redrafter-operator` command line: one subcommand per job, each delegating to its module."""

from __future__ import annotations

import argparse
import sys
from typing import Callable

import yaml
from pydantic import ValidationError

Command = Callable[[argparse.Namespace], int]


def _cmd_crd(args: argparse.Namespace) -> int:
    from .api.crd import crd_yaml

    sys.stdout.write(crd_yaml())
    return 0


def _cmd_render(args: argparse.Namespace) -> int:
    from .api import KIND
    from .controller.preview import PreviewError, planned_children
    from .controller.validation import operator_image
    from .yamlio import dump_all

    with open(args.file, encoding="utf-8") if args.file != "-" else sys.stdin as fh:
        docs = [d for d in yaml.safe_load_all(fh) if d]
    resources = [d for d in docs if d.get("kind") == KIND]
    if not resources:
        print(f"error: {args.file} contains no {KIND}", file=sys.stderr)
        return 2
    out = []
    for body in resources:
        meta = body.setdefault("metadata", {})
        if args.namespace:
            meta["namespace"] = args.namespace
        try:
            out.extend(
                planned_children(
                    body,
                    active=args.active,
                    canary=args.canary,
                    promoted_key=args.promoted_key,
                    operator_namespace=args.operator_namespace,
                    image=operator_image(),
                )
            )
        except PreviewError as exc:
            errors = str(exc).split("; ")
            print(
                f"error: {KIND} {meta.get('name', '?')} is invalid:",
                *(f"  {e}" for e in errors),
                sep="\n",
                file=sys.stderr,
            )
            return 2
    sys.stdout.write(dump_all(out))
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    """The demo needs the development package (control plane launcher, simulated node), never part of this distribution."""
    print(
        "error: the demo runs on the development package redrafter-sim (a local control plane and a simulated GPU node), which this "
        "installation does not include.\nFrom a clone of the repository: `make demo` (installs it), or "
        "`pip install -e ./sim` and then `redrafter-sim demo`.",
        file=sys.stderr,
    )
    return 2


#: subcommands other modules contribute (run, evaluate, cache, check), by the module that adds each one's parser
PLUGINS = {
    "run": "redrafter_operator.controller.main",
    "evaluate": "redrafter_operator.evaluate.cli",
    "cache": "redrafter_operator.cache_cli",
    "check": "redrafter_operator.check.cli",
}
BUILTINS = ("crd", "demo", "render")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """Every subcommand's parser; given the ``command`` about to run, only the plugin that adds it is imported
    (the operator's controller takes a second to import, which `check` or `render` need not pay)."""
    from . import __version__

    parser = argparse.ArgumentParser(prog="redrafter-operator", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("crd", help="print the CustomResourceDefinition generated from the API models")
    p.set_defaults(func=_cmd_crd)

    p = sub.add_parser("demo", help="moved to the development package redrafter-sim (`make demo`)", add_help=False)
    p.set_defaults(func=_cmd_demo)

    p = sub.add_parser("render", help="print every manifest the operator would create for a resource (GitOps review)")
    p.add_argument("-f", "--file", required=True, help="YAML file with ReDrafterDeployment(s), or - for stdin")
    p.add_argument("-n", "--namespace", help="namespace to render into (default: the file's, else default)")
    p.add_argument(
        "--active", choices=["redrafter", "base"], default="redrafter", help="engine the stable Service should select"
    )
    p.add_argument(
        "--operator-namespace",
        help="namespace the operator runs in (its metrics scrape is admitted by spec.serving.networkPolicy)",
    )
    p.add_argument(
        "--canary",
        action="store_true",
        help="with --active base: the ReDrafter canary Deployment the policy runs in the base pool",
    )
    p.add_argument(
        "--promoted-key",
        metavar="KEY",
        help="the ReDrafter engine key that passed validation and serves today "
        "(status.validation.promoted.redrafterKey): a changed drafter is validated beside it in the "
        "candidate Deployment",
    )
    p.set_defaults(func=_cmd_render)

    if command in PLUGINS:
        wanted = [PLUGINS[command]]
    elif command in BUILTINS:
        wanted = []
    else:  # help, or a typo: list them all
        wanted = list(PLUGINS.values())
    for register in _plugins(wanted):
        register(sub)
    return parser


def _plugins(modules: list[str]) -> list[Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None]]:
    """The ``register_cli`` of each module (it adds its own parser); a module not in this build is skipped."""
    import importlib

    out = []
    for module in modules:
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name and module.startswith(exc.name):
                continue  # that part is not in this build
            raise
        out.append(mod.register_cli)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv[0] if argv else None)
    args, extra = parser.parse_known_args(argv)
    if extra and args.func is not _cmd_demo:  # the demo stub takes the demo's arguments, to explain itself
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    command: Command = args.func
    try:
        return command(args)
    except ValidationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
