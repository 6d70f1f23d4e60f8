"""The packages of `lab/` show the two streams and data flows one way through them: a package imports only the
packages below it (not even inside a function), no module imports itself back through others, and the lab's own
frames in a trace are found from its modules, not from path strings."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

LAB = ROOT / "lab"

#: what each package may import from the lab (besides itself). Timing: apply -> run -> measure -> verdicts;
#: traces: run (profile) -> traces (parse -> analysis); both meet in results, then pages; campaigns and commands on top.
ALLOWED = {
    "base": set(),
    "apply": {"base"},
    "traces": {"base"},
    "verdicts": {"base"},
    "results": {"base", "verdicts"},
    "pages": {"base", "verdicts", "results", "apply"},
    "run": {"base", "apply"},
    "measure": {"base", "apply", "run", "traces", "verdicts", "results", "pages"},
    "campaigns": {"base", "apply", "run", "verdicts", "results"},
    "commands": {"base", "apply", "run", "traces", "verdicts", "results", "pages", "measure", "campaigns"},
}
TOP = {"cli": {"base", "commands"}, "__init__": set(), "__main__": {"cli"}}


def package_of(path: Path) -> str:
    parts = path.relative_to(LAB).parts
    return parts[0] if len(parts) > 1 else path.stem


def lab_imports(path: Path) -> set[str]:
    """The `lab.X.Y` modules a file imports anywhere (top level or inside functions), as dotted names after `lab.`."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "lab":
            parts = node.module.split(".")[1:]
            if parts:
                found.add(".".join(parts))
            else:
                found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".", 1)[1] for a in node.names if a.name.startswith("lab."))
    return found


def modules() -> dict[str, Path]:
    return {".".join(p.relative_to(LAB).with_suffix("").parts).removesuffix(".__init__"): p for p in LAB.rglob("*.py")}


def test_there_are_no_flat_modules_left():
    flat = {p.name for p in LAB.glob("*.py")}
    assert flat <= {"__init__.py", "__main__.py", "cli.py"}, f"modules outside a package: {sorted(flat)}"
    assert set(ALLOWED) == {p.name for p in LAB.iterdir() if (p / "__init__.py").exists()}


def test_each_package_imports_only_the_packages_below_it():
    for name, path in modules().items():
        pkg = package_of(path)
        allowed = ALLOWED.get(pkg, TOP.get(pkg, set())) | {pkg}
        used = {m.split(".")[0] for m in lab_imports(path)}
        assert used <= allowed, f"lab/{path.relative_to(LAB)} imports {sorted(used - allowed)}"


def test_the_package_rules_form_no_circle():
    seen: dict[str, int] = {}

    def depth(pkg: str, stack: tuple = ()) -> int:
        assert pkg not in stack, f"packages import each other in a circle: {' -> '.join(stack + (pkg,))}"
        if pkg not in seen:
            seen[pkg] = 1 + max((depth(p, stack + (pkg,)) for p in ALLOWED[pkg]), default=0)
        return seen[pkg]

    for pkg in ALLOWED:
        depth(pkg)


