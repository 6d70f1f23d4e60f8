"""First-block cache: decide whether to skip from the previous call's comparison, which the host never waits for.

`FBCHeadBlockHook._should_compute_remaining_blocks` compares the first block's residual with the one of the last
fully computed call and reads the ratio on the host (`.item()`) to decide whether the other blocks run: a sync in
every transformer call after the first, the host waiting for the first block before it can launch the rest (+3
syncs per 4-step call on FLUX.1, +6 on Wan and Qwen-Image with CFG: the settings census, H100). The decision is the cache's purpose and must be made on the host.

Only a change to what the cache does removes the wait: this rewrite still computes each call's ratio on the device,
but copies it to the host without waiting (pinned memory and an event on CUDA), and decides from the previous call's
ratio, whose copy finished long before (the device has run the rest of that call since). So it skips one call later
than upstream, and may skip a call upstream computes or compute one upstream skips: **the outputs differ from the
cache's own**, which is why `all` leaves this fix out (`changes_outputs`) and an A/B of it times it with the
difference reported instead of refusing it. The first two calls of each context compute (upstream's second may
skip: no ratio is on the host yet); a context's state starts afresh with every pipeline call, so two calls of one arm
agree. If the device has not
reached the previous call's comparison yet, the read waits for it (an event wait: rare, and the decision is the same).
Found by the lab in the settings users run; not upstream. Measured at true size (FLUX.1, H200): equivalent within
±1 % where the cache computes every call, and 1.59x slower at a threshold of 1.0, where its first skip comes one call
later (upstream computed 1 call of 4, the lag 2): a negative finding, in results/FINDINGS.md. Compiled at a
threshold of 0.2 (H100): 1.020x faster on Qwen-Image at 8 blocks, equivalent within ±1 % on FLUX.1; eager on
Qwen-Image, undecided in three runs of 40 blocks.
"""

import libcst as cst
import libcst.matchers as m

from lab.apply import EVERY, Fix, FunctionRewrite, Rewrite, Upstream, parse_method, with_method_before

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


FIX = Fix(
    name="first_block_cache_lagged",
    description="The first-block cache decides from the previous call's residual ratio, copied to the host without a "
                "wait, instead of reading the current one in every transformer call (changes what the cache skips).",
    upstream=Upstream(refs=(), since=None, note="found by the lab; every transformer call still reads in 0.42.1",
                      overlaps=()),
    pipelines=EVERY,
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
)
