"""FasterCache: the low-frequency mask made on the device of the states it splits, not on the host and copied.

Where FasterCache runs CFG as one batch (CogVideoX, Mochi), its denoiser hook splits the transformer's output into
low and high frequencies with `_split_low_high_freq`, at every step: the step that computes both branches splits
each, a step that approximates the unconditional branch splits the conditional one. The function builds its circular
mask from `torch.arange(height)` and `torch.arange(width)` on the host and moves it with `.to(x.device)`, a blocking
host-to-device copy (a sync) in every call, which `faster_cache_timestep_once` leaves. The rewrite makes the two
ranges on `x.device`, so the mask is computed there and the `.to` does nothing. Integer arithmetic gives the same mask
on any device, so the outputs are bit-identical. Found by `lab census` in the settings users run; still in 0.42.1.
"""

import libcst as cst
import libcst.matchers as m

from lab.apply import Example, Fix, FunctionRewrite, Rewrite, Upstream

# the scenarios that take FasterCache with CFG as one batch (`lab settings`): without CFG (FLUX.1, Kontext,
# HunyuanVideo) the hook approximates no unconditional branch and never splits
PIPELINES = ("cogvideox", "mochi")
FUNCTION = "_split_low_high_freq"
# `torch.arange(height)` / `torch.arange(width)`, with no device
RANGE = m.Call(func=m.Attribute(m.Name("torch"), m.Name("arange")),
               args=[m.Arg(m.Name("height") | m.Name("width"), keyword=None)])
ON_DEVICE = cst.Arg(cst.parse_expression("x.device"), keyword=cst.Name("device"),
                    equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))


class FrequencyMaskOnDevice(FunctionRewrite):
    DESCRIPTION = "make FasterCache's frequency mask on the device of the states it splits"
    FUNCTIONS = frozenset({FUNCTION})
    EDITS = frozenset({"height", "width"})

    def already_fixed(self, node: cst.FunctionDef) -> bool:
        return bool(m.findall(node, m.Call(func=m.Attribute(m.Name("torch"), m.Name("arange")),
                                           args=[m.ZeroOrMore(), m.Arg(keyword=m.Name("device")), m.ZeroOrMore()])))

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if self.inside_target() and m.matches(updated_node, RANGE):
            self.edited(updated_node.args[0].value.value)
            return updated_node.with_changes(args=[updated_node.args[0].with_changes(comma=cst.Comma(
                whitespace_after=cst.SimpleWhitespace(" "))), ON_DEVICE])
        return updated_node


# --- examples (tests/test_fix_examples.py): only in `_split_low_high_freq`, since another function's
# `torch.arange(height)` is not FasterCache's mask

SPLIT = """
def _split_low_high_freq(x):
    fft = torch.fft.fft2(x)
    fft_shifted = torch.fft.fftshift(fft)
    height, width = x.shape[-2:]
    radius = min(height, width) // 5

    y_grid, x_grid = torch.meshgrid(torch.arange(height), torch.arange(width))
    center_x, center_y = width // 2, height // 2
    mask = (x_grid - center_x) ** 2 + (y_grid - center_y) ** 2 <= radius**2

    low_freq_mask = mask.unsqueeze(0).unsqueeze(0).to(x.device)
    return low_freq_mask


def elsewhere(height):
    return torch.arange(height)
"""
SPLIT_FIXED = SPLIT.replace("torch.arange(height), torch.arange(width)",
                            "torch.arange(height, device=x.device), torch.arange(width, device=x.device)")
EXAMPLES = (
    Example("both_ranges_are_made_on_the_states_device", SPLIT, SPLIT_FIXED),
    Example("already_fixed_is_left_alone", SPLIT_FIXED),
    Example("a_mask_of_another_shape_leaves_the_module_unchanged",
            SPLIT.replace("torch.arange(width))", "torch.arange(width + 1))"),
            warning="`_split_low_high_freq` does not have the expected shape (missing edits: width; unexpected: none); "
                    "left unchanged."),
)


FIX = Fix(
    name="faster_cache_freq_mask_device",
    description="FasterCache's low/high-frequency split builds its mask on the device of the states it splits "
                "instead of on the host and copying it there in every call.",
    upstream=Upstream(refs=(), note="found by lab census in the settings users run; not upstream (still in 0.42.1)",
                      overlaps=()),
    rewrites=(
        Rewrite(
            module="diffusers.hooks.faster_cache",
            targets=(FUNCTION,),
            codemod=FrequencyMaskOnDevice,
            pipelines=PIPELINES,
        ),
    ),
    setting="faster_cache",
    examples=EXAMPLES,
)
