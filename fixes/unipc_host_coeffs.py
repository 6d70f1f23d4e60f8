"""UniPC with no host-device sync per step: the coefficient chain stays on the host.

UniPC keeps `self.sigmas` on the CPU, so sigma -> lambda -> h -> rk -> b -> rhos are small CPU tensors. 0.37.1 then
copies `rks`, `b` and the 0.5 constant to the device one blocking copy at a time and solves on the device (which
syncs too); 0.38+ (#13356, #13489) instead copies every sigma to the device first, which moves the syncs rather than
removing them (results/FINDINGS.md has the counts). Here nothing goes to the device: `rks`/`b` are stacked on the
CPU, the small system is solved on the CPU, and the `rhos` are applied as Python numbers (a 0-dim CPU tensor or a
float times a CUDA tensor needs no sync). Applies to the 0.37.1 shape and to the 0.38+ shape.
"""

import libcst as cst
import libcst.matchers as m

from fixes._unipc import unipc_rewrite
from lab.apply import Example, Fix, FunctionRewrite, Overlap, Upstream

DEVICE = m.Arg(keyword=m.Name("device"))
SIGMAS = m.Subscript(value=m.Attribute(value=m.Name("self"), attr=m.Name("sigmas")))
# `self.sigmas[i].to(device)` (0.38+): a blocking host-to-device copy of one sigma
SIGMA_TO_DEVICE = m.Call(func=m.Attribute(value=SIGMAS, attr=m.Name("to")), args=[m.Arg(m.Name("device"))])
# `torch.einsum("k,bkc...->bc...", rhos, D1s)`: applies the device-side rhos
EINSUM = m.Call(func=m.Attribute(m.Name("torch"), m.Name("einsum")),
                args=[m.Arg(m.SimpleString('"k,bkc...->bc..."')), m.Arg(), m.Arg(m.Name("D1s"))])
# `torch.linalg.solve(...).to(device).to(x.dtype)`
SOLVE_TO_DEVICE = m.Call(func=m.Attribute(
    value=m.Call(func=m.Attribute(value=m.Call(func=m.Attribute(attr=m.Name("solve"))), attr=m.Name("to")),
                 args=[m.Arg(m.Name("device"))]),
    attr=m.Name("to")))


# `device = sample.device` (`this_sample.device` in the corrector): the device the chain was moved to
DEVICE_OF = m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(m.Name("device"))],
                                                 value=m.Attribute(attr=m.Name("device")))])


class _DeviceReaders(cst.CSTVisitor):
    """How many times a function reads the name `device` (not an attribute `.device`, not a keyword `device=`, not
    the assignment of `DEVICE_OF`)."""

    def __init__(self) -> None:
        self.count = 0

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> bool:
        return not m.matches(node, DEVICE_OF)

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        node.value.visit(self)
        return False

    def visit_Arg(self, node: cst.Arg) -> bool:
        node.value.visit(self)
        return False

    def visit_Name(self, node: cst.Name) -> None:
        self.count += node.value == "device"


class _DropDevice(cst.CSTTransformer):
    """The `device = ...device` line removed (its function no longer reads it)."""

    def leave_SimpleStatementLine(self, original_node, updated_node):
        return cst.RemovalSentinel.REMOVE if m.matches(updated_node, DEVICE_OF) else updated_node


def _stmt(code: str) -> cst.BaseSmallStatement:
    return cst.parse_statement(code).body[0]


