"""The documentation follows the code: docs/commands.md has a section for every subcommand, every `lab ...` example in
it and in the README parses with the lab's own parser, every relative link of the README, the reference and the
summary of FINDINGS leads to a file (and heading) that exists, the committed docs/fixes.md is what `lab table` writes,
and the README stays a page a newcomer reads in ten minutes, its Layout in its first half."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from lab.commands import ORDER
from tests.conftest import ROOT

README = ROOT / "README.md"
COMMANDS = ROOT / "docs" / "commands.md"
FINDINGS = ROOT / "results" / "FINDINGS.md"

#: the README's longest: what a newcomer reads in ten minutes; the reference is docs/commands.md
README_LINES = 300
#: pages another change writes, which the README links before they exist
PENDING = {ROOT / "docs" / "adding-a-fix.md"}
#: a word standing for what the reader puts there (`<fix>`, `...`): such a line is an example of a form, not a command
PLACEHOLDER = re.compile(r"<[^<>\s]+>|\.\.\.")


def examples(path: Path, root: Path = ROOT) -> list[tuple[str, list[str]]]:
    """Each `lab ...` command of the ```bash blocks of a page, as (`page:line`, its arguments after `lab`): comments
    and `VAR=value` prefixes left out, `\\` continuations joined, and each command of a `&&`, `;` or `|` list apart.
    The program may be `lab`, `.venv/bin/lab` or `python -m lab`."""
    found, block, start, joined = [], False, 0, ""
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith("```"):
            block = line.strip() == "```bash"
            continue
        if not block:
            continue
        if not joined:
            start = number
        joined += line
        if joined.endswith("\\"):
            joined = joined[:-1] + " "
            continue
        command, joined = joined, ""
        lexer = shlex.shlex(command, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split, lexer.commenters = True, "#"
        words, part = list(lexer), []
        for word in words + [";"]:
            if word and set(word) <= set(";&|"):
                argv = command_of(part)
                if argv is not None:
                    found.append((f"{path.relative_to(root)}:{start}", argv))
                part = []
            else:
                part.append(word)
    return found


def command_of(words: list[str]) -> list[str] | None:
    """The arguments after the program when `words` run the lab, else None."""
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):
        words = words[1:]
    if words[:1] and (words[0] == "lab" or words[0].endswith("/lab")):
        return words[1:]
    if words[:3] == ["python", "-m", "lab"] or words[:3] == [".venv/bin/python", "-m", "lab"]:
        return words[3:]
    return None


def all_examples() -> list[tuple[str, list[str]]]:
    return examples(README) + examples(COMMANDS)


def test_every_subcommand_has_its_section_and_examples():
    text = COMMANDS.read_text()
    headings = re.findall(r"^## `lab (\w+)[` ]", text, re.M)
    assert sorted(headings) == sorted(ORDER), f"sections for {sorted(set(ORDER) - set(headings))} missing, " \
                                              f"or for {sorted(set(headings) - set(ORDER))} no longer subcommands"
    assert headings == list(ORDER), "docs/commands.md lists the subcommands in the order `lab --help` does"
    shown = {argv[0] for where, argv in examples(COMMANDS) if argv}
    assert set(ORDER) <= shown, f"no example of {sorted(set(ORDER) - shown)} in docs/commands.md"


@pytest.fixture(scope="module")
def parser():
    from lab.cli import build_parser

    return build_parser()


@pytest.mark.parametrize("where,argv", all_examples(), ids=lambda v: v if isinstance(v, str) else None)
def test_each_example_parses(where, argv, parser, capsys):
    if any(PLACEHOLDER.search(word) for word in argv):
        pytest.skip(f"{where}: a placeholder stands in it ({' '.join(argv)})")
    try:
        parser.parse_args(argv)
    except SystemExit as e:
        pytest.fail(f"{where}: `lab {' '.join(argv)}` does not parse ({e.code}): {capsys.readouterr().err.strip()}")


