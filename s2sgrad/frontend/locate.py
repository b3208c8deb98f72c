"""Turn nodes into located diagnostics.

`Locator` wraps the positions libcst's PositionProvider computed for one module and
builds `Diagnostic` values that point at a node, with the source line for the caret.
Lines are split the way Python and libcst count them (`\\n`, `\\r\\n`, `\\r`), not by
`str.splitlines`, which also breaks at form feeds and other separators.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import libcst as cst
from libcst.metadata import CodeRange

from s2sgrad.diagnostics import Diagnostic

_NEWLINE = re.compile(r"\r\n|\r|\n")


def split_lines(source: str) -> list[str]:
    """Split `source` into lines as Python numbers them (no line terminators)."""
    lines = _NEWLINE.split(source)
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def line_text(lines: list[str], line: int) -> str:
    """Return line `line` (1-based) of `lines`, or "" when out of range."""
    return lines[line - 1] if 0 < line <= len(lines) else ""


class Locator:
    """Build diagnostics that point at nodes of one parsed module."""

    def __init__(
        self, path: str, source: str, positions: Mapping[cst.CSTNode, CodeRange]
    ):
        self.path = path
        self.lines = split_lines(source)
        self.positions = positions

    def line_of(self, node: cst.CSTNode) -> int:
        return self.positions[node].start.line

    def error(
        self, code: str, node: cst.CSTNode, message: str, hint: str | None = None
    ) -> Diagnostic:
        start = self.positions[node].start
        return self.at(code, start.line, start.column + 1, message, hint)

    def at(
        self, code: str, line: int, column: int, message: str, hint: str | None = None
    ) -> Diagnostic:
        text = line_text(self.lines, line)
        return Diagnostic(code, message, self.path, line, column, text, hint)
