"""Source rewrites: run libcst codemods over diffusers source and install the rewritten definitions.

A rewrite fix is a libcst codemod (see :class:`FunctionRewrite`). The lab never edits files on disk: it reads
the module's source, runs the codemods of every active fix on it in order, and compiles only the definitions
that changed (functions, methods, simple class or module assignments) into the original module's namespace,
so that what runs is exactly what `lab diff` prints. :class:`lab.apply.patching.Patcher` swaps them in and out.
"""

from __future__ import annotations

import dataclasses
import linecache
import textwrap
import traceback
import types
from collections.abc import Callable, Sequence

import libcst as cst
import libcst.matchers as m
from libcst.codemod import (
    CodemodContext,
    SkipFile,
    SkipReason,
    TransformExit,
    TransformFailure,
    TransformResult,
    TransformSkip,
    TransformSuccess,
    VisitorBasedCodemodCommand,
    transform_module,
)
from libcst.metadata import MetadataWrapper, PositionProvider

from lab.base.errors import LabError


class FunctionRewrite(VisitorBasedCodemodCommand):
    """A codemod that edits named functions all-or-nothing.

    Subclasses set `FUNCTIONS` (the function names it edits) and `EDITS` (labels of the edits each function
    must receive), and call `self.edited(label)` from their `leave_*` methods when they make an edit. When a
    target function leaves with a different set of edits than `EDITS` (the site does not have the expected
    shape), the codemod warns and keeps the original function: a partial edit is never emitted. A function
    for which `already_fixed(node)` is true is left alone without a warning.
    """

    FUNCTIONS: frozenset[str] = frozenset()
    EDITS: frozenset[str] = frozenset()
    #: whether the walk goes inside a target function, for `leave_*` methods that edit its statements; a codemod
    #: that edits a target whole in `leave_FunctionDef` sets False and skips the walk (begin_index, over dozens of
    #: pipeline modules)
    WALKS_TARGETS: bool = True

    def __init__(self, context: CodemodContext) -> None:
        super().__init__(context)
        self._stack: list[set[str]] = []
        self._refused = False

    def edited(self, label: str) -> None:
        if not self._stack:
            raise RuntimeError(f"{type(self).__name__} made edit {label!r} outside a target function")
        self._stack[-1].add(label)

    def inside_target(self) -> bool:
        return bool(self._stack)

    def already_fixed(self, node: cst.FunctionDef) -> bool:  # noqa: ARG002 - hook for subclasses
        return False

    def required_edits(self, node: cst.FunctionDef) -> frozenset[str]:  # noqa: ARG002 - hook for subclasses
        return self.EDITS

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        if node.name.value in self.FUNCTIONS:
            self._stack.append(set())
            return self.WALKS_TARGETS
        # no edit is made outside a target (`edited`), so the body of any other function is not walked: most of a
        # pipeline module is methods that are not `__call__`, and `begin_index` rewrites dozens of pipeline modules
        return self.inside_target()

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        if original_node.name.value not in self.FUNCTIONS:
            return updated_node
        made = self._stack.pop()
        if self.already_fixed(original_node):
            return original_node
        required = self.required_edits(original_node)
        if made == required:
            return updated_node
        missing = ", ".join(sorted(required - made)) or "none"
        unexpected = ", ".join(sorted(made - required)) or "none"
        self.warn(
            f"`{original_node.name.value}` does not have the expected shape (missing edits: {missing}; "
            f"unexpected: {unexpected}); left unchanged."
        )
        self._refused = True
        return original_node

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        # All or nothing per module: edits of several functions depend on each other (a call site and the
        # signature it calls), so one refused site keeps the whole module as it was.
        return original_node if self._refused else updated_node


BLANK_LINE = cst.EmptyLine(indent=False)


def parse_method(source: str) -> cst.FunctionDef:
    """Parse a method written at top level as it will sit in a class body (docstring lines indented to match)."""
    wrapped = cst.parse_module("class _:\n" + textwrap.indent(textwrap.dedent(source).strip("\n") + "\n", "    "))
    return wrapped.body[0].body.body[0].with_changes(leading_lines=[BLANK_LINE])


