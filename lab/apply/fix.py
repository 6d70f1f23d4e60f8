"""The fix catalog: what a fix declares, how fixes are discovered, and how they are switched on and off.

A fix is one module in `fixes/` that defines `FIX = Fix(...)`. Adding a fix is adding a file (`docs/adding-a-fix.md`;
`fixes/unipc_device_const.py` is the shortest complete example). A fix applies as

- libcst rewrites (:class:`Rewrite`) of diffusers modules, compiled into the live modules, with the examples of each
  codemod (:class:`lab.apply.examples.Example`, which `tests/test_fix_examples.py` turns into its tests); and/or
- a runtime patch (`runtime(pipe, patcher)`) for changes that are not source edits.

What a rewrite fix touches is declared once, on its rewrites: the fix's pipelines are theirs, and its first upstream
release the earliest of theirs (:meth:`Fix.__post_init__`; a fix that declares them too, otherwise, is an error).

:func:`applied` is the context manager that switches a set of fixes on and restores diffusers exactly on exit.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import enum
import importlib
import importlib.util
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import cache
from typing import Any

from lab.apply import rewrite as rw
from lab.apply.examples import Example
from lab.apply.patching import CallCounter, Patcher
from lab.apply.rewrite_cache import rewrite
from lab.apply.versions import diffusers_version, is_at_least
from lab.base.discovery import discover
from lab.base.errors import LabError, UsageError, unknown_name

#: the words of a fix's note where the installed diffusers already has it (`Fix.status_for`); a census of another
#: diffusers keeps its own such notes, which `census_lacks` reads back
UPSTREAM = "is already upstream in diffusers"


@dataclasses.dataclass(frozen=True)
class Overlap:
    """An upstream pull request that changes what a fix changes, or the same lines: its number (`#14176`, or
    `accelerate#3412`), its state (open, merged, closed), and what it does otherwise than the fix."""

    ref: str
    state: str
    differs: str


@dataclasses.dataclass(frozen=True)
class Upstream:
    """Where a fix stands upstream: PRs/issues, the first diffusers release that ships it (None: not upstream), and
    the upstream pull requests its change overlaps (`overlaps`: None where they were not searched for, () where a
    search by the files and functions it changes found none). A rewrite fix leaves `since` out: it is the earliest
    `upstream_since` of its rewrites, filled in by `Fix`."""

    refs: tuple[str, ...]
    since: str | None = None
    note: str = ""
    overlaps: tuple[Overlap, ...] | None = None


#: `pipelines=EVERY`: the fix touches code that every scenario runs (hooks, the progress bar).
EVERY = ("*",)


def covers(pipelines: tuple[str, ...], pipeline: str) -> bool:
    return pipeline in pipelines or pipelines == EVERY


@dataclasses.dataclass(frozen=True)
class Rewrite:
    """A libcst rewrite of one diffusers module.

    `targets` are qualified names inside `module` that the codemod edits; `pipelines` are the scenarios whose
    call runs this site (`EVERY` for all; none for a site that no scenario runs, which only its source is tested on),
    and the fix's pipelines are those of its rewrites; `upstream_since` is the release from which the installed source
    already has the fix.
    """

    module: str
    targets: tuple[str, ...]
    codemod: type[rw.FunctionRewrite]
    upstream_since: str | None = None
    pipelines: tuple[str, ...] = ()

    @property
    def path(self) -> str:
        return repo_path(self.module)


def _pipelines_of(rewrites: Iterable[Rewrite]) -> tuple[str, ...]:
    """The pipelines a set of rewrites runs in, each once in their order (`EVERY` where one runs in every one)."""
    found = tuple(dict.fromkeys(p for r in rewrites for p in r.pipelines))
    return EVERY if "*" in found else found


def _earliest(releases: Iterable[str | None]) -> str | None:
    """The earliest of some releases (None: none)."""
    from packaging.version import Version

    return min((r for r in releases if r is not None), key=Version, default=None)


def repo_path(module: str) -> str:
    """Path of a diffusers module in the diffusers repository (`src/diffusers/...`)."""
    return "src/" + module.replace(".", "/") + ".py"


class Applies(str, enum.Enum):
    """Whether a fix, or one rewrite of it (a site), applies on the installed diffusers. Its value is the word `lab
    fixes --json` writes, so that a member compares equal to its word."""

    APPLIES = "applies"
    UPSTREAM = "upstream"  # already in this diffusers: skipped
    MISSING = "missing"  # the site's module or function does not exist in this diffusers
    SHAPE = "shape"  # the site is not in the shape the rewrite expects: left unchanged, with a warning
    OTHER_PIPELINE = "other_pipeline"  # the fix does not touch this pipeline
    CANNOT = "cannot"  # its sites are missing or not in the expected shape
    NEEDS_SETTING = "needs setting"  # its code runs only in a setting this run does not turn on

    def __str__(self) -> str:
        return self.value


@dataclasses.dataclass(frozen=True)
class SiteStatus:
    """The state of one rewrite on the installed diffusers (`APPLIES`, `UPSTREAM`, `MISSING` or `SHAPE`)."""

    rewrite: Rewrite
    state: Applies
    detail: str

    @property
    def applies(self) -> bool:
        return self.state is Applies.APPLIES


@dataclasses.dataclass(frozen=True)
class Fix:
    """One performance fix. Declared once in `fixes/<name>.py` as `FIX = Fix(...)`.

    A rewrite fix names its pipelines and upstream releases on its rewrites (`Rewrite.pipelines`,
    `Rewrite.upstream_since`) and carries `examples` of each of its codemods; a fix without rewrites names its
    `pipelines` itself.
    """

    name: str
    description: str
    upstream: Upstream
    #: the scenarios the fix applies to (`EVERY` for all): a fix without rewrites names them; a rewrite fix's are its
    #: rewrites' (in their order), filled in here
    pipelines: tuple[str, ...] = ()
    rewrites: tuple[Rewrite, ...] = ()
    #: the cases of each codemod of the rewrites (`Example`): a rewrite, and a no-op or a warning, at least, for each
    examples: tuple[Example, ...] = ()
    #: the scenario the catalog's own tests try the fix on (`tests/test_reversibility.py`): the first of its pipelines
    #: unless named; a fix of every pipeline names one
    tried_on: str | None = None
    #: `runtime(pipe, patcher)` patches a built pipeline through `patcher`; None for pure rewrites.
    runtime: Callable[[Any, Patcher], None] | None = None
    #: what the runtime patch (or the diff) changes, for `lab fixes` and reports.
    runtime_targets: tuple[str, ...] = ()
    #: call-counter labels (`Class.method` of a rewritten definition, or a label the runtime patch counts)
    #: that prove the fix's code ran; empty: any rewritten definition that is called.
    exercised_by: tuple[str, ...] = ()
    #: largest allowed max-abs difference of the outputs with and without the fix (0.0: bit-identical).
    tolerance: float = 0.0
    #: fixes that rewrite the same code another way; they cannot be applied together.
    conflicts: tuple[str, ...] = ()
    #: fixes of `conflicts` whose change this one makes too, and more: what one of them measured, this one makes (a
    #: campaign's plan reads their results as this fix's part, `lab.campaigns.status.changed_by_a_part`)
    includes: tuple[str, ...] = ()
    #: the setting (`lab.run.settings`, `--setting`) without which the fixed code never runs (it is in that setting's
    #: hooks): `all` and `each` leave the fix out unless the setting is on, and naming it without is an error; options
    #: after a colon (`group_offload:block_level,stream`) are the ones its code needs, each a bool option's name (on)
    #: or a value (`block_level`): without them the setting does not count as on
    setting: str | None = None
    #: what the fix changes in the outputs, on purpose (a cache's decisions): `all` and the joint set of `each` leave
    #: it out (it is compared alone, or named), and an A/B times it with the outputs' difference reported as a warning
    #: instead of refusing it; empty for a fix that keeps the outputs
    changes_outputs: str = ""
    #: a change given as a diff (`lab.apply.change`): `install(patcher)` puts its compiled definitions in place (no
    #: pipeline needed), and `lines` are, per compiled file, the changed lines that hold code; the change is
    #: exercised when one of them runs (line coverage), not by call counts
    install: Callable[[Patcher], None] | None = None
    lines: tuple[tuple[str, tuple[int, ...]], ...] = ()
    #: `release()` lets go of what the fix keeps across its turns (pinned copies of the weights, which an A/B's arm
    #: switches reuse), once the setting its turns ran in is undone (`release`); None for a fix that keeps nothing
    release: Callable[[], None] | None = None

    def __post_init__(self) -> None:
        """Fill in what a rewrite fix's rewrites declare (its pipelines, its first upstream release) and each example's
        codemod; a one-line error for a fix that declares them otherwise."""
        if self.rewrites:
            pipelines = _pipelines_of(self.rewrites)
            if not pipelines:
                raise LabError(f"`fixes/{self.name}.py`: none of its rewrites names a pipeline "
                               "(`Rewrite(pipelines=...)`); a fix's pipelines are its rewrites'.")
            if self.pipelines and set(self.pipelines) != set(pipelines):
                raise LabError(f"`fixes/{self.name}.py` declares the pipelines {', '.join(self.pipelines)} and its "
                               f"rewrites {', '.join(pipelines)}: name them on the rewrites only.")
            since = _earliest(r.upstream_since for r in self.rewrites)
            if self.upstream.since is not None and self.upstream.since != since:
                raise LabError(f"`fixes/{self.name}.py` declares `Upstream(since={self.upstream.since!r})` and its "
                               f"rewrites {since!r} as the first release that ships it: name it on the rewrites only "
                               "(`Rewrite(upstream_since=...)`).")
            object.__setattr__(self, "pipelines", pipelines)
            object.__setattr__(self, "upstream", dataclasses.replace(self.upstream, since=since))
        object.__setattr__(self, "examples", tuple(self._own(e) for e in self.examples))
        names = [e.name for e in self.examples]
        if len(set(names)) < len(names):
            raise LabError(f"`fixes/{self.name}.py` has two examples named `{max(names, key=names.count)}`: each "
                           "needs its own.")
        if self.tried_on is None and self.pipelines and self.pipelines != EVERY:
            object.__setattr__(self, "tried_on", self.pipelines[0])
        elif self.tried_on is not None and not covers(self.pipelines, self.tried_on):
            raise LabError(f"`fixes/{self.name}.py` is tried on `{self.tried_on}`, which is not one of its pipelines "
                           f"({', '.join(self.pipelines)}).")

    def _own(self, example: Example) -> Example:
        """`example` with the codemod it is a case of: the one it names, or the fix's only one."""
        codemods = self.codemods
        if example.codemod is None and len(codemods) == 1:
            return dataclasses.replace(example, codemod=codemods[0])
        if example.codemod is None or example.codemod not in codemods:
            given = f"names `{example.codemod.__name__}`" if example.codemod is not None else "names no codemod"
            raise LabError(f"`fixes/{self.name}.py`: its example `{example.name}` {given}; its codemods are: "
                           f"{', '.join(c.__name__ for c in codemods) or 'none (it has no rewrites)'}.")
        return example

    @property
    def codemods(self) -> tuple[type[rw.FunctionRewrite], ...]:
        """The codemods of the fix's rewrites, each once, in order."""
        return tuple(dict.fromkeys(r.codemod for r in self.rewrites))

    @property
    def kind(self) -> str:
        kinds = (["rewrite"] if self.rewrites else []) + (["runtime"] if self.runtime else []) + (
            ["diff"] if self.install else [])
        return "+".join(kinds)

    @property
    def targets(self) -> tuple[str, ...]:
        return tuple(f"{r.module}:{t}" for r in self.rewrites for t in r.targets) + self.runtime_targets

    def site_statuses(self) -> list[SiteStatus]:
        return [site_status(r) for r in self.rewrites]

    def status_for(self, pipeline: str) -> tuple[Applies, str]:
        """Whether the fix applies to scenario `pipeline` on the installed diffusers, and why (not): `APPLIES`,
        `UPSTREAM` (already in this diffusers: skipped), `OTHER_PIPELINE` (the fix does not touch this pipeline) or
        `CANNOT` (its sites are missing or not in the expected shape).
        """
        version = diffusers_version()
        if not covers(self.pipelines, pipeline):
            return Applies.OTHER_PIPELINE, (
                f"`{self.name}` does not apply to the `{pipeline}` pipeline (it touches: {', '.join(self.pipelines)})."
            )
        # only this pipeline's sites are worked out (begin_index reaches 48 modules, each a rewrite on a cold cache)
        relevant = [site_status(r) for r in self.rewrites if covers(r.pipelines, pipeline)]
        if any(s.applies for s in relevant):
            return Applies.APPLIES, "applies (rewrite)"
        if not relevant and self.install is not None:
            return Applies.APPLIES, "applies (diff)"
        if not relevant and self.runtime is not None:
            return Applies.APPLIES, "applies (runtime patch)"
        if relevant and all(s.state is Applies.UPSTREAM for s in relevant):
            return Applies.UPSTREAM, (
                f"`{self.name}` {UPSTREAM} {version} (since {relevant[0].rewrite.upstream_since}); skipped."
            )
        details = "; ".join(s.detail for s in relevant) or "no site"
        return Applies.CANNOT, f"`{self.name}` cannot apply to `{pipeline}` on diffusers {version}: {details}."

    def summary_status(self) -> str:
        """One line for `lab fixes`: which sites apply, are already upstream, are missing or have another shape.

        The per-site details are in :meth:`site_statuses` (and `lab fixes --json`).
        """
        statuses = self.site_statuses()
        groups: dict[str, list[str]] = {}
        for st in statuses:
            name = st.rewrite.module.rsplit(".", 1)[-1]
            if st.state is Applies.UPSTREAM and st.rewrite.upstream_since:
                groups.setdefault(f"already upstream (since {st.rewrite.upstream_since})", []).append(name)
            elif st.state is Applies.UPSTREAM:
                groups.setdefault("already has the change", []).append(name)
            elif st.state is Applies.MISSING:
                groups.setdefault(f"not in diffusers {diffusers_version()}", []).append(name)
            elif st.state is Applies.SHAPE:
                groups.setdefault("not in the expected shape (left unchanged)", []).append(name)
        applying = sum(st.applies for st in statuses)
        parts = [f"applies ({applying} of {len(statuses)} sites)"] if applying else []
        parts += [f"{label}: {', '.join(names)}" for label, names in groups.items()]
        if self.runtime is not None:
            parts.append("runtime patch applies")
        return "; ".join(parts) or "nothing to apply"


