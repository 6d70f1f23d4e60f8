"""What one `transformer.dtype` read costs the host, against the size of the model and the hooks on it.

`ModelMixin.dtype` calls `get_parameter_dtype`, which walks every submodule looking for a layerwise-casting hook
before it reads the first parameter. Flux2 and Klein (and Z-Image) read it at every denoising step, between the
transformer calls, while the GPU waits; the `transformer_dtype` fix reads it once before the loop. This times the read
on the lab's five transformers at their true module trees (built on the `meta` device: the walk depends on the
modules, not on the weights), at several depths up to the true one, and at the true depth with the hooks a user may
have attached: the first-block cache, layerwise casting (the walk stops at the first hooked module) and, where an
accelerator exists, group offloading (on a twin with the true blocks and tiny widths, since it needs real tensors).
For Flux2 it also gives the cost per pipeline call of the real Flux.2 models (Klein 4B, Klein 9B, dev 32B).

Writes `results/dtype_walk/<host>.{json,md}`:

    python benchmarks/dtype_walk.py            # this machine (cpu) or the GPU host (h200, h100)
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from lab import results  # noqa: E402
from lab.base import console  # noqa: E402
from lab.commands._shared import device_tag  # noqa: E402
from lab.run.scenario import get_scenario, resolve  # noqa: E402

PIPELINES = ("flux", "flux2", "ltx2", "qwenimage", "wan")
# The real Flux.2 transformers (diffusers-upstream.md D.2): blocks, and the steps their model cards use.
FLUX2_MODELS = {
    "FLUX.2 [klein] 4B": dict(num_layers=5, num_single_layers=20, steps=4),
    "FLUX.2 [klein] base 9B (the lab's flux2)": dict(num_layers=8, num_single_layers=24, steps=4),
    "FLUX.2 [dev] 32B": dict(num_layers=8, num_single_layers=48, steps=50),
}


def read_us(model: torch.nn.Module, reads: int) -> float:
    """Median host time of one `model.dtype` read, in µs."""
    model.dtype  # noqa: B018 (first read outside the timing)
    times = []
    for _ in range(reads):
        start = time.perf_counter()
        model.dtype  # noqa: B018
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def modules(model: torch.nn.Module) -> int:
    return sum(1 for _ in model.named_modules())


def on_meta(pipeline: str, **overrides) -> torch.nn.Module:
    scenario = get_scenario(pipeline)
    model = scenario.models["transformer"]
    config = {**scenario.config("transformer", "full"), **overrides}
    with torch.device("meta"):
        return resolve(model.cls)(**config)


def true_blocks(pipeline: str) -> dict[str, int]:
    """The true count of each block stack (`Scenario.config` caps each at `layers`: no cap gives the true ones)."""
    scenario = get_scenario(pipeline)
    config = scenario.config("transformer", "full", layers=10**9)
    return {key: config[key] for key in scenario.models["transformer"].blocks}


def depths(pipeline: str, reads: int) -> list[dict]:
    """The read at 1, 2, 4, ... blocks per stack up to the true depth (each stack capped at its own count)."""
    deepest = max(true_blocks(pipeline).values())
    ladder = [2 ** i for i in range(deepest.bit_length()) if 2 ** i < deepest] + [deepest]
    rows = []
    for n in ladder:
        config = get_scenario(pipeline).config("transformer", "full", layers=n)
        blocks = {key: config[key] for key in true_blocks(pipeline)}
        model = on_meta(pipeline, **blocks)
        us, count = read_us(model, reads), modules(model)
        rows.append({"pipeline": pipeline, "blocks": blocks, "modules": count, "read_us": us,
                     "us_per_module": us / count})
    return rows


def hooked(pipeline: str, reads: int, accelerator: str | None) -> list[dict]:
    """The read at the true depth with each kind of hook attached (a variant that cannot attach says why)."""
    rows = []

    def row(hooks: str, build, note: str = "") -> None:
        try:
            model = build()
        except Exception as e:  # a model without that hook support: say so, keep the others
            rows.append({"pipeline": pipeline, "hooks": hooks, "error": f"{type(e).__name__}: {e}"[:200]})
            return
        rows.append({"pipeline": pipeline, "hooks": hooks, "modules": modules(model),
                     "hooked_modules": sum(hasattr(m, "_diffusers_hook") for m in model.modules()),
                     "read_us": read_us(model, reads), "note": note})

    row("none", lambda: on_meta(pipeline))

    def first_block_cache():
        from diffusers import FirstBlockCacheConfig

        model = on_meta(pipeline)
        model.enable_cache(FirstBlockCacheConfig(threshold=0.05))
        return model

    def layerwise_casting():
        model = on_meta(pipeline)
        model.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.bfloat16)
        return model

    row("first-block cache", first_block_cache)
    row("layerwise casting", layerwise_casting)
    if accelerator:
        def group_offload(kind: str):
            def build():
                scenario = get_scenario(pipeline)
                model = scenario.models["transformer"]
                twin = resolve(model.cls)(**{**scenario.config("transformer", "tiny"), **true_blocks(pipeline)})
                twin.enable_group_offload(onload_device=torch.device(accelerator), offload_type=kind,
                                          **({"num_blocks_per_group": 1} if kind == "block_level" else {}))
                return twin
            return build

        note = "a twin: the true blocks at tiny widths (group offloading moves real tensors)"
        row("group offloading, block level", group_offload("block_level"), note)
        row("group offloading, leaf level", group_offload("leaf_level"), note)
    return rows


def flux2_calls(reads: int) -> list[dict]:
    rows = []
    for name, spec in FLUX2_MODELS.items():
        blocks = {k: v for k, v in spec.items() if k != "steps"}
        model = on_meta("flux2", **blocks)
        us = read_us(model, reads)
        # one read per step in Flux2KleinPipeline/Flux2Pipeline.__call__ (`latents.to(self.transformer.dtype)`)
        rows.append({"model": name, **blocks, "modules": modules(model), "read_us": us, "steps": spec["steps"],
                     "per_call_ms": us * spec["steps"] / 1e3})
    return rows


def markdown(data: dict) -> str:
    lines = [f"# One `transformer.dtype` read on the host ({data['host']})", "",
             f"{data['cpu']}, torch {data['torch']}, diffusers {data['diffusers']}; median of {data['reads']} reads. "
             f"Command: `{data['command']}`.", "",
             "## Against the depth (no hooks)", "", "| pipeline | blocks | modules | read (µs) | µs per module |",
             "|---|---|---:|---:|---:|"]
    for r in data["depths"]:
        blocks = " + ".join(str(v) for v in r["blocks"].values())
        lines.append(f"| {r['pipeline']} | {blocks} | {r['modules']:,} | {r['read_us']:,.0f} | {r['us_per_module']:.2f} |")
    lines += ["", "## At the true depth, with hooks", "", "| pipeline | hooks | modules (hooked) | read (µs) | note |",
              "|---|---|---:|---:|---|"]
    for r in data["hooks"]:
        if "error" in r:
            lines.append(f"| {r['pipeline']} | {r['hooks']} | | | cannot attach: {r['error']} |")
        else:
            lines.append(f"| {r['pipeline']} | {r['hooks']} | {r['modules']:,} ({r['hooked_modules']:,}) | "
                         f"{r['read_us']:,.0f} | {r['note']} |")
    lines += ["", "## Per Flux2 pipeline call (one read per step without the fix, one per call with it)", "",
              "| model | double + single blocks | modules | read (µs) | steps | host time per call without the fix (ms) |",
              "|---|---|---:|---:|---:|---:|"]
    for r in data["flux2_calls"]:
        lines.append(f"| {r['model']} | {r['num_layers']} + {r['num_single_layers']} | {r['modules']:,} | "
                     f"{r['read_us']:,.0f} | {r['steps']} | {r['per_call_ms']:.1f} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reads", type=int, default=200, help="timed reads per model (default 200)")
    p.add_argument("--out", type=Path, default=ROOT / "results" / "dtype_walk")
    args = p.parse_args()
    import diffusers

    accelerator = "cuda" if torch.cuda.is_available() else None
    host = device_tag("cuda" if accelerator else "cpu")
    data = {"host": host, "cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
            "diffusers": diffusers.__version__, "reads": args.reads,
            "command": "python benchmarks/dtype_walk.py" + (f" --reads {args.reads}" if args.reads != 200 else ""),
            "depths": [], "hooks": []}
    for pipeline in PIPELINES:
        console.progress(f"{pipeline}: depths ...")
        data["depths"] += depths(pipeline, args.reads)
        console.progress(f"{pipeline}: hooks ...")
        data["hooks"] += hooked(pipeline, args.reads, accelerator)
    data["flux2_calls"] = flux2_calls(args.reads)
    args.out.mkdir(parents=True, exist_ok=True)
    results.write(args.out / f"{host}.json", data, replace=True)
    (args.out / f"{host}.md").write_text(markdown(data))
    print(markdown(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
