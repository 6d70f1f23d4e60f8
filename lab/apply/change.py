"""`lab ab --patch`: any unified diff of diffusers source as the test arm, applied in memory and removed exactly.

A diff as `git diff` writes it in a diffusers checkout (paths `src/diffusers/...`), or as `lab diff` writes it, is
parsed, its hunks are applied to the installed diffusers' source text (nothing on disk changes), and the definitions
it changes are compiled into the live modules through a :class:`lab.apply.patching.Patcher`, as the catalog's rewrites
are. The result is a :class:`lab.apply.fix.Fix` whose `lines` name the lines the diff added: `lab ab` counts a change as
exercised when one of them runs (line coverage, `lab.apply.coverage`). Several diffs stack, in order, as one change.

Files outside the package (tests, docs) are skipped with a note. A hunk that does not apply is one error naming
the file, the hunk, the installed diffusers and the releases it would apply to (from the release wheels at hand).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import re
import traceback
import types
from collections.abc import Sequence
from pathlib import Path

from packaging.version import Version

from lab.apply import releases
from lab.apply import rewrite as rw
from lab.apply.fix import EVERY, Fix, Upstream
from lab.apply.patching import Patcher
from lab.base.errors import LabError, UsageError

HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)$")


class PatchError(UsageError):
    """A diff that cannot be read or applied."""


@dataclasses.dataclass(frozen=True)
class Hunk:
    old_start: int
    old_len: int
    new_start: int
    new_len: int
    section: str
    lines: tuple[str, ...]  # each with its prefix: " " context, "-" removed, "+" added (newline kept)

    @property
    def header(self) -> str:
        return f"@@ -{self.old_start},{self.old_len} +{self.new_start},{self.new_len} @@{self.section}"

    @property
    def old_lines(self) -> list[str]:
        return [line[1:] for line in self.lines if line[0] in " -"]


@dataclasses.dataclass(frozen=True)
class FileDiff:
    old_path: str | None  # None: the diff creates the file
    new_path: str | None  # None: the diff deletes it
    hunks: tuple[Hunk, ...]
    binary: bool = False

    @property
    def path(self) -> str:
        return self.new_path or self.old_path or "?"

    @property
    def package_path(self) -> str | None:
        """`diffusers/...py` for a file of the diffusers package (from `src/diffusers/...` or `diffusers/...`)."""
        for path in (self.old_path, self.new_path):
            if path is None:
                continue
            if path.startswith("src/diffusers/"):
                return path[len("src/"):]
            if path.startswith("diffusers/"):
                return path
        return None

    @property
    def module(self) -> str | None:
        path = self.package_path
        if path is None or not path.endswith(".py"):
            return None
        module = path[: -len(".py")].replace("/", ".")
        return module[: -len(".__init__")] if module.endswith(".__init__") else module


def _strip(path: str) -> str | None:
    path = path.split("\t")[0].strip()
    if path == "/dev/null":
        return None
    return path[2:] if path[:2] in ("a/", "b/") else path


def parse(text: str, name: str = "diff") -> list[FileDiff]:
    """The files of a unified diff, in order. Text before the first file (a commit message, `lab diff`'s header)
    is skipped, as `git apply` does."""
    files: list[FileDiff] = []
    lines = text.splitlines(True)
    i = 0
    old = new = None
    hunks: list[Hunk] = []
    binary = False
    started = False

    def close() -> None:
        if started:
            files.append(FileDiff(old, new, tuple(hunks), binary))

    while i < len(lines):
        line = lines[i]
        if line.startswith("diff --git "):
            close()
            parts = line.split()
            old, new = (_strip(parts[2]), _strip(parts[3])) if len(parts) >= 4 else (None, None)
            hunks, binary, started = [], False, True
        elif line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            if not started or hunks:
                close()
                hunks, binary = [], False
            started = True
            old, new = _strip(line[4:]), _strip(lines[i + 1][4:])
            i += 1
        elif line.startswith(("Binary files ", "GIT binary patch")) and started:
            binary = True
        elif line.startswith("@@"):
            match = HUNK.match(line.rstrip("\r\n"))
            if not match or not started:
                raise PatchError(f"{name}, line {i + 1}: `{line.strip()}` is not a hunk header of a unified diff.")
            old_start, old_len, new_start, new_len = (int(match[1]), int(match[2] or 1), int(match[3]),
                                                      int(match[4] or 1))
            body: list[str] = []
            need_old, need_new = old_len, new_len
            i += 1
            while i < len(lines) and (need_old > 0 or need_new > 0):
                raw = lines[i]
                tag = raw[0] if raw.strip("\r\n") else " "  # an editor may strip a blank context line to nothing
                if tag == "\\":
                    _no_newline(body)
                    i += 1
                    continue
                if tag not in " -+":
                    raise PatchError(f"{name}, line {i + 1}: the hunk {line.strip()} ends early (expected "
                                     f"{need_old} more old and {need_new} more new lines).")
                text_line = raw[1:] if raw.strip("\r\n") else "\n"
                body.append(tag + text_line)
                need_old -= tag in " -"
                need_new -= tag in " +"
                i += 1
            if need_old > 0 or need_new > 0:
                raise PatchError(f"{name}: the hunk {line.strip()} is cut off at the end of the file.")
            if i < len(lines) and lines[i].startswith("\\"):
                _no_newline(body)
                i += 1
            hunks.append(Hunk(old_start, old_len, new_start, new_len, match[5], tuple(body)))
            continue
        i += 1
    close()
    if not files:
        raise PatchError(f"{name} holds no file changes: is it a unified diff (`git diff` output)?")
    return files


def _no_newline(body: list[str]) -> None:
    if body:
        body[-1] = body[-1].rstrip("\r\n")


@dataclasses.dataclass
class Applied:
    """A file after some diffs: its source, and the lines (1-based, in that source) the diffs added or cut."""

    source: str
    changed: set[int]


def _same(a: str, b: str) -> bool:
    return a.rstrip("\r\n") == b.rstrip("\r\n")


def _find(old: list[str], expected: list[str], nominal: int, start: int) -> int | None:
    """Where `expected` occurs in `old` at or after `start`, nearest to `nominal` (as `patch` does, without fuzz)."""
    last = len(old) - len(expected)
    for distance in range(0, len(old) + 1):
        for at in ((nominal - distance, nominal + distance) if distance else (nominal,)):
            if start <= at <= last and all(_same(old[at + k], e) for k, e in enumerate(expected)):
                return at
        if nominal - distance < start and nominal + distance > last:
            return None
    return None


def apply(before: Applied, diff: FileDiff, where: str) -> Applied:
    """`diff` applied to `before`; raises HunkNotApplied (with `where` in its message) when a hunk does not match.
    The lines changed earlier are carried to their new numbers."""
    old = before.source.splitlines(True)
    out: list[str] = []
    line_map: dict[int, int] = {}  # old line -> new line, for the lines kept
    added: set[int] = set()
    cursor = 0
    drift = 0
    for number, hunk in enumerate(diff.hunks, 1):
        expected = hunk.old_lines
        nominal = (hunk.old_start - 1 if hunk.old_len else hunk.old_start) + drift
        at = _find(old, expected, max(nominal, cursor), cursor)
        if at is None:
            raise HunkNotApplied(diff, number, hunk, old, nominal, where)
        drift = at - (hunk.old_start - 1 if hunk.old_len else hunk.old_start)
        for k in range(cursor, at):
            line_map[k + 1] = len(out) + 1
            out.append(old[k])
        k = at
        cut = False
        for line in hunk.lines:
            tag, text = line[0], line[1:]
            if tag == " ":
                line_map[k + 1] = len(out) + 1
                out.append(old[k])
                k += 1
                if cut:  # the line after removed lines stands for them
                    added.add(len(out))
                    cut = False
            elif tag == "-":
                k += 1
                cut = True
            else:
                out.append(text)
                added.add(len(out))
                cut = False
        if cut and out:
            added.add(len(out))
        cursor = k
    for k in range(cursor, len(old)):
        line_map[k + 1] = len(out) + 1
        out.append(old[k])
    for i, line in enumerate(out[:-1]):  # a "no newline at end of file" line that is no longer last
        if not line.endswith("\n"):
            out[i] = line + "\n"
    changed = {line_map[n] for n in before.changed if n in line_map} | added
    return Applied("".join(out), changed)


class HunkNotApplied(PatchError):
    def __init__(self, diff: FileDiff, number: int, hunk: Hunk, old: list[str], nominal: int, where: str) -> None:
        self.diff, self.number, self.hunk = diff, number, hunk
        at = min(max(nominal, 0), len(old))
        mismatch = ""
        for k, e in enumerate(hunk.old_lines):
            found = old[at + k] if at + k < len(old) else None
            if found is None or not _same(found, e):
                shown = "the end of the file" if found is None else f"`{found.strip()}`"
                mismatch = f" At line {at + k + 1} the diff expects `{e.strip()}` and finds {shown}."
                break
        super().__init__(f"hunk {number} of {len(diff.hunks)} for {diff.path} ({hunk.header.strip()}) does not apply "
                         f"to {where}.{mismatch}")


def nearest_releases(diff: FileDiff, installed: str) -> str:
    """Which release wheels at hand the file's diff applies to, nearest to `installed` first; a sentence."""
    wheels = releases.release_wheels()
    path = diff.package_path
    if not wheels or path is None:
        folders = ", ".join(str(p) for p in releases.wheel_dirs())
        return f" No release wheels to check it against in {folders} (set LAB_WHEELS to a folder of diffusers wheels)."
    fits = []
    for version, wheel in wheels.items():
        source = releases.module_source(wheel, path)
        if source is None:
            continue
        try:
            apply(Applied(source, set()), diff, str(version))
        except PatchError:
            continue
        fits.append(version)
    here = Version(installed)
    checked = f"of the {len(wheels)} release wheels at hand ({', '.join(str(v) for v in wheels)})"
    if not fits:
        return f" It applies to none {checked}: rebase it on the installed diffusers."
    fits.sort(key=lambda v: (abs(_ordinal(v, wheels) - _ordinal(here, wheels)), v))
    return (f" It applies to diffusers {fits[0]}" + (f" (and {', '.join(str(v) for v in fits[1:])})" if fits[1:] else "")
            + f", {checked}: run with `--test-diffusers {fits[0]}`, or rebase it.")


def _ordinal(version: Version, known: dict[Version, Path]) -> int:
    ordered = sorted(set(known) | {version})
    return ordered.index(version)


# --- the diff as a fix ------------------------------------------------------------------------------------------


def patch_name(paths) -> str:
    """`patch-<stem>[-<stem>..]`: what result names and reports call a change given as the diffs at `paths`."""
    stems = [re.sub(r"[^A-Za-z0-9_.-]", "_", Path(p).stem) for p in paths]
    return "patch-" + "-".join(stems)


@dataclasses.dataclass(frozen=True)
class Patches:
    """What `--patch` files change: one stacked change, with what it skipped and what it would install."""

    paths: tuple[str, ...]
    modules: dict[str, Applied]
    skipped: tuple[str, ...]
    digest: str

    @property
    def name(self) -> str:
        """`patch-<stem>[-<stem>..]`: what result names and reports call the change."""
        return patch_name(self.paths)

    def to_dict(self) -> dict:
        return {"paths": list(self.paths), "sha256": self.digest, "skipped": list(self.skipped),
                "modules": {m: sorted(a.changed) for m, a in self.modules.items()}}


def read(paths: Sequence[str | Path]) -> Patches:
    """Parse and apply `paths` in order to the installed diffusers' sources (in memory)."""
    from lab.apply.versions import diffusers_version

    version = str(diffusers_version())
    modules: dict[str, Applied] = {}
    skipped: list[str] = []
    digest = hashlib.sha256()
    resolved = [Path(p).resolve() for p in paths]
    twice = sorted({str(p) for p, r in zip(paths, resolved) if resolved.count(r) > 1})
    if twice:
        raise PatchError(f"`--patch {twice[0]}` is given twice: each diff is applied once (several diffs stack in the "
                         "order given).")
    for p in paths:
        path = Path(p)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as e:
            raise UsageError(f"Cannot read the diff {path}: {e.strerror or e}.") from None
        except UnicodeDecodeError:
            raise PatchError(f"{path} is not a text diff.") from None
        digest.update(text.encode())
        for diff in parse(text, str(path)):
            module = diff.module
            if diff.package_path is None:
                skipped.append(f"{diff.path} (outside the diffusers package)")
                continue
            if module is None:
                skipped.append(f"{diff.path} (not Python source)")
                continue
            if diff.binary:
                raise PatchError(f"{path}: {diff.path} is a binary change; the lab applies source diffs only.")
            if diff.old_path is None:
                raise PatchError(f"{path} creates {diff.path}; a new module cannot be added to the installed "
                                 "diffusers at run time. Make a checkout with the change and run `lab ab "
                                 "--test-diffusers /path/to/checkout`.")
            if diff.new_path is None:
                raise PatchError(f"{path} deletes {diff.path}; that cannot be applied at run time.")
            if diff.old_path != diff.new_path:
                raise PatchError(f"{path} renames {diff.old_path} to {diff.new_path}; a module cannot be renamed in "
                                 "the installed diffusers at run time. Make a checkout with the change and run `lab ab "
                                 "--test-diffusers /path/to/checkout`.")
            if module not in modules:
                modules[module] = Applied(_installed_source(module, diff, version), set())
            where = f"the installed diffusers {version}"
            try:
                modules[module] = apply(modules[module], diff, where)
            except HunkNotApplied as e:
                raise PatchError(f"{path}: {e}{nearest_releases(diff, version)}") from None
    if not modules:
        raise PatchError(f"{', '.join(str(p) for p in paths)} change(s) no diffusers source"
                         + (f" (skipped: {'; '.join(skipped)})" if skipped else "") + ".")
    return Patches(tuple(str(p) for p in paths), modules, tuple(skipped), digest.hexdigest())


def _installed_source(module: str, diff: FileDiff, version: str) -> str:
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError:
        raise PatchError(f"diffusers {version} has no {diff.path} (module `{module}`): the diff was made against "
                         f"another diffusers.{nearest_releases(diff, version)}") from None
    with open(mod.__file__, encoding="utf-8") as f:
        return f.read()


def _code_objects(value: object) -> list[types.CodeType]:
    """The code objects of a compiled definition (methods of a class attribute, nested code included)."""
    func = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
    if isinstance(func, property):
        return [c for f in (func.fget, func.fset, func.fdel) if f is not None for c in _code_objects(f)]
    codes, seen = [], set()
    while func is not None and id(func) not in seen:  # through decorators: `__wrapped__`, else the closure's function
        seen.add(id(func))
        code = getattr(func, "__code__", None)
        if code is not None:
            codes.append(code)
        inner = getattr(func, "__wrapped__", None)
        if inner is None:
            cells = [c.cell_contents for c in getattr(func, "__closure__", None) or () if _filled(c)]
            inner = next((f for f in cells if isinstance(f, types.FunctionType)), None)
        func = inner
    out, todo = [], codes
    while todo:
        c = todo.pop()
        out.append(c)
        todo += [k for k in c.co_consts if isinstance(k, types.CodeType)]
    return out


def _filled(cell) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


def as_fix(patches: Patches) -> Fix:
    """The change as a fix: its definitions compiled once, installed through the patcher, and the changed lines
    that hold code (with the first line of each changed definition that holds none: its call counts)."""
    installs: list[tuple[types.ModuleType, str | None, str, object]] = []
    lines: list[tuple[str, tuple[int, ...]]] = []
    for module_name, applied in patches.modules.items():
        module = importlib.import_module(module_name)
        with open(module.__file__, encoding="utf-8") as f:
            original = f.read()
        pseudo = f"{module.__file__} [lab patch: {patches.name}]"
        try:
            definitions = rw.compile_definitions(module, applied.source, pseudo, old_source=original,
                                                 allow_imports=True)
        except SyntaxError as e:
            raise PatchError(f"{', '.join(patches.paths)}: {module_name} does not compile after the diff: {e.msg} "
                             f"(line {e.lineno} of the changed module).") from None
        except LabError as e:
            raise PatchError(f"{', '.join(patches.paths)}: {module_name}: {e} Make a checkout with the change and run "
                             "`lab ab --test-diffusers /path/to/checkout` instead.") from None
        except Exception as e:  # defining what the diff changed fails: a name it uses that the module lacks, ...
            line = next((f.lineno for f in reversed(traceback.extract_tb(e.__traceback__)) if f.filename == pseudo),
                        None)
            raise PatchError(f"{', '.join(patches.paths)}: {module_name} fails when the definitions the diff changes "
                             f"are made: {type(e).__name__}: {e}" + (f" (line {line} of the changed module)" if line
                                                                      else "") + ".") from None
        executable: set[int] = set()
        firsts: dict[int, set[int]] = {}
        for (owner, name), value in definitions.items():
            installs.append((module, owner, name, value))
            for code in _code_objects(value):
                if code.co_filename != pseudo:  # a decorator's wrapper, defined elsewhere
                    continue
                body = {line for _, _, line in code.co_lines() if line is not None}
                executable |= body
                firsts[code.co_firstlineno] = body
        hit = applied.changed & executable
        for first, body in firsts.items():  # a changed definition with no changed code line: its call counts
            end = max(body, default=first)
            if not hit & set(range(first, end + 1)) and applied.changed & set(range(first, end + 1)):
                hit.add(first)
        if hit:
            lines.append((pseudo, tuple(sorted(hit))))

    def install(patcher: Patcher) -> None:
        for module, owner, name, value in installs:
            target = getattr(module, owner) if owner else module
            patcher.setattr(target, name, value)

    names = sorted({f"{m.__name__}:{f'{o}.' if o else ''}{n}" for m, o, n, _ in installs})
    return Fix(name=patches.name, description=f"the change in {', '.join(patches.paths)}",
               upstream=Upstream(refs=tuple(patches.paths), note="a diff given to `lab ab --patch`"),
               pipelines=EVERY, install=install, runtime_targets=tuple(names), lines=tuple(lines))


def load(paths: Sequence[str | Path]) -> tuple[Fix, Patches]:
    """`--patch` files as one fix, and what they change."""
    patches = read(paths)
    return as_fix(patches), patches