# --- status of a rewrite on the installed diffusers -------------------------------------------------------


@cache
def _module_source(module: str) -> str | None:
    """The installed source of `module`, read without importing it (a pipeline module imports its models, and
    a fix such as begin_index reaches dozens of them); None where the module does not exist."""
    try:
        spec = importlib.util.find_spec(module)  # imports the parent packages only: diffusers' are lazy
    except ImportError:
        return None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    with open(spec.origin, encoding="utf-8") as f:
        return f.read()


@cache
def _definitions(source: str) -> dict[str, Any]:
    """The classes and functions a module source defines, nested by name (`{"Cls": {"method": {}}}`)."""
    def walk(body: list[ast.stmt]) -> dict[str, Any]:
        return {node.name: walk(node.body) if isinstance(node, ast.ClassDef) else {}
                for node in body if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))}

    return walk(ast.parse(source).body)


def _has_target(source: str, qualname: str) -> bool:
    scope = _definitions(source)
    for part in qualname.split("."):
        if part not in scope:
            return False
        scope = scope[part]
    return True


def site_status(r: Rewrite) -> SiteStatus:
    version = diffusers_version()
    if is_at_least(r.upstream_since):
        return SiteStatus(r, Applies.UPSTREAM, f"already upstream since {r.upstream_since}")
    source = _module_source(r.module)
    if source is None:
        return SiteStatus(r, Applies.MISSING, f"target not found: module `{r.module}` does not exist in diffusers {version}")
    missing = [t for t in r.targets if not _has_target(source, t)]
    if missing:
        return SiteStatus(r, Applies.MISSING, f"target not found: `{', '.join(missing)}` does not exist in diffusers {version}")
    state, detail = _rewrite_status(r.codemod, source, r.path)
    return SiteStatus(r, state, detail)


