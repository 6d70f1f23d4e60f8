"""Shared by the offload fixes (a module starting with `_` is not a fix): pinned host memory in blocks and the
pinned copies of parameters kept across a fix's turns, the offload of accelerate's model hook by pointing parameters
back at host tensors, the options passed to accelerate's loads of sequential offload, and the rule of group
offloading's kept host tensors that a cast while offloaded replaces, with the group offloading source that the group
offload fixes' examples rewrite."""

from __future__ import annotations

import textwrap
import weakref

import libcst as cst
import libcst.matchers as m

from lab.apply import FunctionRewrite, Overlap, offloading_groups

# --- pinned host memory (model_offload_pinned, sequential_offload_pinned, group_offload_pinned) ----------

BLOCK = 1 << 30  # bytes of one pinned block
ALIGN = 512  # bytes: where each weight starts in a block
_blocks: list = []  # [pinned block, bytes used] of the block being filled


def pinned_bytes(nbytes: int):
    """A pinned uint8 buffer of `nbytes` (the tests give a plain one: a CPU build of torch has no pinned memory)."""
    import torch

    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)


def pinned_copy(tensor):
    """A pinned, contiguous copy of `tensor`, carved from a pinned block (its own buffer when larger). Blocks are large
    because the host allocator rounds each pinned request up to a power of two: one buffer per weight would waste up
    to half of it."""
    nbytes = tensor.numel() * tensor.element_size()
    if nbytes > BLOCK:
        buffer, start = pinned_bytes(nbytes), 0
    else:
        if not _blocks or _blocks[-1][1] + nbytes > BLOCK:
            _blocks.append([pinned_bytes(BLOCK), 0])
        buffer, start = _blocks[-1]
        _blocks[-1][1] = start + -(-nbytes // ALIGN) * ALIGN
    view = buffer[start:start + nbytes].view(tensor.dtype).view(tensor.shape)
    view.copy_(tensor)
    return view


#: id(parameter) -> (a weak reference to it, its pinned view, the pageable tensor and version it was copied from):
#: kept across a fix's turns, so that an A/B's many arm switches allocate nothing more (by id: a tensor's `==` is
#: elementwise, so tensors cannot key a `WeakKeyDictionary`)
_PINNED: dict = {}


def pinned_for(param):
    """The pinned copy of a plain, contiguous host parameter, kept across the fix's turns (model_offload_pinned,
    group_offload_pinned): the values copied into the pinned space it had, else into new space, where its tensor or
    version changed since, or its shape or dtype. None where the parameter is not a plain, contiguous host tensor."""
    import torch

    data = param.data
    if type(data) is not torch.Tensor or data.device.type != "cpu" or not data.is_contiguous():
        return None
    known = pinned_of(param)
    if known is not None and known[0].data_ptr() == data.data_ptr():
        return known[0]  # already pointed there
    if known is None or known[0].shape != data.shape or known[0].dtype != data.dtype:
        view = pinned_copy(data)
    else:
        view = known[0]
        if known[1].data_ptr() != data.data_ptr() or known[2] != param._version:
            view.copy_(data)  # the same pinned space, the values the other arm's offload copied back
    _PINNED[id(param)] = (weakref.ref(param), view, data, param._version)
    return view


def pinned_of(param):
    """(its pinned view, the pageable tensor and the version it was copied from), or None."""
    entry = _PINNED.get(id(param))
    return entry[1:] if entry is not None and entry[0]() is param else None


def release_pinned() -> None:
    """Let go of every pinned copy kept across the fixes' turns, and of the pinned blocks they were carved from (their
    memory back to the host: torch's host allocator caches freed pinned memory until emptied). Call it only once no
    parameter points at a copy (each fix gives the pageable tensors back on exit)."""
    from lab.base.host_memory import empty_host_cache

    _PINNED.clear()
    _blocks.clear()
    empty_host_cache()


def forget_the_gone() -> None:
    """Drop the copies of parameters that no longer exist (once per switch-on, not per parameter)."""
    for key in [k for k, e in _PINNED.items() if e[0]() is None]:
        del _PINNED[key]


# --- model CPU offload: offload by pointing back (model_offload_keep_host, model_offload_pinned) ----------------------

CHANGED = "CpuOffload offload: parameters changed on the device, copied back"


def offload_by_pointing_back(patcher, kept, exercised: str) -> None:
    """Patch `CpuOffload.init_hook` (the hook offloads its model: `UserCpuOffloadHook.offload`, when the next model
    in the sequence runs) to point the parameters of `kept[hook]` (parameter -> (host tensor, its storage and version
    right after the move)) back at their host tensors first; `detach_hook` to let them go (removing a hook leaves its
    model where it is, on the device); and `DiffusionPipeline.maybe_free_model_hooks` to offload each model through
    its hook before it enables the offload again (`patches/accelerate/model_offload_keep_host_diffusers.diff`), so
    that the last models of a call are pointed back too, not copied by its `self.to("cpu")`. A parameter changed on
    the device since the move (pointed elsewhere: a cast, `param.data = ...`; or written in place: its version moved)
    is left to the `.to("cpu")` that follows, which copies it back as upstream does. Counted as `exercised` (the proof
    that it ran), and the parameters left to the copy as `CHANGED`."""
    from accelerate.hooks import CpuOffload
    from diffusers import DiffusionPipeline

    init_hook, detach_hook = CpuOffload.init_hook, CpuOffload.detach_hook
    maybe_free_model_hooks = DiffusionPipeline.maybe_free_model_hooks
    counter = patcher.counter

    def point_back(self) -> None:
        host = kept.pop(self, None)
        if host:
            changed = 0
            for param, (tensor, moved_to, version) in host.items():
                if param.data_ptr() == moved_to and param._version == version:
                    param.data = tensor
                else:  # changed on the device since the move: the `.to("cpu")` that follows copies it back
                    changed += 1
            if counter is not None:
                counter.counts[exercised] += 1
                if changed:
                    counter.counts[CHANGED] += changed

    def pointing_init_hook(self, module):
        point_back(self)
        return init_hook(self, module)

    def letting_go_detach_hook(self, module):
        kept.pop(self, None)
        return detach_hook(self, module)

    def offloading_maybe_free_model_hooks(self):
        for hook in getattr(self, "_all_hooks", []):
            hook.offload()
        return maybe_free_model_hooks(self)

    patcher.setattr(CpuOffload, "init_hook", pointing_init_hook)
    patcher.setattr(CpuOffload, "detach_hook", letting_go_detach_hook)
    patcher.setattr(DiffusionPipeline, "maybe_free_model_hooks", offloading_maybe_free_model_hooks)


# --- sequential CPU offload: options of the loads (sequential_offload_keep_cache, sequential_offload_pinned) ---------

def pass_to_loads(patcher, exercised: str, applies, **options) -> None:
    """Make accelerate's hooks call `set_module_tensor_to_device` with `options` where `applies(device, value)`,
    counting those calls as `exercised`: the one mechanism of the sequential-offload fixes (they compose, each
    wrapping what the other installed)."""
    import accelerate.hooks as hooks

    real = hooks.set_module_tensor_to_device
    counter = patcher.counter

    def with_options(module, tensor_name, device, value=None, *args, **kwargs):
        if applies(device, value):
            kwargs.update(options)
            if counter is not None:
                counter.counts[exercised] += 1
        return real(module, tensor_name, device, value, *args, **kwargs)

    patcher.setattr(hooks, "set_module_tensor_to_device", with_options)


# --- group offloading: kept host tensors follow a cast (the group offload fixes) ---------------------------------

GROUP = "ModuleGroup"
# A group that keeps a host tensor per parameter (`cpu_param_dict`) onloads from it and offloads by pointing back at
# it. `model.to(torch.bfloat16)` while the group is offloaded gives each parameter a new host tensor: the kept one
# would bring the float32 weights back at the next onload (a dtype mismatch in the forward). So the onload first keeps,
# for each parameter whose host tensor is not the one kept, that tensor (pinned where the one it replaces was). The
# check reads a data pointer per tensor and onload: host metadata only.
FOLLOW = cst.parse_module('''
for tensor, kept in self.cpu_param_dict.items():
    # a host tensor replaced while offloaded (`.to(dtype)`) is kept instead, pinned if the one it replaces was
    if type(kept) is torch.Tensor and tensor.data_ptr() != kept.data_ptr() and tensor.device == kept.device:
        self.cpu_param_dict[tensor] = tensor.data.pin_memory() if kept.is_pinned() else tensor.data
''').body[0]
FOLLOWS = m.For(target=m.Tuple([m.Element(m.Name("tensor")), m.Element(m.Name("kept"))]))


def following(onload: cst.FunctionDef) -> cst.FunctionDef | None:
    """`_onload_from_memory` with `FOLLOW` after its wait for the previous transfer and before any copy (before its
    first statement that is not an `if`), or as it is where it has it already (either group offload fix may have put
    it there: the two compose); None where it has no statement to put it before."""
    body = list(onload.body.body)
    if any(m.findall(statement, FOLLOWS) for statement in body):
        return onload
    at = next((i for i, s in enumerate(body) if not isinstance(s, cst.If)), None)
    if at is None:
        return None
    return onload.with_changes(body=onload.body.with_changes(body=[*body[:at], FOLLOW, *body[at:]]))


def point_at_kept(patcher, group) -> None:
    """Point each host tensor of a group at the copy the group keeps of it (`cpu_param_dict`), as the offload at the
    group's hook's registration does upstream, for a group given its copies by a runtime part after that: so that no
    tensor looks replaced at the first onload (`FOLLOW` would copy it again). On exit each tensor still at its copy
    gets back the tensor it held; one replaced since (a cast) keeps its replacement."""
    kept = dict(group.cpu_param_dict)
    held = {t: t.data for t, copy in kept.items() if t.device == copy.device and t.data_ptr() != copy.data_ptr()}
    for tensor in held:
        tensor.data = kept[tensor]

    def give_back() -> None:
        for tensor, data in held.items():
            if tensor.data_ptr() == kept[tensor].data_ptr():
                tensor.data = data

    patcher.on_restore(give_back)


# --- group offloading without a stream: keep the host tensors and point back at them (group_offload_keep_host,
# group_offload_pinned, which keeps them pinned)

#: the open upstream pull request both diffs collide with
SWAP_TENSORS = Overlap("#13751", "open",
                       "`swap_tensors` in group offloading: rewrites both branches of `_offload_to_memory`, the lines "
                       "this diff inserts into (a textual conflict); it keeps the copy back without a stream")
# `return cpu_param_dict`, the whole body of the `if` that returns early without a stream
EARLY_RETURN = m.IndentedBlock(body=[m.SimpleStatementLine(body=[m.Return(m.Name("cpu_param_dict"))])])
KEEP = cst.parse_module('''
if _:
    # no side stream: keep the parameters' host tensors themselves (no copy while the model is on the host,
    # nothing pinned), so that offloading points the parameters back at them instead of copying them back
    for param in [p for module in self.modules for p in module.parameters()] + list(self.parameters):
        if type(param.data) is torch.Tensor:  # a tensor subclass (a quantized weight) moves as before
            cpu_param_dict[param] = param.data.cpu()
    return cpu_param_dict
''').body[0].body
# `cpu_param_dict[param] = param.data.cpu()`, which only the rewrite writes (upstream pins, or calls `_to_cpu`)
KEPT = m.Assign(targets=[m.AssignTarget(m.Subscript(value=m.Name("cpu_param_dict")))],
                value=m.Call(func=m.Attribute(value=m.Attribute(m.Name("param"), m.Name("data")), attr=m.Name("cpu")),
                             args=[]))
POINT_BACK = cst.parse_module('''
for param, kept in self.cpu_param_dict.items():  # kept host tensors: the `.to` below copies nothing back
    param.data = kept
''').body[0]


class KeepHostTensors(FunctionRewrite):
    DESCRIPTION = "group offloading without a stream offloads by pointing the parameters back at their host tensors"
    EDITS_BY_FUNCTION = {"_init_cpu_param_dict": frozenset({"keep"}), "_onload_from_memory": frozenset({"follow"}),
                         "_offload_to_memory": frozenset({"point back"})}
    FUNCTIONS = frozenset(EDITS_BY_FUNCTION)
    EDITS = frozenset().union(*EDITS_BY_FUNCTION.values())
    #: the body that replaces the early return without a stream (`group_offload_pinned` keeps pinned tensors)
    KEEP_BODY = KEEP.body

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return node.name.value == GROUP

    def required_edits(self, node: cst.FunctionDef) -> frozenset[str]:
        return self.EDITS_BY_FUNCTION[node.name.value]

    def already_fixed(self, node: cst.FunctionDef) -> bool:
        return bool(m.findall(node, m.For(target=m.Tuple([m.Element(m.Name("param")), m.Element(m.Name("kept"))])))
                    or m.findall(node, KEPT) or m.findall(node, FOLLOWS))

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        name = original_node.name.value
        if self.inside_target() and name == "_onload_from_memory":
            with_follow = following(updated_node)  # once: as it is where `group_offload_top_level` put it
            if with_follow is not None:
                self.edited("follow")
                updated_node = with_follow
        elif self.inside_target() and name in self.FUNCTIONS:
            updated_node = updated_node.with_changes(body=updated_node.body.with_changes(
                body=[self._edit(name, s) for s in updated_node.body.body]))
        return super().leave_FunctionDef(original_node, updated_node)

    def _edit(self, function: str, statement: cst.BaseStatement) -> cst.BaseStatement:
        """The function's own `if` (not one nested in it), matched by its bodies rather than its test, which
        `group_offload_top_level` rewrites: the two compose."""
        if not isinstance(statement, cst.If):
            return statement
        if function == "_init_cpu_param_dict" and m.matches(statement.body, EARLY_RETURN):
            self.edited("keep")
            return statement.with_changes(body=statement.body.with_changes(body=self.KEEP_BODY))
        if function == "_offload_to_memory" and isinstance(statement.orelse, cst.Else):
            block = statement.orelse.body
            self.edited("point back")
            return statement.with_changes(orelse=statement.orelse.with_changes(
                body=block.with_changes(body=[POINT_BACK, *block.body])))
        return statement


def groups_without_a_stream(pipe) -> list:
    """The groups that group offloading made on the pipeline and that move their own tensors on the compute stream:
    not a stream's (its own pinned copies), the disk's, or the top-level group `group_offload_top_level` gave pinned
    copies (`pinned_copies`)."""
    return [group for _, group in offloading_groups(pipe) if group.stream is None
            and group.offload_to_disk_path is None and not getattr(group, "pinned_copies", False)]


def plain_parameters(group) -> list:
    """A group's parameters that the rewritten `_init_cpu_param_dict` keeps a host tensor for: those of its modules and
    its own, each a plain tensor (a tensor subclass, a quantized weight, moves as upstream moves it)."""
    import torch

    params = [p for module in group.modules for p in module.parameters()] + list(group.parameters)
    return [p for p in params if type(p.data) is torch.Tensor]


def counted_offload(group, offload, counter, label: str):
    """`group.offload_`, counting the calls that point parameters back as `label` (none once another fix pinned the
    group)."""
    def offload_():
        if counter is not None and group.cpu_param_dict and not getattr(group, "pinned_copies", False):
            counter.counts[label] += 1
        return offload()

    return offload_



#: upstream's group offloading (0.37.1), cut down to what the two group offload fixes rewrite: what their examples
#: rewrite (each group's option and copies, its onload and offload, the hook's `__init__`, which neither touches, and
#: the block-level groups' construction)
GROUP_OFFLOADING = """
class ModuleGroup:
    def __init__(
        self,
        modules,
        stream=None,
        record_stream: bool | None = False,
        low_cpu_mem_usage: bool = False,
        onload_self: bool = True,
    ) -> None:
        self.stream = stream
        self.low_cpu_mem_usage = low_cpu_mem_usage
        self.cpu_param_dict = self._init_cpu_param_dict()

    def _init_cpu_param_dict(self):
        cpu_param_dict = {}
        if self.stream is None:
            return cpu_param_dict
        return cpu_param_dict

    def _onload_from_memory(self):
        if self.stream is not None:
            self.stream.synchronize()
        with context:
            if self.stream is not None:
                with self._pinned_memory_tensors() as pinned_memory:
                    self._process_tensors_from_modules(pinned_memory, default_stream=default_stream)
            else:
                self._process_tensors_from_modules(None)

    def _offload_to_memory(self):
        if self.stream is not None:
            if not self.record_stream:
                self._torch_accelerator_module.current_stream().synchronize()
            param.data = self.cpu_param_dict[param]
        else:
            param.data = param.data.to(self.offload_device, non_blocking=False)


class GroupOffloadingHook(ModelHook):
    def __init__(self, group, *, config) -> None:
        self.group = group


def _apply_group_offloading_block_level(module, config):
    group = ModuleGroup(
        modules=current_modules,
        non_blocking=config.non_blocking,
        stream=config.stream,
        record_stream=config.record_stream,
    )
    parameters = _gather_parameters_with_no_group_offloading_parent(module, modules_with_group_offloading)
    buffers = _gather_buffers_with_no_group_offloading_parent(module, modules_with_group_offloading)
    unmatched_group = ModuleGroup(
        modules=unmatched_modules,
        non_blocking=False,
        stream=None,
        record_stream=False,
        onload_self=True,
    )
"""
#: `FOLLOW` as it reads in `_onload_from_memory`, for the examples' expected results
FOLLOW_TEXT = """        for tensor, kept in self.cpu_param_dict.items():
            # a host tensor replaced while offloaded (`.to(dtype)`) is kept instead, pinned if the one it replaces was
            if type(kept) is torch.Tensor and tensor.data_ptr() != kept.data_ptr() and tensor.device == kept.device:
                self.cpu_param_dict[tensor] = tensor.data.pin_memory() if kept.is_pinned() else tensor.data
"""


def followed(source: str) -> str:
    """An example source with `FOLLOW_TEXT` where `following` puts it, before the `with` of `_onload_from_memory`
    (once: as it is where it has it)."""
    onload = "            self.stream.synchronize()\n        with context:\n"
    if FOLLOW_TEXT in source:
        return source
    return source.replace(onload, onload.replace("        with", FOLLOW_TEXT + "        with"), 1)


# `KeepHostTensors`' insertions as they read in the examples' source, for their expected results
KEEP_TEXT = textwrap.indent("""\
# no side stream: keep the parameters' host tensors themselves (no copy while the model is on the host,
# nothing pinned), so that offloading points the parameters back at them instead of copying them back
for param in [p for module in self.modules for p in module.parameters()] + list(self.parameters):
    if type(param.data) is torch.Tensor:  # a tensor subclass (a quantized weight) moves as before
        cpu_param_dict[param] = param.data.cpu()
""", " " * 12)
POINT_BACK_TEXT = textwrap.indent("""\
for param, kept in self.cpu_param_dict.items():  # kept host tensors: the `.to` below copies nothing back
    param.data = kept
""", " " * 12)


def kept(source: str) -> str:
    """An example source as the rewrite leaves it (upstream's group offloading, or `group_offload_top_level`'s)."""
    early_return = "            return cpu_param_dict\n        return cpu_param_dict\n"
    copy_back = "        else:\n            param.data = param.data.to(self.offload_device, non_blocking=False)\n"
    return followed(source.replace(early_return, KEEP_TEXT + early_return).replace(
        copy_back, copy_back.replace("        else:\n", "        else:\n" + POINT_BACK_TEXT)))
