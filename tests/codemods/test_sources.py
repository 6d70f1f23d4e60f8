"""What a fix's examples (`tests/test_fix_examples.py`) cannot show: its rewrites on the releases' own sources, two
fixes' rewrites of one module composed, and what some examples' expected sources hold besides the text itself."""

import difflib

import pytest

from lab.apply.fix import get_fix, rewritten_sources
from lab.apply.rewrite import rewrite_source
from tests.conftest import ROOT, upstream_source
from tests.test_fix_examples import check


def example(fix: str, name: str):
    (found,) = [e for e in get_fix(fix).examples if e.name == name]
    return found


def codemod(fix: str):
    """The fix's codemod (its only one)."""
    (found,) = get_fix(fix).codemods
    return found


def changed_lines(old: str, new: str) -> list[str]:
    """The lines a rewrite removes and adds, each stripped, in diff order."""
    return [line[1:].strip() for line in difflib.unified_diff(old.splitlines(), new.splitlines(), n=0)
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]


# --- what the expected sources hold -----------------------------------------------------------------------------------

def test_what_the_expected_sources_hold():
    """The read of the transformer's dtype before the loop stays; FasterCache's four range tests ask the one helper;
    the pinned top-level group's option is in its five functions and the unmatched group's call."""
    assert "latents = latents.to(self.transformer.dtype)\n" in example("transformer_dtype",
                                                                       "read_once_before_the_loop").after
    faster = example("faster_cache_timestep_once", "every_range_test_asks_the_helper").after
    assert faster.count("_within_timestep_range(") == 5 and "_timestep_on_host = {}" in faster
    assert example("group_offload_top_level", "the_unmatched_group_copies_from_pinned_copies").after.count(
        "pinned_copies") == 7


# --- two fixes' rewrites of one module -----------------------------------------------------------------------------

def test_the_two_group_offload_rewrites_compose_in_either_order_with_one_follow():
    """They rewrite the same functions and find their sites by their bodies, whatever the other made of the tests of
    their `if`s; the rule that a cast's replacement is kept is in both, and inserted once."""
    from dataclasses import replace

    from fixes.group_offload_keep_host import kept

    pinned = example("group_offload_top_level", "the_unmatched_group_copies_from_pinned_copies")
    keep = example("group_offload_keep_host", "the_host_tensors_are_kept_and_pointed_back_at")
    assert pinned.before == keep.before
    check(replace(keep, name="after_group_offload_top_level", before=pinned.after, after=kept(pinned.after)))
    either = rewrite_source(keep.after, [pinned.codemod])
    assert not either.warnings and either.new_source == kept(pinned.after)
    assert either.new_source.count("for tensor, kept in self.cpu_param_dict.items():") == 1


