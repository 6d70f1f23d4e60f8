"""Z-Image: the normalized timestep for CFG truncation, read once before the loop instead of once per step.

`ZImagePipeline.__call__` (0.37.1) reads `t_norm = timestep[0].item()` at the top of every step: a device-to-host
sync per step, although `t_norm` is only used to decide CFG truncation. The rewrite computes all of them with one
`.tolist()` before the loop, and only when CFG truncation can apply (with guidance off, as Z-Image-Turbo runs, not
at all); the loop reads its step's value from the list. Found by `lab census`; diffusers 0.38.0 ships the same change
for the text-to-image pipeline, and its five siblings (image-to-image, inpainting, the two ControlNet pipelines and
Omni) still read it per step in 0.42.1: the rewrite is carried to them by shape (the timesteps they loop over, after
`strength` has cut the schedule, are the ones the list is made of). The values are the same floats: `(1000 - t) /
1000` of the same float32 timesteps, elementwise.
"""

import libcst as cst
import libcst.matchers as m

from lab.apply import BLANK_LINE, Example, Fix, FunctionRewrite, Overlap, Rewrite, Upstream

NUM_TIMESTEPS = m.SimpleStatementLine(
    body=[m.Assign(targets=[m.AssignTarget(m.Attribute(m.Name("self"), m.Name("_num_timesteps")))])]
)
# `t_norm = timestep[0].item()`
READ = m.SimpleStatementLine(body=[m.Assign(
    targets=[m.AssignTarget(m.Name("t_norm"))],
    value=m.Call(func=m.Attribute(value=m.Subscript(value=m.Name("timestep")), attr=m.Name("item"))),
)])
PRECOMPUTE = """
if self.do_classifier_free_guidance and self._cfg_truncation is not None and float(self._cfg_truncation) <= 1:
    _precomputed_t_norms = ((1000 - timesteps.float()) / 1000).tolist()
else:
    _precomputed_t_norms = None
"""


class PrecomputeTNorm(FunctionRewrite):
    DESCRIPTION = "read the CFG-truncation timesteps once before the loop instead of t_norm = timestep[0].item() per step"
    FUNCTIONS = frozenset({"__call__"})
    EDITS = frozenset({"precompute", "read"})

    def already_fixed(self, node: cst.FunctionDef) -> bool:
        return bool(m.findall(node, m.Name("_precomputed_t_norms")))

    def leave_SimpleStatementLine(self, original_node, updated_node):
        if self.inside_target() and m.matches(original_node, READ):
            self.edited("read")
            return cst.parse_statement(
                "t_norm = _precomputed_t_norms[i] if _precomputed_t_norms is not None else None"
            ).with_changes(leading_lines=original_node.leading_lines)
        return updated_node

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        if original_node.name.value in self.FUNCTIONS:
            body = list(updated_node.body.body)
            anchor = next((i for i, s in enumerate(body) if m.matches(s, NUM_TIMESTEPS)), None)
            if anchor is not None:
                block = cst.parse_statement(PRECOMPUTE.strip() + "\n").with_changes(leading_lines=[BLANK_LINE])
                body.insert(anchor + 1, block)
                updated_node = updated_node.with_changes(body=updated_node.body.with_changes(body=body))
                self.edited("precompute")
        return super().leave_FunctionDef(original_node, updated_node)


# --- examples (tests/test_fix_examples.py) ---------------------------------------------------------------------------

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
ZIMAGE_FIXED = """
class ZImagePipeline:
    def __call__(self):
        self._num_timesteps = len(timesteps)

        if self.do_classifier_free_guidance and self._cfg_truncation is not None and float(self._cfg_truncation) <= 1:
            _precomputed_t_norms = ((1000 - timesteps.float()) / 1000).tolist()
        else:
            _precomputed_t_norms = None

        with self.progress_bar(total=num_inference_steps) as progress_bar:
            for i, t in enumerate(timesteps):
                timestep = (1000 - timestep) / 1000
                # Normalized time for time-aware config (0 at start, 1 at end)
                t_norm = _precomputed_t_norms[i] if _precomputed_t_norms is not None else None
                if t_norm > self._cfg_truncation:
                    current_guidance_scale = 0.0
"""
EXAMPLES = (
    Example("read_once_before_the_loop", ZIMAGE, ZIMAGE_FIXED),
    Example("no_op_on_the_0_38_shape",
            ZIMAGE.replace("t_norm = timestep[0].item()", "t_norm = _precomputed_t_norms[i]")),
    Example("left_unchanged_without_the_per_step_read",
            ZIMAGE.replace("t_norm = timestep[0].item()", "t_norm = float(timestep[0])"),
            warning="`__call__` does not have the expected shape (missing edits: read; unexpected: none); left "
                    "unchanged."),
)


FIX = Fix(
    name="zimage_t_norm",
    description="Z-Image: the CFG-truncation timesteps read once before the loop (one .tolist(), none without CFG) "
                "instead of timestep[0].item() every step.",
    upstream=Upstream(refs=("diffusers 0.38.0 pipeline_z_image.py",),
                      note="0.38.0 precomputes them as `_precomputed_t_norms`, the shape this rewrite gives, in the "
                           "text-to-image pipeline; its five siblings still read them per step in 0.42.1", overlaps=(
        Overlap("#13461", "merged",
                "the same precompute in the text-to-image pipeline only (since 0.38.0)"),
        Overlap("#14589", "open",
                "covers Z-Image's per-step syncs; whether its five sibling pipelines too is not shown in what was "
                "found"),
    )),
    rewrites=(
        Rewrite(
            module="diffusers.pipelines.z_image.pipeline_z_image",
            targets=("ZImagePipeline.__call__",),
            codemod=PrecomputeTNorm,
            upstream_since="0.38.0",
            pipelines=("zimage",),
        ),
        # the siblings, still without it in 0.42.1 (no scenario runs them: their diff, and tests on their source)
        *(Rewrite(module=f"diffusers.pipelines.z_image.{module}", targets=(f"{cls}.__call__",), codemod=PrecomputeTNorm)
          for module, cls in (("pipeline_z_image_img2img", "ZImageImg2ImgPipeline"),
                              ("pipeline_z_image_inpaint", "ZImageInpaintPipeline"),
                              ("pipeline_z_image_controlnet", "ZImageControlNetPipeline"),
                              ("pipeline_z_image_controlnet_inpaint", "ZImageControlNetInpaintPipeline"),
                              ("pipeline_z_image_omni", "ZImageOmniPipeline"))),
    ),
    exercised_by=("ZImagePipeline.__call__",),
    examples=EXAMPLES,
)
