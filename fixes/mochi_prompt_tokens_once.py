"""Mochi: each sample's valid prompt tokens found once per mask, not in every attention call.

`MochiAttnProcessor2_0.__call__` keeps only the prompt tokens that the attention mask marks valid, and finds them
with `torch.nonzero(mask)` per sample: a host-device sync (the result's length is read) per sample in every attention
layer of every transformer forward (with CFG two samples per forward, times the layers and the steps). The
pipeline passes one mask for the whole call, so the answer never changes within it. The rewrite finds the indices
once and keeps them, class-wide (every layer's processor shares them), for the mask object they were found for while
its version counter is unchanged; a new or modified mask is looked at afresh. Under `torch.compile` the helper runs
outside the graph (`torch.compiler.disable`: `torch.nonzero`'s data-dependent shape breaks the graph there anyway), so
the indices are kept there too; an inference-mode tensor, which has no version counter, is looked at every time. The
same indices, so the same outputs. Found by `lab census`; still in diffusers 0.42.1.
"""

import libcst as cst
import libcst.matchers as m

from lab.apply import (Example, Fix, FunctionRewrite, Rewrite, Upstream, as_method, parse_method, with_attribute_first,
                       with_method_before)

PROCESSOR = "MochiAttnProcessor2_0"
# `for idx in range(batch_size):`
LOOP = m.For(target=m.Name("idx"), iter=m.Call(func=m.Name("range"), args=[m.Arg(m.Name("batch_size"))]))
# `mask = attention_mask[idx][None, :]`
MASK = m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(m.Name("mask"))],
                                            value=m.Subscript(value=m.Subscript(value=m.Name("attention_mask"))))])
# `valid_prompt_token_indices = torch.nonzero(mask.flatten(), as_tuple=False).flatten()`
NONZERO = m.SimpleStatementLine(body=[m.Assign(
    targets=[m.AssignTarget(m.Name("valid_prompt_token_indices"))],
    value=m.Call(func=m.Attribute(value=m.Call(func=m.Attribute(m.Name("torch"), m.Name("nonzero")))))),
])
FIND = cst.parse_statement("valid_prompt_tokens = self._valid_prompt_tokens(attention_mask)\n")
LOOKUP = cst.parse_statement("valid_prompt_token_indices = valid_prompt_tokens[idx]\n")
LAST = cst.parse_statement(
    "_last_valid_prompt_tokens = None  # (mask, its version, indices per sample): shared by every layer's processor\n")
HELPER = parse_method('''
@torch.compiler.disable
def _valid_prompt_tokens(self, attention_mask: torch.Tensor) -> list[torch.Tensor]:
    """The indices of each sample's valid prompt tokens, found once per mask instead of in every attention call.

    `torch.nonzero` waits for the device (a host-device sync per sample), and the pipeline passes the same mask to
    every attention layer in every step. The indices are kept, class-wide, for the mask object they were found for
    while its version counter is unchanged. Under torch.compile it runs outside the graph, as the `torch.nonzero` it
    replaces did (its data-dependent shape breaks the graph), so the indices are kept there too.
    """

    def find() -> list[torch.Tensor]:
        return [torch.nonzero(mask.flatten(), as_tuple=False).flatten() for mask in attention_mask]

    if attention_mask.is_inference():
        return find()
    last = MochiAttnProcessor2_0._last_valid_prompt_tokens
    if last is not None and last[0] is attention_mask and last[1] == attention_mask._version:
        return last[2]
    indices = find()
    MochiAttnProcessor2_0._last_valid_prompt_tokens = (attention_mask, attention_mask._version, indices)
    return indices
''')


