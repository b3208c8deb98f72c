"""The parts of `s2sgrad/runtime.py` that a generated module uses, as source text.

Takes the names a module's code reads; returns the runtime's import lines and the
top-level definitions those names need (each with the comment block above it, in the
runtime's order), for `--standalone` output, which carries them instead of importing
`s2sgrad.runtime`. The runtime's text is read as data, never imported: conversion
needs no torch. Invariant: the definitions returned define every runtime name they
read, so the copy runs on torch and the standard library alone.
"""

from __future__ import annotations

import ast
import functools
import importlib.resources
from dataclasses import dataclass

#: Runtime names a standalone module never needs (it does not import the runtime).
_SKIPPED = frozenset({"FORMATS", "_serves", "_served", "__getattr__"})


@dataclass(frozen=True)
class _Part:
    """One top-level statement of the runtime."""

    code: str
    defines: frozenset[str]
    reads: frozenset[str]


@dataclass(frozen=True)
class Runtime:
    """The runtime, cut into its imports and its top-level definitions."""

    #: Imported name -> its import line.
    imports: dict[str, str]
    parts: tuple[_Part, ...]

    @property
    def names(self) -> frozenset[str]:
        """Every name the runtime defines at top level."""
        return frozenset().union(*(p.defines for p in self.parts)) - _SKIPPED

    def copy(self, wanted: set[str]) -> tuple[list[str], str]:
        """(import lines, definitions) of what `wanted` needs, transitively."""
        needed = set(wanted) & self.names
        taken: list[_Part] = []
        while True:
            taken = [p for p in self.parts if p.defines & needed]
            reads = set().union(*(p.reads for p in taken)) if taken else set()
            grown = needed | (reads & self.names)
            if grown == needed:
                break
            needed = grown
        reads |= needed
        imports = sorted({self.imports[n] for n in reads if n in self.imports})
        code = ""
        for before, part in zip([None, *taken], taken, strict=False):
            one_line = "\n" not in part.code
            joint = "\n" if before and one_line and "\n" not in before.code else "\n\n"
            code += (joint if before else "") + part.code
        return imports, code


@functools.cache
def runtime() -> Runtime:
    """The runtime of the installed s2sgrad, read once."""
    text = importlib.resources.files("s2sgrad").joinpath("runtime.py").read_text()
    return cut(text)


def cut(text: str) -> Runtime:
    """Cut runtime source into its imports and its top-level definitions."""
    tree = ast.parse(text)
    lines = text.splitlines()
    imports: dict[str, str] = {}
    parts: list[_Part] = []
    end = 0
    for statement in tree.body:
        start = min(
            [statement.lineno]
            + [d.lineno for d in getattr(statement, "decorator_list", [])]
        )
        above = _comments_above(lines, end, start - 1)
        end = statement.end_lineno or statement.lineno
        if isinstance(statement, (ast.Import, ast.ImportFrom)):
            if not (
                isinstance(statement, ast.ImportFrom)
                and statement.module == "__future__"
            ):
                code = _segment(lines, statement)
                for alias in statement.names:
                    imports[(alias.asname or alias.name).split(".")[0]] = code
            continue
        if _is_docstring(statement):
            continue
        code = "\n".join(lines[above:end])
        parts.append(_Part(code, _defines(statement), _reads(statement)))
    return Runtime(imports, tuple(parts))


def _segment(lines: list[str], node: ast.stmt) -> str:
    """`ast.get_source_segment` of `node`, from the text's lines: that function
    splits the whole text again at each call (most of the cost of cutting the
    runtime, once per conversion). The runtime's import lines are ASCII, where
    ast's byte offsets are the column."""
    first, last = node.lineno - 1, (node.end_lineno or node.lineno) - 1
    start, end = node.col_offset, node.end_col_offset
    if first == last:
        return lines[first][start:end]
    return "\n".join(
        [lines[first][start:], *lines[first + 1 : last], lines[last][:end]]
    )


def _comments_above(lines: list[str], previous: int, start: int) -> int:
    """The index of the first line of the comment block right above line `start`."""
    first = start
    while first > previous and lines[first - 1].lstrip().startswith("#"):
        first -= 1
    return first


def _is_docstring(statement: ast.stmt) -> bool:
    return isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)


def _defines(statement: ast.stmt) -> frozenset[str]:
    """The top-level names a statement binds: a definition's, an assignment's targets,
    and those of the statements inside a `try` or an `if` (names bound inside a
    function or a comprehension are not top-level)."""
    if isinstance(statement, (ast.FunctionDef, ast.ClassDef)):
        return frozenset({statement.name})
    if isinstance(statement, (ast.Import, ast.ImportFrom)):
        return frozenset((a.asname or a.name).split(".")[0] for a in statement.names)
    if isinstance(statement, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = (
            statement.targets
            if isinstance(statement, ast.Assign)
            else [statement.target]
        )
        return frozenset(
            n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)
        )
    inner: list[ast.stmt] = []
    if isinstance(statement, ast.Try):
        inner = [*statement.body, *statement.orelse, *statement.finalbody]
        inner += [s for handler in statement.handlers for s in handler.body]
    elif isinstance(statement, ast.If):
        inner = [*statement.body, *statement.orelse]
    return frozenset().union(*(_defines(s) for s in inner))


def _reads(statement: ast.stmt) -> frozenset[str]:
    return frozenset(
        node.id
        for node in ast.walk(statement)
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)
    )
