"""UniPC: build the order-1/2 `rhos` constant on the device instead of copying `[0.5]` from the host."""

import libcst as cst
import libcst.matchers as m

from fixes._unipc import P_UPDATE_0371, unipc_rewrite
from lab.apply import Example, Fix, FunctionRewrite, Upstream

# `torch.tensor([0.5], dtype=..., device=...)`: a Python list copied host-to-device (a blocking copy).
HALF_FROM_LIST = m.Call(
    func=m.Attribute(value=m.Name("torch"), attr=m.Name("tensor")),
    args=[m.Arg(value=m.List(elements=[m.Element(value=m.Float("0.5"))]), keyword=None), m.ZeroOrMore()],
)


class DeviceHalf(FunctionRewrite):
    DESCRIPTION = "torch.tensor([0.5], ...) -> torch.ones(1, ...) * 0.5 in the UniPC updates"
    FUNCTIONS = frozenset({"multistep_uni_p_bh_update", "multistep_uni_c_bh_update"})
    EDITS = frozenset({"half"})

    def already_fixed(self, node: cst.FunctionDef) -> bool:
        return bool(m.findall(node, m.BinaryOperation(left=m.Call(func=m.Attribute(attr=m.Name("ones"))), right=m.Float("0.5"))))

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if not (self.inside_target() and m.matches(updated_node, HALF_FROM_LIST)):
            return updated_node
        self.edited("half")
        ones = updated_node.with_changes(
            func=cst.Attribute(value=cst.Name("torch"), attr=cst.Name("ones")),
            args=[cst.Arg(cst.Integer("1"), comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))), *updated_node.args[1:]],
        )
        return cst.BinaryOperation(
            left=ones,
            operator=cst.Multiply(whitespace_before=cst.SimpleWhitespace(" "), whitespace_after=cst.SimpleWhitespace(" ")),
            right=cst.Float("0.5"),
        )


# --- examples (tests/test_fix_examples.py): the predictor update as 0.37.1 has it ------------------------------------

P_UPDATE = P_UPDATE_0371
P_UPDATE_FIXED = P_UPDATE.replace("torch.tensor([0.5], dtype=x.dtype, device=device)",
                                  "torch.ones(1, dtype=x.dtype, device=device) * 0.5")
EXAMPLES = (
    Example("rewritten", P_UPDATE, P_UPDATE_FIXED),
    Example("no_op_when_fixed", P_UPDATE_FIXED),
    Example("warns_without_the_constant",
            P_UPDATE.replace("torch.tensor([0.5], dtype=x.dtype, device=device)", "half"),
            warning="`multistep_uni_p_bh_update` does not have the expected shape (missing edits: half; unexpected: "
                    "none); left unchanged."),
)


FIX = Fix(
    name="unipc_device_const",
    description="UniPC updates build the 0.5 rhos constant with torch.ones on the device (no host-to-device copy).",
    upstream=Upstream(refs=("#13356",)),
    rewrites=(unipc_rewrite(DeviceHalf, upstream_since="0.38.0"),),
    examples=EXAMPLES,
)