class PromptTokensOnce(FunctionRewrite):
    DESCRIPTION = "MochiAttnProcessor2_0 takes each sample's valid prompt tokens from indices found once per mask"
    FUNCTIONS = frozenset({"__call__"})
    EDITS = frozenset({"find", "mask", "lookup"})

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return node.name.value == PROCESSOR

    def already_fixed(self, node: cst.FunctionDef) -> bool:
        return bool(m.findall(node, m.Call(func=m.Attribute(m.Name("self"), m.Name("_valid_prompt_tokens")))))

    def leave_For(self, original_node: cst.For, updated_node: cst.For) -> cst.For:
        if not (self.inside_target() and m.matches(original_node, LOOP)):
            return updated_node
        body = []
        for stmt in updated_node.body.body:
            if m.matches(stmt, MASK):
                self.edited("mask")
                continue
            if m.matches(stmt, NONZERO):
                self.edited("lookup")
                stmt = LOOKUP.with_changes(leading_lines=stmt.leading_lines)
            body.append(stmt)
        return updated_node.with_changes(body=updated_node.body.with_changes(body=body))

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock):
        # the indices are found before the per-sample loop, in the block that holds it
        if not self.inside_target():
            return updated_node
        body = list(updated_node.body)
        at = next((k for k, s in enumerate(original_node.body) if m.matches(s, LOOP)), None)
        if at is None:
            return updated_node
        self.edited("find")
        body.insert(at, FIND.with_changes(leading_lines=body[at].leading_lines))
        body[at + 1] = body[at + 1].with_changes(leading_lines=[])
        return updated_node.with_changes(body=body)

    def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        if original_node.name.value != PROCESSOR or updated_node.deep_equals(original_node):
            return updated_node
        return with_attribute_first(with_method_before(updated_node, HELPER, "__call__"), LAST)


# --- examples (tests/test_fix_examples.py) ---------------------------------------------------------------------------

MOCHI = '''
class MochiAttnProcessor2_0:
    """Attention processor used in Mochi."""

    def __init__(self):
        pass

    def __call__(self, attn, hidden_states, encoder_hidden_states, attention_mask, image_rotary_emb=None):
        batch_size, heads, _, dim = query.shape
        attn_outputs = []
        for idx in range(batch_size):
            mask = attention_mask[idx][None, :]
            valid_prompt_token_indices = torch.nonzero(mask.flatten(), as_tuple=False).flatten()

            valid_encoder_query = encoder_query[idx : idx + 1, :, valid_prompt_token_indices, :]
        return attn_outputs


class AttnProcessor:
    def __call__(self, attn, hidden_states):
        for idx in range(batch_size):
            mask = attention_mask[idx][None, :]
            valid_prompt_token_indices = torch.nonzero(mask.flatten(), as_tuple=False).flatten()
'''
# the other processor's loop is left alone
MOCHI_FIXED = MOCHI.replace(
    '    """Attention processor used in Mochi."""\n\n    def __init__(self):\n        pass\n',
    '    """Attention processor used in Mochi."""\n\n'
    "    _last_valid_prompt_tokens = None  # (mask, its version, indices per sample): shared by every layer's "
    "processor\n\n    def __init__(self):\n        pass\n\n" + as_method(HELPER), 1,
).replace(
    "        attn_outputs = []\n        for idx in range(batch_size):\n"
    "            mask = attention_mask[idx][None, :]\n"
    "            valid_prompt_token_indices = torch.nonzero(mask.flatten(), as_tuple=False).flatten()\n",
    "        attn_outputs = []\n        valid_prompt_tokens = self._valid_prompt_tokens(attention_mask)\n"
    "        for idx in range(batch_size):\n            valid_prompt_token_indices = valid_prompt_tokens[idx]\n", 1,
)
EXAMPLES = (
    Example("found_once_per_mask", MOCHI, MOCHI_FIXED),
    Example("no_op_when_already_found_once", MOCHI_FIXED),
)


FIX = Fix(
    name="mochi_prompt_tokens_once",
    description="Mochi attention finds each sample's valid prompt tokens once per mask (a nonzero per sample), not "
                "in every attention call of every step.",
    upstream=Upstream(refs=(), note="found by lab census; not upstream (still in 0.42.1)", overlaps=()),
    rewrites=(
        Rewrite(
            module="diffusers.models.attention_processor",
            targets=(f"{PROCESSOR}.__call__",),
            codemod=PromptTokensOnce,
            pipelines=("mochi",),
        ),
    ),
    exercised_by=(f"{PROCESSOR}._valid_prompt_tokens",),
    examples=EXAMPLES,
)