class HostCoefficients(FunctionRewrite):
    DESCRIPTION = "UniPC updates keep rks/b/rhos on the host and apply rhos as Python numbers"
    FUNCTIONS = frozenset({"multistep_uni_p_bh_update", "multistep_uni_c_bh_update"})
    EDITS = frozenset({"rks_one", "rks_stack", "b_stack", "half", "solve", "einsum"})

    def required_edits(self, node: cst.FunctionDef) -> frozenset[str]:
        if m.findall(node, SIGMA_TO_DEVICE):  # the 0.38+ shape: rks are already stacked, sigmas copied
            return (self.EDITS - {"rks_stack"}) | {"sigma_host"}
        return self.EDITS

    def already_fixed(self, node: cst.FunctionDef) -> bool:
        return bool(m.findall(node, m.Call(func=m.Attribute(attr=m.Name("ones_like")), args=[m.Arg(m.Name("h"))])))

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if not self.inside_target():
            return updated_node
        if m.matches(updated_node, SIGMA_TO_DEVICE):
            self.edited("sigma_host")
            return updated_node.func.value
        if m.matches(updated_node, SOLVE_TO_DEVICE):
            self.edited("solve")
            return updated_node.with_changes(func=updated_node.func.with_changes(value=updated_node.func.value.func.value))
        if m.matches(updated_node, EINSUM):
            self.edited("einsum")
            rhos = cst.Module(body=[]).code_for_node(updated_node.args[1].value)
            return cst.parse_expression(f"sum(rho * D1s[:, k] for k, rho in enumerate({rhos}.tolist()))")
        # the 0.5 constant: torch.tensor([0.5], dtype=x.dtype, device=device) or torch.ones(1, ..., device=device) * 0.5
        if m.matches(updated_node, m.Call(func=m.Attribute(m.Name("torch"), m.OneOf(m.Name("tensor"), m.Name("ones"))),
                                          args=[m.Arg(m.OneOf(m.List([m.Element(m.Float("0.5"))]), m.Integer("1"))),
                                                m.Arg(keyword=m.Name("dtype")), DEVICE])):
            self.edited("half")
            args = list(updated_node.args[:2])
            args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            return updated_node.with_changes(args=args)
        return updated_node

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        done = super().leave_FunctionDef(original_node, updated_node)
        if done is original_node or original_node.name.value not in self.FUNCTIONS:
            return done
        # with the whole chain on the host, `device = sample.device` may have no reader left (ruff F841)
        readers = _DeviceReaders()
        done.visit(readers)
        return done if readers.count else done.visit(_DropDevice())

    def leave_SimpleStatementLine(self, original_node, updated_node):
        if not self.inside_target():
            return updated_node
        line = m.SimpleStatementLine
        if m.matches(updated_node, line([m.Expr(m.Call(func=m.Attribute(m.Name("rks"), m.Name("append")),
                                                         args=[m.Arg(m.OneOf(m.Float("1.0"), m.Call()))]))])):
            self.edited("rks_one")
            return updated_node.with_changes(body=[_stmt("rks.append(torch.ones_like(h))")])
        if m.matches(updated_node, line([m.Assign([m.AssignTarget(m.Name("rks"))],
                                                  m.Call(func=m.Attribute(m.Name("torch"), m.Name("tensor"))))])):
            self.edited("rks_stack")
            return updated_node.with_changes(body=[_stmt("rks = torch.stack(rks)")])
        if m.matches(updated_node, line([m.Assign([m.AssignTarget(m.Name("b"))],
                                                  m.OneOf(m.Call(func=m.Attribute(m.Name("torch"), m.Name("tensor"))),
                                                          m.IfExp()))])):
            self.edited("b_stack")
            return updated_node.with_changes(body=[_stmt("b = torch.stack(b)")])
        return updated_node


# --- examples (tests/test_fix_examples.py): the corrector update as 0.37.1 and 0.38.0 have it ------------------------

