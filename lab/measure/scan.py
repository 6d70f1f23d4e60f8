"""`lab scan`: a static libcst scan of diffusers source for sync-prone patterns, each with file:line and function.

The patterns are candidates, not verdicts: whether one syncs depends on where its tensors live, which only a run
shows. `lab hunt` marks which candidates were hit at run time and which runtime sync sites the scan missed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path

import libcst as cst
import libcst.matchers as m
from libcst.metadata import MetadataWrapper, PositionProvider

from lab.base.errors import LabError


def _torch_call(*names: str):
    return m.Call(func=m.Attribute(value=m.Name("torch"), attr=m.OneOf(*(m.Name(n) for n in names))))


#: pattern name -> (matcher, why it can sync)
PATTERNS: dict[str, tuple[m.BaseMatcherNode, str]] = {
    "item": (m.Call(func=m.Attribute(attr=m.Name("item")), args=[]), "`.item()` reads a device scalar on the host"),
    "tolist": (m.Call(func=m.Attribute(attr=m.Name("tolist")), args=[]), "`.tolist()` copies a tensor to the host"),
    "cpu": (m.Call(func=m.Attribute(attr=m.OneOf(m.Name("cpu"), m.Name("numpy"))), args=[]),
            "`.cpu()`/`.numpy()` copies to the host"),
    "nonzero": (m.Call(func=m.Attribute(attr=m.Name("nonzero"))), "`nonzero()` has a data-dependent shape"),
    "tensor_on_device": (
        m.Call(func=m.Attribute(value=m.Name("torch"), attr=m.Name("tensor")),
               args=[m.ZeroOrMore(), m.Arg(keyword=m.Name("device")), m.ZeroOrMore()]),
        "`torch.tensor(<python data>, device=...)` is a blocking host-to-device copy",
    ),
    "indexed_to_device": (
        m.Call(func=m.Attribute(value=m.Subscript(), attr=m.Name("to"))),
        "an indexed tensor copied with `.to(...)`: a blocking copy when the source is on the CPU",
    ),
    "created_then_moved": (
        m.Call(func=m.Attribute(value=_torch_call("from_numpy", "randn", "rand", "tensor", "as_tensor", "cat", "stack",
                                                  "arange", "linspace", "zeros", "ones", "full"),
                                attr=m.Name("to"))),
        "a tensor built (or drawn) on the host and then copied with `.to(device)`: a blocking host-to-device copy",
    ),
    "linalg_solve": (
        m.Call(func=m.Attribute(value=m.Attribute(value=m.Name("torch"), attr=m.Name("linalg")), attr=m.Name("solve"))),
        "`torch.linalg.solve` checks its result on the host (use `solve_ex` or solve on the CPU)",
    ),
    "scalar_cast": (
        m.Call(func=m.OneOf(m.Name("float"), m.Name("int"), m.Name("bool")), args=[m.Arg(value=m.OneOf(m.Subscript(), m.Call()))]),
        "`float/int/bool(<tensor expression>)` reads a value on the host if the tensor is on the device",
    ),
    "shape_from_max": (
        m.BinaryOperation(left=_torch_call("max"), operator=m.Add()),
        "`torch.max(...) + 1` used as a size reads the maximum on the host",
    ),
    "truth_of_reduction": (
        m.If(test=m.Call(func=m.Attribute(attr=m.OneOf(m.Name("all"), m.Name("any"))))),
        "`if t.all()` / `if t.any()` reads a device bool on the host",
    ),
}


@dataclasses.dataclass(frozen=True)
class Finding:
    path: str  # relative to the directory that holds the `diffusers` package, e.g. diffusers/schedulers/x.py
    line: int
    function: str  # qualified: Class.method or function
    pattern: str
    code: str

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


class _Scanner(m.MatcherDecoratableVisitor):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, path: str, module: cst.Module) -> None:
        super().__init__()
        self.path = path
        self.module = module
        self.scope: list[str] = []
        self.findings: list[Finding] = []

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.scope.append(node.name.value)

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self.scope.pop()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.scope.append(node.name.value)

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.scope.pop()

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, (cst.Call, cst.BinaryOperation, cst.If)):
            for name, (matcher, _) in PATTERNS.items():
                if m.matches(node, matcher):
                    line = self.get_metadata(PositionProvider, node).start.line
                    target = node.test if isinstance(node, cst.If) else node
                    code = self.module.code_for_node(target).strip().splitlines()[0][:100]
                    self.findings.append(Finding(self.path, line, ".".join(self.scope) or "<module>", name, code))
        return super().on_visit(node)


def scan_file(path: Path, root: Path) -> list[Finding]:
    try:
        module = cst.parse_module(path.read_text(encoding="utf-8"))
    except (OSError, cst.ParserSyntaxError) as e:
        raise LabError(f"{path}: cannot scan ({str(e).splitlines()[0]}).") from e
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    scanner = _Scanner(path.relative_to(root).as_posix() if path.is_relative_to(root) else path.as_posix(), module)
    wrapper.visit(scanner)
    return scanner.findings


def diffusers_root() -> Path:
    """The directory that holds the installed `diffusers` package."""
    import diffusers

    return Path(diffusers.__file__).parent.parent


def scan(paths: Iterable[Path], progress=None) -> list[Finding]:
    root = diffusers_root()
    files: list[Path] = []
    for p in paths:
        p = Path(p)
        if not p.exists():
            raise LabError(f"{p}: no such file or directory.")
        files += sorted(p.rglob("*.py")) if p.is_dir() else [p]
    findings = []
    for i, f in enumerate(files):
        if progress and len(files) > 20 and i % 50 == 0:
            progress(f"  scanning {i}/{len(files)} files ...")
        findings += scan_file(f, root)
    return findings


def module_files(modules: Iterable[str]) -> list[Path]:
    """Source files of importable modules (e.g. a pipeline's own modules)."""
    import importlib

    out = []
    for name in modules:
        out.append(Path(importlib.import_module(name).__file__))
    return out