def with_method_before(cls: cst.ClassDef, method: cst.FunctionDef, before: str) -> cst.ClassDef:
    """`cls` with `method` added just before its method named `before` (a helper that a rewritten method calls)."""
    body = list(cls.body.body)
    index = next(i for i, s in enumerate(body) if isinstance(s, cst.FunctionDef) and s.name.value == before)
    body.insert(index, method)
    return cls.with_changes(body=cls.body.with_changes(body=body))


def with_attribute_first(cls: cst.ClassDef, statement: cst.SimpleStatementLine) -> cst.ClassDef:
    """`cls` with a class attribute (`_last = None  # ...`) just before its first method, where it takes the method's
    leading lines and the method a blank line (a cache that every instance shares)."""
    body = list(cls.body.body)
    index = next(i for i, s in enumerate(body) if isinstance(s, cst.FunctionDef))
    first = body[index]
    body[index] = first.with_changes(leading_lines=[BLANK_LINE])
    body.insert(index, statement.with_changes(leading_lines=first.leading_lines))
    return cls.with_changes(body=cls.body.with_changes(body=body))


def around_statement(block: cst.IndentedBlock, anchor: m.BaseMatcherNode, *, before: Sequence[cst.CSTNode] = (),
                     after: Sequence[cst.CSTNode] = (),
                     change: Callable[[cst.CSTNode], cst.CSTNode] | None = None) -> cst.IndentedBlock | None:
    """`block` with statements put `before` and `after` the first of its statements that `anchor` matches (and that
    statement passed through `change`), or None where none matches: a `leave_IndentedBlock` of a rewrite that adds a
    line next to the one it recognises returns it, and calls `edited` where it is not None."""
    body = list(block.body)
    at = next((i for i, statement in enumerate(body) if m.matches(statement, anchor)), None)
    if at is None:
        return None
    found = change(body[at]) if change is not None else body[at]
    return block.with_changes(body=[*body[:at], *before, found, *after, *body[at + 1:]])


def call_on_own_line(func: str, args: Sequence[cst.BaseExpression]) -> cst.Call:
    """`func(\n    a, b\n)`: a call whose arguments take a line of their own, one level deeper than the statement it
    stands in (black's layout of a call too long for one line)."""
    def newline(indent: str) -> cst.ParenthesizedWhitespace:
        return cst.ParenthesizedWhitespace(indent=True, last_line=cst.SimpleWhitespace(indent))

    comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    return cst.Call(func=cst.Name(func), whitespace_before_args=newline("    "),
                    args=[*(cst.Arg(a, comma=comma) for a in args[:-1]),
                          cst.Arg(args[-1], whitespace_after_arg=newline(""))])


@dataclasses.dataclass(frozen=True)
class RewriteResult:
    """The outcome of running codemods over one module's source."""

    old_source: str
    new_source: str
    warnings: tuple[str, ...]

    @property
    def changed(self) -> bool:
        return self.old_source != self.new_source


def _transform(codemod: VisitorBasedCodemodCommand, code: str) -> TransformResult:
    """libcst's `transform_module(codemod, code)`, the same results, without the deep copy of the parsed module that
    its metadata wrapper makes for a codemod that reads no metadata (none of the catalog's does): the copy is a large
    part of a rewrite's time (begin_index's dozens of pipeline modules most). A codemod that declares metadata
    dependencies goes through libcst's own path."""
    if codemod.get_inherited_dependencies() or codemod.should_allow_multiple_passes():
        return transform_module(codemod, code)
    try:
        tree = cst.parse_module(code)
        return TransformSuccess(code=codemod.transform_module_impl(tree).code,
                                warning_messages=codemod.context.warnings)
    except KeyboardInterrupt:
        return TransformExit()
    except SkipFile as e:
        return TransformSkip(skip_description=str(e), skip_reason=SkipReason.OTHER,
                             warning_messages=codemod.context.warnings)
    except Exception as e:  # as libcst's: a failure is a result, which rewrite_source raises as a LabError
        return TransformFailure(error=e, traceback_str=traceback.format_exc(),
                                warning_messages=codemod.context.warnings)


