"""A project's own test suite for `lab upstream check` (diffusers', accelerate's: `lab.apply.projects`): which commit
of a repository it comes from, extracted once into the lab's cache, and which of its test files name a module that a
diff touches.

The suite is a folder holding `tests/` (a checkout, or `git archive REV tests pyproject.toml` of one: the project's
`pyproject.toml` holds its ruff configuration, which the check's style step reads). A release's tests are those of
its tag, `vX`; a repository without that tag gives the newest release tag not newer than X (a mirror that stops
before the release), and the suite says which it took and why. Which project a repository or folder holds is the
package its `src/` holds (:func:`project_of_repo`, :func:`project_of_folder`). An extracted suite keeps where it came
from in `ORIGIN` (`origin.json`: commit, tag and note), so that the folder carried to a machine without the
repository (`--tests PATH`) is still reported as the tag and commit it is.

Which test files run (:func:`select`): a touched module `src/diffusers/a/b.py` is named by its dotted path
`diffusers.a.b`, its file stem `b` and the public classes `b.py` defines at its top level, each as a whole
identifier, and the classes of the suite's helpers (files that define no test) whose own body names one of those
names (`FirstBlockCacheTesterMixin`: a test file reaches the module through it). A test file (`tests/**/test_*.py`,
what pytest collects there) is a candidate when its text names one of
those names and it defines tests itself (:func:`defines_tests`: a file of mixins only runs nothing). Candidates rank by whether the file's name ends with a touched stem (`test_group_offloading.py`,
`test_models_transformer_flux2.py`: the module's own test file first), then by how often the text names them, then
by path: the order depends on the files alone, so that a check runs the same files every time.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from packaging.version import InvalidVersion, Version

from lab.apply import releases
from lab.base.errors import UsageError
from lab.base.files import write_text

#: a release tag of diffusers: `v0.40.0`
TAG = re.compile(r"^v(\d[^\s]*)$")
#: the file a diff changes, as `git diff` names it
DIFF_FILE = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.MULTILINE)
#: stems too general to say which module a test file is about (a package's `__init__.py` is named by its dotted path)
GENERIC_STEMS = frozenset({"__init__", "utils", "__main__"})
#: the file beside `tests/` in an extracted suite that says which commit and tag it is
ORIGIN = "origin.json"


@dataclasses.dataclass(frozen=True)
class Suite:
    """A diffusers test suite: `root` holds `tests/`; `commit` is the commit it was extracted from (None for a folder
    given as it is); `ref` what was taken (`v0.40.0`, a revision, or the folder); `note` why, when it is not what
    was asked for."""

    root: Path
    commit: str | None
    ref: str
    note: str = ""


# --- which commit ------------------------------------------------------------------------------------------------


def choose_tag(tags: Iterable[str], version: str) -> str | None:
    """The tag for release `version`: `v{version}` itself, else the newest release tag (`vX.Y.Z`, no pre-release)
    not newer than it; None when there is none. Pure."""
    wanted = Version(version)
    best: tuple[Version, str] | None = None
    for tag in tags:
        match = TAG.match(tag.strip())
        if not match:
            continue
        try:
            found = Version(match[1])
        except InvalidVersion:
            continue
        if found == wanted:
            return tag.strip()
        if found.is_prerelease or found.is_devrelease or found > wanted:
            continue
        if best is None or found > best[0]:
            best = (found, tag.strip())
    return best[1] if best else None


def _git(repo: Path, *args: str) -> str:
    try:
        done = subprocess.run(["git", "-C", str(repo), *args], check=False, capture_output=True, text=True,
                              timeout=120)
    except FileNotFoundError:
        raise UsageError("`git` is not installed here; give the tests as a folder with --tests.") from None
    except subprocess.TimeoutExpired:
        raise UsageError(f"`git {' '.join(args)}` in {repo} took over 2 minutes.") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise UsageError(f"`git {' '.join(args)}` in {repo} failed: {last}")
    return done.stdout


def from_repo(repo: Path, version: str, rev: str | None = None) -> Suite:
    """The suite of release `version` in the git repository `repo` (bare or not): at `rev` when given, else at the
    release's tag (:func:`choose_tag`); its `tests/` extracted into the cache once (:func:`extract`)."""
    repo = Path(repo).expanduser()
    if not repo.exists():
        raise UsageError(f"--repo {repo}: no such folder.")
    _git(repo, "rev-parse", "--git-dir")
    note = ""
    if rev is None:
        tags = _git(repo, "tag", "--list", "v*").split()
        rev = choose_tag(tags, version)
        if rev is None:
            raise UsageError(f"--repo {repo} has no release tag at or before v{version} (its tags: "
                             f"{', '.join(sorted(tags)[-5:]) or 'none'}): give --commit REV.")
        if rev != f"v{version}":
            note = f"{repo} has no tag v{version}: took the newest release tag not newer, {rev}"
    commit = _git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}").strip()
    _git(repo, "cat-file", "-e", f"{commit}:tests")  # a commit without tests/ is one error here, not an empty suite
    root = extract(repo, commit)
    origin = root / ORIGIN
    if not origin.is_file():
        write_text(origin, json.dumps({"commit": commit, "ref": rev, "note": note}, indent=1) + "\n")
    return Suite(root, commit, rev, note)


