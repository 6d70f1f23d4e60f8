"""AuraFlow: the step's timestep kept on the device, not read to the host and copied back in every step.

`AuraFlowPipeline.__call__` builds the transformer's timestep with `torch.tensor([t / 1000])`: `t` is on the device,
so making a host tensor of it reads the value (a device-to-host sync), and the next line copies it back with
`.to(latents.device)` (a blocking host-to-device copy). The rewrite keeps `(t / 1000)` where it is; the same float32
value reaches the transformer. Found by `lab census`; still in diffusers 0.42.1.
"""

import libcst as cst
import libcst.matchers as m

from lab.apply import Example, Fix, FunctionRewrite, Overlap, Rewrite, Upstream

# `torch.tensor([t / 1000])`
HOST = m.Call(func=m.Attribute(m.Name("torch"), m.Name("tensor")),
              args=[m.Arg(m.List(elements=[m.Element(m.BinaryOperation(left=m.Name("t"), operator=m.Divide()))]),
                          keyword=None)])


class TimestepOnDevice(FunctionRewrite):
    DESCRIPTION = "AuraFlow's timestep divided on the device instead of read into a host tensor"
    FUNCTIONS = frozenset({"__call__"})
    EDITS = frozenset({"timestep"})

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if self.inside_target() and m.matches(original_node, HOST):
            self.edited("timestep")
            division = original_node.args[0].value.elements[0].value
            return division.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        return updated_node


# --- examples (tests/test_fix_examples.py) ---------------------------------------------------------------------------

AURA = """
class AuraFlowPipeline:
    def __call__(self):
        for i, t in enumerate(timesteps):
            timestep = torch.tensor([t / 1000]).expand(latent_model_input.shape[0])
            timestep = timestep.to(latents.device, dtype=latents.dtype)
"""
EXAMPLES = (
    Example("divided_on_the_device", AURA, AURA.replace("torch.tensor([t / 1000])", "(t / 1000)")),
    # a timestep made otherwise (another scale, or already on the device) is not the host tensor the rewrite expects
    Example("another_timestep_is_left_unchanged_with_a_warning",
            AURA.replace("torch.tensor([t / 1000])", "torch.tensor([t])"),
            warning="`__call__` does not have the expected shape (missing edits: timestep; unexpected: none); left "
                    "unchanged."),
)


FIX = Fix(
    name="auraflow_timestep_device",
    description="AuraFlow: the step's timestep divided on the device instead of read to the host and copied back.",
    upstream=Upstream(refs=(), note="found by lab census; not upstream (still in 0.42.1)", overlaps=(
        Overlap("#14576", "merged",
                "sets the scheduler's begin index in AuraFlow's pipeline (and four others), lines before the loop: no "
                "conflict; it leaves the per-step `torch.tensor([t / 1000])` this diff removes"),
        Overlap("#11501", "merged",
                "puts AuraFlow's timesteps on the CPU under XLA, which is why this diff keeps the "
                "`.to(latents.device)`"),
    )),
    rewrites=(
        Rewrite(
            module="diffusers.pipelines.aura_flow.pipeline_aura_flow",
            targets=("AuraFlowPipeline.__call__",),
            codemod=TimestepOnDevice,
            pipelines=("auraflow",),
        ),
    ),
    exercised_by=("AuraFlowPipeline.__call__",),
    examples=EXAMPLES,
)