C_UPDATE_0371 = """
class S:
    def multistep_uni_c_bh_update(self, this_model_output, *args, last_sample=None, this_sample=None, order=None):
        sigma_t, sigma_s0 = self.sigmas[self.step_index], self.sigmas[self.step_index - 1]
        device = this_sample.device
        rks.append(1.0)
        rks = torch.tensor(rks, device=device)
        b = torch.tensor(b, device=device)
        if order == 1:
            rhos_c = torch.tensor([0.5], dtype=x.dtype, device=device)
        else:
            rhos_c = torch.linalg.solve(R, b).to(device).to(x.dtype)
        corr_res = torch.einsum("k,bkc...->bc...", rhos_c[:-1], D1s)
        return x_t
"""
C_UPDATE_0371_HOST = """
class S:
    def multistep_uni_c_bh_update(self, this_model_output, *args, last_sample=None, this_sample=None, order=None):
        sigma_t, sigma_s0 = self.sigmas[self.step_index], self.sigmas[self.step_index - 1]
        rks.append(torch.ones_like(h))
        rks = torch.stack(rks)
        b = torch.stack(b)
        if order == 1:
            rhos_c = torch.tensor([0.5], dtype=x.dtype)
        else:
            rhos_c = torch.linalg.solve(R, b).to(x.dtype)
        corr_res = sum(rho * D1s[:, k] for k, rho in enumerate(rhos_c[:-1].tolist()))
        return x_t
"""
C_UPDATE_0380 = """
class S:
    def multistep_uni_c_bh_update(self, this_model_output, *args, last_sample=None, this_sample=None, order=None):
        device = this_sample.device
        sigma_t, sigma_s0 = self.sigmas[self.step_index].to(device), self.sigmas[self.step_index - 1].to(device)
        rks.append(torch.ones((), device=device))
        rks = torch.stack(rks)
        b = torch.stack(b) if len(b) > 0 else torch.tensor(b, device=device)
        if order == 1:
            rhos_c = torch.ones(1, dtype=x.dtype, device=device) * 0.5
        else:
            rhos_c = torch.linalg.solve(R, b).to(device).to(x.dtype)
        corr_res = torch.einsum("k,bkc...->bc...", rhos_c[:-1], D1s)
        return x_t
"""
C_UPDATE_0380_HOST = """
class S:
    def multistep_uni_c_bh_update(self, this_model_output, *args, last_sample=None, this_sample=None, order=None):
        sigma_t, sigma_s0 = self.sigmas[self.step_index], self.sigmas[self.step_index - 1]
        rks.append(torch.ones_like(h))
        rks = torch.stack(rks)
        b = torch.stack(b)
        if order == 1:
            rhos_c = torch.ones(1, dtype=x.dtype) * 0.5
        else:
            rhos_c = torch.linalg.solve(R, b).to(x.dtype)
        corr_res = sum(rho * D1s[:, k] for k, rho in enumerate(rhos_c[:-1].tolist()))
        return x_t
"""
EXAMPLES = (
    Example("rewritten_0371_shape", C_UPDATE_0371, C_UPDATE_0371_HOST),
    Example("rewritten_0380_shape", C_UPDATE_0380, C_UPDATE_0380_HOST),
    Example("no_op_when_fixed", C_UPDATE_0371_HOST),
    Example("warns_without_the_einsum",
            C_UPDATE_0371.replace('torch.einsum("k,bkc...->bc...", rhos_c[:-1], D1s)', "apply(rhos_c, D1s)"),
            warning="`multistep_uni_c_bh_update` does not have the expected shape (missing edits: einsum; unexpected: "
                    "none); left unchanged."),
)


FIX = Fix(
    name="unipc_host_coeffs",
    description="UniPC keeps its coefficient chain on the host: no host-device sync per step (0.37.1 and 0.38+).",
    upstream=Upstream(refs=("#13450 (open, alternative)", "vllm-omni #5971"),
                      note="found by the lab: 0.38's #13356/#13489 moves the UniPC syncs, this removes them",
                      overlaps=(
        Overlap("#13450", "open",
                "aligns the sigmas' device the other way (to the device): a conflicting alternative"),
        Overlap("#13489", "merged",
                "the shape this diff rewrites (each sigma moved to the sample's device)"),
    )),
    rewrites=(unipc_rewrite(HostCoefficients),),
    # The rhos are applied as a sum of Python-number multiples instead of an einsum in the sample's dtype: the
    # rounding can differ in the last bits.
    tolerance=1e-5,
    conflicts=("unipc_stack",),
    examples=EXAMPLES,
)
