"""Data flows one way: scenario -> run -> trace -> analysis -> statistics -> report. A lower layer never imports a
higher one, not even inside a function."""

import ast
from pathlib import Path

from tests.conftest import ROOT

#: modules that run pipelines or the command line: the top of the flow
RUNNERS = {"ab", "runner", "sweep", "hunt", "calibrate", "profile", "worker", "instrument", "cli", "commands",
           "cluster"}
#: what each lower layer may import from the lab
LOWER = {
    "stats": set(),
    "console": set(),
    "errors": set(),
    "trace": {"errors"},
    "analysis": {"trace", "errors", "checklist", "compile_analysis", "gaps"},  # the facade over the analyzers
    "compile_analysis": {"analysis", "trace"},
    "gaps": {"analysis", "trace"},
    "checklist": set(),
    "compile_log": set(),
    "verdict": {"stats", "units"},
    "results": {"errors"},
    "restat": {"results", "stats", "verdict", "errors"},
    "report": {"results", "stats", "verdict"},
    "sweep_report": {"results", "report"},
    "analysis_report": set(),
    "units": set(),
    "naming": set(),
    "history_report": {"naming", "report", "units"},
    "campaign": {"naming", "stats", "units", "verdict", "errors", "fix", "scenario"},
}


def lab_imports(path: Path) -> set[str]:
    """The `lab.X` modules a file imports anywhere (top level or inside functions)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "lab":
            parts = node.module.split(".")
            if len(parts) > 1:
                found.add(parts[1])
            else:
                found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("lab."))
    return found


def test_lower_layers_import_only_what_is_below_them():
    for name, allowed in LOWER.items():
        used = lab_imports(ROOT / "lab" / f"{name}.py")
        assert used <= allowed, f"lab/{name}.py imports {sorted(used - allowed)}"


def test_presentation_never_imports_a_runner():
    for name in ("table", "report", "sweep_report", "analysis_report", "history_report"):
        used = lab_imports(ROOT / "lab" / f"{name}.py")
        assert not used & RUNNERS, f"lab/{name}.py imports {sorted(used & RUNNERS)}"


def test_each_subcommand_is_one_module_with_its_parser_and_handler():
    import argparse
    import importlib

    from lab.commands import ORDER

    files = {p.stem for p in (ROOT / "lab" / "commands").glob("*.py") if not p.stem.startswith("_")}
    assert files == set(ORDER), "every module in lab/commands/ is a subcommand listed in ORDER"
    for name in ORDER:
        module = importlib.import_module(f"lab.commands.{name}")
        assert module.HELP and callable(module.run)
        module.add_arguments(argparse.ArgumentParser())
