"""Wan 2.2: which expert takes each step, decided once before the loop instead of by a sync in every step.

`WanPipeline.__call__` picks the high-noise or the low-noise transformer with `t >= boundary_timestep`, where `t`
is a timestep on the device: `if` reads the comparison on the host, a device-to-host sync at the top of every step
(Wan 2.1, without a boundary, never compares). The rewrite compares all the timesteps at once before the loop
(`(timesteps >= boundary_timestep).tolist()`, one sync) and the loop reads its step's answer from the list. The
same comparisons, so the same experts take the same steps. Found by `lab census`; still in diffusers 0.42.1.
"""

import libcst as cst
import libcst.matchers as m

from lab.apply import BLANK_LINE, Example, Fix, FunctionRewrite, Rewrite, Upstream

# `if self.config.boundary_ratio is not None: boundary_timestep = ... else: boundary_timestep = None`
BOUNDARY = m.If(test=m.Comparison(left=m.Attribute(value=m.Attribute(m.Name("self"), m.Name("config")),
                                                   attr=m.Name("boundary_ratio"))))
# `t >= boundary_timestep`
COMPARE = m.Comparison(left=m.Name("t"), comparisons=[m.ComparisonTarget(m.GreaterThanEqual(),
                                                                           m.Name("boundary_timestep"))])
ONCE = ("high_noise_steps = (timesteps >= boundary_timestep).tolist() if boundary_timestep is not None else None")
LOOKUP = cst.parse_expression("high_noise_steps[i]")


class BoundaryOnce(FunctionRewrite):
    DESCRIPTION = "compare the timesteps with Wan 2.2's boundary once before the loop"
    FUNCTIONS = frozenset({"__call__"})
    EDITS = frozenset({"once", "lookup"})

    def already_fixed(self, node: cst.FunctionDef) -> bool:
        return bool(m.findall(node, m.Name("high_noise_steps")))

    def leave_Comparison(self, original_node, updated_node):
        if self.inside_target() and m.matches(original_node, COMPARE):
            self.edited("lookup")
            return LOOKUP
        return updated_node

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        if original_node.name.value in self.FUNCTIONS:
            body = list(updated_node.body.body)
            anchor = next((i for i, s in enumerate(body) if m.matches(s, BOUNDARY)), None)
            if anchor is not None:
                body.insert(anchor + 1, cst.parse_statement(ONCE + "\n").with_changes(leading_lines=[BLANK_LINE]))
                updated_node = updated_node.with_changes(body=updated_node.body.with_changes(body=body))
                self.edited("once")
        return super().leave_FunctionDef(original_node, updated_node)


# --- examples (tests/test_fix_examples.py) ---------------------------------------------------------------------------

WAN22 = """
class WanPipeline:
    def __call__(self):
        self._num_timesteps = len(timesteps)

        if self.config.boundary_ratio is not None:
            boundary_timestep = self.config.boundary_ratio * self.scheduler.config.num_train_timesteps
        else:
            boundary_timestep = None

        with self.progress_bar(total=num_inference_steps) as progress_bar:
            for i, t in enumerate(timesteps):
                if boundary_timestep is None or t >= boundary_timestep:
                    current_model = self.transformer
"""
WAN22_FIXED = """
class WanPipeline:
    def __call__(self):
        self._num_timesteps = len(timesteps)

        if self.config.boundary_ratio is not None:
            boundary_timestep = self.config.boundary_ratio * self.scheduler.config.num_train_timesteps
        else:
            boundary_timestep = None

        high_noise_steps = (timesteps >= boundary_timestep).tolist() if boundary_timestep is not None else None

        with self.progress_bar(total=num_inference_steps) as progress_bar:
            for i, t in enumerate(timesteps):
                if boundary_timestep is None or high_noise_steps[i]:
                    current_model = self.transformer
"""
EXAMPLES = (
    Example("compared_once_before_the_loop", WAN22, WAN22_FIXED),
    Example("wan_2_1_shape_without_a_boundary_is_left_with_a_warning",
            WAN22.replace("boundary_timestep is None or t >= boundary_timestep", "True"),
            warning="`__call__` does not have the expected shape (missing edits: lookup; unexpected: none); left "
                    "unchanged."),
)


FIX = Fix(
    name="wan_boundary_once",
    description="Wan 2.2: the expert of each step chosen from one comparison of all timesteps before the loop instead "
                "of `t >= boundary_timestep` (a sync) in every step.",
    upstream=Upstream(refs=(), note="found by lab census; not upstream (still in 0.42.1)", overlaps=()),
    rewrites=(
        Rewrite(
            module="diffusers.pipelines.wan.pipeline_wan",
            targets=("WanPipeline.__call__",),
            codemod=BoundaryOnce,
            pipelines=("wan22",),
        ),
    ),
    exercised_by=("WanPipeline.__call__",),
    examples=EXAMPLES,
)
