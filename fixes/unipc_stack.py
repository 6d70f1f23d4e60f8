"""UniPC: `torch.stack` the `rks` and `b` coefficients on the device, with sigma reads moved to the sample's device.

Upstream shipped this as #13356 plus the follow-up #13489: without the follow-up, `self.sigmas` stays on the CPU,
and any order-2 update (every run of 3+ steps) stacks CPU and CUDA tensors and crashes. Both are applied here.
"""

import libcst as cst
import libcst.matchers as m

from fixes._unipc import P_UPDATE_0371, unipc_rewrite
from lab.apply import Example, Fix, FunctionRewrite, Upstream


def _self_sigmas():
    return m.Subscript(value=m.Attribute(value=m.Name("self"), attr=m.Name("sigmas")))


def _torch_tensor_of(name: str):
    return m.Call(
        func=m.Attribute(value=m.Name("torch"), attr=m.Name("tensor")),
        args=[m.Arg(value=m.Name(name), keyword=None), m.Arg(keyword=m.Name("device"))],
    )


# `sigma_t, sigma_s0 = self.sigmas[...], self.sigmas[...]`: the first sigma reads of the update.
SIGMA_PAIR = m.SimpleStatementLine(
    body=[m.Assign(value=m.Tuple(elements=[m.Element(_self_sigmas()), m.Element(_self_sigmas())]))]
)
# `device = sample.device` (p) / `device = this_sample.device` (c), which #13489 moves above the sigma reads.
DEVICE_LINE = m.SimpleStatementLine(
    body=[m.Assign(targets=[m.AssignTarget(m.Name("device"))], value=m.Attribute(attr=m.Name("device")))]
)


def _to_device(node: cst.BaseExpression) -> cst.Call:
    return cst.Call(func=cst.Attribute(value=node, attr=cst.Name("to")), args=[cst.Arg(cst.Name("device"))])


class StackRks(FunctionRewrite):
    DESCRIPTION = "torch.tensor(rks/b) -> torch.stack with sigma reads on the sample's device in the UniPC updates"
    FUNCTIONS = frozenset({"multistep_uni_p_bh_update", "multistep_uni_c_bh_update"})
    EDITS = frozenset({"device_first", "sigma_loop", "rks_append", "rks_stack", "b_stack"})

    def already_fixed(self, node: cst.FunctionDef) -> bool:
        return bool(m.findall(node, m.Call(func=m.Attribute(value=m.Name("torch"), attr=m.Name("stack")), args=[m.Arg(m.Name("rks"))])))

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        if original_node.name.value in self.FUNCTIONS:
            updated_node = self._device_first(updated_node)
        return super().leave_FunctionDef(original_node, updated_node)

    def _device_first(self, node: cst.FunctionDef) -> cst.FunctionDef:
        """Move `device = ...` above the sigma pair and read both sigmas with `.to(device)`."""
        body = list(node.body.body)
        pair = next((i for i, s in enumerate(body) if m.matches(s, SIGMA_PAIR)), None)
        dev = next((i for i, s in enumerate(body) if m.matches(s, DEVICE_LINE)), None)
        if pair is None or dev is None or dev < pair:
            return node
        device_line = body.pop(dev).with_changes(leading_lines=())
        assign = body[pair].body[0]
        elements = [e.with_changes(value=_to_device(e.value)) for e in assign.value.elements]
        new_pair = body[pair].with_changes(body=[assign.with_changes(value=assign.value.with_changes(elements=elements))])
        body[pair : pair + 1] = [device_line.with_changes(leading_lines=body[pair].leading_lines), new_pair.with_changes(leading_lines=())]
        self.edited("device_first")
        return node.with_changes(body=node.body.with_changes(body=body))

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        # self._sigma_to_alpha_sigma_t(self.sigmas[si]) inside the order loop -> self.sigmas[si].to(device)
        if self.inside_target() and m.matches(
            updated_node,
            m.Call(func=m.Attribute(value=m.Name("self"), attr=m.Name("_sigma_to_alpha_sigma_t")), args=[m.Arg(_self_sigmas())]),
        ):
            self.edited("sigma_loop")
            return updated_node.with_changes(args=[cst.Arg(_to_device(updated_node.args[0].value))])
        return updated_node

    def leave_SimpleStatementLine(self, original_node, updated_node):
        if not self.inside_target():
            return updated_node
        # rks.append(1.0) -> rks.append(torch.ones((), device=device))
        if m.matches(updated_node, m.SimpleStatementLine(body=[m.Expr(m.Call(func=m.Attribute(m.Name("rks"), m.Name("append")), args=[m.Arg(m.Float("1.0"))]))])):
            self.edited("rks_append")
            return updated_node.with_changes(body=[cst.parse_statement("rks.append(torch.ones((), device=device))").body[0]])
        # rks = torch.tensor(rks, device=device) -> rks = torch.stack(rks)
        if m.matches(updated_node, m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(m.Name("rks"))], value=_torch_tensor_of("rks"))])):
            self.edited("rks_stack")
            return updated_node.with_changes(body=[cst.parse_statement("rks = torch.stack(rks)").body[0]])
        # b = torch.tensor(b, device=device) -> b = torch.stack(b) if len(b) > 0 else torch.tensor(b, device=device)
        if m.matches(updated_node, m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(m.Name("b"))], value=_torch_tensor_of("b"))])):
            self.edited("b_stack")
            return updated_node.with_changes(
                body=[cst.parse_statement("b = torch.stack(b) if len(b) > 0 else torch.tensor(b, device=device)").body[0]]
            )
        return updated_node


