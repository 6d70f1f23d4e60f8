"""The lab runs a codemod without libcst's copy of the parsed module (`lab.apply.rewrite._transform`): its results
are libcst's own `transform_module`'s, on real sources and on a codemod that skips or fails."""

import libcst as cst
import pytest
from libcst.codemod import (CodemodContext, SkipFile, TransformFailure, TransformSkip, TransformSuccess,
                            VisitorBasedCodemodCommand, transform_module)

from lab.apply import rewrite
from lab.apply.fix import _module_source, catalog


def same(codemod: type[VisitorBasedCodemodCommand], code: str):
    ours = rewrite._transform(codemod(CodemodContext(filename="m.py")), code)
    theirs = transform_module(codemod(CodemodContext(filename="m.py")), code)
    assert type(ours) is type(theirs)
    assert ours.warning_messages == theirs.warning_messages
    return ours, theirs


def site(fix: str, module: str):
    (found,) = [r for r in catalog()[fix].rewrites if r.module == f"diffusers.{module}"]
    return found.codemod, _module_source(found.module)


#: an edit of a scheduler, an edit of a pipeline's `__call__`, and a site refused with a warning (Wan animate sets
#: `_num_timesteps` per segment inside a loop), on the pinned diffusers
SITES = {"edit": ("unipc_stack", "schedulers.scheduling_unipc_multistep"),
         "call": ("begin_index", "pipelines.wan.pipeline_wan"),
         "refused": ("begin_index", "pipelines.wan.pipeline_wan_animate")}


@pytest.mark.parametrize("case", SITES)
def test_the_same_code_and_warnings_as_libcst_on_the_real_sources(case):
    codemod, source = site(*SITES[case])
    ours, theirs = same(codemod, source)
    assert isinstance(ours, TransformSuccess) and ours.code == theirs.code
    assert (ours.code == source) == (case == "refused") and bool(ours.warning_messages) == (case == "refused")
    again, _ = same(codemod, ours.code)  # the fixed source: nothing left to do
    assert again.code == ours.code


class Skips(VisitorBasedCodemodCommand):
    def visit_Module(self, node: cst.Module) -> bool:
        self.warn("looked")
        raise SkipFile("not this one")


class Fails(VisitorBasedCodemodCommand):
    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.Name:
        raise ValueError("broken codemod")


def test_a_skip_and_a_failure_are_libcsts_results():
    ours, theirs = same(Skips, "x = 1\n")
    assert isinstance(ours, TransformSkip) and ours.skip_description == theirs.skip_description == "not this one"
    ours, theirs = same(Fails, "x = 1\n")
    assert isinstance(ours, TransformFailure) and str(ours.error) == str(theirs.error) == "broken codemod"
    ours, _ = same(Fails, "x = (\n")  # a source that does not parse
    assert isinstance(ours, TransformFailure)
