"""`lab`: the command line. Each subcommand is a `cmd_<name>(args) -> int`; user errors print one line."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from lab.errors import LabError, describe_failure

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _scenario_options(p: argparse.ArgumentParser, *, pipeline_required: bool = True) -> None:
    p.add_argument("--pipeline", required=pipeline_required, help="scenario name (see `lab scenarios`)")
    p.add_argument("--size", choices=("full", "tiny", "pretrained"), help="default: full on CUDA, tiny on CPU")
    p.add_argument("--layers", type=int, help="with --size full: keep the true per-layer shapes, N blocks")
    p.add_argument("--steps", type=int, default=4, help="denoising steps (default 4; UniPC order 2 needs 3+)")
    p.add_argument("--full-decode", action="store_true", help="decode to images/video instead of latents")
    p.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), help="default: bf16 on CUDA, fp32 on CPU")
    p.add_argument("--checkpoint", help="with --size pretrained: hub id or local path (default: the scenario's)")
    p.add_argument("--call", choices=("full", "tiny"),
                   help="call settings: the checkpoint's (full) or small ones (tiny); default follows --size")
    p.add_argument("--seed", type=int, default=0)


def _compile_options(p: argparse.ArgumentParser, modes: tuple[str, ...] = ("eager", "compile")) -> None:
    p.add_argument("--mode", choices=modes, default="eager")
    p.add_argument("--compile-regional", action=argparse.BooleanOptionalAction, default=True,
                   help="compile_repeated_blocks (default) or the whole transformer (--no-compile-regional)")
    p.add_argument("--compile-fullgraph", action="store_true")
    p.add_argument("--compile-mode", choices=("default", "reduce-overhead", "max-autotune"), default="default")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lab",
        description="The diffusers fix lab: apply known performance fixes, profile, and prove their effect.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("fixes", help="list every fix and its status on the installed diffusers")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("diff", help="print a fix as a git-apply-able upstream diff")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--fix", help="fix name")
    g.add_argument("--all", action="store_true", help="every fix with a source change")
    p.add_argument("--out", help="directory to write <fix>.diff files into (default: stdout)")

    p = sub.add_parser("scenarios", help="list the scenarios: sizes, parameters, memory, call settings")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("run", help="build a scenario and time one call")
    _scenario_options(p)
    _compile_options(p)
    p.add_argument("--fix", default="", help="fixes to apply: NAME[,NAME..] or all")
    p.add_argument("--warmup", type=int, default=0, help="untimed calls before the timed one (default 0; 1 when compiling)")
    p.add_argument("--json", help="write the stage and per-step timing report (JSON) here")

    from lab import commands

    commands.add_more_parsers(sub, _scenario_options, _compile_options)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    from lab import commands

    handler: Callable[[argparse.Namespace], int] = getattr(commands, f"cmd_{args.command}")
    try:
        return handler(args)
    except LabError as e:
        print(f"ERROR: {e}", file=sys.stderr)
        return e.exit_code
    except OSError as e:
        print(f"ERROR: {e.strerror or e}: {e.filename}" if e.filename else f"ERROR: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("Interrupted.", file=sys.stderr)
        return 130
    except Exception as e:  # a failure inside diffusers or torch: one line here, the traceback in a file
        print(f"ERROR: {describe_failure(e)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
