"""Before/after source tests for the pipeline rewrites: begin_index, flux2_unpack_hw, transformer_dtype, zimage_t_norm,
wan_boundary_once, auraflow_timestep_device and cogvideox_host_timestep."""

import pytest
from libcst.codemod import CodemodTest

from fixes.auraflow_timestep_device import TimestepOnDevice
from fixes.begin_index import SetBeginIndex
from fixes.cogvideox_host_timestep import HostTimesteps
from fixes.flux2_unpack_hw import UnpackWithHeightWidth
from fixes.transformer_dtype import HoistTransformerDtype
from fixes.wan_boundary_once import BoundaryOnce
from fixes.zimage_t_norm import PrecomputeTNorm

CALL = """
class P:
    def __call__(self):
        audio_scheduler = copy.deepcopy(self.scheduler)
        timesteps, num_inference_steps = retrieve_timesteps(self.scheduler, num_inference_steps, device)
        self._num_timesteps = len(timesteps)

        for i, t in enumerate(timesteps):
            latents = self.scheduler.step(noise_pred, t, latents)[0]
"""


class TestSetBeginIndex(CodemodTest):
    TRANSFORM = SetBeginIndex

    def test_rewritten_with_audio_scheduler(self) -> None:
        after = CALL.replace(
            "        self._num_timesteps = len(timesteps)\n",
            "        self._num_timesteps = len(timesteps)\n\n"
            "        # We set the index here to remove DtoH sync, helpful especially during compilation.\n"
            "        # Check out more details here: https://github.com/huggingface/diffusers/pull/11696\n"
            "        self.scheduler.set_begin_index(0)\n"
            "        audio_scheduler.set_begin_index(0)\n",
        )
        self.assertCodemod(CALL, after)

    def test_no_op_when_the_pipeline_already_sets_it(self) -> None:
        before = CALL.replace("self._num_timesteps = len(timesteps)", "self.scheduler.set_begin_index(0)")
        self.assertCodemod(before, before)

    def test_warns_without_an_anchor(self) -> None:
        before = CALL.replace("self._num_timesteps = len(timesteps)", "n = len(timesteps)")
        self.assertCodemod(
            before, before,
            expected_warnings=["`__call__` does not have the expected shape (missing edits: begin_index; unexpected: none); left unchanged."],
        )

    def test_a_loop_that_may_start_later_in_the_schedule_is_left_alone(self) -> None:
        # an index of 0 would step from the schedule's first sigma where the loop starts at its `t_start`-th timestep
        for later in ("timesteps = timesteps[t_start:]", "timesteps = self.trim(timesteps)"):
            before = CALL.replace("        self._num_timesteps", f"        {later}\n        self._num_timesteps")
            self.assertCodemod(
                before, before,
                expected_warnings=["`__call__` does not have the expected shape (missing edits: begin_index; unexpected: none); left unchanged."],
            )

    def test_a_prefix_of_the_schedule_still_starts_at_its_first_timestep(self) -> None:
        # SDXL's `denoising_end` keeps the first timesteps: index 0 is still where the loop starts
        before = CALL.replace("        self._num_timesteps", "        timesteps = timesteps[:num_inference_steps]\n"
                                                              "        self._num_timesteps")
        after = before.replace("        self._num_timesteps = len(timesteps)\n",
                               "        self._num_timesteps = len(timesteps)\n\n"
                               "        # We set the index here to remove DtoH sync, helpful especially during compilation.\n"
                               "        # Check out more details here: https://github.com/huggingface/diffusers/pull/11696\n"
                               "        self.scheduler.set_begin_index(0)\n        audio_scheduler.set_begin_index(0)\n")
        self.assertCodemod(before, after)


UNPACK = """
class Flux2KleinPipeline:
    @staticmethod
    def _unpack_latents_with_ids(x: torch.Tensor, x_ids: torch.Tensor) -> list[torch.Tensor]:
        for data, pos in zip(x, x_ids):
            h_ids = pos[:, 1].to(torch.int64)
            w_ids = pos[:, 2].to(torch.int64)

            h = torch.max(h_ids) + 1
            w = torch.max(w_ids) + 1
        return x_list

    def __call__(self, height, width):
        latents = self._unpack_latents_with_ids(latents, latent_ids)
        return latents
"""
UNPACK_FIXED = """
class Flux2KleinPipeline:
    @staticmethod
    def _unpack_latents_with_ids(
        x: torch.Tensor, x_ids: torch.Tensor, height: int | None = None, width: int | None = None
    ) -> list[torch.Tensor]:
        for data, pos in zip(x, x_ids):
            h_ids = pos[:, 1].to(torch.int64)
            w_ids = pos[:, 2].to(torch.int64)

            h = height if height is not None else torch.max(h_ids) + 1
            w = width if width is not None else torch.max(w_ids) + 1
        return x_list

    def __call__(self, height, width):
        # Pass pre-computed latent height/width to avoid DtoH sync from torch.max().item()
        latent_height = 2 * (int(height) // (self.vae_scale_factor * 2))
        latent_width = 2 * (int(width) // (self.vae_scale_factor * 2))
        latents = self._unpack_latents_with_ids(latents, latent_ids, latent_height // 2, latent_width // 2)
        return latents
"""


