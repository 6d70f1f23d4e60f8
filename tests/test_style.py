"""The house rules of the code (issue 84): no module of `lab/` over 600 lines and no function over 80, and comments
and docstrings that state a rule and its reason in the present tense. What was measured, on which host and when
belongs in results/FINDINGS.md, the results and the commit messages, not in `lab/`, `fixes/` or `scenarios/`: a
figure there goes stale as the code it describes changes, and no test holds it."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

from tests.conftest import ROOT

MODULE_LINES = 600
FUNCTION_LINES = 80
#: where comments and docstrings are read for the notebook
PROSE = ("lab", "fixes", "scenarios")

#: a GPU model named as a host ("on the H200", "H100 host"), not as a tag the code reads (those are quoted)
HOST = re.compile(r"\b(?:H100|H200|A100)(?!\d)")
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b|\b(?:January|February|March|April|May|June|July|August|September|October|"
                  r"November|December) 20\d\d\b")
_NUMBER = r"(?<![\w.^])[~≈]?\d+(?:[.,]\d+)*"
#: a measured quantity: a time, a size or a rate with its unit (`12.3 ms`, `55 GB/s`, `11 minutes`, `an 8-minute
#: call`), or a factor with decimals (`4.1x`, `0.2345x`; `24 x 128` is a shape, `32x` a model's fixed ratio)
QUANTITY = re.compile(
    _NUMBER + r"(?:"
    r"\s?(?:ns|µs|us|ms|min|[KMGT]i?B(?:/s)?|TB/s|T?FLOP/?s|TFLOPS)(?![\w/])"  # a unit that cannot be a word
    r"|(?:\s|(?<=\.\d)|(?<=\.\d\d)|(?<=\.\d\d\d))(?:s|seconds?|minutes?|hours?|h)(?![\w/])"  # `12 s`, `1.5s`
    r"|-(?:second|minute|hour)s?\b"  # `an 8-minute call`
    r")"
    r"|(?<![\w.])[~≈]?\d+\.\d+\s?[x×](?![\w])"  # a factor measured (`4.1x`)
    r"|[~≈]\s?\d+(?:\.\d+)?\s?(?:[x×%])(?!\w)")  # an approximate factor or share (`~3x`, `~4%`)
#: words before a quantity that make it a bound a rule sets (`gaps over 100 µs`, `under 10 µs`), not a measurement
BOUND = re.compile(r"(?:(?<!-)>|<|≥|≤|\bover|\bunder|\babove|\bbelow|\bat least|\bat most|\bwithin|\bmore than|"
                   r"\bless than|\bup to|\bbeyond|\bpast|\bevery|\bper)\s*$")
#: literal text the code reads or writes (`40 s`, "NVIDIA H200"): examples of formats and names, not claims
LITERAL = re.compile(r"`[^`]*`|\"[^\"]*\"")
#: a name of a constant in the text: a number there is the constant's chosen value (`SPARE_S`, `JOB_GRACE_S`)
CONSTANT = re.compile(r"\b[A-Z][A-Z0-9]*_[A-Z0-9_]+\b")


def prose(path: Path) -> list[tuple[int, str]]:
    """The comments (tokenize) and docstrings (ast) of a file, each line with its number."""
    source = path.read_text()
    lines: list[tuple[int, str]] = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            lines.append((token.start[0], token.string))
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                lines += [(first.lineno + k, line) for k, line in enumerate(first.value.value.splitlines())]
    return sorted(lines)


def assigned_constants(path: Path) -> set[int]:
    """The lines that assign an upper-case name (`SPARE_S = 60.0`), and the `#:` comment lines just above them: a
    number with its unit there is the constant's chosen value."""
    source = path.read_text()
    lines = source.splitlines()
    found = set()
    for node in ast.walk(ast.parse(source)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id.isupper() for t in targets):
            found.update(range(node.lineno, node.end_lineno + 1))
            above = node.lineno - 1
            while above >= 1 and lines[above - 1].lstrip().startswith("#:"):
                found.add(above)
                above -= 1
    return found


