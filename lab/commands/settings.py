"""`lab settings`: the settings users run (`--setting NAME[:OPTIONS]`), what each does, and which scenario can take
which on this machine; with `--pipeline`, one pipeline's settings measured, memory against time, upstream and with
the catalog's fixes (`lab.measure.settings_map`), as a result, a page and a plot."""

from __future__ import annotations

import argparse
import json

from tabulate import tabulate

HELP = ("list the settings users run (--setting): offloading, cache hooks, attention backends, LoRA, fp8 storage; "
        "with --pipeline, measure which to run: peak GPU memory against time per call")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", help="check the scenarios against this device (default: cuda when available)")
    p.add_argument("--json", action="store_true")
    g = p.add_argument_group("which setting should I use? (--pipeline: measured)")
    g.add_argument("--pipeline", metavar="NAME",
                   help="measure this scenario in each setting, upstream and with the catalog's fixes: peak GPU "
                        "memory, time per call, the offload limit; the fastest setting for each memory budget")
    g.add_argument("--size", choices=("tiny", "full"), help="default: full on CUDA, tiny on a CPU")
    g.add_argument("--layers", type=int, help="transformer blocks (default: all, as the checkpoint has them)")
    g.add_argument("--steps", type=int, default=2, help="denoising steps per call (default 2)")
    g.add_argument("--try", dest="points", action="append", metavar="SETTINGS",
                   help="a point to measure: a setting (`group_offload:stream`), several joined by `;` to compose "
                        "them, or `none`; repeat for more (default: none, every offloading mode, float8 storage and "
                        "float8 storage with a streamed group offload)")
    g.add_argument("--calls", type=int, default=2, help="timed calls per point after its warm-up call (default 2)")
    g.add_argument("--slow", type=float, default=20.0, metavar="SECONDS",
                   help="a point whose warm-up call takes this long is timed by it alone (profiled where it offloads)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--out", default="results/settings-map", help="results folder (default results/settings-map)")
    g.add_argument("--resume", action="store_true",
                   help="go on from the map already in --out: its points are kept, the points it lacks measured "
                        "(same pipeline, size, steps and device)")
    g.add_argument("--host-trace", action="store_true",
                   help="each offloading point not slow takes one more call, profiled with the host's Python functions "
                        "(which slows it: it is timed for nothing), for what the host did while the device sat idle; "
                        "with --resume, a kept fixed arm past 1.3x its limit without one is measured again")
    g.add_argument("--trace-dir", metavar="DIR",
                   help="keep each offloading point's profiled call (device activity only) here, gzipped, to open in "
                        "Perfetto")


def run(args: argparse.Namespace) -> int:
    if args.pipeline:
        return _map(args)
    return _catalog(args)


def _map(args: argparse.Namespace) -> int:
    """`--pipeline`: the settings map of one scenario, written as a result with its page and plot."""
    from pathlib import Path

    from lab.base import outputs
    from lab.base.errors import UsageError
    from lab.commands._shared import command_line, progress
    from lab.measure import settings_map
    from lab.pages import settings_map as page
    from lab.run import settings
    from lab.run.scenario import default_device, default_size, get_scenario, setting_target

    scenario = get_scenario(args.pipeline)
    device = args.device or default_device()
    size = args.size or default_size(device)
    if args.calls < 1 or args.steps < 1 or (args.layers is not None and args.layers < 1):
        raise UsageError("`--calls`, `--steps` and `--layers` must be at least 1.")
    if not args.slow > 0:
        raise UsageError(f"`--slow {args.slow}`: a number of seconds above 0.")
    texts = ["" if t.strip() == "none" else t.strip() for t in (args.points or settings_map.DEFAULT_SETTINGS)]
    target = setting_target(scenario)
    runnable = []
    for text in texts:  # refused here, before the build, each with its reason (a CPU cannot offload)
        chosen = settings.parse_all(settings_map.split(text))
        why = next((w for w in (settings.refusal(s, target, device) for s in chosen) if w), None)
        if why:
            progress(f"not measured: `{text}` on {device}: {why}")
        else:
            runnable.append(text)
    if not runnable:
        raise UsageError(f"nothing to measure: no point asked for can run on {device} (each is named above); a GPU "
                         "runs the offloading modes.")
    outputs.check(args.out)
    if args.trace_dir:
        outputs.check(args.trace_dir, option="--trace-dir")
    prior = _prior(args, scenario, size, device) if args.resume else None
    result = settings_map.run_map(scenario, size=size, layers=args.layers, steps=args.steps, device=device,
                                  texts=runnable, calls=args.calls, seed=args.seed, slow_s=args.slow,
                                  command=command_line(), progress=progress, prior=prior,
                                  save=lambda so_far: page.write_result(so_far, Path(args.out)),
                                  trace_dir=Path(args.trace_dir) if args.trace_dir else None,
                                  host_trace=args.host_trace)
    paths = page.write(result, Path(args.out))
    for line in page.markdown(result).splitlines():
        if line.startswith("- with "):
            print(line)
    print(f"wrote {paths['json']}, {paths['md'].name}" + (f", {paths['png'].name}" if paths['png'].exists() else ""))
    return 130 if result.interrupted else 0


