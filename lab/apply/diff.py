"""`lab diff`: a fix's rewrites as a unified diff that `git apply` takes in a diffusers checkout."""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Sequence

from lab.apply import releases
from lab.apply.fix import Fix, repo_path, rewrite, rewritten_sources
from lab.apply.versions import diffusers_version
from lab.base.errors import UsageError


def unified_diff(old: str, new: str, path: str, context: int = 3) -> str:
    """A git-style unified diff of one file (`path` relative to the repository root); "" when unchanged.

    Uses difflib's matcher without its "popular line" heuristic, which in a long file treats lines such as
    `else:` as junk and then shows them as removed and re-added.
    """
    if old == new:
        return ""
    a, b = old.splitlines(True), new.splitlines(True)
    out = [f"diff --git a/{path} b/{path}\n", f"--- a/{path}\n", f"+++ b/{path}\n"]
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for group in matcher.get_grouped_opcodes(context):
        i1, i2, j1, j2 = group[0][1], group[-1][2], group[0][3], group[-1][4]
        out.append(f"@@ -{_range(i1, i2)} +{_range(j1, j2)} @@\n")
        for tag, a1, a2, b1, b2 in group:
            if tag == "equal":
                out += [" " + line for line in a[a1:a2]]
                continue
            out += ["-" + line for line in a[a1:a2]]
            out += ["+" + line for line in b[b1:b2]]
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in out)


def _range(start: int, stop: int) -> str:
    """A hunk range as unified diffs write it (1-based start, length; an empty range starts one line earlier)."""
    length = stop - start
    first = start + 1 if length else start
    return f"{first},{length}"


def release_diff(fix: Fix | Sequence[Fix], version: str) -> tuple[str, list[str]]:
    """The upstream diff for `fix` (or for several fixes at once, their rewrites composed in the order given) against
    diffusers release `version` (its source read from the release wheel, not imported), and a note per site left out:
    already upstream there, missing, or not in the expected shape."""
    from packaging.version import Version

    wheel = releases.find_wheel(version)
    by_module: dict[str, list] = {}
    notes: list[str] = []
    for r in [r for f in ([fix] if isinstance(fix, Fix) else fix) for r in f.rewrites]:
        if r.upstream_since and Version(version) >= Version(r.upstream_since):
            notes.append(f"{r.path}: already upstream in {version} (since {r.upstream_since})")
            continue
        by_module.setdefault(r.module, []).append(r)
    body = []
    for module, rewrites in by_module.items():
        path = repo_path(module)
        source = releases.module_source(wheel, path[len("src/"):])
        if source is None:
            notes.append(f"{path}: not in diffusers {version}")
            continue
        result = rewrite(source, tuple(r.codemod for r in rewrites), path)
        if result.warnings:
            notes.append(f"{path}: not in the expected shape in {version} ({' '.join(result.warnings)})")
            continue
        if not result.changed:
            notes.append(f"{path}: diffusers {version} already has the change")
            continue
        body.append(unified_diff(result.old_source, result.new_source, path))
    return "".join(body), notes


def fix_diff(fix: Fix) -> str:
    """The upstream diff for `fix` against the installed diffusers, with a header naming the fix and release."""
    if not fix.rewrites:
        raise UsageError(
            f"`{fix.name}` is a runtime patch ({', '.join(fix.runtime_targets)}) with no source change, so it has "
            "no upstream diff. Apply it in your own code instead."
        )
    results = rewritten_sources([fix])
    version = diffusers_version()
    body = "".join(unified_diff(r.old_source, r.new_source, repo_path(m)) for m, r in results.items())
    if not body:
        raise UsageError(f"`{fix.name}` changes nothing in diffusers {version}: {fix.summary_status()}.")
    header = [
        f"# lab fix: {fix.name} - {fix.description}",
        f"# made from diffusers {version}: `git apply` it in a diffusers checkout of v{version}",
        f"# upstream: {', '.join(fix.upstream.refs) or 'none'}"
        + (f"; first released in {fix.upstream.since}" if fix.upstream.since else "; not upstream"),
    ]
    return "\n".join(header) + "\n" + body


HUNK = re.compile(r"^@@ -(\d+),(\d+) ")


def hunks(diff: str) -> dict[str, list[tuple[range, list[float]]]]:
    """Each hunk of a unified diff by file: the old file's lines it reads (context included, 0-based) and where it
    changes them: a removed line at its index, lines added between two old lines at the half between them."""
    found: dict[str, list[tuple[range, list[float]]]] = {}
    path, line, edits = "", 0, []
    for text in diff.splitlines():
        if text.startswith("diff --git a/"):
            path = text[len("diff --git a/"):].split(" ", 1)[0]
        elif match := HUNK.match(text):
            first = int(match[1]) - (1 if int(match[2]) else 0)
            line, edits = first, []
            found.setdefault(path, []).append((range(first, first + int(match[2])), edits))
        elif text.startswith("-") and not text.startswith("---"):
            edits.append(line)
            line += 1
        elif text.startswith("+") and not text.startswith("+++"):
            edits.append(line - 0.5)
        elif text.startswith(" "):
            line += 1
    return found


def collide(a: str, b: str) -> list[str]:
    """The files where one of two diffs of the same release changes lines the other reads (changes or holds as
    context): `git apply` of the second after the first fails there, since its hunk no longer matches."""
    hunks_a, hunks_b = hunks(a), hunks(b)

    def inside(edits: list[float], lines: range) -> bool:
        return any(lines.start - 0.5 < e < lines.stop - 0.5 for e in edits)

    return sorted(path for path in hunks_a.keys() & hunks_b.keys()
                  if any(inside(edits, lines) for lines, _ in hunks_b[path] for _, edits in hunks_a[path])
                  or any(inside(edits, lines) for lines, _ in hunks_a[path] for _, edits in hunks_b[path]))


def together_name(a: Fix, b: Fix) -> str:
    """The file name of the diff of two colliding fixes at once: `together/<first>--<second>.diff`, by name."""
    first, second = sorted((a.name, b.name))
    return f"together/{first}--{second}.diff"


def collisions(fix: Fix, body: str, version: str) -> list[tuple[Fix, list[str]]]:
    """The other fixes whose diff against `version` changes or reads the same lines as `body` (`fix`'s diff), with
    the files where they do: only fixes that rewrite one of the same modules are diffed."""
    from lab.apply.fix import catalog

    modules = {r.module for r in fix.rewrites}
    found = []
    for other in sorted(catalog().values(), key=lambda f: f.name):
        if other.name == fix.name or not modules & {r.module for r in other.rewrites}:
            continue
        other_body, _ = _release_diff_of(other, version, str(releases.find_wheel(version)))
        if files := collide(body, other_body):
            found.append((other, files))
    return found


@functools.lru_cache(maxsize=256)
def _release_diff_of(fix: Fix, version: str, wheel: str) -> tuple[str, list[str]]:
    """`release_diff` of one catalog fix, once per process and wheel: each PR page diffs every other fix of its
    modules, so a page of every fix would otherwise rewrite the same release sources again for each."""
    return release_diff(fix, version)


def together_diff(a: Fix, b: Fix, version: str) -> str:
    """Two colliding fixes as one diff against `version`, their rewrites composed as the lab runs them together."""
    first, second = sorted((a, b), key=lambda f: f.name)
    body, _ = release_diff([first, second], version)
    return "\n".join([f"# lab fixes: {first.name} and {second.name}, together (their diffs change the same lines)",
                      f"# made from diffusers {version}: `git apply` it in a diffusers checkout of v{version}"]) + \
        "\n" + body
