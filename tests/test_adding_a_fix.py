"""Adding a fix is one new file plus `lab diff` (`docs/adding-a-fix.md`): a copy of the repository's `fixes/` with one
fix written here is discovered, its examples become its codemod tests, its reversibility test finds the scenario it
is tried on, and `lab diff` writes its diff, with nothing else edited; and no test holds a hand list of the fixes."""

from __future__ import annotations

import ast
import shutil
import sys
from pathlib import Path

import pytest

from lab.apply.fix import catalog
from tests.conftest import ROOT

NAME = "mark_timesteps"
#: a new fix, as a fix author writes it: one codemod, its rewrite of FLUX.1's pipeline, and its examples
NEW_FIX = '''"""FLUX.1: the line that counts the timesteps marked with a comment (tests/test_adding_a_fix.py's)."""

import libcst as cst
import libcst.matchers as m

from lab.apply import Example, Fix, FunctionRewrite, Rewrite, Upstream

COUNT = m.SimpleStatementLine(
    body=[m.Assign(targets=[m.AssignTarget(m.Attribute(m.Name("self"), m.Name("_num_timesteps")))])])


class MarkCount(FunctionRewrite):
    DESCRIPTION = "mark the timestep count"
    FUNCTIONS = frozenset({"__call__"})
    EDITS = frozenset({"mark"})

    def already_fixed(self, node: cst.FunctionDef) -> bool:
        return bool(m.findall(node, m.TrailingWhitespace(comment=m.Comment("# counted"))))

    def leave_SimpleStatementLine(self, original_node, updated_node):
        if not (self.inside_target() and m.matches(updated_node, COUNT)):
            return updated_node
        self.edited("mark")
        return updated_node.with_changes(trailing_whitespace=cst.TrailingWhitespace(
            whitespace=cst.SimpleWhitespace("  "), comment=cst.Comment("# counted")))


CALL = """
class FluxPipeline:
    def __call__(self):
        self._num_timesteps = len(timesteps)
"""
EXAMPLES = (
    Example("marked", CALL, CALL.replace("len(timesteps)", "len(timesteps)  # counted")),
    Example("no_op_when_marked", CALL.replace("len(timesteps)", "len(timesteps)  # counted")),
    Example("warns_without_a_count", CALL.replace("self._num_timesteps", "n"),
            warning="`__call__` does not have the expected shape (missing edits: mark; unexpected: none); left "
                    "unchanged."),
)

FIX = Fix(
    name="mark_timesteps",
    description="FLUX.1's timestep count marked with a comment.",
    upstream=Upstream(refs=(), note="a test fix", overlaps=()),
    rewrites=(Rewrite(module="diffusers.pipelines.flux.pipeline_flux", targets=("FluxPipeline.__call__",),
                      codemod=MarkCount, pipelines=("flux",)),),
    examples=EXAMPLES,
)
'''


def _forget_the_catalog() -> None:
    catalog.cache_clear()
    from lab.apply import rewrite_cache

    rewrite_cache._rewriting_code.cache_clear()