def module_edges(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Which lab modules each lab module imports (`from lab.pkg import mod` names the module `pkg.mod`)."""
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        targets = graph.setdefault(name, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "lab":
                base = node.module.partition(".")[2]
                for alias in node.names:
                    full = f"{base}.{alias.name}" if base else alias.name
                    targets.add(full if full in mods else base)
        targets.discard(name)
        targets.discard("")
    return graph


def test_no_module_imports_itself_back():
    graph = module_edges(modules())
    state: dict[str, int] = {}

    def visit(n: str, stack: list[str]) -> None:
        state[n] = 1
        for m in sorted(graph.get(n, ())):
            assert state.get(m) != 1, f"import circle: {' -> '.join(stack + [n, m])}"
            if m not in state:
                visit(m, stack + [n])
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n, [])


def test_presentation_never_imports_a_runner():
    for path in (LAB / "pages").glob("*.py"):
        used = {m.split(".")[0] for m in lab_imports(path)}
        assert not used & {"run", "measure", "campaigns", "commands"}, f"lab/pages/{path.name} imports {used}"


def test_the_lab_wrappers_in_traces_are_found_from_their_modules():
    from lab.base import paths as lab_paths
    from lab.traces import timeline

    paths = lab_paths.lab_wrapper_paths()
    assert len(paths) == len(lab_paths.LAB_WRAPPERS)
    for path in paths:
        assert (ROOT / path).is_file(), path
    pattern = timeline.lab_wrapper_pattern()
    import re

    assert re.search(pattern, f"{ROOT}/lab/run/runner.py(40): timed_call")
    assert re.search(pattern, "lab/apply/patching.py(12): wrapper")  # a wheel install, site-packages/ cut off
    assert not re.search(pattern, "diffusers/pipelines/wan/pipeline_wan.py(300): __call__")


def test_lab_help_stays_light():
    code = ("import sys, lab.cli\nsys.argv = ['lab', '--help']\ntry:\n    lab.cli.main()\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('torch', 'diffusers', 'numpy', 'libcst', 'scipy') if m in sys.modules), "
            "file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0 and proc.stderr.strip() == "[]", proc.stderr


def test_each_subcommand_is_one_module_with_its_parser_and_handler():
    import argparse
    import importlib

    from lab.commands import ORDER

    files = {p.stem for p in (LAB / "commands").glob("*.py") if not p.stem.startswith("_")}
    assert files == set(ORDER), "every module in lab/commands/ is a subcommand listed in ORDER"
    for name in ORDER:
        module = importlib.import_module(f"lab.commands.{name}")
        assert module.HELP and callable(module.run)
        module.add_arguments(argparse.ArgumentParser())


def test_the_readme_layout_names_every_package_and_module():
    readme = (ROOT / "README.md").read_text()
    layout = readme[readme.index("## Layout"):]
    layout = layout[:layout.find("\n## ", 5)] if "\n## " in layout[5:] else layout
    for pkg in ALLOWED:
        bullet = next((line for line in layout.split("\n- ") if line.startswith(f"`lab/{pkg}/`")), None)
        assert bullet is not None, f"README's Layout has no bullet for lab/{pkg}/"
        bullet = " ".join(bullet.split())
        for path in sorted((LAB / pkg).glob("*.py")):
            if path.stem != "__init__" and (pkg != "commands" or path.stem.startswith("_")):  # subcommands: ORDER
                assert f"`{path.name}`" in bullet, f"README's Layout does not name lab/{pkg}/{path.name}"
    assert "from lab.apply import" in readme[readme.index("## Adding a fix"):readme.index("## Adding a scenario")]


def test_a_subcommand_imports_its_own_module_alone():
    code = ("import sys, lab.cli\ntry:\n    lab.cli.main(['analyze', '--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.startswith('lab.commands.')), file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0 and "--gap-threshold" in proc.stdout, proc.stderr
    assert proc.stderr.strip() == "['lab.commands.analyze']", proc.stderr
    from lab.cli import build_parser

    with pytest.raises(SystemExit):  # another subcommand's options are not known to a parser built for one
        build_parser(only="analyze").parse_args(["fixes", "--json"])
    assert build_parser().parse_args(["fixes", "--json"]).json


def test_no_date_in_the_code():
    """Docstrings and comments state the rule and its reason in the present tense; when something was measured, and
    on which host, is for FINDINGS, the results and the commit messages."""
    import re

    date = re.compile(r"\b20\d\d-\d\d-\d\d\b|\b(January|February|March|April|May|June|July|August|September|October|"
                      r"November|December) 20\d\d\b")
    dated = [f"{path.relative_to(ROOT)}:{n}" for folder in ("lab", "fixes", "scenarios")
             for path in sorted((ROOT / folder).rglob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1) if date.search(line)]
    assert not dated, dated
