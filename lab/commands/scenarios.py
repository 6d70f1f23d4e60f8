"""`lab scenarios`: the target pipelines, their sizes, parameter counts, memory estimates and call settings."""

from __future__ import annotations

import argparse
import json

from tabulate import tabulate

HELP = "list the scenarios: sizes, parameters, memory, call settings"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    import torch

    from lab.run.scenario import catalog, default_device, default_size, estimate, fmt_bytes, fmt_params

    device = default_device()
    rows = []
    for s in catalog().values():
        full = estimate(s, "full", None, torch.bfloat16)
        tiny = estimate(s, "tiny", None, torch.float32)
        rows.append({
            "name": s.name, "pipeline": s.pipeline_cls.rsplit(".", 1)[-1], "checkpoint": s.checkpoint,
            "sizes": "full, tiny, pretrained, full --layers N",
            "params_full": full.total_params, "peak_full_bytes_estimate": full.peak_bytes,
            "params_tiny": tiny.total_params, "call": dict(s.call), "sources": s.sources,
        })
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
        return 0
    print(f"Default here: --size {default_size(device)} on {device}.\n")
    table = [
        [r["name"], r["pipeline"], r["checkpoint"], fmt_params(r["params_full"]), fmt_bytes(r["peak_full_bytes_estimate"]),
         fmt_params(r["params_tiny"]), ", ".join(f"{k}={v}" for k, v in r["call"].items())]
        for r in rows
    ]
    print(tabulate(table, headers=["scenario", "pipeline", "checkpoint", "params (full)", "peak mem est. (full, bf16)",
                                   "params (tiny)", "call settings"], tablefmt="simple", maxcolwidths=[None, None, 30, None, None, None, 40]))
    print("\nAll scenarios: output_type='latent' (--full-decode to decode), 4 steps (--steps), random weights from "
          "the true configs (--size pretrained loads the checkpoint). Peak memory is an estimate (weights + activations).")
    return 0