@cache
def _rewrite_status(codemod: type[rw.FunctionRewrite], source: str, path: str) -> tuple[Applies, str]:
    """What one codemod does to one module source (through :func:`rewrite`, so worked out once)."""
    result = rewrite(source, (codemod,), path)
    if result.warnings:
        return Applies.SHAPE, "site not in the expected shape: " + " ".join(result.warnings)
    if not result.changed:
        return Applies.UPSTREAM, "already has the change (nothing to rewrite)"
    return Applies.APPLIES, "applies"


# --- discovery ----------------------------------------------------------------------------------------------


@cache
def catalog() -> dict[str, Fix]:
    """Every fix in the `fixes` package, by name. A module that defines no `FIX` is an error."""
    import fixes

    found: dict[str, Fix] = {}
    for module, fix in discover(fixes, "FIX", Fix, lambda f: f.name):
        if fix.name != module:
            raise LabError(f"`fixes/{module}.py` declares the fix name `{fix.name}`; it must match the file name.")
        found[fix.name] = fix
    for fix in found.values():
        if stray := [name for name in fix.includes if name not in fix.conflicts]:
            raise LabError(f"`fixes/{fix.name}.py` includes {', '.join(f'`{n}`' for n in stray)} without conflicting "
                           "with it: a fix that makes another's change too rewrites the same code, so both "
                           "cannot be on; name it in `conflicts` as well.")
    return found