class TestUnpackWithHeightWidth(CodemodTest):
    TRANSFORM = UnpackWithHeightWidth

    def test_rewritten(self) -> None:
        self.assertCodemod(UNPACK, UNPACK_FIXED)

    def test_no_op_when_fixed(self) -> None:
        self.assertCodemod(UNPACK_FIXED, UNPACK_FIXED)

    def test_unexpected_shape_keeps_the_whole_module(self) -> None:
        # The call site would be rewritten, but the helper has no torch.max: both stay as they are (a call with
        # four arguments into a two-argument helper would crash).
        before = UNPACK.replace("h = torch.max(h_ids) + 1", "h = int(h_ids.max()) + 1")
        self.assertCodemod(
            before, before,
            expected_warnings=[
                "`_unpack_latents_with_ids` does not have the expected shape (missing edits: h; unexpected: none); left unchanged."
            ],
        )


def test_begin_index_sites_on_the_0421_siblings():
    """On the real 0.42.1 sources: text/image-to-video get 0, video2video the number of skipped timesteps, LTX2
    variants their audio scheduler too, and Wan animate (index set per segment) is refused with a warning."""
    from lab.apply.rewrite import rewrite_source
    from tests.conftest import upstream_source

    def rewrite(module):
        return rewrite_source(upstream_source("0.42.1", f"diffusers.pipelines.{module}"), [SetBeginIndex])

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
    from fixes.begin_index import FIX
    from tests.conftest import ROOT

    scanned = [r.path for r in FIX.rewrites if not r.pipelines and r.module.split(".")[2] not in ("wan", "ltx2")]
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


DTYPE_LOOP = """
class Flux2KleinPipeline:
    def __call__(self):
        latents = latents.to(self.transformer.dtype)
        self.scheduler.set_begin_index(0)
        with self.progress_bar(total=num_inference_steps) as progress_bar:
            for i, t in enumerate(timesteps):
                latent_model_input = latents.to(self.transformer.dtype)
                if image_latents is not None:
                    latent_model_input = torch.cat([latents, image_latents], dim=1).to(self.transformer.dtype)
"""


class TestHoistTransformerDtype(CodemodTest):
    TRANSFORM = HoistTransformerDtype

    def test_read_once_before_the_loop(self) -> None:
        after = (DTYPE_LOOP
                 .replace("        with self.progress_bar", "        # ModelMixin.dtype walks every submodule: read it once\n"
                          "        transformer_dtype = self.transformer.dtype\n        with self.progress_bar")
                 .replace("latents.to(self.transformer.dtype)\n                if", "latents.to(transformer_dtype)\n                if")
                 .replace("dim=1).to(self.transformer.dtype)", "dim=1).to(transformer_dtype)"))
        assert "latents = latents.to(self.transformer.dtype)\n" in after  # the read before the loop stays
        self.assertCodemod(DTYPE_LOOP, after)

    def test_no_op_when_already_read_once(self) -> None:
        before = DTYPE_LOOP.replace("        self.scheduler.set_begin_index(0)\n",
                                    "        transformer_dtype = self.transformer.dtype\n")
        self.assertCodemod(before, before)

    def test_warns_when_the_loop_does_not_read_it(self) -> None:
        before = DTYPE_LOOP.replace("for i, t in enumerate(timesteps):", "if True:")
        self.assertCodemod(
            before, before,
            expected_warnings=["`__call__` does not have the expected shape (missing edits: hoist, use; unexpected: "
                               "none); left unchanged."])

    def test_both_branches_of_a_cfg_test(self) -> None:
        # Z-Image's loop: the read in either branch of `if apply_cfg`
        before = """
class ZImagePipeline:
    def __call__(self):
        with self.progress_bar(total=num_inference_steps) as progress_bar:
            for i, t in enumerate(timesteps):
                if apply_cfg:
                    latents_typed = latents.to(self.transformer.dtype)
                else:
                    latent_model_input = latents.to(self.transformer.dtype)
"""
        after = (before.replace("        with self.progress_bar", "        # ModelMixin.dtype walks every submodule: read "
                                "it once\n        transformer_dtype = self.transformer.dtype\n        with self.progress_bar")
                 .replace("latents.to(self.transformer.dtype)\n                else", "latents.to(transformer_dtype)\n"
                          "                else")
                 .replace("latent_model_input = latents.to(self.transformer.dtype)",
                          "latent_model_input = latents.to(transformer_dtype)"))
        self.assertCodemod(before, after)

    @pytest.mark.slow  # parses the releases\' own sources
    def test_the_real_sources(self) -> None:
        from lab.apply.fix import get_fix, rewritten_sources

        rewritten = rewritten_sources([get_fix("transformer_dtype")])
        assert sum(".z_image." in module for module in rewritten) == 6 and len(rewritten) == 8
        for module, result in rewritten.items():
            assert result.changed and not result.warnings, module
            assert result.new_source.count("self.transformer.dtype") == result.old_source.count("self.transformer.dtype") - 1


