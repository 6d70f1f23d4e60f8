"""Lumina 2: copy the rope frequencies to the device once, instead of in every transformer forward.

`Lumina2RotaryPosEmbed` keeps `freqs_cis`, one table of complex frequencies per axis, as a plain list attribute (not
buffers), so `from_pretrained` + `.to(device)` leaves the tables on the host, and `_get_freqs_cis` copies each one to
the device with `self.freqs_cis[i].to(ids.device)`: three blocking host-to-device copies in every transformer call.
The copies are kept per device on the module (under `torch.compile` the call copies as before, so compiled graphs
keep no Python-side state), as `qwen_rope_device` does for Qwen-Image. Found by `lab census`; still in diffusers
0.42.1.
"""

import libcst as cst
import libcst.matchers as m

from lab.apply import Example, Fix, FunctionRewrite, Rewrite, Upstream, as_method, parse_method, with_method_before

# `self.freqs_cis[i].to(ids.device)`
COPY = m.Call(func=m.Attribute(value=m.Subscript(value=m.Attribute(m.Name("self"), m.Name("freqs_cis"))),
                               attr=m.Name("to")))
HELPER = parse_method('''
def _freqs_cis_on(self, i: int, device: torch.device) -> torch.Tensor:
    """Axis `i` of `freqs_cis` on `device`, copied there once per device instead of once per forward.

    `freqs_cis` is a plain list attribute, so the pipeline's `.to(device)` leaves it on the host and each copy is a
    blocking host-to-device transfer.
    """
    if torch.compiler.is_compiling():
        return self.freqs_cis[i].to(device)
    cache = self.__dict__.setdefault("_freqs_cis_by_device", {})
    key = torch.device(device)
    if key not in cache:
        cache[key] = [freqs.to(device) for freqs in self.freqs_cis]
    return cache[key][i]
''')


class CacheFreqsCis(FunctionRewrite):
    DESCRIPTION = "Lumina2RotaryPosEmbed._get_freqs_cis takes each axis from a per-device copy made once"
    FUNCTIONS = frozenset({"_get_freqs_cis"})
    EDITS = frozenset({"lookup"})

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return node.name.value == "Lumina2RotaryPosEmbed"

    def already_fixed(self, node: cst.FunctionDef) -> bool:
        return bool(m.findall(node, m.Call(func=m.Attribute(m.Name("self"), m.Name("_freqs_cis_on")))))

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if self.inside_target() and m.matches(original_node, COPY):
            self.edited("lookup")
            index = original_node.func.value.slice[0].slice.value
            device = original_node.args[0].value
            return cst.parse_expression("self._freqs_cis_on(i, d)").with_changes(
                args=[cst.Arg(index, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))), cst.Arg(device)])
        return updated_node

    def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        if original_node.name.value != "Lumina2RotaryPosEmbed" or updated_node.deep_equals(original_node):
            return updated_node
        return with_method_before(updated_node, HELPER, "_get_freqs_cis")


# --- examples (tests/test_fix_examples.py): the helper goes just before the method that asks it ----------------------

LUMINA = """
class Lumina2RotaryPosEmbed(nn.Module):
    def _get_freqs_cis(self, ids: torch.Tensor) -> torch.Tensor:
        result = []
        for i in range(len(self.axes_dim)):
            freqs = self.freqs_cis[i].to(ids.device)
            result.append(freqs)
        return result
"""
EXAMPLES = (
    Example("copied_once_per_device", LUMINA,
            LUMINA.replace("    def _get_freqs_cis", "\n" + as_method(HELPER) + "    def _get_freqs_cis")
            .replace("self.freqs_cis[i].to(ids.device)", "self._freqs_cis_on(i, ids.device)")),
    Example("no_op_when_already_cached",
            LUMINA.replace("self.freqs_cis[i].to(ids.device)", "self._freqs_cis_on(i, ids.device)")),
)


FIX = Fix(
    name="lumina2_rope_device",
    description="Lumina 2 rope copies its freqs_cis tables to the device once per device, not in every transformer "
                "forward.",
    upstream=Upstream(refs=(), note="found by lab census; not upstream (still in 0.42.1)", overlaps=()),
    rewrites=(
        Rewrite(
            module="diffusers.models.transformers.transformer_lumina2",
            targets=("Lumina2RotaryPosEmbed._get_freqs_cis",),
            codemod=CacheFreqsCis,
            pipelines=("lumina2",),
        ),
    ),
    exercised_by=("Lumina2RotaryPosEmbed._freqs_cis_on",),
    examples=EXAMPLES,
)
