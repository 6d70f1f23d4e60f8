"""`scheduler.set_begin_index(0)` before the denoising loop.

Without a begin index, the scheduler's first `step()` finds its index with `(timesteps == t).nonzero().item()`,
a device-to-host sync once per call and scheduler. The rewrite adds the call after `self._num_timesteps = ...`
in pipelines that lack it (and for every `audio_scheduler` copy, as LTX2 has); the runtime form does the same for
any text-to-X pipeline by calling `set_begin_index(0)` after each `set_timesteps`.

An index of 0 is right only where the loop walks the schedule from its first timestep: the rewrite inserts it only
where `timesteps` is never anything but the whole schedule (`retrieve_timesteps`, `self.scheduler.timesteps`, or a
prefix of it), and inserts the number of skipped timesteps where the pipeline calls `get_timesteps` (a `strength`);
any other site is reported and left as it is. Besides the pipelines the lab runs, the diff covers every pipeline of
0.42.1 that steps a flow-matching scheduler in that shape (38 more, found by `benchmarks/begin_index_scan.py`;
source tests only).
"""

import functools
import inspect

import libcst as cst
import libcst.matchers as m

from lab.apply import BLANK_LINE, Example, Fix, FunctionRewrite, Overlap, Rewrite, Upstream

# `self._num_timesteps = len(timesteps)`: timesteps are final here, right before the loop.
NUM_TIMESTEPS = m.SimpleStatementLine(
    body=[m.Assign(targets=[m.AssignTarget(m.Attribute(m.Name("self"), m.Name("_num_timesteps")))])]
)
# `<anything>.set_begin_index(...)`: the pipeline sets an index itself
SETS_BEGIN_INDEX = m.Call(func=m.Attribute(attr=m.Name("set_begin_index")))
# `audio_scheduler = ...` anywhere in `__call__`: LTX2's second scheduler needs its own begin index.
AUDIO_SCHEDULER = m.Assign(targets=[m.AssignTarget(m.Name("audio_scheduler"))])
# `self.get_timesteps(num_inference_steps, timesteps, strength, device)`: a strength pipeline skips the first
# timesteps, so its begin index is the number skipped, not 0.
GET_TIMESTEPS = m.Call(func=m.Attribute(m.Name("self"), m.Name("get_timesteps")))
# What may bind `timesteps` where the loop starts at the schedule's first timestep: `timesteps, n =
# retrieve_timesteps(...)`, `timesteps = self.scheduler.timesteps`, or a prefix of it (`timesteps[:n]`, SDXL's
# `denoising_end`). Anything else (a slice from later on, a helper of its own) may start the loop later, where an
# index of 0 would step from the wrong sigma: such a site is left unchanged.
WHOLE_SCHEDULE = (m.Call(func=m.Name("retrieve_timesteps"))
                  | m.Attribute(value=m.Attribute(m.Name("self"), m.Name("scheduler")), attr=m.Name("timesteps"))
                  | m.Subscript(value=m.Name("timesteps"), slice=[m.SubscriptElement(m.Slice(lower=None))]))
BINDS_TIMESTEPS = m.Assign(targets=[m.AtLeastN(m.AssignTarget(
    m.Name("timesteps") | m.Tuple(elements=[m.ZeroOrMore(), m.Element(m.Name("timesteps")), m.ZeroOrMore()])), n=1)])
LOOP = m.For(iter=m.Call(func=m.Name("enumerate"), args=[m.Arg(m.Name("timesteps"))]))
COMMENT = (
    "# We set the index here to remove DtoH sync, helpful especially during compilation.",
    "# Check out more details here: https://github.com/huggingface/diffusers/pull/11696",
)


class _Sites(cst.CSTVisitor):
    """Every assignment, call and `for` loop in a function, found in one walk: `m.findall` walks the whole
    `__call__` once per pattern, and a pipeline's `__call__` is hundreds of lines, in each of the dozens of modules this
    fix rewrites."""

    def __init__(self) -> None:
        self.assigns: list[cst.Assign] = []
        self.calls: list[cst.Call] = []
        self.loops: list[cst.For] = []

    def visit_Assign(self, node: cst.Assign) -> None:
        self.assigns.append(node)

    def visit_Call(self, node: cst.Call) -> None:
        self.calls.append(node)

    def visit_For(self, node: cst.For) -> None:
        self.loops.append(node)

    @classmethod
    def of(cls, node: cst.FunctionDef) -> "_Sites":
        sites = cls()
        node.visit(sites)
        return sites