@pytest.mark.slow  # parses the releases' own sources
def test_the_group_offload_rewrites_on_the_real_sources():
    """0.37.1 and 0.42.1 (which added TorchAO handling around the same lines): the pinned top-level group changes the
    five functions and nothing else; keeping the host tensors makes three insertions in three functions; in either
    order together, each once."""
    follow = [line.strip() for line in (
        "for tensor, kept in self.cpu_param_dict.items():",
        "# a host tensor replaced while offloaded (`.to(dtype)`) is kept instead, pinned if the one it replaces was",
        "if type(kept) is torch.Tensor and tensor.data_ptr() != kept.data_ptr() and tensor.device == kept.device:",
        "self.cpu_param_dict[tensor] = tensor.data.pin_memory() if kept.is_pinned() else tensor.data")]
    keep = ["# no side stream: keep the parameters' host tensors themselves (no copy while the model is on the host,",
            "# nothing pinned), so that offloading points the parameters back at them instead of copying them back",
            "for param in [p for module in self.modules for p in module.parameters()] + list(self.parameters):",
            "if type(param.data) is torch.Tensor:  # a tensor subclass (a quantized weight) moves as before",
            "cpu_param_dict[param] = param.data.cpu()"]
    point_back = ["for param, kept in self.cpu_param_dict.items():  # kept host tensors: the `.to` below copies "
                  "nothing back", "param.data = kept"]
    top, kept = codemod("group_offload_top_level"), codemod("group_offload_keep_host")
    for version in ("0.37.1", "0.42.1"):
        source = upstream_source(version, "diffusers.hooks.group_offloading")
        result = rewrite_source(source, [top])
        assert result.changed and not result.warnings, version
        assert changed_lines(source, result.new_source) == [
            "pinned_copies: bool = False,", "self.pinned_copies = pinned_copies",
            "if self.stream is None:", "if self.stream is None and not self.pinned_copies:",
            *follow,
            "if self.stream is not None:", "if self.stream is not None or self.pinned_copies:",
            "if self.stream is not None:", "if not self.record_stream:",
            "if self.stream is not None or self.pinned_copies:",
            "if self.stream is not None and not self.record_stream:",
            "parameters = _gather_parameters_with_no_group_offloading_parent(module, modules_with_group_offloading)",
            "buffers = _gather_buffers_with_no_group_offloading_parent(module, modules_with_group_offloading)",
            "parameters = _gather_parameters_with_no_group_offloading_parent(",
            "module, modules_with_group_offloading | {name for name, _ in unmatched_modules}", ")",
            "buffers = _gather_buffers_with_no_group_offloading_parent(",
            "module, modules_with_group_offloading | {name for name, _ in unmatched_modules}", ")",
            "non_blocking=False,", "non_blocking=config.stream is not None,",
            "pinned_copies=config.stream is not None,", "low_cpu_mem_usage=config.low_cpu_mem_usage,"], version
        again = rewrite_source(result.new_source, [top])
        assert not again.changed and not again.warnings, version

        result = rewrite_source(source, [kept])
        assert result.changed and not result.warnings, version
        assert changed_lines(source, result.new_source) == keep + follow + point_back, version
        assert not rewrite_source(result.new_source, [kept]).changed
        for order in ([kept, top], [top, kept]):
            both = rewrite_source(source, order)
            assert not both.warnings and both.new_source.count("kept") == 9, version
            assert both.new_source.count("pinned_copies") == 7, version


# --- the releases' own sources ---------------------------------------------------------------------------------------

def test_begin_index_sites_on_the_0421_siblings():
    """On the real 0.42.1 sources: text/image-to-video get 0, video2video the number of skipped timesteps, LTX2
    variants their audio scheduler too, and Wan animate (index set per segment) is refused with a warning."""
    def rewrite(module):
        return rewrite_source(upstream_source("0.42.1", f"diffusers.pipelines.{module}"), [codemod("begin_index")])

    i2v = rewrite("wan.pipeline_wan_i2v")
    assert not i2v.warnings and "self.scheduler.set_begin_index(0)" in i2v.new_source
    v2v = rewrite("wan.pipeline_wan_video2video")
    assert "self.scheduler.set_begin_index(len(self.scheduler.timesteps) - len(timesteps))" in v2v.new_source
    condition = rewrite("ltx2.pipeline_ltx2_condition")
    assert "audio_scheduler.set_begin_index(0)" in condition.new_source and not condition.warnings
    animate = rewrite("wan.pipeline_wan_animate")
    assert not animate.changed and animate.warnings


def test_begin_index_on_every_flow_matching_pipeline_of_0421_that_walks_the_whole_schedule():
    """The sites found by scanning 0.42.1, read off the committed PR diff (which `tests/test_patches.py` checks is
    the rewrite's output on the 0.42.1 sources): each gets exactly `self.scheduler.set_begin_index(0)` (LTX-Video
    condition: the number of timesteps its strength skips), right after its `_num_timesteps` line, and nothing
    else."""
    scanned = [r.path for r in get_fix("begin_index").rewrites
               if not r.pipelines and r.module.split(".")[2] not in ("wan", "ltx2")]
    assert len(scanned) == 38  # `python benchmarks/begin_index_scan.py` lists them
    cut = "src/diffusers/pipelines/ltx/pipeline_ltx_condition.py"  # `denoise_strength` cuts it with `get_timesteps`
    per_file, current = {}, None
    for line in (ROOT / "patches" / "pr" / "begin_index.diff").read_text().splitlines():
        if line.startswith("+++ b/"):
            current = per_file.setdefault(line[len("+++ b/"):], [])
        elif current is not None and line[:1] in "+- " and not line.startswith(("+++", "---")):
            current.append(line)
    for path in scanned:
        hunk = per_file[path]
        added = [line[1:].strip() for line in hunk if line.startswith("+")]
        assert not any(line.startswith("-") for line in hunk), path
        index = "len(self.scheduler.timesteps) - len(timesteps)" if path == cut else "0"
        assert [a for a in added if a and not a.startswith("#")] == [f"self.scheduler.set_begin_index({index})"], path
        before = [line for line in hunk if line.startswith(" ") and line.strip()]
        assert any("self._num_timesteps = " in line for line in before[:3]), path