@pytest.fixture
def with_a_new_fix(tmp_path):
    """The `fixes` package imported from a copy of the repository's with `NEW_FIX` added (the catalog, and every fix
    module, read afresh from it); the repository's own again after."""
    import fixes

    copy = tmp_path / "fixes"
    shutil.copytree(Path(fixes.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__", "regressions"))
    (copy / f"{NAME}.py").write_text(NEW_FIX)
    own = {name: module for name, module in sys.modules.items() if name == "fixes" or name.startswith("fixes.")}
    for name in own:
        del sys.modules[name]
    sys.path.insert(0, str(tmp_path))
    _forget_the_catalog()
    try:
        yield copy
    finally:
        sys.path.remove(str(tmp_path))
        for name in [n for n in sys.modules if n == "fixes" or n.startswith("fixes.")]:
            del sys.modules[name]
        sys.modules.update(own)
        _forget_the_catalog()


@pytest.mark.slow  # imports every fix module again, rewrites a pipeline module and builds a pipeline
def test_a_new_fix_file_is_all_a_new_fix_needs(with_a_new_fix):
    import fixes

    from lab.apply.diff import fix_diff
    from tests.test_fix_examples import cases, check, uncovered
    from tests.test_reversibility import (test_every_fix_is_tried_on_a_scenario,
                                          test_restored_after_normal_exit_and_exception)

    assert Path(fixes.__file__).parent == with_a_new_fix  # the copy is what the catalog reads
    found = catalog()
    assert NAME in found and set(found) - {NAME} == set(_repository_fixes())
    new = found[NAME]
    assert new.pipelines == ("flux",) and new.tried_on == "flux" and new.upstream.since is None  # derived
    generated = [case for case, _ in cases(found.values()) if case.startswith(f"{NAME}-")]
    assert generated == [f"{NAME}-marked", f"{NAME}-no_op_when_marked", f"{NAME}-warns_without_a_count"]
    for example in new.examples:
        check(example)
    assert uncovered(new) == []
    test_every_fix_is_tried_on_a_scenario()  # the reversibility test's scenario, derived: no list to add it to
    test_restored_after_normal_exit_and_exception(NAME)  # applied to the scenario it is tried on, and given back
    diff = fix_diff(new)
    assert "+        self._num_timesteps = len(timesteps)  # counted\n" in diff
    assert diff.count("\n+") - diff.count("\n+++") == 1


def _repository_fixes() -> list[str]:
    return sorted(p.stem for p in (ROOT / "fixes").glob("*.py") if not p.stem.startswith("_"))


def test_no_test_holds_a_hand_list_of_the_fixes():
    """A literal list, tuple, set or dict in tests/ that names half the catalog or more is a list a new fix would have
    to join: such a list is derived from the catalog instead (`Fix.tried_on`, `Fix.examples`)."""
    names = set(catalog())
    listed = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.List, ast.Tuple, ast.Set, ast.Dict)):
                items = node.keys if isinstance(node, ast.Dict) else node.elts
                named = {i.value for i in items if isinstance(i, ast.Constant) and i.value in names}
                if len(named) >= len(names) // 2:
                    listed.append(f"{path.relative_to(ROOT)}:{node.lineno} names {len(named)} fixes")
    assert not listed, listed


def test_what_a_fix_declares_twice_otherwise_or_leaves_unclear_is_refused_in_one_line():
    """A rewrite fix's pipelines and first release are its rewrites'; its examples name their codemod where it has
    several, each once; a fix of every pipeline is tried on a scenario, any other on one of its pipelines."""
    from lab.apply import EVERY, Example, Fix, Rewrite, Upstream
    from lab.base.errors import LabError

    stack, half = catalog()["unipc_stack"], catalog()["unipc_device_const"]
    both = (*stack.rewrites, *half.rewrites)
    cases = {
        "declares the pipelines flux and its rewrites wan, wan_v2v, wan22": dict(pipelines=("flux",)),
        "declares `Upstream(since='0.37.0')` and its rewrites '0.38.0'": dict(upstream=Upstream((), since="0.37.0")),
        "none of its rewrites names a pipeline": dict(
            rewrites=tuple(Rewrite(r.module, r.targets, r.codemod) for r in stack.rewrites)),
        "its example `rewritten` names no codemod; its codemods are: StackRks, DeviceHalf": dict(
            rewrites=both, examples=(Example("rewritten", "x = 1\n", "x = 2\n"),)),
        "its example `rewritten` names `DeviceHalf`; its codemods are: StackRks": dict(
            examples=(Example("rewritten", "x = 1\n", "x = 2\n", codemod=half.codemods[0]),)),
        "has two examples named `case`": dict(examples=(Example("case", "x = 1\n"), Example("case", "y = 1\n"))),
        "is tried on `flux`, which is not one of its pipelines (wan, wan_v2v, wan22)": dict(tried_on="flux"),
    }
    for message, changed in cases.items():
        declared = dict(name="twice", description="test", upstream=Upstream(()), rewrites=stack.rewrites) | changed
        with pytest.raises(LabError, match="^`fixes/twice.py`.*" + message.replace("(", r"\(").replace(")", r"\)")):
            Fix(**declared)
    assert Fix(name="everywhere", description="test", upstream=Upstream(()), pipelines=EVERY).tried_on is None
    with pytest.raises(LabError, match="a codemod that warns leaves the code as it was"):
        Example("both", "x = 1\n", "x = 2\n", warning="no")
    with pytest.raises(LabError, match="`after` is `before`"):
        Example("same", "x = 1\n", "x = 1\n")


def test_no_fix_imports_another_fixs_module():
    """What fixes share is in a module of its own whose name starts with `_` (`fixes/_offload.py`), which discovery
    does not take for a fix: a fix's module can then be read, and removed, alone."""
    imported = []
    for path in sorted((ROOT / "fixes").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            modules = ([node.module] if isinstance(node, ast.ImportFrom) and node.module else
                       [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            imported += [f"{path.name}: {m}" for m in modules
                         if m.startswith("fixes.") and not m.split(".")[1].startswith("_")]
    assert not imported, imported