class SetBeginIndex(FunctionRewrite):
    DESCRIPTION = "insert scheduler.set_begin_index(0) before the denoising loop"
    FUNCTIONS = frozenset({"__call__"})
    EDITS = frozenset({"begin_index"})
    WALKS_TARGETS = False  # the edit is made on `__call__` whole, in leave_FunctionDef
    _walked: tuple[cst.FunctionDef | None, _Sites | None] = (None, None)  # the last `__call__` walked, its sites

    def _sites(self, node: cst.FunctionDef) -> _Sites:
        """`_Sites.of(node)`, walked once per `__call__`: `_insert` and `already_fixed` both ask of the same node (its
        children are not walked, so the node that leaves is the one that entered), and a walk of a pipeline's
        `__call__` is most of this rewrite's time."""
        if self._walked[0] is not node:
            self._walked = (node, _Sites.of(node))
        return self._walked[1]

    def already_fixed(self, node: cst.FunctionDef) -> bool:
        return any(m.matches(c, SETS_BEGIN_INDEX) for c in self._sites(node).calls)

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        if original_node.name.value in self.FUNCTIONS:
            updated_node = self._insert(updated_node)
        return super().leave_FunctionDef(original_node, updated_node)

    def _insert(self, node: cst.FunctionDef) -> cst.FunctionDef:
        body = list(node.body.body)
        anchor = next((i for i, s in enumerate(body) if m.matches(s, NUM_TIMESTEPS)), None)
        if anchor is None:
            return node
        sites = self._sites(node)
        audio = any(m.matches(a, AUDIO_SCHEDULER) for a in sites.assigns)
        schedulers = ["self.scheduler"] + (["audio_scheduler"] if audio else [])
        skips = any(m.matches(c, GET_TIMESTEPS) for c in sites.calls)
        if not skips and not self._walks_the_whole_schedule(sites):
            return node  # no edit: the all-or-nothing rule reports the site and leaves it as it is
        index = "len(self.scheduler.timesteps) - len(timesteps)" if skips else "0"
        calls = [cst.parse_statement(f"{s}.set_begin_index({index})") for s in schedulers]
        comment = [BLANK_LINE] + [cst.EmptyLine(comment=cst.Comment(c)) for c in COMMENT]
        calls[0] = calls[0].with_changes(leading_lines=comment)
        body[anchor + 1 : anchor + 1] = calls
        self.edited("begin_index")
        return node.with_changes(body=node.body.with_changes(body=body))

    @staticmethod
    def _walks_the_whole_schedule(sites: _Sites) -> bool:
        """The loop runs `for ... in enumerate(timesteps)` and `timesteps` is only ever the whole schedule, so its
        first step is the schedule's index 0 (what `index_for_timestep` would find)."""
        binds = [a for a in sites.assigns if m.matches(a, BINDS_TIMESTEPS)]
        return (any(m.matches(loop, LOOP) for loop in sites.loops) and bool(binds)
                and all(m.matches(bind.value, WHOLE_SCHEDULE) for bind in binds))


