"""What a pull request for a fix needs: the diff against the newest release, what it changes and why, and what the
lab measured (the committed results of the fix alone), as `patches/pr/<fix>.{diff,md}`."""

from __future__ import annotations

import importlib
import os
from pathlib import Path

from lab import results
from lab.apply import releases
from lab.apply.diff import collisions, release_diff, together_diff, together_name
from lab.apply.fix import Fix
from lab.apply.regression import new_file_diff, regression_of
from lab.apply.style import style_diff
from lab.apply.upstream import committed
from lab.base.errors import UsageError
from lab.pages.report import interval_text


def _conflict(a, b) -> bool:
    """Whether two fixes are declared to conflict (either names the other in its `conflicts`)."""
    return a.name in b.conflicts or b.name in a.conflicts


def _why(fix: Fix) -> str:
    """The fix module's docstring: the explanation a reviewer reads first."""
    try:
        doc = importlib.import_module(f"fixes.{fix.name}").__doc__ or ""
    except ImportError:
        doc = ""
    return doc.strip() or fix.description


def _touched(diff: str) -> list[str]:
    files, added, removed = [], {}, {}
    current = None
    for line in diff.splitlines():
        if line.startswith("+++ b/"):
            current = line[len("+++ b/"):]
            files.append(current)
            added[current] = removed[current] = 0
        elif current and line.startswith("+") and not line.startswith("+++"):
            added[current] += 1
        elif current and line.startswith("-") and not line.startswith("---"):
            removed[current] += 1
    return [f"`{f}` (+{added[f]} -{removed[f]})" for f in files]


def measured(fix: Fix, results_dir: Path, page_dir: Path) -> list[str]:
    """Table rows of the committed GPU results of the fix alone."""
    rows = []
    for path, r in results.all_results(results_dir / "ab"):
        if r.fixes != [fix.name] or r.base or not results.on_gpu(r) or not r.stats:  # alone, against upstream
            continue
        m = (r.profile or {}).get("metrics") or {}

        def change(key: str, scale: float = 1.0, unit: str = "") -> str:
            if key not in m or m[key].get("control") is None:
                return "n/a"
            return f"{m[key]['control'] / scale:,.1f}{unit} -> {m[key]['test'] / scale:,.1f}{unit}"

        link = os.path.relpath(path.with_suffix(".md"), page_dir)
        size = r.size + (f", {r.layers} blocks" if r.layers else "") + "".join(f", in {s}" for s in r.settings)
        rows.append(f"| {r.scenario} | {r.mode} | {size} "
                    f"| [{r.verdict_text}]({link}) | {interval_text(r.stats)} | {change('syncs')} | "
                    f"{change('gpu_idle_us', 1e3, ' ms')} | {r.environment.gpu} |")
    return sorted(rows)


def _checked(fix: Fix, reports: list, page_dir: Path) -> list[str]:
    """What diffusers' own tests said of the diff, from its committed `lab upstream check` reports (`../checks/`, and
    `../checks/gpu/` where the check also ran on a GPU: `reports`, as `lab.apply.upstream.committed` reads them)."""
    from lab.pages.check_report import where

    if not reports:
        return ["## diffusers' own tests", "", f"Not checked yet: `lab upstream check --fix {fix.name}`.", ""]
    lines = ["## diffusers' own tests", ""]
    for path, check in reports:
        link = os.path.relpath(path.with_suffix(".md"), page_dir)
        lines += [f"**{check.status}** ([report]({link}), tests of {check.suite_ref} on {where(check)}): "
                  f"{check.reason}.", ""]
        lines += [*_style(check), *_pipelines(check)]
        if check.regressions:
            why = (f"The change is meant to change what the code computes ({fix.changes_outputs}): each of these "
                   "asserts what it changes, and must change with it in the pull request." if fix.changes_outputs
                   else "Each is a regression to mend before a pull request.")
            lines += [*[f"- `{o.id}`: {o.message.splitlines()[0][:160] if o.message else o.after}"
                        for o in check.regressions], "", why, ""]
    return lines


def _style(check) -> list[str]:
    """What ruff said of the touched files with the diff (the report's style step)."""
    if check.style is None or check.style.status == "not run":  # ruff is judged where it is installed
        return []
    return [f"ruff: **{check.style.status}** ({check.style.reason}; {check.style.ruff or 'ruff'}, "
            f"{check.style.config}).", ""]


def _pipelines(check) -> list[str]:
    """The test pipelines' outputs, released against with the diff (the report's second stage)."""
    from lab.apply.test_pipelines import words

    if not check.pipelines:
        return [f"Test pipelines: {check.pipelines_note}.", ""] if check.pipelines_note else []
    lines = [f"Test pipelines (diffusers' tiny ones, `get_dummy_components()` / `get_dummy_inputs()`, on "
             f"{check.pipelines[0].device or 'the CPU'}), released against with the diff:", ""]
    for c in check.pipelines:
        stand_ins = f"; {'; '.join(c.stand_ins)}" if c.stand_ins else ""
        lines.append(f"- `{c.test}` (`{c.pipeline}`): {words(c)}{stand_ins}")
    return lines + ([f"- {check.pipelines_note}"] if check.pipelines_note else []) + [""]


