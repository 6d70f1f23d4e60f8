"""Flux2 and Z-Image: read the transformer's dtype once before the denoising loop, not at every step.

`self.transformer.dtype` is `ModelMixin.dtype`, which calls `get_parameter_dtype`: a walk over every submodule of
the transformer (looking for a layerwise-casting hook) before it finds the first parameter. Flux2 and Klein do it at
the top of every step (`latents.to(self.transformer.dtype)`), so the host spends that walk between the last
transformer call of one step and the first of the next, while the GPU waits (found by `lab analyze`'s gap
attribution: `get_parameter_dtype` between steps). Z-Image's pipelines do the same in both branches of their CFG
test (found by searching the pipelines for the read inside their loops; no scenario here, so checked as source
rewrites only). Wan already reads it once (`transformer_dtype = ...` before its loop); this does the same. Closed
upstream PR #13571 cached the property instead.
"""

import libcst as cst
import libcst.matchers as m

from lab.apply import Example, Fix, FunctionRewrite, Overlap, Rewrite, Upstream

# `self.transformer.dtype`
DTYPE = m.Attribute(value=m.Attribute(value=m.Name("self"), attr=m.Name("transformer")), attr=m.Name("dtype"))
HOISTED = "transformer_dtype"


class HoistTransformerDtype(FunctionRewrite):
    DESCRIPTION = "read self.transformer.dtype once before the denoising loop"
    FUNCTIONS = frozenset({"__call__"})
    EDITS = frozenset({"hoist", "use"})

    def __init__(self, context) -> None:
        super().__init__(context)
        self._loops = 0

    def already_fixed(self, node: cst.FunctionDef) -> bool:
        return bool(m.findall(node, m.Assign(targets=[m.AssignTarget(m.Name(HOISTED))])))

    def visit_For(self, node: cst.For) -> bool:
        self._loops += self.inside_target()
        return True

    def leave_For(self, original_node: cst.For, updated_node: cst.For) -> cst.For:
        self._loops -= self.inside_target()
        return updated_node

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.BaseExpression) -> cst.BaseExpression:
        # only inside the loop: a read before the loop runs once anyway
        if self.inside_target() and self._loops > 0 and m.matches(original_node, DTYPE):
            self.edited("use")
            return cst.Name(HOISTED)
        return updated_node

    def leave_With(self, original_node: cst.With, updated_node: cst.With):
        # the `with self.progress_bar(...)` statement that holds the denoising loop reading the dtype
        if not (self.inside_target() and self._loops == 0 and m.findall(original_node, m.For())
                and m.findall(original_node, DTYPE)):
            return updated_node
        self.edited("hoist")
        read = cst.parse_statement(f"{HOISTED} = self.transformer.dtype").with_changes(
            leading_lines=[*updated_node.leading_lines,
                           cst.EmptyLine(comment=cst.Comment("# ModelMixin.dtype walks every submodule: read it once"))])
        return cst.FlattenSentinel([read, updated_node.with_changes(leading_lines=[])])


def _site(module: str, cls: str, pipelines: tuple[str, ...] = ()) -> Rewrite:
    package = "flux2" if module.startswith("pipeline_flux2") else "z_image"
    return Rewrite(module=f"diffusers.pipelines.{package}.{module}", targets=(f"{cls}.__call__",),
                   codemod=HoistTransformerDtype, pipelines=pipelines)


# --- examples (tests/test_fix_examples.py) ---------------------------------------------------------------------------

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
# the read before the loop stays: only the loop's reads take the hoisted value
DTYPE_LOOP_FIXED = """
class Flux2KleinPipeline:
    def __call__(self):
        latents = latents.to(self.transformer.dtype)
        self.scheduler.set_begin_index(0)
        # ModelMixin.dtype walks every submodule: read it once
        transformer_dtype = self.transformer.dtype
        with self.progress_bar(total=num_inference_steps) as progress_bar:
            for i, t in enumerate(timesteps):
                latent_model_input = latents.to(transformer_dtype)
                if image_latents is not None:
                    latent_model_input = torch.cat([latents, image_latents], dim=1).to(transformer_dtype)
"""
# Z-Image's loop: the read in either branch of `if apply_cfg`
CFG_BRANCHES = """
class ZImagePipeline:
    def __call__(self):
        with self.progress_bar(total=num_inference_steps) as progress_bar:
            for i, t in enumerate(timesteps):
                if apply_cfg:
                    latents_typed = latents.to(self.transformer.dtype)
                else:
                    latent_model_input = latents.to(self.transformer.dtype)
"""
CFG_BRANCHES_FIXED = """
class ZImagePipeline:
    def __call__(self):
        # ModelMixin.dtype walks every submodule: read it once
        transformer_dtype = self.transformer.dtype
        with self.progress_bar(total=num_inference_steps) as progress_bar:
            for i, t in enumerate(timesteps):
                if apply_cfg:
                    latents_typed = latents.to(transformer_dtype)
                else:
                    latent_model_input = latents.to(transformer_dtype)
"""
EXAMPLES = (
    Example("read_once_before_the_loop", DTYPE_LOOP, DTYPE_LOOP_FIXED),
    Example("no_op_when_already_read_once",
            DTYPE_LOOP.replace("        self.scheduler.set_begin_index(0)\n",
                               "        transformer_dtype = self.transformer.dtype\n")),
    Example("warns_when_the_loop_does_not_read_it", DTYPE_LOOP.replace("for i, t in enumerate(timesteps):", "if True:"),
            warning="`__call__` does not have the expected shape (missing edits: hoist, use; unexpected: none); left "
                    "unchanged."),
    Example("both_branches_of_a_cfg_test", CFG_BRANCHES, CFG_BRANCHES_FIXED),
)


FIX = Fix(
    name="transformer_dtype",
    description="Flux2 and Z-Image pipelines read the transformer's dtype once before the loop (ModelMixin.dtype "
                "walks every submodule; it ran at every step).",
    upstream=Upstream(refs=("#13571 (closed)",), note="still read at every step in 0.42.1", overlaps=(
        Overlap("#13571", "closed",
                "cached `ModelMixin.dtype` itself (invalidated in `_apply`) instead of reading it once per pipeline "
                "call"),
    )),
    rewrites=(
        _site("pipeline_flux2_klein", "Flux2KleinPipeline", ("flux2",)),
        _site("pipeline_flux2", "Flux2Pipeline"),
        _site("pipeline_z_image", "ZImagePipeline"),
        _site("pipeline_z_image_img2img", "ZImageImg2ImgPipeline"),
        _site("pipeline_z_image_inpaint", "ZImageInpaintPipeline"),
        _site("pipeline_z_image_controlnet", "ZImageControlNetPipeline"),
        _site("pipeline_z_image_controlnet_inpaint", "ZImageControlNetInpaintPipeline"),
        _site("pipeline_z_image_omni", "ZImageOmniPipeline"),
    ),
    examples=EXAMPLES,
)
