"""Chroma: the zero guidance embedding made on the timestep's device, not on the host and copied in every forward.

`ChromaCombinedTimestepTextProjEmbeddings.forward` embeds a guidance of zero with
`self.guidance_proj(torch.tensor([0] * batch_size))`: a tensor made on the host, embedded on the host, then moved
with `.to(device=timestep.device)`, a blocking host-to-device copy (a sync) in every transformer call. The rewrite
fills the zeros on the timestep's device (`torch.zeros`, a fill kernel: `torch.tensor([...], device=...)` would still
copy the list from the host). The embedding of zero is exact on either device (sin 0 = 0, cos 0 = 1), so the
outputs are bit-identical. Found by `lab census`; still in diffusers 0.42.1.
"""

import libcst as cst
import libcst.matchers as m

from lab.apply import Example, Fix, FunctionRewrite, Rewrite, Upstream

# `torch.tensor([0] * batch_size)`, with no device
ZEROS = m.Call(func=m.Attribute(m.Name("torch"), m.Name("tensor")),
               args=[m.Arg(m.BinaryOperation(left=m.List(), operator=m.Multiply(), right=m.Name("batch_size")),
                           keyword=None)])
ON_DEVICE = cst.parse_expression("torch.zeros(batch_size, dtype=torch.long, device=timestep.device)")


class GuidanceOnDevice(FunctionRewrite):
    DESCRIPTION = "make Chroma's zero guidance on the timestep's device"
    FUNCTIONS = frozenset({"forward"})
    EDITS = frozenset({"zeros"})

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return node.name.value == "ChromaCombinedTimestepTextProjEmbeddings"

    def already_fixed(self, node: cst.FunctionDef) -> bool:
        return bool(m.findall(node, m.Call(func=m.Attribute(m.Name("torch"), m.Name("zeros")),
                                           args=[m.ZeroOrMore(), m.Arg(keyword=m.Name("device")), m.ZeroOrMore()])))

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if self.inside_target() and m.matches(updated_node, ZEROS):
            self.edited("zeros")
            return ON_DEVICE
        return updated_node


# --- examples (tests/test_fix_examples.py) ---------------------------------------------------------------------------

CHROMA = """
class ChromaCombinedTimestepTextProjEmbeddings(nn.Module):
    def forward(self, timestep: torch.Tensor) -> torch.Tensor:
        batch_size = timestep.shape[0]
        guidance_proj = self.guidance_proj(torch.tensor([0] * batch_size)).to(
            dtype=timestep.dtype, device=timestep.device
        )
        return guidance_proj


class Other(nn.Module):
    def forward(self, batch_size):
        return torch.tensor([0] * batch_size)
"""
EXAMPLES = (
    # the other class's forward is left alone
    Example("zeros_made_on_the_timestep_device", CHROMA,
            CHROMA.replace("self.guidance_proj(torch.tensor([0] * batch_size))",
                           "self.guidance_proj(torch.zeros(batch_size, dtype=torch.long, device=timestep.device))")),
    Example("no_op_when_already_on_the_device",
            CHROMA.replace("torch.tensor([0] * batch_size))", "torch.zeros(batch_size, device=d))")),
)


FIX = Fix(
    name="chroma_guidance_device",
    description="Chroma: the zero guidance embedding made on the timestep's device instead of copied from the host "
                "in every transformer forward.",
    upstream=Upstream(refs=(), note="found by lab census; not upstream (still in 0.42.1)", overlaps=()),
    rewrites=(
        Rewrite(
            module="diffusers.models.transformers.transformer_chroma",
            targets=("ChromaCombinedTimestepTextProjEmbeddings.forward",),
            codemod=GuidanceOnDevice,
            pipelines=("chroma",),
        ),
    ),
    exercised_by=("ChromaCombinedTimestepTextProjEmbeddings.forward",),
    examples=EXAMPLES,
)