ZIMAGE = """
class ZImagePipeline:
    def __call__(self):
        self._num_timesteps = len(timesteps)

        with self.progress_bar(total=num_inference_steps) as progress_bar:
            for i, t in enumerate(timesteps):
                timestep = (1000 - timestep) / 1000
                # Normalized time for time-aware config (0 at start, 1 at end)
                t_norm = timestep[0].item()
                if t_norm > self._cfg_truncation:
                    current_guidance_scale = 0.0
"""


class TestPrecomputeTNorm(CodemodTest):
    TRANSFORM = PrecomputeTNorm

    def test_read_once_before_the_loop(self) -> None:
        after = ZIMAGE.replace(
            "        self._num_timesteps = len(timesteps)\n",
            "        self._num_timesteps = len(timesteps)\n\n"
            "        if self.do_classifier_free_guidance and self._cfg_truncation is not None and "
            "float(self._cfg_truncation) <= 1:\n"
            "            _precomputed_t_norms = ((1000 - timesteps.float()) / 1000).tolist()\n"
            "        else:\n"
            "            _precomputed_t_norms = None\n",
        ).replace("t_norm = timestep[0].item()",
                  "t_norm = _precomputed_t_norms[i] if _precomputed_t_norms is not None else None")
        self.assertCodemod(ZIMAGE, after)

    def test_no_op_on_the_0_38_shape(self) -> None:
        before = ZIMAGE.replace("t_norm = timestep[0].item()", "t_norm = _precomputed_t_norms[i]")
        self.assertCodemod(before, before)

    def test_left_unchanged_without_the_per_step_read(self) -> None:
        before = ZIMAGE.replace("t_norm = timestep[0].item()", "t_norm = float(timestep[0])")
        self.assertCodemod(
            before, before,
            expected_warnings=["`__call__` does not have the expected shape (missing edits: read; unexpected: "
                               "none); left unchanged."],
        )


WAN22 = """
class WanPipeline:
    def __call__(self):
        self._num_timesteps = len(timesteps)

        if self.config.boundary_ratio is not None:
            boundary_timestep = self.config.boundary_ratio * self.scheduler.config.num_train_timesteps
        else:
            boundary_timestep = None

        with self.progress_bar(total=num_inference_steps) as progress_bar:
            for i, t in enumerate(timesteps):
                if boundary_timestep is None or t >= boundary_timestep:
                    current_model = self.transformer
"""


class TestBoundaryOnce(CodemodTest):
    TRANSFORM = BoundaryOnce

    def test_compared_once_before_the_loop(self) -> None:
        after = WAN22.replace(
            "            boundary_timestep = None\n\n",
            "            boundary_timestep = None\n\n"
            "        high_noise_steps = (timesteps >= boundary_timestep).tolist() if boundary_timestep is not None "
            "else None\n\n",
        ).replace("t >= boundary_timestep:", "high_noise_steps[i]:")
        self.assertCodemod(WAN22, after)

    def test_wan_2_1_shape_without_a_boundary_is_left_with_a_warning(self) -> None:
        before = WAN22.replace("boundary_timestep is None or t >= boundary_timestep", "True")
        self.assertCodemod(
            before, before,
            expected_warnings=["`__call__` does not have the expected shape (missing edits: lookup; unexpected: "
                               "none); left unchanged."],
        )


