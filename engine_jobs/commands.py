"""The ``plan`` and ``build`` sub-commands of ``python -m engine_jobs``.

``plan`` prints the steps and exact argv of a build spec without running or fetching anything;
``build`` runs the Job. Both end with an :class:`~engine_jobs.errors.ExitCode`.
"""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

from .contract import BUILD_SPEC_FILE, CONFIG_MOUNT, ENGINE_DIR, TRAIN_SPEC_FILE, BuildResult, TrainingResult
from .errors import BuildError, ExitCode, bad_input, format_termination_message, write_termination_message
from .progress import Log
from .settings import Settings, describe

DEFAULT_SPEC = f"{CONFIG_MOUNT}/{BUILD_SPEC_FILE}"
DEFAULT_TRAIN_SPEC = f"{CONFIG_MOUNT}/{TRAIN_SPEC_FILE}"


def _spec_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec_path", nargs="?", metavar="SPEC", help=f"build spec JSON (default {DEFAULT_SPEC})")
    p.add_argument("--spec", dest="spec_flag", metavar="SPEC", help="same as the positional SPEC")


def _spec_path(args: argparse.Namespace) -> str:
    return args.spec_flag or args.spec_path or DEFAULT_SPEC


def add_plan_parser(sub: Any) -> None:
    p = sub.add_parser(
        "plan",
        help="print the build steps of a spec (runs nothing)",
        description="Print the ordered build steps with exact argv.\n\nSettings:\n" + describe(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _spec_arguments(p)
    p.add_argument(
        "--architecture",
        choices=["llama", "qwen"],
        help="for architecture auto when the base config.json is not readable yet (hf://, s3://)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_plan)


def add_train_parser(sub: Any) -> None:
    p = sub.add_parser(
        "train",
        help="train (or find in the cache) the ReDrafter drafter of a training spec",
        description="Run the drafter training Job.\n\nSettings:\n" + describe(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("spec_path", nargs="?", metavar="SPEC", help=f"training spec JSON (default {DEFAULT_TRAIN_SPEC})")
    p.add_argument("--spec", dest="spec_flag", metavar="SPEC", help="same as the positional SPEC")
    p.add_argument("--termination-log", help="termination-message file (default REDRAFTER_TERMINATION_LOG)")
    p.set_defaults(func=cmd_train)


def add_build_parser(sub: Any) -> None:
    p = sub.add_parser(
        "build",
        help="build (or find in the cache) the engine of a spec",
        description="Run the build Job.\n\nSettings:\n" + describe(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _spec_arguments(p)
    p.add_argument("--termination-log", help="termination-message file (default REDRAFTER_TERMINATION_LOG)")
    p.set_defaults(func=cmd_build)


# ---- plan --------------------------------------------------------------------------------------


def plan_document(spec_path: str, settings: Settings, architecture: str | None) -> dict[str, Any]:
    from .build import load_spec
    from .fetch import planned_location
    from .plan import Layout, plan_steps, resolve_architecture
    from .validate import read_config

    spec = load_spec(spec_path)
    if spec.backend == "pytorch":
        raise bad_input(
            "a PyTorch-backend spec has no build steps: its Job fetches, verifies and lays out the checkpoints "
            "(engine_jobs/prepare.py)"
        )
    where: dict[str, Any] = {
        "sources_mount": settings.sources_mount,
        "download_dir": settings.download_dir,
        "cache_dir": spec.cache_dir,
    }
    base_dir = planned_location("base", spec.base, **where)
    drafter_dir = planned_location("drafter", spec.drafter, **where) if spec.drafter else None
    if architecture:
        arch = resolve_architecture(architecture, None)
    elif spec.architecture != "auto":
        arch = resolve_architecture(spec.architecture, None)
    elif Path(base_dir, "config.json").is_file():
        arch = resolve_architecture("auto", read_config(Path(base_dir), "base"))
    else:
        raise bad_input(
            f"architecture is auto and {spec.base.uri} is not readable before fetch; "
            "pass --architecture llama|qwen to print the plan"
        )
    tmp = f"{spec.cache_dir}/.tmp-{spec.key}-<host>-<pid>"
    layout = Layout(
        base_model_dir=base_dir, drafter_model_dir=drafter_dir, work_dir=f"{tmp}/work", engine_dir=f"{tmp}/{ENGINE_DIR}"
    )
    steps = plan_steps(spec, settings, arch, layout)
    return {
        "key": spec.key,
        "variant": spec.variant,
        "architecture": arch,
        "artifact": f"{spec.cache_dir}/{spec.key}",
        "sources": {
            "base": base_dir,
            "drafter": drafter_dir,
            "tokenizer": planned_location("tokenizer", spec.tokenizer, **where),
        },
        "steps": [{"name": s.name, "description": s.description, "argv": list(s.argv)} for s in steps],
    }


def cmd_plan(args: argparse.Namespace) -> int:
    try:
        doc = plan_document(_spec_path(args), Settings.from_env(), args.architecture)
    except BuildError as exc:
        print(f"error ({exc.code.name}): {exc.reason}", file=sys.stderr)
        return int(exc.code)
    except ValueError as exc:  # a malformed setting
        print(f"error (BAD_INPUT): {exc}", file=sys.stderr)
        return int(ExitCode.BAD_INPUT)
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    print(f"engine {doc['key']}  variant={doc['variant']}  architecture={doc['architecture']}")
    print(f"artifact: {doc['artifact']}/  ({ENGINE_DIR}/, tokenizer/, model_repo/, manifest.json last)")
    for role, where in doc["sources"].items():
        if where:
            print(f"{role}: {where}")
    for i, step in enumerate(doc["steps"], 1):
        print(f"\n# {i}. {step['name']}: {step['description']}")
        argv = step["argv"]
        print(" \\\n    ".join(_pairs(argv)))
    return 0


def _pairs(argv: list[str]) -> list[str]:
    """Display only: the program on the first line, then ``--flag value`` per line (as in the README)."""
    lines: list[str] = []
    for token in argv:
        quoted = shlex.quote(token)
        if not lines:
            lines.append(quoted)
        elif token.startswith("--"):
            lines.append(quoted)
        elif lines[-1].startswith("--") and " " not in lines[-1]:
            lines[-1] += " " + quoted  # the flag's value
        elif len(lines) == 1:
            lines[0] += " " + quoted  # the script after the interpreter
        else:
            lines.append(quoted)
    return lines


# ---- build -------------------------------------------------------------------------------------


def _terminate(signum: int, _frame: Any) -> None:
    raise BuildError(
        ExitCode.TERMINATED, f"stopped by signal {signal.Signals(signum).name} (Job deadline or pod deletion)"
    )


def cmd_build(args: argparse.Namespace) -> int:
    def run(settings: Settings, log: Log) -> str:
        from .build import build, load_spec
        from .prepare import prepare

        spec = load_spec(_spec_path(args))
        # the PyTorch path has no engine: its Job prepares the checkpoints both variants serve
        manifest = (prepare if spec.backend == "pytorch" else build)(spec, settings, log)
        result = BuildResult(
            size_bytes=int((manifest.get("sizes") or {}).get("artifact_bytes") or 0),
            built_at=(manifest.get("builder") or {}).get("built_at"),
        )
        return result.message(
            # the Job's variant: a PyTorch-path artifact serves both and may have been prepared by the other's Job
            f"OK: engine {manifest['key']} ({spec.variant}) is complete at {spec.cache_dir}/{manifest['key']}"
        )

    return _run_job(args, run)


def cmd_train(args: argparse.Namespace) -> int:
    def run(settings: Settings, log: Log) -> str:
        from .train import load_train_spec, train

        spec = load_train_spec(args.spec_flag or args.spec_path or DEFAULT_TRAIN_SPEC)
        manifest = train(spec, settings, log)
        evaluation = manifest.get("evaluation") or {}
        figures = ("heldOutAcceptance", "untrainedAcceptance", "promptLookupAcceptance", "tokensPerStep", "loss")
        result = TrainingResult.model_validate(
            {
                **{k: evaluation.get(k) for k in figures},
                **{k: (evaluation.get(k) or [None])[0] for k in ("heldOutTop1", "trainTop1")},
                "steps": int(evaluation.get("steps") or 0),
                "sizeBytes": int((manifest.get("sizes") or {}).get("artifact_bytes") or 0),
                "trainedAt": (manifest.get("builder") or {}).get("built_at"),
            }
        )
        return result.message(
            f"OK: drafter {manifest['key']} is complete at {spec.cache_dir}/drafters/{manifest['key']}"
        )

    return _run_job(args, run)


def _run_job(args: argparse.Namespace, run: Any) -> int:
    """A Job's common ending: the termination message (``OK: ...`` and its result, or the failure's code and
    reason with the output tail) and the exit code."""
    log = Log()
    termination_log = args.termination_log
    signal.signal(signal.SIGTERM, _terminate)
    try:
        settings = Settings.from_env()
        termination_log = termination_log or settings.termination_log
        write_termination_message(termination_log, run(settings, log))
        return 0
    except BuildError as exc:
        code, reason, detail = exc.code, exc.reason, exc.detail
    except ValueError as exc:  # a malformed setting
        code, reason, detail = ExitCode.BAD_INPUT, str(exc), ""
    except Exception as exc:  # a bug: say so, with the traceback tail for the report
        code, reason, detail = ExitCode.INTERNAL, f"unexpected {type(exc).__name__}: {exc}", traceback.format_exc()
    log(f"FAILED ({code.name}, exit {int(code)}): {reason}", stream=sys.stderr)
    if detail:
        log("last output:\n" + detail, stream=sys.stderr)
    write_termination_message(
        termination_log or Settings.from_env({}).termination_log,
        log.redact(format_termination_message(code, reason, detail)),
    )
    return int(code)