def runtime(pipe, patcher) -> None:
    """Call `set_begin_index(0)` after every `set_timesteps` of the pipeline's scheduler class.

    Only for pipelines whose `__call__` does not set a begin index itself (text-to-X pipelines that start at the
    first timestep; an img2img pipeline that skips timesteps sets its own index). Patched on the class, so
    `copy.deepcopy(self.scheduler)` copies (LTX2's audio scheduler) get it too.
    """
    if "set_begin_index" in inspect.getsource(type(pipe).__call__):
        return
    scheduler_cls = type(pipe.scheduler)
    original = inspect.getattr_static(scheduler_cls, "set_timesteps")

    @functools.wraps(original)
    def set_timesteps(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        self.set_begin_index(0)
        return out

    patcher.setattr(scheduler_cls, "set_timesteps", set_timesteps, count_as="begin_index.set_timesteps")


# --- examples (tests/test_fix_examples.py) ---------------------------------------------------------------------------

CALL = """
class P:
    def __call__(self):
        audio_scheduler = copy.deepcopy(self.scheduler)
        timesteps, num_inference_steps = retrieve_timesteps(self.scheduler, num_inference_steps, device)
        self._num_timesteps = len(timesteps)

        for i, t in enumerate(timesteps):
            latents = self.scheduler.step(noise_pred, t, latents)[0]
"""
CALL_FIXED = """
class P:
    def __call__(self):
        audio_scheduler = copy.deepcopy(self.scheduler)
        timesteps, num_inference_steps = retrieve_timesteps(self.scheduler, num_inference_steps, device)
        self._num_timesteps = len(timesteps)

        # We set the index here to remove DtoH sync, helpful especially during compilation.
        # Check out more details here: https://github.com/huggingface/diffusers/pull/11696
        self.scheduler.set_begin_index(0)
        audio_scheduler.set_begin_index(0)

        for i, t in enumerate(timesteps):
            latents = self.scheduler.step(noise_pred, t, latents)[0]
"""
NO_ANCHOR = ("`__call__` does not have the expected shape (missing edits: begin_index; unexpected: none); left "
             "unchanged.")


def _before_the_count(source: str, line: str) -> str:
    """`source` with `line` just before its `self._num_timesteps = ...`."""
    return source.replace("        self._num_timesteps", f"        {line}\n        self._num_timesteps")


EXAMPLES = (
    Example("rewritten_with_audio_scheduler", CALL, CALL_FIXED),
    Example("no_op_when_the_pipeline_already_sets_it",
            CALL.replace("self._num_timesteps = len(timesteps)", "self.scheduler.set_begin_index(0)")),
    Example("warns_without_an_anchor", CALL.replace("self._num_timesteps = len(timesteps)", "n = len(timesteps)"),
            warning=NO_ANCHOR),
    # an index of 0 would step from the schedule's first sigma where the loop starts at its `t_start`-th timestep
    Example("a_loop_that_may_start_later_in_the_schedule_is_left_alone",
            _before_the_count(CALL, "timesteps = timesteps[t_start:]"), warning=NO_ANCHOR),
    Example("a_loop_over_timesteps_of_a_helper_of_its_own_is_left_alone",
            _before_the_count(CALL, "timesteps = self.trim(timesteps)"), warning=NO_ANCHOR),
    # SDXL's `denoising_end` keeps the first timesteps: index 0 is still where the loop starts
    Example("a_prefix_of_the_schedule_still_starts_at_its_first_timestep",
            _before_the_count(CALL, "timesteps = timesteps[:num_inference_steps]"),
            _before_the_count(CALL_FIXED, "timesteps = timesteps[:num_inference_steps]")),
)


FIX = Fix(
    name="begin_index",
    description=("Call scheduler.set_begin_index(...) before the loop (0, or where `strength` starts the schedule) so "
                 "the first step skips nonzero().item()."),
    upstream=Upstream(refs=("#11696", "#13356", "#13564"), note="Wan in 0.38.0, LTX2 in 0.39.0",
                      overlaps=(
        Overlap("#13206", "open",
                "sets `begin_index` in the flow-matching pipelines (56 files), the start offset of video-to-video and "
                "LTX condition inside `get_timesteps()`: the same purpose, strength offsets included, and conflicts "
                "across most of this diff's files"),
        Overlap("#14176", "open",
                "the SD3 text-to-image part of this diff alone, with a `hasattr` guard"),
        Overlap("#14576", "merged",
                "the same call in HunyuanVideo, Mochi, Lumina 2, AuraFlow and Chroma text-to-image, files this diff "
                "does not touch"),
    )),
    rewrites=(
        Rewrite(
            module="diffusers.pipelines.wan.pipeline_wan",
            targets=("WanPipeline.__call__",),
            codemod=SetBeginIndex,
            upstream_since="0.38.0",
            pipelines=("wan", "wan22"),
        ),
        Rewrite(
            module="diffusers.pipelines.ltx2.pipeline_ltx2",
            targets=("LTX2Pipeline.__call__",),
            codemod=SetBeginIndex,
            upstream_since="0.39.0",
            pipelines=("ltx2",),
        ),
        # Carried over by `lab census` (each of these pipelines reads the index on the host in its first step);
        # upstream added the call to most of them later, and SD3, Cosmos 2 and SANA still lack it in 0.42.1.
        *(
            Rewrite(module=f"diffusers.pipelines.{module}", targets=(f"{cls}.__call__",), codemod=SetBeginIndex,
                    upstream_since=since, pipelines=(scenario,))
            for module, cls, since, scenario in (
                ("stable_diffusion_xl.pipeline_stable_diffusion_xl", "StableDiffusionXLPipeline", "0.39.0", "sdxl"),
                ("stable_diffusion_3.pipeline_stable_diffusion_3", "StableDiffusion3Pipeline", None, "sd35"),
                ("chroma.pipeline_chroma", "ChromaPipeline", "0.41.0", "chroma"),
                ("hunyuan_video.pipeline_hunyuan_video", "HunyuanVideoPipeline", "0.41.0", "hunyuan_video"),
                ("z_image.pipeline_z_image", "ZImagePipeline", "0.38.0", "zimage"),
                ("cosmos.pipeline_cosmos2_text2image", "Cosmos2TextToImagePipeline", None, "cosmos2"),
                ("mochi.pipeline_mochi", "MochiPipeline", "0.41.0", "mochi"),
                ("lumina2.pipeline_lumina2", "Lumina2Pipeline", "0.41.0", "lumina2"),
                ("aura_flow.pipeline_aura_flow", "AuraFlowPipeline", "0.41.0", "auraflow"),
                ("sana.pipeline_sana", "SanaPipeline", None, "sana"),
            )
        ),
        # Still without a begin index in 0.42.1 (their sites are also checked by tests on the 0.42.1 source; Wan
        # video-to-video and LTX2 image-to-video have scenarios). Wan animate sets `_num_timesteps` per segment
        # inside a loop: the rewrite reports that shape.
        Rewrite(
            module="diffusers.pipelines.wan.pipeline_wan_video2video",
            targets=("WanVideoToVideoPipeline.__call__",),
            codemod=SetBeginIndex,
            pipelines=("wan_v2v",),
        ),
        Rewrite(
            module="diffusers.pipelines.ltx2.pipeline_ltx2_image2video",
            targets=("LTX2ImageToVideoPipeline.__call__",),
            codemod=SetBeginIndex,
            pipelines=("ltx2_i2v",),
        ),
        *(
            Rewrite(module=f"diffusers.pipelines.{module}", targets=(f"{cls}.__call__",), codemod=SetBeginIndex)
            for module, cls in (
                ("wan.pipeline_wan_i2v", "WanImageToVideoPipeline"),
                ("wan.pipeline_wan_vace", "WanVACEPipeline"),
                ("wan.pipeline_wan_animate", "WanAnimatePipeline"),
                ("ltx2.pipeline_ltx2_condition", "LTX2ConditionPipeline"),
                ("ltx2.pipeline_ltx2_ic_lora", "LTX2InContextPipeline"),
                ("ltx2.pipeline_ltx2_hdr_lora", "LTX2HDRPipeline"),
            )
        ),
        # Every other pipeline of 0.42.1 that steps a `FlowMatchEulerDiscreteScheduler` without a begin index (each
        # one's first `step` finds it with `nonzero().item()`) in the shape the rewrite needs: `_num_timesteps` before
        # the loop, and `timesteps` only ever the whole schedule (or a prefix of it), or cut by `get_timesteps` (LTX
        # condition's `denoise_strength`). Found by `python benchmarks/begin_index_scan.py`, which lists the 12 left
        # alone and why. No scenario runs them: source tests only.
        *(
            Rewrite(module=f"diffusers.pipelines.{module}", targets=(f"{cls}.__call__",), codemod=SetBeginIndex)
            for module, cls in (
                ("bria_fibo2.pipeline_bria_fibo2", "BriaFibo2Pipeline"),
                ("chronoedit.pipeline_chronoedit", "ChronoEditPipeline"),
                ("controlnet_sd3.pipeline_stable_diffusion_3_controlnet", "StableDiffusion3ControlNetPipeline"),
                ("controlnet_sd3.pipeline_stable_diffusion_3_controlnet_inpainting", "StableDiffusion3ControlNetInpaintingPipeline"),
                ("cosmos.pipeline_cosmos2_video2world", "Cosmos2VideoToWorldPipeline"),
                ("easyanimate.pipeline_easyanimate", "EasyAnimatePipeline"),
                ("easyanimate.pipeline_easyanimate_control", "EasyAnimateControlPipeline"),
                ("flux.pipeline_flux_control", "FluxControlPipeline"),
                ("flux.pipeline_flux_controlnet", "FluxControlNetPipeline"),
                ("hidream_image.pipeline_hidream_image", "HiDreamImagePipeline"),
                ("hunyuan_video.pipeline_hunyuan_skyreels_image2video", "HunyuanSkyreelsImageToVideoPipeline"),
                ("hunyuan_video.pipeline_hunyuan_video_image2video", "HunyuanVideoImageToVideoPipeline"),
                ("hunyuan_video1_5.pipeline_hunyuan_video1_5", "HunyuanVideo15Pipeline"),
                ("hunyuan_video1_5.pipeline_hunyuan_video1_5_image2video", "HunyuanVideo15ImageToVideoPipeline"),
                ("ideogram4.pipeline_ideogram4", "Ideogram4Pipeline"),
                ("joyimage.pipeline_joyimage_edit", "JoyImageEditPipeline"),
                ("joyimage.pipeline_joyimage_edit_plus", "JoyImageEditPlusPipeline"),
                ("kandinsky5.pipeline_kandinsky", "Kandinsky5T2VPipeline"),
                ("kandinsky5.pipeline_kandinsky_i2i", "Kandinsky5I2IPipeline"),
                ("kandinsky5.pipeline_kandinsky_i2v", "Kandinsky5I2VPipeline"),
                ("kandinsky5.pipeline_kandinsky_t2i", "Kandinsky5T2IPipeline"),
                ("longcat_image.pipeline_longcat_image", "LongCatImagePipeline"),
                ("longcat_image.pipeline_longcat_image_edit", "LongCatImageEditPipeline"),
                ("ltx.pipeline_ltx", "LTXPipeline"),
                ("ltx.pipeline_ltx_condition", "LTXConditionPipeline"),
                ("ltx.pipeline_ltx_image2video", "LTXImageToVideoPipeline"),
                ("lucy.pipeline_lucy_edit", "LucyEditPipeline"),
                ("lumina.pipeline_lumina", "LuminaPipeline"),
                ("omnigen.pipeline_omnigen", "OmniGenPipeline"),
                ("pag.pipeline_pag_sana", "SanaPAGPipeline"),
                ("pag.pipeline_pag_sd_3", "StableDiffusion3PAGPipeline"),
                ("sana_video.pipeline_sana_video_i2v", "SanaImageToVideoPipeline"),
                ("stable_audio_3.pipeline_stable_audio_3", "StableAudio3Pipeline"),
                ("stable_audio_3.pipeline_stable_audio_3_audio2audio", "StableAudio3AudioToAudioPipeline"),
                ("stable_audio_3.pipeline_stable_audio_3_inpaint", "StableAudio3InpaintPipeline"),
                ("z_image.pipeline_z_image_controlnet", "ZImageControlNetPipeline"),
                ("z_image.pipeline_z_image_controlnet_inpaint", "ZImageControlNetInpaintPipeline"),
                ("z_image.pipeline_z_image_omni", "ZImageOmniPipeline"),
            )
        ),
    ),
    runtime=runtime,
    runtime_targets=("<scheduler class>.set_timesteps (pipelines without set_begin_index)",),
    exercised_by=("WanPipeline.__call__", "WanVideoToVideoPipeline.__call__", "LTX2Pipeline.__call__",
                  "LTX2ImageToVideoPipeline.__call__", "StableDiffusionXLPipeline.__call__",
                  "StableDiffusion3Pipeline.__call__", "ChromaPipeline.__call__", "HunyuanVideoPipeline.__call__",
                  "ZImagePipeline.__call__", "Cosmos2TextToImagePipeline.__call__", "MochiPipeline.__call__",
                  "Lumina2Pipeline.__call__", "AuraFlowPipeline.__call__", "SanaPipeline.__call__",
                  "begin_index.set_timesteps"),
    examples=EXAMPLES,
)