def rewrite_source(source: str, codemods: Sequence[type[VisitorBasedCodemodCommand]], filename: str = "") -> RewriteResult:
    """Run `codemods` over `source` in order. Never edits files; raises LabError if libcst fails."""
    code = source
    warnings: list[str] = []
    for codemod in codemods:
        result = _transform(codemod(CodemodContext(filename=filename)), code)
        if isinstance(result, TransformExit):  # libcst turns a Ctrl-C into a result: it is still a Ctrl-C
            raise KeyboardInterrupt
        if isinstance(result, TransformFailure):
            raise LabError(f"{codemod.__name__} failed on {filename or 'source'}: {result.error}")
        if isinstance(result, TransformSkip):
            warnings.extend(result.warning_messages)
            continue
        if not isinstance(result, TransformSuccess):
            raise LabError(f"{codemod.__name__} on {filename or 'source'}: libcst returned {type(result).__name__}")
        warnings.extend(f"{codemod.__name__}: {w}" for w in result.warning_messages)
        code = result.code
    return RewriteResult(source, code, tuple(warnings))


# --- finding what changed -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Definition:
    """A definition that a rewrite added or changed: `owner` is a class name, or None for module level."""

    owner: str | None
    name: str
    node: cst.CSTNode


def _assigned_name(stmt: cst.CSTNode) -> str | None:
    if m.matches(stmt, m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(target=m.Name())])])):
        return stmt.body[0].targets[0].target.value
    if m.matches(stmt, m.SimpleStatementLine(body=[m.AnnAssign(target=m.Name())])):
        return stmt.body[0].target.value
    return None


def _members(body: Sequence[cst.CSTNode]) -> tuple[dict[str, cst.CSTNode], list[cst.CSTNode]]:
    """Named members (functions, classes, simple assignments) and the other statements of a body."""
    named: dict[str, cst.CSTNode] = {}
    other: list[cst.CSTNode] = []
    for stmt in body:
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            named[stmt.name.value] = stmt
        elif (name := _assigned_name(stmt)) is not None:
            named[name] = stmt
        else:
            other.append(stmt)
    return named, other


def _is_import(stmt: cst.CSTNode) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and all(isinstance(s, (cst.Import, cst.ImportFrom)) for s in stmt.body)


def _added_imports(old: list[str], new: list[tuple[str, cst.CSTNode]]) -> list[cst.CSTNode] | None:
    """The import statements `new` adds to the statements `old`, when that is all it changes (else None)."""
    added, i = [], 0
    for text, node in new:
        if i < len(old) and old[i] == text:
            i += 1
        elif _is_import(node):
            added.append(node)
        else:
            return None
    return added if i == len(old) else None


def changed_definitions(old: cst.Module, new: cst.Module, allow_imports: bool = False) -> list[Definition]:
    """The module- and class-level definitions that differ between two versions of a module.

    Raises LabError for a change the lab cannot install at run time (a statement that is not a definition, a
    removed definition, and an import unless `allow_imports`: then each added import statement is a Definition
    with `owner` None and `name` "import").
    """
    code = old.code_for_node
    new_code = new.code_for_node
    old_named, old_other = _members(old.body)
    new_named, new_other = _members(new.body)
    imports: list[cst.CSTNode] = []
    if [code(s) for s in old_other] != [new_code(s) for s in new_other]:
        added = _added_imports([code(s) for s in old_other], [(new_code(s), s) for s in new_other]) if allow_imports else None
        if added is None:
            raise LabError("The change edits module-level statements other than definitions"
                           + (" and added imports" if allow_imports else "") + "; it cannot be applied at run time.")
        imports = added
    if set(old_named) - set(new_named):
        raise LabError(f"The change removes {sorted(set(old_named) - set(new_named))}; it cannot be applied at run time.")
    out: list[Definition] = [Definition(None, "import", node) for node in imports]
    for name, node in new_named.items():
        before = old_named.get(name)
        if before is not None and code(before) == new_code(node):
            continue
        if isinstance(node, cst.ClassDef) and isinstance(before, cst.ClassDef):
            old_members, old_rest = _members(before.body.body)
            new_members, new_rest = _members(node.body.body)
            if [code(s) for s in old_rest] != [new_code(s) for s in new_rest] or set(old_members) - set(new_members):
                raise LabError(f"The change edits class `{name}` beyond its methods and attributes (or removes one); "
                               "it cannot be applied at run time.")
            for member, member_node in new_members.items():
                old_member = old_members.get(member)
                if old_member is None or code(old_member) != new_code(member_node):
                    out.append(Definition(name, member, member_node))
        else:
            out.append(Definition(None, name, node))
    return out