def test_the_examples_are_found(tmp_path):
    """The collector sees what a reader sees: a comment, a `VAR=` prefix, a command list, a continuation and the
    program's other spellings; prose, other programs and other blocks are not commands."""
    page = tmp_path / "page.md"
    page.write_text("lab fixes --json\n"
                    "```bash\n"
                    "lab fixes --json            # the catalog\n"
                    "LAB_WHEELS=.releases lab census --diffusers 0.42.1\n"
                    "cd ~/lab && .venv/bin/lab ab --fix all --pipeline wan | tail -1\n"
                    "lab history --pipeline wan \\\n"
                    "    --reference 0.37.1\n"
                    "python -m lab table --restat; git status\n"
                    "```\n"
                    "```text\n"
                    "lab run --pipeline wan\n"
                    "```\n")
    found = [(where.split(":")[-1], argv) for where, argv in examples(page, root=tmp_path)]
    assert found == [("3", ["fixes", "--json"]), ("4", ["census", "--diffusers", "0.42.1"]),
                     ("5", ["ab", "--fix", "all", "--pipeline", "wan"]),
                     ("6", ["history", "--pipeline", "wan", "--reference", "0.37.1"]), ("8", ["table", "--restat"])]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but `-` and `_` dropped, each space a `-`."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    block = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            block = not block
        m = None if block else re.match(r"#{1,6} (.+)", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(text: str) -> list[str]:
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    return re.findall(r"\]\(([^)\s]+)\)", text)


def summary_of_findings() -> str:
    text = FINDINGS.read_text()
    start = text.index("\n## Summary")
    return text[start:text.index("\n## ", start + 5)]


@pytest.mark.parametrize("page", ["README.md", "docs/commands.md", "results/FINDINGS.md (summary)"])
def test_relative_links_lead_somewhere(page):
    path = FINDINGS if page.startswith("results/FINDINGS") else ROOT / page
    text = summary_of_findings() if path == FINDINGS else path.read_text()
    broken = []
    for link in links(text):
        if re.match(r"[a-z]+:", link):
            continue
        target, _, anchor = link.partition("#")
        target_path = (path.parent / target).resolve() if target else path
        if target_path in PENDING and not target_path.exists():
            continue
        if not target_path.exists():
            broken.append(link)
        elif anchor and target_path.suffix == ".md" and anchor not in anchors(target_path):
            broken.append(f"{link} (no such heading)")
    assert not broken, f"{page}: {broken}"


@pytest.mark.slow  # reading a result loads the statistics (scipy)
def test_the_summary_of_findings_quotes_its_results():
    """Each row of the summary that links an A/B result quotes the verdict and the interval that result holds, in the
    words and digits results/README.md prints them: the summary cannot drift from the measurement."""
    from lab import results
    from lab.pages.fix_catalog import speed
    from lab.pages.report import interval_text

    rows = [line for line in summary_of_findings().splitlines() if re.search(r"\]\(ab/[^)]+\.md\)", line)]
    assert rows, "the summary of FINDINGS links no A/B result"
    for row in rows:
        (page,) = re.findall(r"\]\((ab/[^)]+)\.md\)", row)
        r = results.read(FINDINGS.parent / f"{page}.json")
        assert f"[{speed(r)}](" in row and interval_text(r.stats) in row, \
            f"FINDINGS' summary says of {page}: {row}; the result says {speed(r)}, {interval_text(r.stats)}"


def test_readme_is_short_with_its_layout_in_the_first_half():
    lines = README.read_text().splitlines()
    assert len(lines) <= README_LINES, f"README.md has {len(lines)} lines, {README_LINES} at most: the reference " \
                                       "belongs in docs/commands.md, the measurements in results/FINDINGS.md"
    layout = lines.index("## Layout")
    assert layout < len(lines) / 2, f"README's Layout starts at line {layout + 1} of {len(lines)}"
    text = README.read_text()
    for page in ("docs/commands.md", "docs/fixes.md", "docs/adding-a-fix.md", "results/README.md",
                 "results/FINDINGS.md"):
        assert f"]({page}" in text, f"README.md does not link {page}"


@pytest.mark.slow
def test_committed_fix_catalog_is_current():
    from lab.pages import fix_catalog

    committed = (ROOT / "docs" / "fixes.md").read_text()
    assert committed == fix_catalog.generate(ROOT / "results", ROOT / "patches", ROOT / "docs"), \
        "docs/fixes.md is stale: run `lab table`"
