"""First-block cache: decide whether to skip from the previous call's comparison, which the host never waits for.

`FBCHeadBlockHook._should_compute_remaining_blocks` compares the first block's residual with the one of the last
fully computed call and reads the ratio on the host (`.item()`) to decide whether the other blocks run: a sync in
every transformer call after the first, the host waiting for the first block before it can launch the rest. The
decision is the cache's purpose and must be made on the host.

Only a change to what the cache does removes the wait: this rewrite still computes each call's ratio on the device,
but copies it to the host without waiting (pinned memory and an event on CUDA), and decides from the previous call's
ratio, whose copy finished long before (the device has run the rest of that call since). So it skips one call later
than upstream, and may skip a call upstream computes or compute one upstream skips: **the outputs differ from the
cache's own**, which is why `all` leaves this fix out (`changes_outputs`) and an A/B of it times it with the
difference reported instead of refusing it. The first two calls of each context compute (upstream's second may
skip: no ratio is on the host yet); a context's state starts afresh with every pipeline call, so two calls of one arm
agree. If the device has not reached the previous call's comparison yet, the read waits for it (an event wait:
rare, and the decision is the same). What it costs: where a skip comes one call later, that call is computed, which
can cost more than the wait saves (results/FINDINGS.md has the A/Bs, a slowdown among them); it applies only with the
first-block cache on, and is compared alone. Found by the lab in the settings users run; not upstream.
"""

import libcst as cst
import libcst.matchers as m

from lab.apply import (EVERY, Example, Fix, FunctionRewrite, Rewrite, Upstream, as_method, parse_method,
                       with_method_before)

HOOK = "FBCHeadBlockHook"
DECIDE = "_should_compute_remaining_blocks"

# `diff = (absmean / prev_hidden_states_absmean).item()`
READ = m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(m.Name("diff"))], value=m.Call(
    func=m.Attribute(attr=m.Name("item"))))])
# `return diff > self.threshold`
RETURN = m.SimpleStatementLine(body=[m.Return(m.Comparison(left=m.Name("diff")))])
LAGGED = cst.parse_module('''
ratio = absmean / prev_hidden_states_absmean
# decide from the previous call's ratio, copied to the host without a wait; this call's goes there for the next
previous, shared_state.pending_ratio = getattr(shared_state, "pending_ratio", None), self._ratio_to_host(ratio)
if previous is None:
    return True
return previous() > self.threshold
''').body
HELPER = parse_method('''
@staticmethod
def _ratio_to_host(ratio: torch.Tensor):
    """A reader of `ratio` (a 0-d tensor) that the host can call later without a sync: on CUDA the value is
    copied to pinned host memory without a wait, and the reader waits only if the device is not there yet."""
    if ratio.device.type != "cuda":
        return ratio.detach().to("cpu").item
    host = torch.empty((), dtype=ratio.dtype, pin_memory=True)
    host.copy_(ratio, non_blocking=True)
    copied = torch.cuda.Event()
    copied.record()

    def read() -> float:
        if not copied.query():
            copied.synchronize()
        return host.item()

    return read
''')


class LaggedDecision(FunctionRewrite):
    DESCRIPTION = "FBCHeadBlockHook decides from the previous call's ratio, copied to the host without a wait"
    FUNCTIONS = frozenset({DECIDE})
    EDITS = frozenset({"read", "return"})

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return node.name.value == HOOK

    def already_fixed(self, node: cst.FunctionDef) -> bool:
        return bool(m.findall(node, m.Attribute(m.Name("self"), m.Name("_ratio_to_host"))))

    def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine,
                                  updated_node: cst.SimpleStatementLine) -> cst.BaseStatement:
        if not self.inside_target():
            return updated_node
        if m.matches(updated_node, READ):
            self.edited("read")
            return cst.FlattenSentinel(LAGGED)
        if m.matches(updated_node, RETURN):
            self.edited("return")
            return cst.RemovalSentinel.REMOVE
        return updated_node

    def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        if original_node.name.value != HOOK or updated_node.deep_equals(original_node):
            return updated_node
        return with_method_before(updated_node, HELPER, DECIDE)


# --- examples (tests/test_fix_examples.py) ---------------------------------------------------------------------------

FBC = """
class FBCHeadBlockHook(ModelHook):
    def reset_state(self, module):
        self.state_manager.reset()
        return module

    @torch.compiler.disable
    def _should_compute_remaining_blocks(self, hidden_states_residual: torch.Tensor) -> bool:
        shared_state = self.state_manager.get_state()
        if shared_state.head_block_residual is None:
            return True
        prev_hidden_states_residual = shared_state.head_block_residual
        absmean = (hidden_states_residual - prev_hidden_states_residual).abs().mean()
        prev_hidden_states_absmean = prev_hidden_states_residual.abs().mean()
        diff = (absmean / prev_hidden_states_absmean).item()
        return diff > self.threshold


class FBCBlockHook(ModelHook):
    def _should_compute_remaining_blocks(self, x):
        diff = x.item()
        return diff > self.threshold
"""
# the other class's method of the same name is left alone
FBC_FIXED = """
class FBCHeadBlockHook(ModelHook):
    def reset_state(self, module):
        self.state_manager.reset()
        return module

""" + as_method(HELPER) + """
    @torch.compiler.disable
    def _should_compute_remaining_blocks(self, hidden_states_residual: torch.Tensor) -> bool:
        shared_state = self.state_manager.get_state()
        if shared_state.head_block_residual is None:
            return True
        prev_hidden_states_residual = shared_state.head_block_residual
        absmean = (hidden_states_residual - prev_hidden_states_residual).abs().mean()
        prev_hidden_states_absmean = prev_hidden_states_residual.abs().mean()
        ratio = absmean / prev_hidden_states_absmean
        # decide from the previous call's ratio, copied to the host without a wait; this call's goes there for the next
        previous, shared_state.pending_ratio = getattr(shared_state, "pending_ratio", None), self._ratio_to_host(ratio)
        if previous is None:
            return True
        return previous() > self.threshold


class FBCBlockHook(ModelHook):
    def _should_compute_remaining_blocks(self, x):
        diff = x.item()
        return diff > self.threshold
"""
EXAMPLES = (
    Example("rewritten", FBC, FBC_FIXED),
    Example("already_fixed_is_left_alone", FBC_FIXED),
    Example("another_read_is_left_unchanged_with_a_warning",
            FBC.replace("        diff = (absmean / prev_hidden_states_absmean).item()\n",
                        "        diff = float(absmean / prev_hidden_states_absmean)\n"),
            warning="`_should_compute_remaining_blocks` does not have the expected shape (missing edits: read; "
                    "unexpected: none); left unchanged."),
)


FIX = Fix(
    name="first_block_cache_lagged",
    description="The first-block cache decides from the previous call's residual ratio, copied to the host without a "
                "wait, instead of reading the current one in every transformer call (changes what the cache skips).",
    upstream=Upstream(refs=(), note="found by the lab; every transformer call still reads in 0.42.1",
                      overlaps=()),
    setting="first_block_cache",
    changes_outputs="it skips one transformer call later than the cache's own rule, so it may skip others",
    rewrites=(
        Rewrite(
            module="diffusers.hooks.first_block_cache",
            targets=(f"{HOOK}.{DECIDE}",),
            codemod=LaggedDecision,
            pipelines=EVERY,
        ),
    ),
    exercised_by=(f"{HOOK}.{DECIDE}",),
    examples=EXAMPLES,
    tried_on="flux",
)
