"""CogVideoX: the scheduler step gets its timestep as a host number, read once before the loop.

`CogVideoXDDIMScheduler.step` (and `CogVideoXDPMScheduler.step`) look the step's alphas up in `alphas_cumprod`, a
tensor kept on the host, with the timestep they are given, and test `prev_timestep >= 0`. The CogVideoX pipelines
pass `t`, the device tensor of their loop, so each lookup copies the index to the host and the test reads it: three
host-device syncs per step. `step` documents its timestep as an `int`. The rewrite
reads all the timesteps once before the loop (`timesteps.tolist()`, one sync, as Z-Image's `_precomputed_t_norms`
does upstream since 0.38.0) and passes the step's value; the DPM branch's look-back timestep and the dynamic-CFG
`t.item()` read the same list. The transformer still gets the device tensor. The alphas are the same host tensors
indexed by the same integers, so outputs are bit-identical. Found by `lab census`; still in diffusers 0.42.1.
"""

import libcst as cst
import libcst.matchers as m

from lab.apply import BLANK_LINE, Example, Fix, FunctionRewrite, Overlap, Rewrite, Upstream

STEP = m.Call(func=m.Attribute(m.Attribute(m.Name("self"), m.Name("scheduler")), m.Name("step")))
LOOP = m.For(target=m.Tuple(elements=[m.Element(m.Name("i")), m.Element(m.Name("t"))]),
             iter=m.Call(func=m.Name("enumerate"), args=[m.Arg(m.Name("timesteps"))]))
# `timesteps[i - 1]` (the DPM branch's look-back timestep)
BACK = m.Subscript(value=m.Name("timesteps"), slice=[m.SubscriptElement(m.Index(
    m.BinaryOperation(left=m.Name("i"), operator=m.Subtract(), right=m.Integer("1"))))])
ITEM = m.Call(func=m.Attribute(m.Name("t"), m.Name("item")), args=[])
CURRENT = m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(
    m.Attribute(m.Name("self"), m.Name("_current_timestep")))])])
READ = cst.parse_statement(
    "# the scheduler looks its alphas up in host tensors with the timestep: read the timesteps to the host once\n"
    "host_timesteps = timesteps.tolist()\n")
BIND = cst.parse_statement("t_host = host_timesteps[i]\n")


def _wrapped(call: cst.Call) -> cst.Call:
    """A one-line call with its arguments on a line of their own, as ruff formats a call too long for one line."""
    if any("\n" in cst.Module([]).code_for_node(a) for a in call.args) or not call.args:
        return call
    newline = cst.ParenthesizedWhitespace(first_line=cst.TrailingWhitespace(), indent=True,
                                          last_line=cst.SimpleWhitespace("    "))
    closing = cst.ParenthesizedWhitespace(first_line=cst.TrailingWhitespace(), indent=True,
                                          last_line=cst.SimpleWhitespace(""))
    args = list(call.args)
    args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT, whitespace_after_arg=closing)
    return call.with_changes(whitespace_before_args=newline, args=args)


class HostTimesteps(FunctionRewrite):
    DESCRIPTION = "the scheduler step gets the timestep as a host number read once before the loop, not the device `t`"
    FUNCTIONS = frozenset({"__call__"})
    EDITS = frozenset({"read", "bind", "step"})

    def __init__(self, context) -> None:
        super().__init__(context)
        self._in_step = 0

    def already_fixed(self, node: cst.FunctionDef) -> bool:
        return bool(m.findall(node, m.Name("host_timesteps")))

    def visit_Call(self, node: cst.Call) -> bool:
        if self.inside_target() and m.matches(node, STEP):
            self._in_step += 1
        return True

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if not self.inside_target():
            return updated_node
        if m.matches(original_node, ITEM):  # dynamic CFG's `t.item()`
            return cst.Name("t_host")
        if not m.matches(original_node, STEP):
            return updated_node
        self._in_step -= 1
        args = list(updated_node.args)
        for k, arg in enumerate(args):
            if arg.keyword is None and m.matches(arg.value, m.Name("t")):
                args[k] = arg.with_changes(value=cst.Name("t_host"))
                self.edited("step")
        return _wrapped(updated_node.with_changes(args=args))

    def leave_Subscript(self, original_node: cst.Subscript, updated_node: cst.Subscript) -> cst.BaseExpression:
        if self.inside_target() and self._in_step and m.matches(original_node, BACK):
            return updated_node.with_changes(value=cst.Name("host_timesteps"))
        return updated_node

    def leave_For(self, original_node: cst.For, updated_node: cst.For) -> cst.For:
        if not (self.inside_target() and m.matches(original_node, LOOP)):
            return updated_node
        # the step's host timestep, next to where the loop records the step's device one (else first in the loop)
        body = list(updated_node.body.body)
        at = next((k for k, s in enumerate(body) if m.matches(s, CURRENT)), 0)
        body.insert(at, BIND.with_changes(leading_lines=body[at].leading_lines))
        body[at + 1] = body[at + 1].with_changes(leading_lines=[])
        self.edited("bind")
        return updated_node.with_changes(body=updated_node.body.with_changes(body=body))

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        if original_node.name.value in self.FUNCTIONS and self._stack:
            # before the top-level statement that holds the denoising loop (`with self.progress_bar(...)`)
            body = list(updated_node.body.body)
            anchor = next((k for k, s in enumerate(body) if m.findall(s, LOOP)), None)
            if anchor is not None:
                body.insert(anchor, READ.with_changes(leading_lines=[BLANK_LINE, *READ.leading_lines]))
                updated_node = updated_node.with_changes(body=updated_node.body.with_changes(body=body))
                self.edited("read")
        return super().leave_FunctionDef(original_node, updated_node)


