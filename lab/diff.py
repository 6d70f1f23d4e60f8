"""`lab diff`: a fix's rewrites as a unified diff that `git apply` takes in a diffusers checkout."""

from __future__ import annotations

import difflib

from lab.errors import UsageError
from lab.fix import Fix, rewritten_sources
from lab.versions import diffusers_version


def unified_diff(old: str, new: str, path: str) -> str:
    """A git-style unified diff of one file (`path` relative to the repository root); "" when unchanged."""
    if old == new:
        return ""
    lines = difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{path}", f"b/{path}", n=3)
    return f"diff --git a/{path} b/{path}\n" + "".join(lines)


def fix_diff(fix: Fix) -> str:
    """The upstream diff for `fix` against the installed diffusers, with a header naming the fix and release."""
    if not fix.rewrites:
        raise UsageError(
            f"`{fix.name}` is a runtime patch ({', '.join(fix.runtime_targets)}) with no source change, so it has "
            "no upstream diff. Apply it in your own code instead."
        )
    results = rewritten_sources([fix])
    version = diffusers_version()
    body = "".join(unified_diff(r.old_source, r.new_source, "src/" + m.replace(".", "/") + ".py") for m, r in results.items())
    if not body:
        raise UsageError(f"`{fix.name}` changes nothing in diffusers {version}: {fix.summary_status()}.")
    header = [
        f"# lab fix: {fix.name} - {fix.description}",
        f"# made from diffusers {version}: `git apply` it in a diffusers checkout of v{version}",
        f"# upstream: {', '.join(fix.upstream.refs)}"
        + (f"; first released in {fix.upstream.since}" if fix.upstream.since else "; not upstream"),
    ]
    return "\n".join(header) + "\n" + body
