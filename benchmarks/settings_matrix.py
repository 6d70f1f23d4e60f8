"""Which scenario runs in which setting users turn on, and what each setting adds to one call's host scalar reads:
every scenario at tiny size on this machine, each CPU-capable setting (`lab.run.settings`) alone, one profiled call.

    python benchmarks/settings_matrix.py --out results/settings/tiny__cpu

writes `<out>.json` and `<out>.md`: per scenario and setting, "ok" with the host scalar reads of one profiled call
(`.item()`-style reads: on a GPU each is a sync) against the plain pipeline's, "refused" with the lab's reason, or the
error the call raised. The settings that need an accelerator (offloading) are refused here by design.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SETTINGS = ["first_block_cache", "pyramid_attention_broadcast", "taylorseer_cache", "mag_cache", "faster_cache",
            "layerwise_casting", "attention_backend:native", "lora:rank=4", "lora:rank=4,fused"]
#: settings whose host scalar reads are of host tensors: on a GPU they wait for nothing
HOST_ONLY = {"mag_cache": "MagCache's reads are of its ratios (`mag_ratios`, a host tensor) and of what it accumulates "
                          "from them: on a GPU they wait for nothing. Its calibration call is not counted"}


def scalar_reads(built, folder: Path, stem: str) -> int:
    from lab.run.profile import ProfileOptions, profile_call
    from lab.traces.analysis import analyze
    from lab.traces.trace import load

    paths = profile_call(built, folder, stem, ProfileOptions(with_stack=False))
    return analyze(load(paths["trace"]))["host_reads"]["scalar_reads"]


def main() -> int:
    warnings.filterwarnings("ignore")
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="results/settings/tiny__cpu")
    args = p.parse_args()
    import diffusers

    from lab.base.errors import UsageError
    from lab.run.scenario import build, catalog

    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, scenario in catalog().items():
            try:
                plain = scalar_reads(build(scenario, size="tiny", device="cpu"), Path(tmp), f"{name}_plain")
            except Exception as e:  # noqa: BLE001 - a scenario this machine cannot build (Cosmos 2 needs torchvision)
                rows[name] = {"plain": {"state": "error", "why": f"{type(e).__name__}: {str(e).splitlines()[0]}"}}
                print(name, rows[name]["plain"], file=sys.stderr, flush=True)
                continue
            rows[name] = {"plain": {"state": "ok", "scalar_reads": plain}}
            for text in SETTINGS:
                try:
                    built = build(scenario, size="tiny", device="cpu", settings=[text])
                    reads = scalar_reads(built, Path(tmp), f"{name}_{text.replace(':', '_').replace(',', '_')}")
                    built.undo_settings()
                    rows[name][text] = {"state": "ok", "scalar_reads": reads}
                except UsageError as e:
                    rows[name][text] = {"state": "refused", "why": str(e).split(": ", 1)[-1]}
                except Exception as e:  # noqa: BLE001 - what the call raised is the finding
                    rows[name][text] = {"state": "error", "why": f"{type(e).__name__}: {str(e).splitlines()[0]}"}
                print(name, text, rows[name][text], file=sys.stderr, flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/settings_matrix.py" + ("" if args.out == p.get_default("out") else f" --out {args.out}")
    data = {"kind": "settings_matrix", "command": command, "diffusers": diffusers.__version__, "device": "cpu",
            "size": "tiny", "settings": SETTINGS, "rows": rows}
    out.with_suffix(".json").write_text(json.dumps(data, indent=1) + "\n")
    lines = ["# The settings users run, on the tiny scenarios (CPU)", "",
             f"`{command}`; diffusers {diffusers.__version__}, one profiled call of 4 steps per cell. Each cell: the "
             "host scalar reads of that call (on a GPU each one is a host-device sync) against the plain pipeline's, "
             "or why it did not run. Offloading needs an accelerator and is refused on a CPU by design; `quantized` "
             "needs torchao, which the lab's environment leaves out (tests/test_settings.py runs it with its own). "
             + "; ".join(f"`{k}`: {v}." for k, v in HOST_ONLY.items()), "",
             "| scenario | plain | " + " | ".join(f"`{s}`" for s in SETTINGS) + " |",
             "|---|---|" + "---|" * len(SETTINGS)]
    notes: list[str] = []
    for name, row in rows.items():
        if row["plain"]["state"] != "ok":
            notes.append(f"- `{name}`: **not built**: {row['plain']['why']}")
            lines.append(f"| {name} | **not built** [{len(notes)}] |" + " |" * len(SETTINGS))
            continue
        cells = [str(row["plain"]["scalar_reads"])]
        for text in SETTINGS:
            c = row[text]
            if c["state"] == "ok":
                delta = c["scalar_reads"] - row["plain"]["scalar_reads"]
                cells.append(f"{c['scalar_reads']} ({delta:+d})")
            else:
                notes.append(f"- `{name}`, `{text}`: **{c['state']}**: {c['why']}")
                cells.append(f"**{c['state']}** [{len(notes)}]")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", *[f"[{i}] {n[2:]}" + "  " for i, n in enumerate(notes, 1)], ""]
    out.with_suffix(".md").write_text("\n".join(lines))
    print(f"wrote {out.with_suffix('.json')}, {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