def get_fix(name: str) -> Fix:
    fixes = catalog()
    if name not in fixes:
        raise unknown_name("fix", name, fixes)
    return fixes[name]


def parse_fix_list(spec: str) -> list[Fix]:
    """`a,b` or `all` into fixes; an unknown name raises UsageError with the closest match."""
    if not spec:
        raise UsageError("No fix given: pass `--fix NAME[,NAME..]` or `--fix all` (see `lab fixes`).")
    if spec == "all":
        return list(catalog().values())
    names = [n.strip() for n in spec.split(",") if n.strip()]
    return [get_fix(n) for n in dict.fromkeys(names)]


# --- applying -------------------------------------------------------------------------------------------------


def rewritten_sources(fixes: Sequence[Fix], pipeline_classes: frozenset[str] | None = None
                      ) -> dict[str, rw.RewriteResult]:
    """Run the codemods of all applicable rewrites, grouped by module, in fix order. With `pipeline_classes` (the
    names of a running pipeline's class and its bases), a rewrite of another pipeline's methods is left out: its code
    cannot run in this pipeline, and rewriting and compiling every pipeline a fix reaches (begin_index: dozens of
    modules) would cost a run many seconds."""
    by_module: dict[str, list[Rewrite]] = {}
    for fix in fixes:
        for r in fix.rewrites:
            if pipeline_classes is not None and _other_pipelines_only(r, pipeline_classes):
                continue
            if site_status(r).applies:
                by_module.setdefault(r.module, []).append(r)
    out = {}
    for module, rewrites in by_module.items():
        source = _module_source(module)
        out[module] = rewrite(source, tuple(r.codemod for r in rewrites), rewrites[0].path)
    return out


