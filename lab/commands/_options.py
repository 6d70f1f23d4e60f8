"""Groups of options that several subcommands share: which scenario, how it is compiled, how an A/B is timed."""

from __future__ import annotations

import argparse

from lab.base import naming


def scenario_options(p: argparse.ArgumentParser, *, pipeline_required: bool = True) -> None:
    p.add_argument("--pipeline", required=pipeline_required, help="scenario name (see `lab scenarios`)")
    p.add_argument("--size", choices=("full", "tiny", "pretrained"), help="default: full on CUDA, tiny on CPU")
    p.add_argument("--layers", type=int, help="with --size full: keep the true per-layer shapes, N blocks")
    p.add_argument("--steps", type=int, default=naming.DEFAULT_STEPS,
                   help=f"denoising steps (default {naming.DEFAULT_STEPS}; UniPC order 2 needs 3+; other counts show "
                        "in the result's name)")
    p.add_argument("--full-decode", action="store_true", help="decode to images/video instead of latents")
    p.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), help="default: bf16 on CUDA, fp32 on CPU")
    p.add_argument("--checkpoint", help="with --size pretrained: hub id or local path (default: the scenario's)")
    p.add_argument("--call", choices=("full", "tiny"),
                   help="call settings: the checkpoint's (full) or small ones (tiny); default follows --size")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--setting", action="append", metavar="NAME[:OPTIONS]",
                   help="turn on a setting users run, in both arms, after the build (repeatable; `lab settings` lists "
                        "them): first_block_cache:threshold=0.2, group_offload:leaf_level,stream, lora:rank=8,fused, "
                        "attention_backend:flex, ...")


def compile_options(p: argparse.ArgumentParser, modes: tuple[str, ...] = ("eager", "compile")) -> None:
    p.add_argument("--mode", choices=modes, default="eager")
    p.add_argument("--compile-regional", action=argparse.BooleanOptionalAction, default=True,
                   help="compile_repeated_blocks (default) or the whole transformer (--no-compile-regional)")
    p.add_argument("--compile-fullgraph", action="store_true")
    p.add_argument("--compile-mode", choices=("default", "reduce-overhead", "max-autotune"), default="default")
    p.add_argument("--compile-backend", choices=("inductor", "eager", "aot_eager"), default="inductor",
                   help="inductor (default); eager runs dynamo alone: graph breaks and recompiles without a C compiler")


def ab_options(p: argparse.ArgumentParser) -> None:
    """How an A/B is timed, decided and profiled (`lab ab`, `lab sweep`)."""
    timing_options(p)
    p.add_argument("--profile", action=argparse.BooleanOptionalAction, default=True, help="paired profiled calls")
    p.add_argument("--with-stack", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--profile-calls", type=int, default=3,
                   help="profiled calls per arm; the trace metrics are their medians, with their range (default 3)")
    p.add_argument("--bound", choices=("decide", "check", "off"), default="decide",
                   help="the bound the profiled calls put on the change (a call ends no earlier than its GPU's "
                        "work): decide (default) times no block where it alone decides equivalence, and cuts the "
                        "blocks' equivalence interval otherwise; check reads it and times the blocks anyway; off "
                        "reads none")
    p.add_argument("--replace", action="store_true", help="overwrite an existing result")
    p.add_argument("--trace-dir", default="traces", help="where the paired traces go (default traces/, not in git)")
    p.add_argument("--timing-lock", metavar="FILE",
                   help="lock FILE while profiling and timing, so that runs sharing a host never measure at once "
                        "(`lab campaign run --exclusive-timing` passes it)")


def timing_options(p: argparse.ArgumentParser) -> None:
    """How the blocks are laid out and when they decide (`lab ab`, `lab sweep`, `lab calibrate`)."""
    g = p.add_argument_group("timing and decision (see README: the verdict)")
    g.add_argument("--blocks", type=int,
                   help="a fixed design of N interleaved blocks, decided once at the end (default: sequential)")
    g.add_argument("--max-blocks", type=int, default=40,
                   help="sequential: the most blocks before it stops undecided (default 40)")
    g.add_argument("--min-blocks", type=int, default=6, help="sequential: the first look (default 6)")
    g.add_argument("--budget", metavar="TIME",
                   help="sequential: stop undecided once the timing blocks have taken this long (90s, 10m, 1.5h)")
    g.add_argument("--lead-in", type=int, default=1,
                   help="untimed calls at the start of each block, by the arm that goes first (default 1)")
    g.add_argument("--warmup", type=int, default=0, help="untimed calls per arm after each switch (default 0)")
    g.add_argument("--repeat", type=int, default=2,
                   help="timed calls per arm per block, mirrored (C T T C); the block's value is their median (default 2)")
    g.add_argument("--alpha", type=float, default=0.05, help="chance of a wrong faster/slower verdict (default 0.05)")
    g.add_argument("--margin", type=float, default=1.0, help="equivalence margin in percent (default ±1%%)")
    g.add_argument("--one-pair", action="store_true",
                   help="arms in worker processes of their own (--isolate, two diffusers, lab history, lab calibrate "
                        "--isolate): keep one pair of processes for every block instead of a fresh pair per block "
                        "(uncalibrated: a difference between the two processes would be a bias)")
    g.add_argument("--pairs-at-once", type=int, default=1, metavar="N",
                   help="fresh worker pairs: start the pairs of N blocks side by side before the first of them, "
                        "so that they build together (each holds its pipeline on the device until its block; "
                        "default 1)")
