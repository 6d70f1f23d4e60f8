"""`lab`: the command line. Each subcommand is one module of :mod:`lab.commands` (its parser and its handler);
this module builds the parser from them and turns errors into one line each."""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys

from lab.base import files
from lab.base.errors import LabError, describe_failure, during_interruption, take_interruptions
from lab.commands import ORDER

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _module(name: str):
    return importlib.import_module(f"lab.commands.{name}")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with `only`, the options of that subcommand alone (the others are names without
    options: their modules, and what they import, stay unloaded, which keeps a short command such as `lab analyze`
    short)."""
    parser = argparse.ArgumentParser(
        prog="lab",
        description="The diffusers fix lab: apply known performance fixes, profile, and prove their effect.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in ORDER:
        if only is not None and name != only:
            sub.add_parser(name)
            continue
        module = _module(name)
        module.add_arguments(sub.add_parser(name, help=module.HELP, description=module.__doc__.splitlines()[0]))
    return parser


def main(argv: list[str] | None = None) -> int:
    take_interruptions()  # a Ctrl-C or a time limit's SIGTERM keeps what was measured
    given = sys.argv[1:] if argv is None else argv
    parser = build_parser(only=given[0] if given and given[0] in ORDER else None)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return _module(args.command).run(args)
    except KeyboardInterrupt:
        print("Interrupted.", file=sys.stderr)
        return 130
    except Exception as e:
        if during_interruption(e):  # a cleanup that failed on the way out of a Ctrl-C or a time limit
            print(f"Interrupted ({type(e).__name__} on the way out: {e}).", file=sys.stderr)
            return 130
        if isinstance(e, LabError):
            print(f"ERROR: {e}", file=sys.stderr)
            return e.exit_code
        if isinstance(e, OSError):
            print(f"ERROR: {os_error(e)}", file=sys.stderr)
            return 1
        print(f"ERROR: {describe_failure(e)}", file=sys.stderr)  # inside diffusers or torch; the traceback in a file
        return 1
    finally:
        files.release_all()  # the results this command claimed (`files.claim`): another may write them now


def os_error(e: OSError) -> str:
    """One line for a failure to read or write a file: what the system said, and where; a full disk says so with
    what to do (the files it was writing are left as they were: `lab.base.files`)."""
    where = f": {e.filename}" if e.filename else ""
    if e.errno == errno.ENOSPC:
        return (f"no space left on device{where} ({e.strerror or 'ENOSPC'}): nothing half-written was kept; free "
                "some space, or write elsewhere (`--out`, `--trace-dir`), and run it again.")
    return f"{e.strerror or e}{where}" if e.filename else str(e)


if __name__ == "__main__":
    sys.exit(main())