def notebook(text: str, of_constant: bool = False) -> list[str]:
    """What in one line of prose is a host, a date or a measured quantity (the module's docstring says why not);
    `of_constant`: the line assigns a constant or documents one (`assigned_constants`), and a quantity there is its
    chosen value, as it is on a line that names one."""
    bare = LITERAL.sub(lambda m: " " * len(m[0]), text)
    found = [m[0] for m in (*HOST.finditer(bare), *DATE.finditer(text))]
    if not of_constant and not CONSTANT.search(text):
        found += [m[0].strip() for m in QUANTITY.finditer(bare) if not BOUND.search(bare[:m.start()])]
    return found


def offences(folders=PROSE) -> list[str]:
    out = []
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            name = str(path.relative_to(ROOT))
            constants = assigned_constants(path)
            for n, line in prose(path):
                if found := notebook(line, n in constants):
                    out.append(f"{name}:{n}: {', '.join(found)}: {line.strip()[:100]}")
    return out


@pytest.mark.parametrize("text, found", [
    ("# on the H200 one profiled call's GPU idle measured 20.8, 102.8 and 259.7 ms", ["H200", "259.7 ms"]),
    ("until 2026-11-28 the cache stays", ["2026-11-28"]),
    ("the copies run at some 55 GB/s from pageable memory", ["55 GB/s"]),
    ("the fix made it 4.1x faster; the profiler slows a call ~3x", ["4.1x", "~3x"]),
    ("a run took 11 minutes, out of reach of a 10-minute call", ["11 minutes", "10-minute"]),
    ("its test arm took 6 s calls against 40.5s", ["6 s", "40.5s"]),
    ("FLUX.1 16.07x (20.3 -> 1.27 s per call)", ["16.07x", "1.27 s"]),  # an arrow is no bound
    ("# no idle gap over 100 µs inside the denoising loop", []),  # a threshold the rule sets
    ("launch latency under 10 µs, a step under 1 % of the call", []),
    ("`lab ab` takes `--budget 10m`; `duration` writes `40 s`, `7 min`", []),  # formats, quoted
    ('the row of a trace naming "NVIDIA H200"', []),
    ("24 x 128 heads, 32x compression, mask 1s of the prompt", []),  # shapes and words, not measurements
    ("a float keeps every nanosecond of 2^43 µs", []),  # a power of two, not a figure
    ("seconds a job keeps free to write (`SPARE_S`): 60 s", []),  # a constant's value, named
])
def test_the_notebook_patterns(text, found):
    assert notebook(text) == found


def test_a_chosen_constant_beside_its_assignment_is_no_measurement(tmp_path):
    path = tmp_path / "m.py"
    path.write_text('#: the pinned blocks: 1 GiB each\nBLOCK = 1 << 30\nx = 2  # took 3.5 s on the H200\n'
                    'LIMIT_S = 9.0  # 9 s, as on the H100\ndef f():\n    """A call took 12 ms."""\n')
    constants = assigned_constants(path)
    hits = [(n, found) for n, t in prose(path) if (found := notebook(t, n in constants))]
    assert hits == [(3, ["H200", "3.5 s"]), (4, ["H100"]), (6, ["12 ms"])]


def test_no_module_in_lab_is_over_600_lines():
    long = [f"{p.relative_to(ROOT)}: {n} lines" for p in sorted((ROOT / "lab").rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > MODULE_LINES]
    assert not long, long


def test_no_function_in_lab_is_over_80_lines():
    long = [f"{p.relative_to(ROOT)}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1} lines"
            for p in sorted((ROOT / "lab").rglob("*.py")) for node in ast.walk(ast.parse(p.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > FUNCTION_LINES]
    assert not long, long


def test_no_measurement_host_or_date_in_the_code_s_prose():
    found = offences()
    assert not found, "\n".join(["to results/FINDINGS.md, keeping the rule in the code:"] + found)
