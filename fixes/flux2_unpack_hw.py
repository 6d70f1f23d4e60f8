"""Flux2: pass the latent height/width to `_unpack_latents_with_ids` instead of `torch.max(ids) + 1` on the GPU.

`torch.max(h_ids) + 1` is a GPU tensor used as a shape (`torch.zeros((h * w, ch))`, `out.view(h, w, ch)`), which
syncs. The call site knows the size from the pixel height/width. Upstream fixed `Flux2KleinPipeline` in 0.38.0;
`Flux2Pipeline` and the Klein inpaint and KV pipelines still have the pattern in 0.42.1.
"""

import libcst as cst
import libcst.matchers as m

from lab.apply import Example, Fix, FunctionRewrite, Overlap, Rewrite, Upstream


# `h = torch.max(h_ids) + 1` / `w = torch.max(w_ids) + 1`
def _max_plus_one(var: str, ids: str):
    return m.SimpleStatementLine(
        body=[
            m.Assign(
                targets=[m.AssignTarget(m.Name(var))],
                value=m.BinaryOperation(
                    left=m.Call(func=m.Attribute(m.Name("torch"), m.Name("max")), args=[m.Arg(m.Name(ids))]),
                    operator=m.Add(),
                    right=m.Integer("1"),
                ),
            )
        ]
    )


# `latents = self._unpack_latents_with_ids(latents, <ids>)` in `__call__` (two arguments: not yet fixed)
CALL_SITE = m.SimpleStatementLine(
    body=[
        m.Assign(
            value=m.Call(func=m.Attribute(m.Name("self"), m.Name("_unpack_latents_with_ids")), args=[m.Arg(), m.Arg()])
        )
    ]
)
SIGNATURE = cst.parse_statement(
    "def _unpack_latents_with_ids(\n"
    "    x: torch.Tensor, x_ids: torch.Tensor, height: int | None = None, width: int | None = None\n"
    ") -> list[torch.Tensor]:\n    pass\n"
)


class UnpackWithHeightWidth(FunctionRewrite):
    DESCRIPTION = "pass latent height/width to _unpack_latents_with_ids instead of torch.max(ids) + 1"
    FUNCTIONS = frozenset({"_unpack_latents_with_ids", "__call__"})

    def required_edits(self, node: cst.FunctionDef) -> frozenset[str]:
        if node.name.value == "__call__":
            return frozenset({"call_site"})
        return frozenset({"signature", "h", "w"})

    def already_fixed(self, node: cst.FunctionDef) -> bool:
        if node.name.value == "__call__":
            return bool(m.findall(node, m.Call(func=m.Attribute(m.Name("self"), m.Name("_unpack_latents_with_ids")), args=[m.Arg()] * 4)))
        return any(p.name.value == "height" for p in node.params.params)

    def leave_FunctionDef(self, original_node, updated_node):
        if original_node.name.value == "_unpack_latents_with_ids" and self.inside_target():
            if [p.name.value for p in updated_node.params.params] == ["x", "x_ids"]:
                updated_node = updated_node.with_changes(
                    params=SIGNATURE.params, whitespace_before_params=SIGNATURE.whitespace_before_params
                )
                self.edited("signature")
        return super().leave_FunctionDef(original_node, updated_node)

    def leave_SimpleStatementLine(self, original_node, updated_node):
        if not self.inside_target():
            return updated_node
        for var, ids, dim in (("h", "h_ids", "height"), ("w", "w_ids", "width")):
            if m.matches(updated_node, _max_plus_one(var, ids)):
                self.edited(var)
                return cst.parse_statement(f"{var} = {dim} if {dim} is not None else torch.max({ids}) + 1").with_changes(
                    leading_lines=updated_node.leading_lines
                )
        if m.matches(updated_node, CALL_SITE):
            self.edited("call_site")
            call = updated_node.body[0].value
            target = cst.Module(body=[]).code_for_node(updated_node.body[0].targets[0].target)
            x, ids = (cst.Module(body=[]).code_for_node(a.value) for a in call.args)
            first = cst.parse_statement("latent_height = 2 * (int(height) // (self.vae_scale_factor * 2))")
            comment = cst.EmptyLine(comment=cst.Comment("# Pass pre-computed latent height/width to avoid DtoH sync from torch.max().item()"))
            return cst.FlattenSentinel(
                [
                    first.with_changes(leading_lines=[*updated_node.leading_lines, comment]),
                    cst.parse_statement("latent_width = 2 * (int(width) // (self.vae_scale_factor * 2))"),
                    cst.parse_statement(
                        f"{target} = self._unpack_latents_with_ids({x}, {ids}, latent_height // 2, latent_width // 2)"
                    ),
                ]
            )
        return updated_node


def _site(module: str, cls: str, since: str | None, pipelines: tuple[str, ...] = ()) -> Rewrite:
    return Rewrite(
        module=f"diffusers.pipelines.flux2.{module}",
        targets=(f"{cls}._unpack_latents_with_ids", f"{cls}.__call__"),
        codemod=UnpackWithHeightWidth,
        upstream_since=since,
        pipelines=pipelines,
    )


# --- examples (tests/test_fix_examples.py) ---------------------------------------------------------------------------

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
EXAMPLES = (
    Example("rewritten", UNPACK, UNPACK_FIXED),
    Example("no_op_when_fixed", UNPACK_FIXED),
    # the call site would be rewritten, but the helper has no `torch.max`: both stay as they are (a call with four
    # arguments into a two-argument helper would crash)
    Example("unexpected_shape_keeps_the_whole_module",
            UNPACK.replace("h = torch.max(h_ids) + 1", "h = int(h_ids.max()) + 1"),
            warning="`_unpack_latents_with_ids` does not have the expected shape (missing edits: h; unexpected: none); "
                    "left unchanged."),
)


FIX = Fix(
    name="flux2_unpack_hw",
    description="Flux2 pipelines pass latent height/width to _unpack_latents_with_ids (no torch.max(ids) sync).",
    upstream=Upstream(refs=("#13356",), note="Klein only; Flux2, Klein inpaint and KV unfixed in 0.42.1",
                      overlaps=(
        Overlap("#13356", "merged",
                "the same change in `Flux2KleinPipeline` only; the three pipelines of this diff lost their \"Copied "
                "from\" line, so `make fix-copies` does not carry it"),
        Overlap("#13485", "merged",
                "also edits Klein's `_unpack_latents_with_ids` (index dtype by device): a later fix-copies could "
                "collide"),
    )),
    rewrites=(
        _site("pipeline_flux2_klein", "Flux2KleinPipeline", "0.38.0", ("flux2",)),
        _site("pipeline_flux2", "Flux2Pipeline", None),
        _site("pipeline_flux2_klein_inpaint", "Flux2KleinInpaintPipeline", None),
        _site("pipeline_flux2_klein_kv", "Flux2KleinKVPipeline", None),
    ),
    exercised_by=("Flux2KleinPipeline._unpack_latents_with_ids",),
    examples=EXAMPLES,
)