def _regression(fix: Fix, test, reports: list) -> list[str]:
    """What the page says of the regression test the diff carries (`fixes/regressions/<fix>.py`)."""
    if test is None:
        return ["## Its test", "", f"The diff carries no regression test yet: `fixes/regressions/{fix.name}.py` would "
                "hold it (the first line names where it lands in diffusers).", ""]
    from lab.apply.upstream import proving
    from lab.pages.check_report import where

    lines = ["## Its test", "", f"The diff adds `{test.path}`, meant to fail on the release without the change and pass "
             f"with it; not run both ways yet: `lab upstream check --fix {fix.name}`."]
    check = proving([c for _, c in reports])
    if check is not None and check.proof:
        lines[-1] = f"The diff adds `{test.path}`. `lab upstream check` ran it both ways " \
            f"(on {where(check)}): **{check.proof}**: {check.proof_reason}."
    return lines + [""]


def _overlaps(overlaps) -> list[str]:
    """What the page says of the upstream pull requests the change overlaps (`Upstream.overlaps`)."""
    if overlaps is None:
        return ["Overlapping upstream pull requests: not searched for yet."]
    if not overlaps:
        return ["Overlapping upstream pull requests: none found (searched by the files and functions it changes)."]
    return ["Overlapping upstream pull requests (found by the files and functions it changes):", "",
            *[f"- {o.ref} ({o.state}): {o.differs}" for o in overlaps]]


def pr_files(fix: Fix, version: str, results_dir: Path, page_dir: Path) -> tuple[str, str, dict[str, str]]:
    """(the diff, the description, and by file name the diff of `fix` together with each fix whose diff collides
    with it) for a pull request of `fix` against diffusers `version`."""
    body, notes = release_diff(fix, version)
    if not body:
        raise UsageError(f"`{fix.name}` changes nothing in diffusers {version}: " + "; ".join(notes) + ".")
    body, styled = _styled(body, version)
    header = [f"# lab fix: {fix.name} - {fix.description}",
              f"# made from diffusers {version}: `git apply` it in a diffusers checkout of v{version}",
              f"# upstream: {', '.join(fix.upstream.refs) or 'none'}"
              + (f"; first released in {fix.upstream.since}" if fix.upstream.since else "; not upstream")]
    test = regression_of(fix.name)
    reports = committed(page_dir.parent / "checks", fix.name)
    diff = "\n".join(header) + "\n" + body + (new_file_diff(test.path, test.source) if test else "")
    rows = measured(fix, results_dir, page_dir)
    text = [f"# `{fix.name}`: {fix.description}", "",
            f"Against diffusers {version}: `git apply {fix.name}.diff` in a checkout of v{version}. Touches "
            + ", ".join(_touched(body)) + ".", "",
            "The lines the diff adds are formatted as diffusers' `make style` formats them (`ruff format` of those "
            "lines with diffusers' ruff configuration)" + (": except" if styled else "."), "",
            *([f"- {n}" for n in styled] + [""] if styled else []),
            "## Why", "", _why(fix), "", *_regression(fix, test, reports)]
    if notes:
        text += ["Sites left out of this diff:", "", *[f"- {n}" for n in notes], ""]
    found = collisions(fix, body, version)
    instead = [(other, files) for other, files in found if _conflict(fix, other)]
    found = [(other, files) for other, files in found if not _conflict(fix, other)]
    if instead:
        text += ["## Instead of another diff", "",
                 "These rewrite the same code another way and the lab never runs them together with this one (the fixes "
                 "declare the conflict): upstream takes one of the two, so no diff of both is made:", "",
                 *[f"- `{other.name}` ({', '.join(f'`{f}`' for f in files)})" for other, files in instead], ""]
    if found:
        text += ["## With the other diffs", "",
                 "These change or read the same lines, so `git apply` takes only one of the two; the diff that makes "
                 "both changes at once (the two rewrites composed, as the lab runs them together) is beside this one:",
                 "", *[f"- `{other.name}` ({', '.join(f'`{f}`' for f in files)}): `{together_name(fix, other)}`"
                       for other, files in found], ""]
    text += [*_checked(fix, reports, page_dir), "## Measured by the fix lab", ""]
    if rows:
        text += ["Each row is one `lab ab` of the fix alone (true-size configs with random weights, 4 steps; "
                 "interleaved, counterbalanced blocks; the verdict is read off the interval shown; syncs and GPU "
                 "idle per call from the paired profiles). Measured on diffusers 0.37.1 with the fix applied by "
                 "the lab; the diff above is the same change against the newest release.", "",
                 "| pipeline | mode | size | verdict | ratio [interval] | syncs per call | GPU idle per call | GPU |",
                 "|---|---|---|---|---|---|---|---|", *rows, ""]
    else:
        text += ["No GPU result of the fix alone is committed yet: run `lab ab --fix "
                 f"{fix.name} --pipeline PIPELINE{f' --setting {fix.setting}' if fix.setting else ''}` on a GPU.", ""]
    text += [f"Upstream: {', '.join(fix.upstream.refs) or 'none'}" + (f"; {fix.upstream.note}" if fix.upstream.note else "")
             + ".", "", *_overlaps(fix.upstream.overlaps),
             "", f"Made by `lab diff --fix {fix.name} --pr --against {version}`.", ""]
    joint = {}
    for other, _ in found:
        head, sep, rest = together_diff(fix, other, version).partition("diff --git ")
        joint[together_name(fix, other)] = head + (_styled(sep + rest, version)[0] if sep else "")
    return diff, "\n".join(text), joint


def _styled(body: str, version: str) -> tuple[str, list[str]]:
    """`body` with the lines it adds formatted as diffusers' `make style` formats them (`lab.apply.style`), and a
    note per file left as the rewrite wrote it."""
    wheel = releases.find_wheel(version)
    return style_diff(body, lambda path: releases.module_source(wheel, path))