def _other_pipelines_only(r: Rewrite, pipeline_classes: frozenset[str]) -> bool:
    """Whether every target of `r` is a method of a pipeline class that the running pipeline is not (nor derives
    from)."""
    if not r.module.startswith("diffusers.pipelines."):
        return False
    owners = {t.split(".")[0] for t in r.targets}
    return all("." in t for t in r.targets) and not owners & pipeline_classes


def _pipeline_classes(pipe: Any) -> frozenset[str] | None:
    return None if pipe is None else frozenset(c.__name__ for c in type(pipe).__mro__)


@cache
def _compiled(names: tuple[str, ...], pipeline_classes: frozenset[str] | None = None
              ) -> tuple[tuple[Any, str | None, str, Any], ...]:
    """The rewritten definitions of a set of fixes (for one pipeline class, where given), compiled once: toggling
    reuses the same objects, so it is cheap and compiled code (torch.compile guards on function identity) does not
    recompile on every toggle."""
    fixes = [get_fix(n) for n in names]
    out = []
    for module_name, result in rewritten_sources(fixes, pipeline_classes).items():
        if result.warnings:  # each applies alone, but one refuses the other's output
            raise LabError(f"the fixes {', '.join(names)} do not compose on `{module_name}`: " + " ".join(result.warnings))
        if not result.changed:
            continue
        module = importlib.import_module(module_name)
        pseudo = f"{module.__file__} [lab fix: {'+'.join(names)}]"
        for (owner, name), value in rw.compile_definitions(module, result.new_source, pseudo).items():
            out.append((module, owner, name, value))
    return tuple(out)