def _prior(args: argparse.Namespace, scenario, size: str, device: str):
    """The map `--resume` goes on from (None where there is none yet); one of another device or call is refused."""
    from pathlib import Path

    from lab import results
    from lab.base import naming
    from lab.base.errors import UsageError
    from lab.commands._shared import device_tag, progress

    name = naming.settings_map_name(scenario.name, naming.size_tag(size, args.layers, steps=args.steps),
                                    device_tag(device))
    path = Path(args.out) / f"{name}.json"
    if not path.exists():
        progress(f"nothing stored at {path} to go on from: measuring every point")
        return None
    prior = results.read(path)
    if prior.kind != "settings-map" or prior.steps != args.steps or prior.size != size or prior.layers != args.layers:
        raise UsageError(f"{path} is not a map of the same calls (size, layers and steps must be the same) to go on "
                         "from: drop --resume to measure it afresh.")
    return prior


def _catalog(args: argparse.Namespace) -> int:
    from lab.base.errors import UsageError
    from lab.run import settings
    from lab.run.scenario import catalog, default_device, setting_target

    device = args.device or default_device()
    kinds = list(settings.SETTINGS.values())
    rows = [{"name": k.name, "does": k.does, "api": k.api, "options": dict(k.options),
             "choices": {o: list(w) for o, w in k.choices.items()}, "ranges": {o: str(r) for o, r in k.ranges.items()},
             "accelerator_only": bool(k.accelerator_only),
             "verify": k.verify} for k in kinds]
    matrix: dict[str, dict[str, str]] = {}
    for scenario in catalog().values():
        target = setting_target(scenario)
        matrix[scenario.name] = {}
        for k in kinds:
            try:
                settings.check([settings.Setting(k, dict(k.options))], scenario.name, target, device)
                matrix[scenario.name][k.name] = "yes"
            except UsageError as e:
                matrix[scenario.name][k.name] = str(e).split(": ", 1)[-1]
    if args.json:
        print(json.dumps({"device": device, "settings": rows, "applies": matrix}, indent=2, default=str))
        return 0
    print(tabulate([[r["name"], r["does"], r["api"],
                     ", ".join(f"{o}={v}" + (f" in {r['ranges'][o]}" if o in r["ranges"] else "")
                               for o, v in r["options"].items()) or "-"]
                    for r in rows], headers=["setting", "what it does", "diffusers API", "options (defaults)"],
                   tablefmt="simple", maxcolwidths=[None, 50, 36, 34]))
    print(f"\nWhich scenario takes which setting on {device} (checked before anything is built; a cache is tried on the "
          "transformer made on the meta device):\n")
    print(tabulate([[name, *("yes" if v == "yes" else "no" for v in row.values())] for name, row in matrix.items()],
                   headers=["scenario", *[k.name for k in kinds]], tablefmt="simple"))
    refusals = sorted({(k, why) for row in matrix.values() for k, why in row.items() if why != "yes"})
    if refusals:
        print("\nWhy not:")
        for k, why in refusals:
            print(f"  {k}: {why}")
    print("\nUse: lab ab --fix FIX --pipeline NAME --setting first_block_cache:threshold=0.2 (repeatable; both arms "
          "run in the setting; its tag goes into the result's name).")
    return 0
