"""`lab settings`: the settings users run (`--setting NAME[:OPTIONS]`), what each does, and which scenario can take
which on this machine."""

from __future__ import annotations

import argparse
import json

from tabulate import tabulate

HELP = "list the settings users run (--setting): offloading, cache hooks, attention backends, LoRA, fp8 storage"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", help="check the scenarios against this device (default: cuda when available)")
    p.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
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
