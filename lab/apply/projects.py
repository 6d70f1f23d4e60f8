"""The projects a fix's upstream diff goes to: diffusers, and accelerate (model offloading's hooks).

`lab upstream check` runs the same steps for each (a release's package copied twice, laid out as a checkout,
`src/<package>/` and `tests/`; the project's own tests of the touched modules; the diff's own regression test): what
differs between them is only what this describes, so that there is one check, not one per project.
"""

from __future__ import annotations

import dataclasses

from lab.base.errors import unknown_name


@dataclasses.dataclass(frozen=True)
class Project:
    """One project under test.

    `name` is its package's import name, the word a diff's header names it by (`# made from diffusers 0.42.1`) and the
    word that starts a regression test's first line (`# accelerate: tests/test_x.py`); `tests` is its test folder in
    a checkout; `pipelines` whether its test suite holds tiny test pipelines (`tests/pipelines/`, diffusers only).
    """

    name: str
    tests: str = "tests"
    pipelines: bool = False

    @property
    def possessive(self) -> str:
        """`diffusers'`, `accelerate's`: as a report names the project's tests."""
        return f"{self.name}'" if self.name.endswith("s") else f"{self.name}'s"

    @property
    def source(self) -> str:
        """The package's folder in a checkout: `src/<name>/`."""
        return f"src/{self.name}/"


DIFFUSERS = Project("diffusers", pipelines=True)
ACCELERATE = Project("accelerate")
#: by name; the first is the project a suite belongs to when nothing says otherwise
PROJECTS = {p.name: p for p in (DIFFUSERS, ACCELERATE)}


def project(name: str) -> Project:
    """The project called `name`; a one-line error naming the known ones otherwise."""
    if name not in PROJECTS:
        raise unknown_name("project", name, PROJECTS)
    return PROJECTS[name]
