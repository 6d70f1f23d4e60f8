"""Disable the tqdm progress bar, as the upstream profiling harness and flux-fast do (runtime only)."""

from lab.apply import EVERY, Fix, Upstream


def runtime(pipe, patcher) -> None:
    # What `pipe.set_progress_bar_config(disable=True)` stores, keeping any other tqdm options the user set.
    config = dict(getattr(pipe, "_progress_bar_config", {}))
    config["disable"] = True
    patcher.setattr(pipe, "_progress_bar_config", config)
    patcher.count(pipe, "progress_bar", "no_progress_bar.progress_bar")


FIX = Fix(
    name="no_progress_bar",
    description="pipe.set_progress_bar_config(disable=True): no tqdm refresh inside the denoising loop.",
    upstream=Upstream(refs=("#13356 (harness only)",), since=None, note="harness setting, not a library change"),
    pipelines=EVERY,
    runtime=runtime,
    runtime_targets=("pipe._progress_bar_config",),
    exercised_by=("no_progress_bar.progress_bar",),
    tried_on="wan",
)