AURA = """
class AuraFlowPipeline:
    def __call__(self):
        for i, t in enumerate(timesteps):
            timestep = torch.tensor([t / 1000]).expand(latent_model_input.shape[0])
            timestep = timestep.to(latents.device, dtype=latents.dtype)
"""


class TestTimestepOnDevice(CodemodTest):
    TRANSFORM = TimestepOnDevice

    def test_divided_on_the_device(self) -> None:
        self.assertCodemod(AURA, AURA.replace("torch.tensor([t / 1000])", "(t / 1000)"))


COGVIDEOX = """
class CogVideoXPipeline:
    def __call__(self):
        num_warmup_steps = max(len(timesteps) - num_inference_steps * self.scheduler.order, 0)

        with self.progress_bar(total=num_inference_steps) as progress_bar:
            old_pred_original_sample = None
            for i, t in enumerate(timesteps):
                if self.interrupt:
                    continue

                self._current_timestep = t
                timestep = t.expand(latent_model_input.shape[0])
                if use_dynamic_cfg:
                    self._guidance_scale = 1 + guidance_scale * (num_inference_steps - t.item())
                if not isinstance(self.scheduler, CogVideoXDPMScheduler):
                    latents = self.scheduler.step(noise_pred, t, latents, **extra_step_kwargs, return_dict=False)[0]
                else:
                    latents, old_pred_original_sample = self.scheduler.step(
                        noise_pred,
                        old_pred_original_sample,
                        t,
                        timesteps[i - 1] if i > 0 else None,
                        latents,
                    )
"""
COGVIDEOX_FIXED = """
class CogVideoXPipeline:
    def __call__(self):
        num_warmup_steps = max(len(timesteps) - num_inference_steps * self.scheduler.order, 0)

        # the scheduler looks its alphas up in host tensors with the timestep: read the timesteps to the host once
        host_timesteps = timesteps.tolist()

        with self.progress_bar(total=num_inference_steps) as progress_bar:
            old_pred_original_sample = None
            for i, t in enumerate(timesteps):
                if self.interrupt:
                    continue

                t_host = host_timesteps[i]
                self._current_timestep = t
                timestep = t.expand(latent_model_input.shape[0])
                if use_dynamic_cfg:
                    self._guidance_scale = 1 + guidance_scale * (num_inference_steps - t_host)
                if not isinstance(self.scheduler, CogVideoXDPMScheduler):
                    latents = self.scheduler.step(
                        noise_pred, t_host, latents, **extra_step_kwargs, return_dict=False
                    )[0]
                else:
                    latents, old_pred_original_sample = self.scheduler.step(
                        noise_pred,
                        old_pred_original_sample,
                        t_host,
                        host_timesteps[i - 1] if i > 0 else None,
                        latents,
                    )
"""


class TestHostTimesteps(CodemodTest):
    TRANSFORM = HostTimesteps

    def test_the_step_gets_host_timesteps_read_once(self) -> None:
        self.assertCodemod(COGVIDEOX, COGVIDEOX_FIXED)  # the transformer's `t` stays on the device

    def test_no_op_when_already_on_the_host(self) -> None:
        self.assertCodemod(COGVIDEOX_FIXED, COGVIDEOX_FIXED)

    def test_left_unchanged_when_the_step_does_not_take_t(self) -> None:
        before = COGVIDEOX.replace("step(noise_pred, t, latents", "step(noise_pred, s, latents").replace(
            "                        t,\n", "                        s,\n")
        self.assertCodemod(before, before, expected_warnings=[
            "`__call__` does not have the expected shape (missing edits: step; unexpected: none); left unchanged."])

    @pytest.mark.slow  # parses the releases\' own sources
    def test_the_real_sources(self) -> None:
        """All six pipelines that give a CogVideoX scheduler the device `t`, on 0.37.1 (installed) and 0.42.1."""
        from fixes.cogvideox_host_timestep import SITES
        from lab.apply.fix import get_fix, rewritten_sources
        from lab.apply.rewrite import rewrite_source
        from tests.conftest import upstream_source

        rewritten = rewritten_sources([get_fix("cogvideox_host_timestep")])
        assert len(rewritten) == len(SITES) == 6
        for module, result in rewritten.items():
            assert result.changed and not result.warnings, module
            new = result.new_source
            assert new.count("host_timesteps = timesteps.tolist()") == 1 and "t_host = host_timesteps[i]" in new
            assert "t.item()" not in new and "self.scheduler.step(noise_pred, t," not in new, module
        for module, _, _ in SITES:
            result = rewrite_source(upstream_source("0.42.1", f"diffusers.pipelines.{module}"), [HostTimesteps])
            assert result.changed and not result.warnings, module
