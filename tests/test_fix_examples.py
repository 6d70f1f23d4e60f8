"""Every fix's examples (`Fix.examples`), checked as libcst's `CodemodTest` checks a codemod: one test per fix and
case, named `<fix>-<case>`, generated from the catalog, so that a new fix's examples are tested with no edit here; and
every rewrite fix carries them: each of its codemods a rewrite case and a case it leaves as it is (a no-op or a
warning)."""

import pytest
from libcst.codemod import CodemodTest

from lab.apply.fix import Fix, catalog


def cases(fixes) -> list[tuple[str, object]]:
    """Each example of each fix, with its test's id (`<fix>-<case>`)."""
    return [(f"{fix.name}-{example.name}", example) for fix in fixes for example in fix.examples]


CASES = cases(catalog().values())


def check(example) -> None:
    """What `example.codemod` makes of `example.before`: `example.expected`, with the example's warning or none."""
    case = CodemodTest()
    case.TRANSFORM = example.codemod
    case.maxDiff = None
    case.assertCodemod(example.before, example.expected,
                       expected_warnings=[example.warning] if example.warning is not None else [])


def uncovered(fix: Fix) -> list[str]:
    """The codemods of `fix` that lack a rewrite case, or a case they leave as they are, each with what it lacks."""
    lacking = []
    for codemod in fix.codemods:
        kinds = {e.kind for e in fix.examples if e.codemod is codemod}
        if "rewrite" not in kinds:
            lacking.append(f"{codemod.__name__}: no rewrite case")
        if not kinds & {"no-op", "warning"}:
            lacking.append(f"{codemod.__name__}: no no-op or warning case")
    return lacking


@pytest.mark.parametrize("example", [e for _, e in CASES], ids=[case for case, _ in CASES])
def test_example(example):
    check(example)


@pytest.mark.parametrize("name", sorted(name for name, fix in catalog().items() if fix.rewrites))
def test_every_codemod_of_a_rewrite_fix_has_its_cases(name):
    assert not uncovered(catalog()[name]), f"`fixes/{name}.py` needs examples: {'; '.join(uncovered(catalog()[name]))}"


def test_a_fix_without_examples_is_found_out():
    rewriting = catalog()["unipc_stack"]
    bare = Fix(name="bare", description="test", upstream=rewriting.upstream, rewrites=rewriting.rewrites)
    assert uncovered(bare) == ["StackRks: no rewrite case", "StackRks: no no-op or warning case"]
    only_rewrites = Fix(name="half", description="test", upstream=rewriting.upstream, rewrites=rewriting.rewrites,
                        examples=tuple(e for e in rewriting.examples if e.kind == "rewrite"))
    assert uncovered(only_rewrites) == ["StackRks: no no-op or warning case"]