# --- examples (tests/test_fix_examples.py): the predictor update as 0.37.1 has it, and as 0.38.0 has it --------------

P_UPDATE = P_UPDATE_0371
P_UPDATE_STACKED = """
class S:
    def multistep_uni_p_bh_update(self, model_output, *args, sample=None, order=None, **kwargs):
        device = sample.device
        sigma_t, sigma_s0 = self.sigmas[self.step_index + 1].to(device), self.sigmas[self.step_index].to(device)
        alpha_t, sigma_t = self._sigma_to_alpha_sigma_t(sigma_t)
        h = lambda_t - lambda_s0

        rks = []
        for i in range(1, order):
            alpha_si, sigma_si = self._sigma_to_alpha_sigma_t(self.sigmas[si].to(device))
            rks.append(rk)

        rks.append(torch.ones((), device=device))
        rks = torch.stack(rks)
        b = []
        b = torch.stack(b) if len(b) > 0 else torch.tensor(b, device=device)
        if order == 2:
            rhos_p = torch.tensor([0.5], dtype=x.dtype, device=device)
        return x_t
"""
EXAMPLES = (
    Example("rewritten", P_UPDATE, P_UPDATE_STACKED),
    Example("already_fixed_is_a_no_op", P_UPDATE_STACKED),
    Example("other_functions_untouched", P_UPDATE.replace("multistep_uni_p_bh_update", "some_other_update")),
    # `rks` built some other way: the site is not what the rewrite expects, so nothing is edited
    Example("unexpected_shape_warns_and_changes_nothing",
            P_UPDATE.replace("rks = torch.tensor(rks, device=device)", "rks = make_rks(rks)"),
            warning="`multistep_uni_p_bh_update` does not have the expected shape (missing edits: rks_stack; "
                    "unexpected: none); left unchanged."),
)


FIX = Fix(
    name="unipc_stack",
    description="UniPC updates stack rks/b on the device (torch.stack) with sigmas read onto the sample's device.",
    upstream=Upstream(refs=("#13356", "#13489", "#13488")),
    rewrites=(unipc_rewrite(StackRks, upstream_since="0.38.0"),),
    # The sigma -> lambda -> rk chain now runs on the sample's device instead of the CPU, so float32 rounding can
    # differ in the last bits on an accelerator; on the CPU it is bit-identical.
    tolerance=1e-5,
    examples=EXAMPLES,
)