def _install_rewrites(fixes: Sequence[Fix], patcher: Patcher, pipe: Any = None) -> None:
    if not any(f.rewrites for f in fixes):
        return
    for module, owner, name, value in _compiled(tuple(f.name for f in fixes), _pipeline_classes(pipe)):
        target = getattr(module, owner) if owner else module
        patcher.setattr(target, name, value, count_as=f"{owner}.{name}" if owner else name)


def release(fixes: Sequence[Fix]) -> None:
    """Let go of what `fixes` keep across their turns: each fix's `release`. Two fixes may share what they keep (the
    offload fixes' pinned blocks), so a release must hold when another's already ran."""
    for fix in fixes:
        if fix.release is not None:
            fix.release()


@contextlib.contextmanager
def applied(fixes: Sequence[Fix], pipe: Any = None, counter: CallCounter | None = None) -> Iterator[Patcher]:
    """Switch `fixes` on (rewrites, then diffs and runtime patches on `pipe`); restore everything on exit, even on
    error."""
    patcher = Patcher(counter)
    try:
        _install_rewrites(fixes, patcher, pipe)
        for fix in fixes:
            if fix.install is not None:
                fix.install(patcher)
            if fix.runtime is not None and pipe is not None:
                fix.runtime(pipe, patcher)
        yield patcher
    finally:
        patcher.restore()


def exercised(fix: Fix, counter: CallCounter) -> int:
    """How many calls of the fix's own code the counter saw."""
    if fix.exercised_by:
        return sum(counter.counts[label] for label in fix.exercised_by)
    labels = {f"{t}" for r in fix.rewrites for t in r.targets}
    return sum(n for label, n in counter.counts.items() if label in labels)


def _setting_words(setting: str) -> tuple[str, set[str]]:
    """A setting as the results record it (`group_offload (level=block_level, stream=True)`, or a bare name): its name
    and the words its options satisfy (`block_level`, `stream`, `level=block_level`, `stream=True`)."""
    name, _, options = setting.partition(" (")
    words = set()
    for item in filter(None, options.rstrip(")").split(", ")):
        key, _, value = item.partition("=")
        words |= {item, key if value == "True" else value}
    return name.strip(), words


def needs_setting(fix: Fix, settings: Sequence[str]) -> str | None:
    """Why `fix` cannot run without a setting that is not among `settings` (as the results record them:
    `lab.run.settings.Setting.describe()`, or bare names when the fix needs no option), or None."""
    if not fix.setting:
        return None
    name, _, wanted = fix.setting.partition(":")
    required = {w.strip() for w in wanted.split(",") if w.strip()}
    if any(given == name and required <= words for given, words in map(_setting_words, settings)):
        return None
    return f"`{fix.name}` only runs with `--setting {fix.setting}` (its code is in that setting's hooks)"


