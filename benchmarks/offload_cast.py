"""Check: a model cast to another dtype after group offloading was enabled, with and without the offload fixes.

    python benchmarks/offload_cast.py [--out results/offload_cast.json]

`model.to(torch.bfloat16)` after `enable_group_offload(...)` gives every parameter a new host tensor. A group that
keeps host tensors of its own (upstream's stream path, its pinned copies; `group_offload_keep_host` without a stream)
must use the new ones, or the next forward mixes float32 weights with bfloat16 activations. For each way of group
offloading (block level, without a stream and with one) and each set of offload fixes, a small FLUX.1-shaped
transformer is offloaded in float32, called once, cast to bfloat16 and called twice more; the result says whether
those calls ran and whether their outputs equal the same model cast before offloading. On a GPU it runs with real
streams and pinned memory (`tests/test_group_offload_keep_host.py` runs the same on the CPU with stand-ins).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CASES = [  # (use_stream, fixes switched on)
    (False, ()), (False, ("group_offload_keep_host",)),
    (True, ()), (True, ("group_offload_top_level",)), (True, ("group_offload_keep_host",)),
    (True, ("group_offload_keep_host", "group_offload_top_level")),
]


def transformer():
    import torch
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(0)
    return FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=2, num_single_layers=2,
                                  attention_head_dim=64, num_attention_heads=4, joint_attention_dim=128,
                                  pooled_projection_dim=64, axes_dims_rope=[16, 24, 24])


def inputs(dtype, device) -> dict:
    import torch

    g = torch.Generator().manual_seed(1)
    return dict(hidden_states=torch.randn(1, 64, 16, generator=g).to(device, dtype),
                encoder_hidden_states=torch.randn(1, 16, 128, generator=g).to(device, dtype),
                pooled_projections=torch.randn(1, 64, generator=g).to(device, dtype),
                timestep=torch.tensor([1.0], device=device, dtype=dtype),
                img_ids=torch.zeros(64, 3, device=device), txt_ids=torch.zeros(16, 3, device=device), return_dict=False)


def case(stream: bool, fixes: tuple[str, ...], device: str, expected) -> dict:
    import torch

    from lab.apply.fix import applied, get_fix

    model = transformer()
    model.enable_group_offload(onload_device=torch.device(device), offload_device=torch.device("cpu"),
                               offload_type="block_level", num_blocks_per_group=1, use_stream=stream)
    row = {"use_stream": stream, "fixes": list(fixes)}
    try:
        with applied([get_fix(name) for name in fixes], SimpleNamespace(components={"transformer": model})):
            model(**inputs(torch.float32, device))
            model.to(torch.bfloat16)
            outputs = [model(**inputs(torch.bfloat16, device))[0] for _ in range(2)]
        row.update(runs=True, equal=all(torch.equal(out.cpu(), expected) for out in outputs))
    except RuntimeError as e:
        row.update(runs=False, error=str(e).splitlines()[0][:200])
    return row


def main() -> int:
    import diffusers
    import torch

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="results/offload_cast.json")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("offload_cast.py: needs CUDA (streams and pinned memory); the CPU's check is the test suite's")
        return 2
    expected = transformer().to("cuda", torch.bfloat16)(**inputs(torch.bfloat16, "cuda"))[0].cpu()
    rows = []
    for stream, fixes in CASES:
        rows.append(case(stream, fixes, "cuda", expected))
        print(json.dumps(rows[-1]))
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "diffusers": diffusers.__version__,
           "python": platform.python_version(), "command": "python benchmarks/offload_cast.py", "cases": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
