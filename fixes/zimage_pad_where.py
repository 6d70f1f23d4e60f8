"""Z-Image: pad tokens put in place with `torch.where`, not with a boolean-mask assignment that syncs.

`ZImageTransformer2DModel._prepare_sequence` writes its pad token with `feats_cat[torch.cat(inner_pad_mask)] =
pad_token`: assigning through a boolean mask finds the selected rows with `nonzero()`, a device-to-host sync, twice
per transformer call (the image and the caption sequences). The rewrite selects with `torch.where(mask, pad_token,
feats_cat)`, which gives the same values without leaving the device. Found by `lab census`; diffusers 0.38.0 ships
the same change.
"""

import libcst as cst
import libcst.matchers as m

from lab.apply import Example, Fix, FunctionRewrite, Rewrite, Upstream

# `feats_cat[torch.cat(inner_pad_mask)] = pad_token`
ASSIGN = m.SimpleStatementLine(body=[m.Assign(
    targets=[m.AssignTarget(m.Subscript(value=m.Name("feats_cat")))], value=m.Name("pad_token"))])
WHERE = ("mask = torch.cat(inner_pad_mask).unsqueeze(-1)", "feats_cat = torch.where(mask, pad_token, feats_cat)")


class PadWithWhere(FunctionRewrite):
    DESCRIPTION = "select Z-Image's pad tokens with torch.where instead of a boolean-mask assignment"
    FUNCTIONS = frozenset({"_prepare_sequence"})
    EDITS = frozenset({"where"})

    def already_fixed(self, node: cst.FunctionDef) -> bool:
        return bool(m.findall(node, m.Call(func=m.Attribute(m.Name("torch"), m.Name("where")))))

    def leave_SimpleStatementLine(self, original_node, updated_node):
        if self.inside_target() and m.matches(original_node, ASSIGN):
            self.edited("where")
            first, second = (cst.parse_statement(s) for s in WHERE)
            return cst.FlattenSentinel([first.with_changes(leading_lines=original_node.leading_lines), second])
        return updated_node


# --- examples (tests/test_fix_examples.py) ---------------------------------------------------------------------------

ZIMAGE_PAD = """
class ZImageTransformer2DModel:
    def _prepare_sequence(self, feats, inner_pad_mask, pad_token):
        # Pad token
        feats_cat = torch.cat(feats, dim=0)
        feats_cat[torch.cat(inner_pad_mask)] = pad_token
        return feats_cat
"""
EXAMPLES = (
    Example("where_instead_of_a_masked_assignment", ZIMAGE_PAD,
            ZIMAGE_PAD.replace("        feats_cat[torch.cat(inner_pad_mask)] = pad_token\n",
                               "        mask = torch.cat(inner_pad_mask).unsqueeze(-1)\n"
                               "        feats_cat = torch.where(mask, pad_token, feats_cat)\n")),
    Example("no_op_on_the_0_38_shape",
            ZIMAGE_PAD.replace("feats_cat[torch.cat(inner_pad_mask)] = pad_token",
                               "feats_cat = torch.where(mask, pad_token, feats_cat)")),
)


FIX = Fix(
    name="zimage_pad_where",
    description="Z-Image: pad tokens selected with torch.where instead of a boolean-mask assignment (a nonzero sync "
                "per sequence in every transformer forward).",
    upstream=Upstream(refs=("diffusers 0.38.0 transformer_z_image.py",),
                      note="0.38.0 uses the same torch.where"),
    rewrites=(
        Rewrite(
            module="diffusers.models.transformers.transformer_z_image",
            targets=("ZImageTransformer2DModel._prepare_sequence",),
            codemod=PadWithWhere,
            upstream_since="0.38.0",
            pipelines=("zimage",),
        ),
    ),
    exercised_by=("ZImageTransformer2DModel._prepare_sequence",),
    examples=EXAMPLES,
)