#: every pipeline whose loop passes its device `t` to a CogVideoX scheduler's `step` (0.37.1 and 0.42.1)
SITES = (
    ("cogvideo.pipeline_cogvideox", "CogVideoXPipeline", ("cogvideox",)),
    ("cogvideo.pipeline_cogvideox_image2video", "CogVideoXImageToVideoPipeline", ()),
    ("cogvideo.pipeline_cogvideox_video2video", "CogVideoXVideoToVideoPipeline", ()),
    ("cogvideo.pipeline_cogvideox_fun_control", "CogVideoXFunControlPipeline", ()),
    ("consisid.pipeline_consisid", "ConsisIDPipeline", ()),
    ("cogview3.pipeline_cogview3plus", "CogView3PlusPipeline", ()),
)

# --- examples (tests/test_fix_examples.py) ---------------------------------------------------------------------------

COGVIDEOX = """
class CogVideoXPipeline:
    def __call__(self):
        num_warmup_steps = max(len(timesteps) - num_inference_steps * self.scheduler.order, 0)

        with self.progress_bar(total=num_inference_steps) as progress_bar:
            old_pred_original_sample = None
            for i, t in enumerate(timesteps):
                if self.interrupt:
                    continue

                self._current_timestep = t
                timestep = t.expand(latent_model_input.shape[0])
                if use_dynamic_cfg:
                    self._guidance_scale = 1 + guidance_scale * (num_inference_steps - t.item())
                if not isinstance(self.scheduler, CogVideoXDPMScheduler):
                    latents = self.scheduler.step(noise_pred, t, latents, **extra_step_kwargs, return_dict=False)[0]
                else:
                    latents, old_pred_original_sample = self.scheduler.step(
                        noise_pred,
                        old_pred_original_sample,
                        t,
                        timesteps[i - 1] if i > 0 else None,
                        latents,
                    )
"""
# the transformer's `t` stays on the device
COGVIDEOX_FIXED = """
class CogVideoXPipeline:
    def __call__(self):
        num_warmup_steps = max(len(timesteps) - num_inference_steps * self.scheduler.order, 0)

        # the scheduler looks its alphas up in host tensors with the timestep: read the timesteps to the host once
        host_timesteps = timesteps.tolist()

        with self.progress_bar(total=num_inference_steps) as progress_bar:
            old_pred_original_sample = None
            for i, t in enumerate(timesteps):
                if self.interrupt:
                    continue

                t_host = host_timesteps[i]
                self._current_timestep = t
                timestep = t.expand(latent_model_input.shape[0])
                if use_dynamic_cfg:
                    self._guidance_scale = 1 + guidance_scale * (num_inference_steps - t_host)
                if not isinstance(self.scheduler, CogVideoXDPMScheduler):
                    latents = self.scheduler.step(
                        noise_pred, t_host, latents, **extra_step_kwargs, return_dict=False
                    )[0]
                else:
                    latents, old_pred_original_sample = self.scheduler.step(
                        noise_pred,
                        old_pred_original_sample,
                        t_host,
                        host_timesteps[i - 1] if i > 0 else None,
                        latents,
                    )
"""
EXAMPLES = (
    Example("the_step_gets_host_timesteps_read_once", COGVIDEOX, COGVIDEOX_FIXED),
    Example("no_op_when_already_on_the_host", COGVIDEOX_FIXED),
    Example("left_unchanged_when_the_step_does_not_take_t",
            COGVIDEOX.replace("step(noise_pred, t, latents", "step(noise_pred, s, latents").replace(
                "                        t,\n", "                        s,\n"),
            warning="`__call__` does not have the expected shape (missing edits: step; unexpected: none); left "
                    "unchanged."),
)


FIX = Fix(
    name="cogvideox_host_timestep",
    description="CogVideoX: the scheduler step gets the timestep as a host number (one .tolist() before the loop) "
                "instead of the device `t` it indexes host tables with (3 syncs per step).",
    upstream=Upstream(refs=(), note="found by lab census; not upstream (still in 0.42.1)", overlaps=(
        Overlap("#14589", "open",
                "removes the same per-step syncs (the scheduler indexing host tables with a device `t`) and more: "
                "Z-Image and Cosmos loops, and regional compilation for CogVideoX"),
        Overlap("#13125", "closed",
                "changed the CogVideoX schedulers' `step()`, not the pipelines: related, no conflict"),
    )),
    rewrites=tuple(
        Rewrite(module=f"diffusers.pipelines.{module}", targets=(f"{cls}.__call__",), codemod=HostTimesteps,
                pipelines=scenarios)
        for module, cls, scenarios in SITES
    ),
    exercised_by=tuple(f"{cls}.__call__" for _, cls, _ in SITES),
    examples=EXAMPLES,
)