@pytest.mark.slow  # parses the releases' own sources
def test_transformer_dtype_on_the_real_sources():
    rewritten = rewritten_sources([get_fix("transformer_dtype")])
    assert sum(".z_image." in module for module in rewritten) == 6 and len(rewritten) == 8
    for module, result in rewritten.items():
        assert result.changed and not result.warnings, module
        reads = result.old_source.count("self.transformer.dtype")
        assert result.new_source.count("self.transformer.dtype") == reads - 1


@pytest.mark.slow  # parses the releases' own sources
def test_cogvideox_host_timestep_on_the_real_sources():
    """All six pipelines that give a CogVideoX scheduler the device `t`, on 0.37.1 (installed) and 0.42.1."""
    from fixes.cogvideox_host_timestep import SITES

    rewritten = rewritten_sources([get_fix("cogvideox_host_timestep")])
    assert len(rewritten) == len(SITES) == 6
    for module, result in rewritten.items():
        assert result.changed and not result.warnings, module
        new = result.new_source
        assert new.count("host_timesteps = timesteps.tolist()") == 1 and "t_host = host_timesteps[i]" in new
        assert "t.item()" not in new and "self.scheduler.step(noise_pred, t," not in new, module
    for module, _, _ in SITES:
        result = rewrite_source(upstream_source("0.42.1", f"diffusers.pipelines.{module}"),
                                [codemod("cogvideox_host_timestep")])
        assert result.changed and not result.warnings, module


@pytest.mark.slow  # parses the releases' own sources
def test_the_lumina2_rewrites_on_the_real_sources_together():
    """On 0.37.1 and 0.42.1, the caption lengths alone and after lumina2_rope_device (the two edit the same class)."""
    for version in ("0.37.1", "0.42.1"):
        source = upstream_source(version, "diffusers.models.transformers.transformer_lumina2")
        both = rewrite_source(source, [codemod("lumina2_rope_device"), codemod("lumina2_caption_lengths_once")])
        assert not both.warnings and both.new_source.count("def _caption_lengths") == 1
        assert "self._freqs_cis_on(i, ids.device)" in both.new_source
        assert ".sum(dim=1).tolist()" not in both.new_source.split("def _caption_lengths")[0]


@pytest.mark.slow  # parses the releases' own sources
def test_mochi_prompt_tokens_once_on_the_real_sources():
    for version in ("0.37.1", "0.42.1"):
        result = rewrite_source(upstream_source(version, "diffusers.models.attention_processor"),
                                [codemod("mochi_prompt_tokens_once")])
        assert result.changed and not result.warnings, version
        assert result.new_source.count("torch.nonzero(") == result.old_source.count("torch.nonzero(")  # moved
        assert "valid_prompt_token_indices = valid_prompt_tokens[idx]" in result.new_source


@pytest.mark.slow  # parses the releases' own sources
def test_the_faster_cache_rewrites_on_the_real_sources():
    """Each alone, and the two together (they compose)."""
    ranges, mask = codemod("faster_cache_timestep_once"), codemod("faster_cache_freq_mask_device")
    for version in ("0.37.1", "0.42.1"):
        source = upstream_source(version, "diffusers.hooks.faster_cache")
        result = rewrite_source(source, [ranges])
        assert result.changed and not result.warnings, version
        assert result.old_source.count("< config.current_timestep_callback()") == 2
        assert "< self.current_timestep_callback()" not in result.new_source
        assert "< config.current_timestep_callback()" not in result.new_source
        assert result.new_source.count("_within_timestep_range(") == 5  # the helper and its four callers
        assert not rewrite_source(result.new_source, [ranges]).changed

        result = rewrite_source(source, [mask])
        assert result.changed and not result.warnings, version
        assert result.old_source.count("torch.arange(height), torch.arange(width)") == 1
        on_device = "torch.arange(height, device=x.device), torch.arange(width, device=x.device)"
        assert result.new_source.count(on_device) == 1
        assert not rewrite_source(result.new_source, [mask]).changed
        both = rewrite_source(source, [mask, ranges])
        assert both.changed and not both.warnings, version
