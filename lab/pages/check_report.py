"""The page of one `lab upstream check` (`<fix>.md` beside its `<fix>.json`): what ran, what the diff changed in its
project's own tests, what its own test showed, what ruff says of the touched files and how the test pipelines' outputs
compare."""

from __future__ import annotations

from lab.apply.projects import project
from lab.apply.test_pipelines import words
from lab.apply.upstream import Check, Outcome

#: at most this many tests are listed per kind on the page (the JSON holds them all)
SHOWN = 30


def _cell(message: str) -> str:
    return message.replace("|", "\\|").replace("\n", " ")[:200]


def _tests(title: str, outcomes: list[Outcome]) -> list[str]:
    if not outcomes:
        return []
    lines = [f"### {title} ({len(outcomes)})", "", "| test | released | with the diff | error |", "|---|---|---|---|"]
    for o in outcomes[:SHOWN]:
        lines.append(f"| `{o.id}` | {o.before} | {o.after} | {_cell(o.message)} |")
    if len(outcomes) > SHOWN:
        lines.append(f"| ... {len(outcomes) - SHOWN} more in the JSON | | | |")
    return lines + [""]


def _style(check: Check) -> list[str]:
    if check.style is None:
        return []
    st = check.style
    lines = ["## ruff", "", f"**{st.status}**: {st.reason}" + (f" ({st.ruff}; configuration: {st.config})" if st.ruff
                                                             else f" (configuration: {st.config})"), ""]
    if st.files:
        lines += ["| file | findings | formatted | released: findings, formatted |", "|---|---|---|---|"]
        for f in st.files:
            released = "new file" if f.released_findings is None else \
                f"{f.released_findings}, {'yes' if f.released_formatted else 'no'}"
            found = "; ".join(f"{x.code} line {x.line}: {_cell(x.message)}" for x in f.findings[:5]) or "0"
            lines.append(f"| `{f.file}` | {found} | {'yes' if f.formatted else 'no'} | {released} |")
        lines.append("")
    return lines


def _pipelines(check: Check) -> list[str]:
    if not check.pipelines and not check.pipelines_note:
        return []
    lines = ["## Test pipelines", ""]
    if check.pipelines:
        lines += ["Each built from the suite's `get_dummy_components()` and called with its `get_dummy_inputs()`, in "
                  "each copy in a process of its own; the outputs released against with the diff.", "",
                  "| test pipeline | pipeline | output | device | outcome |", "|---|---|---|---|---|"]
        for c in check.pipelines:
            shape = f"{c.dtype} {c.shape}" if c.shape else ""
            lines.append(f"| `{c.test}` | `{c.pipeline}` | {shape} | {c.device} | {_cell(words(c))} |")
        lines.append("")
        lines += [f"- `{c.test}`: {s}" for c in check.pipelines for s in c.stand_ins]
    if check.pipelines_note:
        lines.append(f"- {check.pipelines_note}")
    return lines + [""]


def where(check: Check) -> str:
    """Where a check's tests ran, in words: `the CPU`, or the GPU torch named (`the GPU (NVIDIA H200)`)."""
    device = check.device or "cpu"
    return f"the GPU ({device.removeprefix('cuda (')}" if device.startswith("cuda (") else (
        "the GPU" if device.startswith("cuda") else "the CPU")


def markdown(check: Check) -> str:
    suite = check.suite_ref + (f" ({check.suite_commit[:12]})" if check.suite_commit else "")
    after = f" after {', '.join(f'`{a}`' for a in check.after)}" if check.after else ""
    lines = [
        f"# Upstream check: `{check.fix}`",
        "",
        f"**{check.status}**: {check.reason}",
        "",
        f"- diff: `{check.diff}`, made from {check.project} {check.release}{after}; modules: "
        + (", ".join(f"`{m}`" for m in check.modules) or "none"),
        f"- {project(check.project).possessive} tests: {suite}"
        + (f"; {check.suite_note}" if check.suite_note else ""),
        f"- ran on {check.host}: Python {check.python}, torch {check.torch or 'n/a'}, {check.device or 'n/a'}; "
        f"{check.seconds:.0f} s in all ({check.started})" + ("; offline: `HF_HUB_OFFLINE=1`" if check.offline else ""),
    ]
    if check.missing_packages:
        lines.append(f"- missing here (the tests import them): {', '.join(f'`{m}`' for m in check.missing_packages)}")
    if check.command:
        lines.append(f"- command: `{check.command}`")
    lines.append("")
    if check.apply_error:
        lines += ["`git apply` says:", "", "```", check.apply_error, "```", ""]
    if check.test_files:
        lines += [f"## Test files ({len(check.test_files)} of {check.candidates} that name the modules)", ""]
        lines += [f"- `{f.file}` ({f.mentions} mention{'' if f.mentions == 1 else 's'}: {', '.join(f.names)})"
                  for f in check.test_files] + [""]
    if check.runs:
        keys = [k for k in check.runs[0].counts if any(r.counts.get(k) for r in check.runs)]
        lines += ["## Runs", "", "| copy | " + " | ".join(keys) + " | seconds | stopped |",
                  "|---|" + "---|" * len(keys) + "---|---|"]
        for r in check.runs:
            lines.append(f"| {r.arm} | " + " | ".join(str(r.counts.get(k, 0)) for k in keys)
                         + f" | {r.seconds:.0f} | {r.could_not_run or ''} |")
        lines.append("")
        for r in check.runs:
            for reason, n in r.skipped_because.items():
                lines.append(f"- {r.arm}: {n} skipped: {reason}")
            for e in r.collection_errors:
                lines.append(f"- {r.arm}: `{e.file}` could not be collected: {e.message}")
            for test, names in r.restored.items():
                lines.append(f"- {r.arm}: `{test}` left {', '.join(f'`{n}`' for n in names)} replaced; put back "
                             "after it, so that the tests after it ran on the torch they import")
        if any(r.collection_errors or r.skipped_because or r.restored for r in check.runs):
            lines.append("")
    if check.proof:
        lines += ["## Its own test", "", f"**{check.proof}**: {check.proof_reason}."
                  + "".join(f" `{f}`" for f in check.regression_files), ""]
        if check.proof_tests:
            lines += ["| test | released | with the diff | released failure |", "|---|---|---|---|"]
            lines += [f"| `{o.id}` | {o.before} | {o.after} | {_cell(o.message)} |" for o in check.proof_tests]
            lines.append("")
    lines += _style(check) + _pipelines(check)
    lines += _tests("Regressions: pass released, not with the diff", check.regressions)
    lines += _tests("Fixed: fail released, pass with the diff", check.fixed)
    lines += _tests("Changed otherwise", check.changed)
    lines += _tests("Failing either way", check.failing_both)
    return "\n".join(lines).rstrip() + "\n"