def from_folder(path: Path) -> Suite:
    """A suite given as a folder (a checkout): it must hold `tests/`. A suite the lab extracted (its `ORIGIN` file)
    is the commit and tag it was extracted from; any other folder is itself."""
    path = Path(path).expanduser()
    if not (path / "tests").is_dir():
        raise UsageError(f"--tests {path}: no tests/ folder there; give a checkout (the folder holding tests/).")
    try:
        origin = json.loads((path / ORIGIN).read_text())
        return Suite(path.resolve(), str(origin["commit"]), str(origin["ref"]), str(origin.get("note", "")))
    except FileNotFoundError:
        return Suite(path.resolve(), None, str(path))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UsageError(f"--tests {path}: its {ORIGIN} cannot be read ({e}); remove it to take the folder as it "
                         "is.") from None


def project_of_repo(repo: Path, names: Iterable[str]) -> str | None:
    """Which of the projects `names` the git repository `repo` holds: the one whose package its HEAD's `src/` holds
    (None when none does, or the repository cannot be read)."""
    for name in names:
        done = subprocess.run(["git", "-C", str(repo), "cat-file", "-e", f"HEAD:src/{name}/__init__.py"],
                              capture_output=True, check=False)
        if done.returncode == 0:
            return name
    return None


def project_of_folder(path: Path, names: Iterable[str]) -> str | None:
    """Which of the projects `names` the checkout `path` holds (its `src/<name>/`), or None."""
    return next((name for name in names if (Path(path) / "src" / name / "__init__.py").is_file()), None)


def extract(repo: Path, commit: str) -> Path:
    """A folder holding `tests/` (and `pyproject.toml`, where the commit has one) of `commit` (`git archive`),
    extracted once into the cache, `<cache>/suites/<commit>/`, under a temporary name renamed into place once
    complete, as a release is unpacked. A suite extracted without its `pyproject.toml` gets it added."""
    target = releases.cache_dir() / "suites" / commit
    has_config = subprocess.run(["git", "-C", str(repo), "cat-file", "-e", f"{commit}:pyproject.toml"],
                                capture_output=True, check=False).returncode == 0
    if (target / "tests").is_dir():
        if has_config and not (target / "pyproject.toml").is_file():
            write_text(target / "pyproject.toml", _git(repo, "show", f"{commit}:pyproject.toml"))
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{commit[:12]}-", dir=target.parent))
    paths = ["tests", *(["pyproject.toml"] if has_config else [])]
    try:
        with tempfile.TemporaryFile() as archive:
            done = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", commit, *paths], stdout=archive,
                                  stderr=subprocess.PIPE, check=False, timeout=600)
            if done.returncode != 0:
                raise UsageError(f"`git archive {commit} tests` in {repo} failed: "
                                 f"{done.stderr.decode(errors='replace').strip()}")
            archive.seek(0)
            with tarfile.open(fileobj=archive, mode="r:") as tar:
                tar.extractall(scratch, filter="data")
        try:
            scratch.rename(target)
        except OSError:  # another process extracted it first
            if not (target / "tests").is_dir():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