# --- compiling them into the module's namespace -----------------------------------------------------------


def _first_line(node: cst.CSTNode, positions) -> int:
    decorators = getattr(node, "decorators", ())
    start = decorators[0] if decorators else node
    return positions[start].start.line


def compile_definitions(module: types.ModuleType, new_source: str, pseudo_filename: str, *, old_source: str | None = None,
                        allow_imports: bool = False) -> dict[tuple[str | None, str], object]:
    """Compile the definitions that `new_source` changes relative to `module`'s source (its file, or `old_source`).

    Returns `{(owner, name): object}` where each object was compiled with the module's globals, at the line
    numbers it has in `new_source`, and is registered in `linecache` under `pseudo_filename` so tracebacks and
    profiler stacks show the rewritten lines. Methods are compiled inside a class of the same name (so name
    mangling matches) and their `__class__` cell is pointed at the real class (so zero-argument `super()` works).
    With `allow_imports`, the names that added import statements bind are returned as module-level entries (and
    visible to the definitions' decorators).
    """
    if old_source is None:
        with open(module.__file__, encoding="utf-8") as f:
            old_source = f.read()
    old_tree = cst.parse_module(old_source)
    wrapper = MetadataWrapper(cst.parse_module(new_source), unsafe_skip_copy=True)
    new_tree = wrapper.module
    positions = wrapper.resolve(PositionProvider)
    definitions = changed_definitions(old_tree, new_tree, allow_imports=allow_imports)

    linecache.cache[pseudo_filename] = (len(new_source), None, new_source.splitlines(True), pseudo_filename)
    compiled: dict[tuple[str | None, str], object] = {}
    imported: dict[str, object] = {}
    for d in definitions:
        if d.name == "import":  # a keyword: never the name of a definition
            exec(compile(cst.Module(body=[d.node]).code, pseudo_filename, "exec"), module.__dict__, imported)  # noqa: S102
    compiled.update({(None, name): value for name, value in imported.items()})
    by_owner: dict[str | None, list[Definition]] = {}
    for d in definitions:
        if d.name != "import":
            by_owner.setdefault(d.owner, []).append(d)

    for owner, defs in by_owner.items():
        for d in defs:
            line = _first_line(d.node, positions)
            text = cst.Module(body=[d.node.with_changes(leading_lines=())]).code
            if owner is None:
                source = "\n" * (line - 1) + text
            else:
                source = "\n" * (line - 2) + f"class {owner}:\n" + textwrap.indent(text, "    ")
            namespace: dict[str, object] = dict(imported)
            exec(compile(source, pseudo_filename, "exec"), module.__dict__, namespace)  # noqa: S102
            if owner is None:
                compiled[(None, d.name)] = namespace[d.name]
                continue
            real_cls = getattr(module, owner)
            shell = namespace[owner]
            value = shell.__dict__[d.name]
            func = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
            if isinstance(func, types.FunctionType):
                func.__qualname__ = f"{real_cls.__qualname__}.{d.name}"
                for var, cell in zip(func.__code__.co_freevars, func.__closure__ or ()):
                    if var == "__class__":
                        cell.cell_contents = real_cls
            compiled[(owner, d.name)] = value
    return compiled