def check_fixes_for(pipeline: str, fixes: Sequence[Fix], *, skip_inapplicable: bool,
                    settings: Sequence[str] = ()) -> tuple[list[Fix], list[str]]:
    """Split fixes into those that apply to `pipeline` (in `settings`, as the results record them) and notes for
    those skipped.

    A fix already upstream in the installed diffusers is always skipped with a note. With
    `skip_inapplicable=False` (fixes named explicitly), a fix that does not apply is a UsageError.
    """
    keep, notes = [], []
    for fix in fixes:
        state, why = fix.status_for(pipeline)
        if state is Applies.APPLIES and needs_setting(fix, settings):
            state, why = Applies.NEEDS_SETTING, needs_setting(fix, settings)
        clash = [k.name for k in keep if k.name in fix.conflicts or fix.name in k.conflicts]
        if state is Applies.APPLIES and clash:
            message = (f"`{fix.name}` and `{clash[0]}` rewrite the same code in different ways and cannot be applied "
                       "together; name one of them.")
            if not skip_inapplicable:
                raise UsageError(message)
            notes.append(f"skipped: {message}")
        elif state is Applies.APPLIES and fix.changes_outputs and skip_inapplicable:
            notes.append(f"skipped: `{fix.name}` changes what the pipeline computes ({fix.changes_outputs}): "
                         "name it to compare it")
        elif state is Applies.APPLIES:
            keep.append(fix)
        elif state is Applies.UPSTREAM or skip_inapplicable:
            notes.append(f"skipped: {why}")
        else:
            raise UsageError(why)
    return keep, notes


def over(base: Sequence[Fix], fixes: Sequence[Fix]) -> tuple[list[Fix], list[Fix]]:
    """The two arms of an A/B of `fixes` over `base` (`lab ab --base`): the control runs `base`; the test runs
    `fixes` and every fix of `base` that is not among them and conflicts with none of them (a base fix that a tested
    one conflicts with gives way to it: `model_offload_pinned` over `model_offload_keep_host` times one against the
    other)."""
    names = {f.name for f in fixes}
    kept = [b for b in base if b.name not in names
            and not any(b.name in f.conflicts or f.name in b.conflicts for f in fixes)]
    return list(base), [*fixes, *kept]


def not_yet_run(pipeline: str, settings: Sequence[str], ran: Iterable[str]) -> list[str]:
    """The fixes that `lab ab --fix each` would run on `pipeline` (in `settings`) now and that are not in `ran`: what
    the catalog gained since a measurement that ran `ran`."""
    return sorted({f.name for fixes, _ in each_sets(pipeline, settings) for f in fixes} - set(ran))


def census_lacks(census: Any) -> list[str]:
    """The fixes a census result (`lab.results.schema.CensusResult`) did not run although they apply to its pipeline
    now: a census that lacks one is owed again (`lab census`, the campaign state "new fixes", its page). None for a
    census that failed: it is owed anyway. A census of another diffusers than the installed one (`lab census
    --diffusers`) keeps what it found already upstream there: its own notes say so, judged by the diffusers it ran."""
    if census.error:
        return []
    lacking = not_yet_run(census.scenario, census.settings, census.fixes_run)
    if census.environment.diffusers != diffusers_version():
        upstream = {note.split("`")[1] for note in census.skipped if f" {UPSTREAM} " in note}
        lacking = [name for name in lacking if name not in upstream]
    return lacking


def each_sets(pipeline: str, settings: Sequence[str] = ()) -> list[tuple[list[Fix], list[str]]]:
    """What `lab ab --fix each` compares on `pipeline` (in `settings`), each set with its notes: every applicable fix
    on its own, then all of them together (a fix that conflicts with an earlier one stays out of the joint set, with
    a note)."""
    alone = [f for f in catalog().values()
             if f.status_for(pipeline)[0] is Applies.APPLIES and not needs_setting(f, settings)]
    if not alone:
        return []
    together = check_fixes_for(pipeline, list(catalog().values()), skip_inapplicable=True, settings=settings)
    return [([f], []) for f in alone] + ([together] if len(together[0]) > 1 else [])
