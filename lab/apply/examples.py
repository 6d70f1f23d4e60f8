"""The examples a rewrite fix carries, as Fixit's rules carry their valid and invalid code: each is a case of one of
its codemods, checked with libcst's `CodemodTest` by `tests/test_fix_examples.py`, which generates one test per fix
and case from the catalog."""

from __future__ import annotations

import dataclasses

from lab.base.errors import LabError

@dataclasses.dataclass(frozen=True)
class Example:
    """One case of a codemod: `before` rewritten into `after` without a warning (a rewrite); `before` left as it is
    without a warning (no `after`: a no-op, where the code already has the change); or `before` left as it is with
    `warning`, the codemod's warning where the code lacks the expected shape. `name` is the case's id in the test's name; `codemod` says which of the fix's
    codemods the case is for, where the fix has more than one (`Fix` fills it in where it has one)."""

    name: str
    before: str
    after: str | None = None
    warning: str | None = None
    codemod: type | None = None

    def __post_init__(self) -> None:
        if self.warning is not None and self.after is not None:
            raise LabError(f"example `{self.name}`: a codemod that warns leaves the code as it was (all or nothing): "
                           "give it `after` or `warning`, not both.")
        if self.after is not None and self.after == self.before:
            raise LabError(f"example `{self.name}`: `after` is `before`; a case that changes nothing gives no `after`.")

    @property
    def kind(self) -> str:
        """"rewrite", "no-op" or "warning"."""
        return "warning" if self.warning is not None else "no-op" if self.after is None else "rewrite"

    @property
    def expected(self) -> str:
        """The source the codemod must leave."""
        return self.before if self.after is None else self.after


def as_method(node) -> str:
    """A method (a `libcst.FunctionDef`, as `parse_method` gives it) as its source reads in a class body, for an
    example's `after` that holds a helper method the rewrite adds."""
    import libcst as cst

    shell = cst.parse_module("class _:\n    pass\n")
    cls = shell.body[0]
    cls = cls.with_changes(body=cls.body.with_changes(body=[node.with_changes(leading_lines=())]))
    return shell.with_changes(body=[cls]).code.split("\n", 1)[1]
