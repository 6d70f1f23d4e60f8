"""Which lines of diffusers does a tiny run leave out? Records the lines of diffusers (pipeline, models, attention,
scheduler, hooks, utils: every file of the package) that one call runs, per scenario, and compares two such records (tiny on the CPU against `full --layers 2`
on the GPU): the lines that run at full size but not at tiny size, with their source.

    python benchmarks/tiny_coverage.py record --dtype bfloat16 --out results/coverage/tiny__cpu.json   # tiny, here
    python benchmarks/tiny_coverage.py record --size full --layers 2 --out results/coverage/full-2l__h200.json
    python benchmarks/tiny_coverage.py compare results/coverage/tiny__cpu.json results/coverage/full-2l__h*.json

`record --merge --pipelines a,b` adds scenarios to an existing record of the same size, device, dtype, diffusers and
torch (the record says which command recorded which scenario); a record is written after each scenario.

`compare TINY FULL [FULL ...]` takes one or more full records (made on different GPUs, each for its own scenarios: a
scenario in two of them is refused) and writes `<out>.md` (default `results/coverage/tiny_leaves_out.md`): per
scenario and file, each line that only the full run ran, with its reason where `ON_ACCELERATOR_ONLY` below gives one
(`"path:line": "why"`: a line that runs only on an accelerator) or the scenario's `tiny_leaves_out` does (a line that
only the true config can run). A line without a reason is a difference between the tiny build and the true one: mend
the scenario's tiny config (or its scheduler, dtype or inputs) until it runs.
Lines are those of one call after a warm-up call, under `torch.compiler.set_stance("force_eager")`.
"""

from __future__ import annotations

import argparse
import json
import linecache
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


#: lines that run only on an accelerator, whatever the size (a tiny run on the CPU cannot take them); a reason per line
ON_ACCELERATOR_ONLY = {
    **{f"diffusers/utils/torch_utils.py:{n}": "randn_tensor with a CPU generator and latents on the GPU (the lab seeds "
       "a CPU generator, so that every device draws the same noise); on the CPU the two are on one device" for n in range(170, 176)},
}


def diffusers_files() -> dict[str, str]:
    """Every source file of the installed diffusers (the tracer looks only at frames of these, and one call touches
    a few dozen of them: pipeline, models, attention dispatch, scheduler, hooks, utils): absolute path -> path from
    `diffusers/`."""
    import diffusers

    top = Path(diffusers.__file__).resolve().parent
    return {str(p): "diffusers/" + p.relative_to(top).as_posix() for p in sorted(top.rglob("*.py"))}


def record_one(name: str, size: str, layers: int | None, device: str | None, dtype=None) -> dict[str, list[int]]:
    import torch

    from lab.apply.coverage import LineCoverage, eager
    from lab.run.runner import timed_call
    from lab.run.scenario import build, get_scenario

    built = build(get_scenario(name), size=size, layers=layers, device=device, dtype=dtype)
    timed_call(built, seed=0, marks=False)  # warm-up: lazy first-call paths are not what a steady call runs
    files = diffusers_files()
    with eager(), LineCoverage(files) as cov:
        timed_call(built, seed=0, marks=False)
    del built
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return {files[f]: sorted(lines) for f, lines in sorted(cov.hits.items()) if lines}


