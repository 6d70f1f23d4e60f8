"""`lab analyze`: any torch.profiler trace, or two side by side (CONTROL TEST)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from lab.base import files
from lab.base.errors import LabError, UsageError

HELP = "analyze a torch.profiler trace, or compare two (CONTROL TEST)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("traces", nargs="+", metavar="TRACE", help=".json or .json.gz Chrome trace(s)")
    p.add_argument("--json", action="store_true", help="print the full result as JSON")
    p.add_argument("--function", action="append", metavar="FILE:FUNC",
                   help="also total a Python function, e.g. hooks.py:_set_context (repeatable)")
    p.add_argument("--gap-threshold", type=float, default=100.0, help="list GPU idle gaps longer than this (µs)")
    p.add_argument("--folded", metavar="DIR",
                   help="write the folded stacks of each kind of gap to DIR (<source>__<kind>.folded, for a flame graph)")


def run(args: argparse.Namespace) -> int:
    from lab.traces import raw

    if len(args.traces) > 2:
        raise UsageError("Give one trace to analyze, or two (CONTROL TEST) to compare.")
    reading = [raw.prefetch(t) for t in args.traces]  # decompressing while the analyzers import
    from lab.pages.analysis_report import format_analysis, format_compare
    from lab.traces.analysis import analyze, compare
    from lab.traces.trace import load

    functions = tuple(args.function or ())
    try:
        traces = [load(t, data=r()) for t, r in zip(args.traces, reading)]
    except LabError as e:  # the traces are what the user gave: one that cannot be read is bad input
        raise UsageError(str(e)) from None
    if len(traces) == 1:
        result = analyze(traces[0], functions=functions, gap_threshold_us=args.gap_threshold)
        lines = format_analysis(result)
    else:
        result = compare(*traces, functions=functions, gap_threshold_us=args.gap_threshold)
        # why the two may not compare, and what is wrong with either, ahead of the numbers
        lines = [f"WARNING: {w}" for w in result["warnings"]] + format_compare(result)
    if args.folded:
        from lab.traces.gaps import folded_text

        out = Path(args.folded)
        out.mkdir(parents=True, exist_ok=True)
        for side, r in ([("", result)] if len(traces) == 1 else [("control__", result["control"]), ("test__", result["test"])]):
            for kind in r["gaps"]["kinds"]:
                path = out / f"{side}{kind['source']}__{kind['kind']}.folded".replace(" ", "-")
                files.write_text(path, folded_text(kind))
                lines.append(f"wrote {path}")
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    else:
        print("\n".join(lines))
    return 0
