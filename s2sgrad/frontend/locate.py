"""Turn nodes into located diagnostics.

`Locator` wraps the positions libcst's PositionProvider computed for one module and
builds `Diagnostic` values that point at a node, with the source line for the caret
(lines split by `s2sgrad.lines`, as Python numbers them).
"""

from __future__ import annotations

from collections.abc import Mapping

import libcst as cst
from libcst.metadata import CodeRange

from s2sgrad.diagnostics import Diagnostic
from s2sgrad.lines import line_text, split_lines


class Locator:
    """Build diagnostics that point at nodes of one parsed module."""

    def __init__(
        self, path: str, source: str, positions: Mapping[cst.CSTNode, CodeRange]
    ):
        self.path = path
        self.lines = tuple(split_lines(source))
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
