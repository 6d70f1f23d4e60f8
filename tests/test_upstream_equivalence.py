"""Applying the fixes to diffusers 0.37.1 gives the functions diffusers 0.38.0 ships (compared as ASTs)."""

import ast

import pytest

from lab.apply.fix import get_fix, rewritten_sources
from tests.conftest import upstream_source


def function_ast(source: str, cls: str, name: str) -> str:
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    return ast.dump(item)
    raise AssertionError(f"{cls}.{name} not found")


CASES = [
    (("unipc_stack", "unipc_device_const"), "diffusers.schedulers.scheduling_unipc_multistep", "UniPCMultistepScheduler",
     ("multistep_uni_p_bh_update", "multistep_uni_c_bh_update")),
    (("begin_index",), "diffusers.pipelines.wan.pipeline_wan", "WanPipeline", ("__call__",)),
    (("flux2_unpack_hw",), "diffusers.pipelines.flux2.pipeline_flux2_klein", "Flux2KleinPipeline",
     ("_unpack_latents_with_ids", "__call__")),
]


@pytest.mark.parametrize("fix_names,module,cls,functions", CASES, ids=[c[2] for c in CASES])
def test_rewrite_equals_0380(fix_names, module, cls, functions):
    # as a run of `cls` rewrites them: begin_index reaches 47 other pipelines, which this comparison does not need
    ours = rewritten_sources([get_fix(n) for n in fix_names], frozenset({cls}))[module]
    assert ours.changed and not ours.warnings
    upstream = upstream_source("0.38.0", module)
    for name in functions:
        assert function_ast(ours.new_source, cls, name) == function_ast(upstream, cls, name), name
        # and the change is real: 0.37.1 differs from 0.38.0 in this function
        assert function_ast(ours.old_source, cls, name) != function_ast(upstream, cls, name), name


def test_unipc_stack_alone_is_not_0380():
    """The two UniPC fixes are separate: stack alone leaves the 0.5 constant as in 0.37.1."""
    ours = rewritten_sources([get_fix("unipc_stack")])["diffusers.schedulers.scheduling_unipc_multistep"]
    upstream = upstream_source("0.38.0", "diffusers.schedulers.scheduling_unipc_multistep")
    name = "multistep_uni_p_bh_update"
    assert function_ast(ours.new_source, "UniPCMultistepScheduler", name) != function_ast(upstream, "UniPCMultistepScheduler", name)