def record(args) -> int:
    import platform

    import diffusers
    import torch

    from lab.run.scenario import catalog, default_device, default_size

    device = args.device or default_device()
    size = args.size or default_size(device)
    names = list(catalog()) if args.pipelines == "all" else args.pipelines.split(",")
    gpu = torch.cuda.get_device_name() if device.startswith("cuda") else "none (CPU)"
    data = {"size": size, "layers": args.layers, "device": gpu, "dtype": args.dtype, "diffusers": diffusers.__version__,
            "torch": torch.__version__, "machine": platform.machine(),
            "command": "python benchmarks/tiny_coverage.py " + " ".join(sys.argv[1:]), "runs": {}}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    old = json.loads(out.read_text()) if args.merge and out.exists() else None
    for i, name in enumerate(names, 1):
        print(f"[{i}/{len(names)}] {name} ...", file=sys.stderr, flush=True)
        try:
            data["runs"][name] = record_one(name, size, args.layers, device,
                                            getattr(torch, args.dtype) if args.dtype else None)
        except Exception as e:  # one scenario's failure is recorded, the others go on
            data["runs"][name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
        # after each scenario, so that a run cut short keeps what it recorded
        out.write_text(json.dumps(merged(old, data) if old else data, indent=1) + "\n")
    print(f"wrote {out}", file=sys.stderr)
    return 0


RUN_KEYS = ("size", "layers", "device", "dtype", "diffusers", "torch", "machine")


def merged(old: dict, new: dict) -> dict:
    """`new` with the runs of `old` for the scenarios `new` did not record. The two must have recorded the same
    thing (size, layers, device, dtype, diffusers, torch): lines differ between any two of those."""
    differ = [k for k in RUN_KEYS if k != "machine" and old.get(k) != new.get(k)]
    if differ:
        raise SystemExit("--merge: the existing record differs from this run in "
                         + ", ".join(f"{k} ({old.get(k)} against {new.get(k)})" for k in differ))
    commands = old.get("commands") or {name: old["command"] for name in old["runs"]}
    runs = {**old["runs"], **new["runs"]}
    return {**new, "runs": runs,
            "commands": {name: new["command"] if name in new["runs"] else commands.get(name, old["command"])
                         for name in runs}}


def _source_line(path: str, line: int) -> str:
    import diffusers

    full = Path(diffusers.__file__).resolve().parent.parent / path
    return linecache.getline(str(full), line).strip()


def left_out(tiny: dict, full: dict) -> dict[str, dict[str, list[int]]]:
    """Per scenario and file: the lines the full run ran and the tiny run did not (a pure function of two records)."""
    out: dict[str, dict[str, list[int]]] = {}
    for name, files in full["runs"].items():
        if "error" in files or "error" in tiny["runs"].get(name, {"error": 1}):
            continue
        small = tiny["runs"][name]
        missing = {f: sorted(set(lines) - set(small.get(f, ()))) for f, lines in files.items()}
        missing = {f: lines for f, lines in missing.items() if lines}
        if missing:
            out[name] = missing
    return out


def _commands(record: dict) -> str:
    """The command(s) that made a record, naming the scenarios of each when a merged record has several."""
    by_command: dict[str, list[str]] = {}
    for name, command in (record.get("commands") or {}).items():
        by_command.setdefault(command, []).append(name)
    if len(by_command) <= 1:
        return f"`{record['command']}`"
    return "; ".join(f"`{command}` ({', '.join(names)})" for command, names in by_command.items())


def joined(records: list[dict]) -> dict:
    """One full record from several (each made on its own GPU for its own scenarios): the runs of all, each scenario
    from exactly one record. Records of different diffusers are refused: their lines differ."""
    versions = {r["diffusers"] for r in records}
    if len(versions) > 1:
        raise SystemExit(f"the full records ran diffusers {', '.join(sorted(versions))}: lines differ")
    runs: dict = {}
    for record in records:
        twice = sorted(set(runs) & set(record["runs"]))
        if twice:
            raise SystemExit(f"scenario(s) {', '.join(twice)} are in two full records: keep one")
        runs.update(record["runs"])
    return {**records[0], "runs": runs}


def _made_by(records: list[dict]) -> str:
    return "; ".join(f"{_commands(r)} ({r['device']})" for r in records)


def _scenario_reasons(name: str) -> dict[str, str]:
    """The scenario's own reasons for lines that only its true config can run (`Scenario.tiny_leaves_out`)."""
    from lab.run.scenario import catalog

    scenario = catalog().get(name)
    return dict(scenario.tiny_leaves_out) if scenario is not None else {}


def compare(args) -> int:
    tiny = json.loads(Path(args.tiny).read_text())
    fulls = [json.loads(Path(p).read_text()) for p in args.full]
    full = joined(fulls)
    if tiny["diffusers"] != full["diffusers"]:
        raise SystemExit(f"the two records ran diffusers {tiny['diffusers']} and {full['diffusers']}: lines differ")
    missing = left_out(tiny, full)
    lines = ["# Lines of diffusers a tiny run leaves out", "",
             f"Tiny: {_made_by([tiny])}; full: {_made_by(fulls)}; diffusers "
             f"{full['diffusers']}. Each line below ran in one call at full size and not at tiny size; its reason "
             "follows it where the line runs only on an accelerator or only the true config can run it (the "
             "scenario's `tiny_leaves_out`).", ""]
    unexplained = 0
    for name in full["runs"]:
        errors = [r["error"] for r in (tiny["runs"].get(name, {}), full["runs"][name]) if "error" in r]
        if errors:
            lines += [f"## {name}", "", f"not compared: {'; '.join(errors)}", ""]
            continue
        files = missing.get(name, {})
        reasons = {**ON_ACCELERATOR_ONLY, **_scenario_reasons(name)}
        lines += [f"## {name}", ""]
        if not files:
            lines += ["Nothing: every line the full run ran, the tiny run ran too.", ""]
            continue
        for path, numbers in files.items():
            lines.append(f"- `{path}`")
            for n in numbers:
                why = reasons.get(f"{path}:{n}")
                unexplained += why is None
                lines.append(f"  - {n}: `{_source_line(path, n)}`" + (f" — {why}" if why else ""))
        lines.append("")
    lines.insert(4, f"**{unexplained} line(s) without a reason.**\n")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines))
    print(f"wrote {out}: {unexplained} line(s) without a reason", file=sys.stderr)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    rec = sub.add_parser("record", help="record the lines one call runs, per scenario")
    rec.add_argument("--pipelines", default="all")
    rec.add_argument("--size", default=None)
    rec.add_argument("--layers", type=int, default=None)
    rec.add_argument("--device", default=None)
    rec.add_argument("--dtype", default=None, choices=["bfloat16", "float16", "float32"],
                     help="the weights' dtype (default: the lab's for the device); the GPU record runs bfloat16, so "
                          "the tiny one should too: some lines run only for half-precision weights")
    rec.add_argument("--out", required=True)
    rec.add_argument("--merge", action="store_true",
                     help="keep the existing record's runs of the scenarios not recorded now")
    cmp = sub.add_parser("compare", help="the lines a full record has and a tiny one lacks")
    cmp.add_argument("tiny")
    cmp.add_argument("full", nargs="+", help="one or more full records (each for its own scenarios)")
    cmp.add_argument("--out", default="results/coverage/tiny_leaves_out.md")
    args = parser.parse_args()
    return record(args) if args.what == "record" else compare(args)


if __name__ == "__main__":
    raise SystemExit(main())
