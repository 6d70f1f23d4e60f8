"""Lumina 2: each caption's length read to the host once per mask, not in every transformer forward.

`Lumina2RotaryPosEmbed.forward` lays out its position ids from the captions' lengths, which it reads with
`attention_mask.sum(dim=1).tolist()`: a host-device sync in every transformer call, most of what remains of Lumina
2's loop once `lumina2_rope_device` and `begin_index` are in. The lengths are host
integers by nature (they shape the sequences), but the pipeline passes the same two masks, the prompt's and the
negative prompt's, in every step. The rewrite reads each mask's lengths once and keeps them on the module for the
mask objects they were read for while their version counters are unchanged (the last four masks); a new or modified
mask is read afresh; an inference-mode tensor (no version counter) is read every time. Under `torch.compile` (Lumina 2
names no repeated blocks, so its whole transformer is compiled) the helper runs outside the graph
(`torch.compiler.disable`: `.tolist()` breaks the graph there anyway), so the lengths are kept there too. The same
lengths, so the same outputs. Found by `lab census`; still in diffusers 0.42.1.
"""

import libcst as cst
import libcst.matchers as m

from lab.apply import Example, Fix, FunctionRewrite, Rewrite, Upstream, as_method, parse_method, with_method_before

EMBED = "Lumina2RotaryPosEmbed"
# `attention_mask.sum(dim=1).tolist()`
READ = m.Call(func=m.Attribute(value=m.Call(func=m.Attribute(m.Name("attention_mask"), m.Name("sum"))),
                               attr=m.Name("tolist")), args=[])
HELPER = parse_method('''
@torch.compiler.disable
def _caption_lengths(self, attention_mask: torch.Tensor) -> list[int]:
    """Each sample's caption length, read to the host once per mask instead of in every forward.

    `.tolist()` of a device tensor is a host-device sync, and the pipeline passes the same masks (the prompt's and
    the negative prompt's) in every step. The lengths are kept for the last few mask objects they were read for,
    while each mask's version counter is unchanged. Under torch.compile it runs outside the graph, as the `.tolist()`
    it replaces did (a data-dependent read breaks the graph), so the lengths are kept there too.
    """
    if attention_mask.is_inference():
        return attention_mask.sum(dim=1).tolist()
    cache = self.__dict__.setdefault("_caption_lengths_by_mask", {})
    entry = cache.get(id(attention_mask))
    if entry is None or entry[0] is not attention_mask or entry[1] != attention_mask._version:
        entry = (attention_mask, attention_mask._version, attention_mask.sum(dim=1).tolist())
        cache.pop(id(attention_mask), None)
        cache[id(attention_mask)] = entry
        while len(cache) > 4:
            cache.pop(next(iter(cache)))
    return list(entry[2])
''')


class CaptionLengthsOnce(FunctionRewrite):
    DESCRIPTION = "Lumina2RotaryPosEmbed.forward reads the caption lengths once per mask"
    FUNCTIONS = frozenset({"forward"})
    EDITS = frozenset({"lengths"})

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return node.name.value == EMBED

    def already_fixed(self, node: cst.FunctionDef) -> bool:
        return bool(m.findall(node, m.Call(func=m.Attribute(m.Name("self"), m.Name("_caption_lengths")))))

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if self.inside_target() and m.matches(original_node, READ):
            self.edited("lengths")
            return cst.parse_expression("self._caption_lengths(attention_mask)")
        return updated_node

    def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        if original_node.name.value != EMBED or updated_node.deep_equals(original_node):
            return updated_node
        return with_method_before(updated_node, HELPER, "forward")


# --- examples (tests/test_fix_examples.py) ---------------------------------------------------------------------------

LUMINA_FORWARD = """
class Lumina2RotaryPosEmbed(nn.Module):
    def _get_freqs_cis(self, ids: torch.Tensor) -> torch.Tensor:
        return ids

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor):
        encoder_seq_len = attention_mask.shape[1]
        l_effective_cap_len = attention_mask.sum(dim=1).tolist()
        seq_lengths = [cap_seq_len + image_seq_len for cap_seq_len in l_effective_cap_len]


class Other:
    def forward(self, attention_mask):
        return attention_mask.sum(dim=1).tolist()
"""
EXAMPLES = (
    # the other class's forward is left alone
    Example("read_once_per_mask", LUMINA_FORWARD,
            LUMINA_FORWARD.replace("    def forward(self, hidden_states",
                                   as_method(HELPER) + "\n    def forward(self, hidden_states", 1)
            .replace("l_effective_cap_len = attention_mask.sum(dim=1).tolist()",
                     "l_effective_cap_len = self._caption_lengths(attention_mask)")),
    Example("no_op_when_already_read_once",
            LUMINA_FORWARD.replace("attention_mask.sum(dim=1).tolist()\n        seq",
                                   "self._caption_lengths(attention_mask)\n        seq")),
)


FIX = Fix(
    name="lumina2_caption_lengths_once",
    description="Lumina 2 rope reads its caption lengths (.tolist() of the mask) once per mask, not in every "
                "transformer forward.",
    upstream=Upstream(refs=(), note="found by lab census; not upstream (still in 0.42.1)", overlaps=()),
    rewrites=(
        Rewrite(
            module="diffusers.models.transformers.transformer_lumina2",
            targets=(f"{EMBED}.forward",),
            codemod=CaptionLengthsOnce,
            pipelines=("lumina2",),
        ),
    ),
    exercised_by=(f"{EMBED}._caption_lengths",),
    examples=EXAMPLES,
)
