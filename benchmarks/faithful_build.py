"""Benchmark: does the lab's build behave like the pipeline a user gets? For each scenario, one profiled call of the
lab's build and one of the same random weights after a `save_pretrained` -> `from_pretrained(torch_dtype=...)` ->
`.to(device)` round trip (the user's path), and the exact counts each shows: syncs by call site, host-to-device and
device-to-host copies, host scalar reads, launches per step. A difference is a bug in the build, not a result.

    python benchmarks/faithful_build.py                      # tiny on a CPU: host scalar reads and copies
    python benchmarks/faithful_build.py --size full --layers 2 --out results/faithful   # on a GPU: syncs too
    python benchmarks/faithful_build.py --size full --layers 2 --pipelines sdxl,sana --merge   # add to that report

Writes `<out>/<size>__<device>.json` and `.md` (one row per scenario and build). With `--merge`, the scenarios
measured now replace their rows in the existing report and the other rows stay; each row keeps the command,
environment and lab commit it was measured with, and the page says which rows came from which run.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def round_trip(built, folder: Path):
    """The pipeline a user gets from the same weights: each model saved and loaded back as `from_pretrained` loads
    it (in the dtype the scenario gives it), the pipeline assembled and moved with `.to(device)`."""
    from lab.run.scenario import _model_dtype, resolve

    components = dict(built.pipe.components)
    for name, model in built.scenario.models.items():
        path = folder / name
        components[name].save_pretrained(path)
        components[name] = resolve(model.cls).from_pretrained(path, torch_dtype=_model_dtype(model, built.dtype))
    components["scheduler"] = type(built.pipe.scheduler).from_config(built.pipe.scheduler.config)
    # a keyword the scenario passes may be a registered component in a later release (Cosmos 2's safety_checker)
    extra = {k: v for k, v in built.scenario.pipeline_kwargs.items() if k not in components}
    pipe = type(built.pipe)(**components, **extra)
    pipe.to(built.device)
    pipe.set_progress_bar_config(disable=False)
    return pipe


def counts(analysis: dict) -> dict:
    """What must be equal between the two builds: exact counts, no times."""
    memcpy = analysis["host_reads"]["memcpy"]
    return {
        "syncs": analysis["syncs"]["count"],
        "sync_sites": {site: v["count"] for site, v in sorted(analysis["syncs"]["sites"].items())},
        "host_scalar_reads": analysis["host_reads"]["scalar_reads"],
        "scalar_read_sites": dict(sorted(analysis["host_reads"]["scalar_read_sites"].items())),
        "memcpy_HtoD": memcpy.get("HtoD", {}).get("count", 0),
        "memcpy_DtoH": memcpy.get("DtoH", {}).get("count", 0),
        "launches_per_step": {k: v for k, v in sorted((analysis["launches"].get("per_step") or {}).items())},
    }


def profiled_counts(built, trace_dir: Path, stem: str) -> dict:
    from lab.run.profile import ProfileOptions, profile_call
    from lab.run.runner import timed_call
    from lab.traces.analysis import analyze
    from lab.traces.trace import load

    timed_call(built, seed=0, marks=False)  # warm-up
    paths = profile_call(built, trace_dir, stem, ProfileOptions(record_shapes=False))
    return counts(analyze(load(paths["trace"])))


def compare(name: str, size: str, layers: int | None, device: str | None, dtype, trace_dir: Path) -> dict:
    import dataclasses

    import torch

    from lab.run.scenario import build, get_scenario

    built = build(get_scenario(name), size=size, layers=layers, device=device, dtype=dtype)
    lab_counts = profiled_counts(built, trace_dir, f"{name}_lab")
    lab_output = _output(built)
    with tempfile.TemporaryDirectory() as folder:
        user = dataclasses.replace(built, pipe=round_trip(built, Path(folder)))
        user_counts = profiled_counts(user, trace_dir, f"{name}_user")
        user_output = _output(user)
    differ = sorted(k for k in lab_counts if lab_counts[k] != user_counts[k])
    same_output = bool(torch.equal(lab_output, user_output))
    del built, user
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return {"scenario": name, "lab": lab_counts, "user": user_counts, "differ": differ,
            "outputs_bit_identical": same_output}


def _output(built):
    from lab.run.runner import timed_call

    return timed_call(built, seed=0, marks=False).output.float().cpu()


RUN_KEYS = ("command", "environment", "lab_commit")


def merged(old: dict, new: dict) -> dict:
    """`new` with the rows of `old` whose scenarios `new` did not measure, in catalog order; each old row keeps the run
    it came from (its own keys, or the old report's)."""
    from lab.run.scenario import catalog

    if old.get("size") != new["size"] or old.get("device") != new["device"]:
        raise SystemExit(f"--merge: the existing report is {old.get('size')} on {old.get('device')}, this run "
                         f"{new['size']} on {new['device']}; merge only runs of one size and device")
    measured = {row["scenario"] for row in new["rows"]}
    kept = [{**{k: old.get(k, "?") for k in RUN_KEYS}, **row} for row in old["rows"] if row["scenario"] not in measured]
    order = {name: i for i, name in enumerate(catalog())}
    rows = sorted(kept + new["rows"], key=lambda row: order.get(row["scenario"], len(order)))
    return {**new, "rows": rows}


def _runs(data: dict) -> list[str]:
    """One line per run that rows of this report come from, naming its scenarios."""
    runs: dict[tuple, list[str]] = {}
    for row in data["rows"]:
        runs.setdefault(tuple(row.get(k, data.get(k, "?")) for k in RUN_KEYS), []).append(row["scenario"])
    if len(runs) == 1:
        command, environment, commit = next(iter(runs))
        return [f"`{command}`; {environment}; lab {commit}."]
    return [f"- `{command}`; {environment}; lab {commit}: {', '.join(names)}."
            for (command, environment, commit), names in runs.items()]


def markdown(data: dict) -> str:
    lines = [f"# The lab's build against the user's path ({data['size']}, {data['device']})", "",
             *_runs(data)] + ([f"Build: {data['build']}."] if data.get("build") else []) + ["",
             "Each scenario profiled once as the lab builds it and once after a `save_pretrained` -> `from_pretrained` "
             "-> `.to(device)` round trip of the same weights. Counts are per call of 4 steps.", "",
             "| scenario | build | syncs | HtoD | DtoH | host scalar reads | launches per step | same counts | outputs |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in data["rows"]:
        if "error" in row:
            lines.append(f"| {row['scenario']} | - | error: {row['error']} | | | | | | |")
            continue
        for build in ("lab", "user"):
            c = row[build]
            launches = ", ".join(str(v) for k, v in c["launches_per_step"].items() if k != "outside") or "-"
            same = ("yes" if not row["differ"] else "no: " + ", ".join(row["differ"])) if build == "user" else ""
            out = ("bit-identical" if row["outputs_bit_identical"] else "differ") if build == "user" else ""
            lines.append(f"| {row['scenario']} | {build} | {c['syncs']} | {c['memcpy_HtoD']} | {c['memcpy_DtoH']} | "
                         f"{c['host_scalar_reads']} | {launches} | {same} | {out} |")
    for row in data["rows"]:
        if row.get("differ"):
            lines += ["", f"## {row['scenario']}: what differs", ""]
            for key in row["differ"]:
                lines.append(f"- `{key}`: lab {json.dumps(row['lab'][key])}, user {json.dumps(row['user'][key])}")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipelines", default="all", help="comma-separated scenarios (default: every one)")
    parser.add_argument("--size", default=None, help="tiny (CPU default) or full (CUDA default)")
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default=None, choices=("bf16", "fp16", "fp32"),
                        help="the scenario dtype (default: bf16 on CUDA, fp32 on a CPU)")
    parser.add_argument("--out", default="results/faithful")
    parser.add_argument("--trace-dir", default="traces/faithful")
    parser.add_argument("--label", default="", help="appended to the file names (e.g. __old-build)")
    parser.add_argument("--merge", action="store_true",
                        help="keep the existing report's rows of the scenarios not measured now")
    args = parser.parse_args()

    import platform

    import diffusers
    import torch

    from lab.results import lab_commit
    from lab.run.scenario import DTYPES, catalog, default_device, default_dtype, default_size

    device = args.device or default_device()
    size = args.size or default_size(device)
    dtype = DTYPES[args.dtype] if args.dtype else default_dtype(device)
    names = list(catalog()) if args.pipelines == "all" else args.pipelines.split(",")
    gpu = torch.cuda.get_device_name() if device.startswith("cuda") else "none (CPU)"
    data = {"size": size + (f" --layers {args.layers}" if args.layers else "") + f", {str(dtype).split('.')[-1]}",
            "device": gpu, "command": "python benchmarks/faithful_build.py " + " ".join(sys.argv[1:]),
            "environment": f"torch {torch.__version__}, diffusers {diffusers.__version__}, {platform.machine()}",
            "lab_commit": lab_commit(), "rows": []}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    depth = f"-{args.layers}l" if args.layers else ""
    short = re.search(r"[A-Z]\d{2,3}", gpu)  # NVIDIA H100 80GB HBM3 -> h100
    where = "cpu" if gpu.startswith("none") else (short[0].lower() if short else "gpu")
    tag = f"{size}{depth}-{str(dtype).split('.')[-1]}__{where}{args.label}"
    old = json.loads((out / f"{tag}.json").read_text()) if args.merge and (out / f"{tag}.json").exists() else None
    rows = data["rows"]
    for i, name in enumerate(names, 1):
        print(f"[{i}/{len(names)}] {name} ...", file=sys.stderr, flush=True)
        try:
            rows.append(compare(name, size, args.layers, device, dtype, Path(args.trace_dir)))
        except Exception as e:  # one scenario's failure is recorded, the others go on
            rows.append({"scenario": name, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"})
        rows[-1].update({k: data[k] for k in RUN_KEYS})
        print(f"    differ: {rows[-1].get('differ', rows[-1].get('error'))}", file=sys.stderr, flush=True)
        # after each scenario, so that a run cut short keeps what it measured
        report = merged(old, data) if old else data
        (out / f"{tag}.json").write_text(json.dumps(report, indent=1) + "\n")
        (out / f"{tag}.md").write_text(markdown(report))
    print(f"wrote {out / tag}.json and .md", file=sys.stderr)
    return 1 if any(r.get("differ") or "error" in r or not r.get("outputs_bit_identical") for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