# --- which test files --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Module:
    """A module a diff touches: `path` inside its package (`diffusers/hooks/group_offloading.py`,
    `accelerate/hooks.py`), and the names that name it in a test file."""

    path: str
    dotted: str
    stem: str | None
    classes: tuple[str, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return (self.dotted, *((self.stem,) if self.stem else ()), *self.classes)


def touched_paths(diff: str, package: str = "diffusers") -> list[str]:
    """The package paths of the Python modules of `package` a diff changes (`src/diffusers/x.py` -> `diffusers/x.py`),
    in order."""
    found = []
    for old, new in DIFF_FILE.findall(diff):
        for path in (old, new):
            if path.startswith(f"src/{package}/") and path.endswith(".py") and path[len("src/"):] not in found:
                found.append(path[len("src/"):])
                break
    return found


def module(path: str, source: str | None) -> Module:
    """What names the module at `path` (inside the package): its dotted path, stem, and the public top-level classes
    of `source` (none when the source is missing or does not parse)."""
    dotted = path.removesuffix(".py").replace("/", ".").removesuffix(".__init__")
    stem = Path(path).stem
    classes: list[str] = []
    if source is not None:
        try:
            tree = ast.parse(source)
        except SyntaxError:
            tree = None
        if tree is not None:
            classes = [n.name for n in tree.body if isinstance(n, ast.ClassDef) and not n.name.startswith("_")]
    return Module(path, dotted, None if stem in GENERIC_STEMS else stem, tuple(classes))


@dataclasses.dataclass(frozen=True)
class Match:
    """A test file that names a touched module: its path in the suite (`tests/...`), whether its file name ends with
    a touched stem, how often its text names the modules, and which names it uses."""

    file: str
    by_name: bool
    mentions: int
    names: tuple[str, ...]


def defines_tests(source: str) -> bool:
    """Whether pytest collects a test from a file of this text: a top-level `test_*` function, a `Test*` class or a
    `unittest.TestCase` subclass. A helper that only holds mixins (`test_pipelines_common.py`) names modules without
    running anything itself."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return True  # pytest reports it as a collection error: worth running
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test"):
            return True
        if isinstance(node, ast.ClassDef) and (node.name.startswith("Test") or any(
                (b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "")).endswith("TestCase")
                for b in node.bases)):
            return True
    return False


def select(root: Path, modules: Sequence[Module]) -> list[Match]:
    """Every test file under `root/tests` that names one of `modules`, best first (the module docstring's rule)."""
    names = sorted({n for m in modules for n in m.names}, key=lambda n: (-len(n), n))
    stems = {m.stem for m in modules if m.stem}
    if not names:
        return []
    pattern = _named(names)
    carriers = _carriers(root, pattern)
    if carriers:
        pattern = _named([*names, *carriers])
    found = []
    for path in sorted((root / "tests").rglob("test_*.py")):
        if "__pycache__" in path.parts:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        hits = pattern.findall(text)
        if hits and defines_tests(text):
            by_name = any(path.stem == f"test_{stem}" or path.stem.endswith(f"_{stem}") for stem in stems)
            found.append(Match(path.relative_to(root).as_posix(), by_name, len(hits), tuple(sorted(set(hits)))))
    return sorted(found, key=lambda m: (not m.by_name, -m.mentions, m.file))


def _named(names: Sequence[str]) -> re.Pattern:
    """Any of `names` as a whole identifier (the longest first, so that a name never matches inside a longer one)."""
    names = sorted(set(names), key=lambda n: (-len(n), n))
    return re.compile(r"(?<!\w)(?:" + "|".join(re.escape(n) for n in names) + r")(?!\w)")


def _carriers(root: Path, pattern: re.Pattern) -> list[str]:
    """The classes of the suite's helpers (a file that defines no test: `testing_utils/cache.py`, the mixins of
    `test_pipelines_common.py`) whose own body names a touched module: a test file that uses one tests the module
    through it (`TestFluxTransformerFBCCache(..., FirstBlockCacheTesterMixin)`), so their names select it too."""
    found = []
    for path in sorted((root / "tests").rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        if not pattern.search(text) or (path.name.startswith("test_") and defines_tests(text)):
            continue
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        found += [node.name for node in tree.body if isinstance(node, ast.ClassDef) and not node.name.startswith("_")
                  and pattern.search(ast.get_source_segment(text, node) or "")]
    return found
