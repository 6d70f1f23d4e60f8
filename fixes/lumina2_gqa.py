"""Lumina 2: grouped-query attention read as it is, instead of keys and values copied out to the query's heads.

`Lumina2AttnProcessor2_0` repeats its keys and values to the query's heads before the attention
(`key.unsqueeze(3).repeat(1, 1, 1, n_rep, 1).flatten(2, 3)`, the same for the values, and even where `n_rep` is 1):
two copies of every key and value, `n_rep` times their size, in every attention of every step. PyTorch's attention
reads grouped heads itself (`enable_gqa=True`, torch 2.5 and later): the rewrite passes the keys and values as they
are. The same attention over the same keys: another kernel or path may round differently, so the outputs are
numerically equivalent rather than bit-identical (`lab.verdicts.numerics`), and whether it is faster depends on the
backend that takes grouped heads with a mask on the GPU (the A/B measures it). Found by `lab census`
(`lab.measure.waste`: grouped-query attention expanded by copies); still in 0.42.1.
"""

import libcst as cst
import libcst.matchers as m

from lab.apply import Example, Fix, FunctionRewrite, Overlap, Rewrite, Upstream

# `if n_rep >= 1: key = ...repeat(...); value = ...repeat(...)`
REPEAT = m.If(test=m.Comparison(left=m.Name("n_rep")))
SDPA = m.Call(func=m.Attribute(m.Name("F"), m.Name("scaled_dot_product_attention")))
GQA = cst.Arg(keyword=cst.Name("enable_gqa"), value=cst.parse_expression("n_rep > 1"),
              equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                    whitespace_after=cst.SimpleWhitespace("")))


class GroupedHeads(FunctionRewrite):
    DESCRIPTION = "let Lumina 2's attention read grouped keys and values as they are"
    FUNCTIONS = frozenset({"__call__"})
    EDITS = frozenset({"no_repeat", "enable_gqa"})

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return node.name.value == "Lumina2AttnProcessor2_0"

    def already_fixed(self, node: cst.FunctionDef) -> bool:
        return bool(m.findall(node, m.Arg(keyword=m.Name("enable_gqa"))))

    def leave_If(self, original_node: cst.If, updated_node: cst.If):
        if self.inside_target() and m.matches(original_node, REPEAT):
            self.edited("no_repeat")
            return cst.RemoveFromParent()
        return updated_node

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        if self.inside_target() and m.matches(updated_node, SDPA):
            self.edited("enable_gqa")
            *args, last = updated_node.args  # the new argument takes the last one's place before the `)`
            comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
            last_now = last.with_changes(comma=comma, whitespace_after_arg=cst.SimpleWhitespace(""))
            return updated_node.with_changes(args=[*args, last_now,
                                                   GQA.with_changes(whitespace_after_arg=last.whitespace_after_arg)])
        return updated_node


# --- examples (tests/test_fix_examples.py) ---------------------------------------------------------------------------

LUMINA = """
class Lumina2AttnProcessor2_0:
    def __call__(self, attn, hidden_states):
        # perform Grouped-qurey Attention (GQA)
        n_rep = attn.heads // kv_heads
        if n_rep >= 1:
            key = key.unsqueeze(3).repeat(1, 1, 1, n_rep, 1).flatten(2, 3)
            value = value.unsqueeze(3).repeat(1, 1, 1, n_rep, 1).flatten(2, 3)

        hidden_states = F.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, scale=softmax_scale
        )
        return hidden_states
"""
LUMINA_FIXED = """
class Lumina2AttnProcessor2_0:
    def __call__(self, attn, hidden_states):
        # perform Grouped-qurey Attention (GQA)
        n_rep = attn.heads // kv_heads

        hidden_states = F.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, scale=softmax_scale, enable_gqa=n_rep > 1
        )
        return hidden_states
"""
EXAMPLES = (
    Example("rewritten", LUMINA, LUMINA_FIXED),
    Example("no_op_when_fixed", LUMINA_FIXED),
    Example("warns_when_the_keys_are_not_repeated", LUMINA.replace("        if n_rep >= 1:\n", "        if expand:\n"),
            warning="`__call__` does not have the expected shape (missing edits: no_repeat; unexpected: none); left "
                    "unchanged."),
)


FIX = Fix(
    name="lumina2_gqa",
    description="Lumina 2: grouped-query attention with `enable_gqa=True` instead of keys and values repeated to the "
                "query's heads in every attention call.",
    upstream=Upstream(refs=(), note="found by lab census; not upstream (still in 0.42.1)", overlaps=(
        Overlap("#14523", "merged",
                "went the other way for Krea 2: `enable_gqa` with an `attn_mask` fell back to PyTorch's math attention "
                "there (issue #14518), with more memory; Lumina 2 passes a mask too, so the backend must be checked "
                "where it runs (results/FINDINGS.md: which backend took the calls in both arms)"),
    )),
    rewrites=(
        Rewrite(module="diffusers.models.transformers.transformer_lumina2",
                targets=("Lumina2AttnProcessor2_0.__call__",), codemod=GroupedHeads, pipelines=("lumina2",)),
    ),
    examples=EXAMPLES,
)
