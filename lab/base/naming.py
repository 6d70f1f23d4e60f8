"""What each kind of result is called: one function per kind, used by the subcommands that write results and by
the campaigns that look for them (`lab.campaigns.campaign`), so that the two never disagree on a name."""

from __future__ import annotations

from pathlib import Path

#: device tags in result names; a GPU not listed is `gpu`
GPU_TAGS = ("h200", "h100", "a100", "l40s", "b200")


def own_call(size: str) -> str:
    """The call settings a size uses unless `--call` says otherwise: `tiny` for the tiny size, else the checkpoint's."""
    return "tiny" if size == "tiny" else "full"


#: the denoising steps of every run unless `--steps` says otherwise; other counts show in the result's name
DEFAULT_STEPS = 4


def size_tag(size: str, layers: int | None, call: str | None = None, steps: int | None = None,
             settings: tuple[str, ...] = (), diffusers: str | None = None, decode: bool = False) -> str:
    """`full`, `tiny`, or `full-4l` for 4 of the transformer's blocks; `full-2l-tinycall` when the call settings are
    not the size's own (`--call tiny` on the true shapes); `full-2steps` for 2 denoising steps instead of 4;
    `full-decode` for a call that decodes to images or video (`--full-decode`, as a user's call does), not latents;
    `full-4l-first_block_cache` in a setting users turn on (`lab.run.settings`: each setting's tag, in order);
    `full-2l-diffusers0.42.1` for a census asked of another diffusers (`lab census --diffusers 0.42.1`)."""
    return (f"{size}{f'-{layers}l' if layers else ''}{f'-{call}call' if call and call != own_call(size) else ''}"
            f"{f'-{steps}steps' if steps and steps != DEFAULT_STEPS else ''}{'-decode' if decode else ''}"
            f"{''.join(f'-{t}' for t in settings)}"
            f"{f'-diffusers{diffusers}' if diffusers else ''}")


def device_tag_of(gpu_name: str | None) -> str:
    """`h200` for "NVIDIA H200", `cpu` for no GPU."""
    if not gpu_name:
        return "cpu"
    name = gpu_name.lower()
    return next((tag for tag in GPU_TAGS if tag in name), "gpu")


def fix_tag(fix_names: list[str], base: list[str] = ()) -> str:
    """`begin_index+hook_registry_cache` (A/A: `aa`); over fixes on in both arms (`lab ab --base`):
    `model_offload_pinned-over-model_offload_keep_host`."""
    tag = "+".join(fix_names) if fix_names else "aa"
    return f"{tag}-over-{'+'.join(base)}" if base else tag


def diffusers_tag(control: str, test: str) -> str:
    """`diffusers-0.37.1-to-0.38.0`: the fix tag of an A/B of two diffusers."""
    return f"diffusers-{control}-to-{test}"


def ab_name(fix_names: list[str], mode: str, size: str, device: str, base: list[str] = ()) -> str:
    """`results/ab/<scenario>/<this>.json`."""
    return f"{fix_tag(fix_names, base)}__{mode}__{size}__{device}"


def sweep_name(fix_names: list[str], key: str, mode: str, size: str, device: str) -> str:
    """`results/sweep/<scenario>/<this>.json`; varying the compile mode makes the mode meaningless: it names none."""
    middle = key if key == "compile" else f"{key}__{mode}"
    return f"{fix_tag(fix_names)}__{middle}__{size}__{device}"


def hunt_name(scenario: str, fix_names: list[str], mode: str, size: str, device: str) -> str:
    """`results/hunt/<this>.json` (without fixes: the baseline hunt)."""
    tag = f"{'+'.join(fix_names)}__" if fix_names else ""
    return f"{scenario}__{tag}{mode}__{size}__{device}"


def calibration_name(scenario: str, mode: str, size: str, device: str) -> str:
    """`results/calibration/<this>.json`."""
    return f"{scenario}__{mode}__{size}__{device}"


def history_name(scenario: str, mode: str, size: str, device: str) -> str:
    """`results/history/<this>.json`: one pipeline over diffusers releases."""
    return f"{scenario}__{mode}__{size}__{device}"


def census_name(scenario: str, mode: str, size: str, device: str) -> str:
    """`results/census/<this>.json`: one pipeline of a census."""
    return f"{scenario}__{mode}__{size}__{device}"


def settings_map_name(scenario: str, size: str, device: str) -> str:
    """`results/settings-map/<this>.json`: one pipeline's settings, memory against time (`size`: as `size_tag`)."""
    return f"{scenario}__{size}__{device}"


def census_table_name(mode: str, size: str, device: str) -> str:
    """`results/census/<this>.md`: the census table over the pipelines measured with these settings."""
    return f"census__{mode}__{size}__{device}"


def ab_paths(out: Path, scenario: str, name: str) -> dict[str, Path]:
    """Where an A/B result and its page and plot go: `<out>/<scenario>/<name>.{json,md,png}`."""
    folder = out / scenario  # names may hold dots (diffusers versions): no with_suffix
    return {kind: folder / f"{name}.{kind}" for kind in ("json", "md", "png")}
