"""Format generated code with black, in a pinned and explicit mode.

A generated module is formatted one top-level definition at a time: black's spacing
between module-level definitions is fixed (two blank lines), so the pieces joined with
it are what black makes of the whole text, and black's own second pass (which it runs
when its first changed anything) then covers only the pieces that needed it, not the
whole module. The guard's fixed-point check in the tests formats whole modules, so it
would see any difference.
"""

from __future__ import annotations

import ast
import functools
import itertools

import black
from black.mode import Mode, TargetVersion

_TARGETS = {TargetVersion.PY310}


def mode(line_length: int) -> Mode:
    """Return the exact black mode generated code is formatted with."""
    return Mode(
        target_versions=_TARGETS,
        line_length=line_length,
        string_normalization=True,
        is_pyi=False,
        magic_trailing_comma=True,
        preview=False,
    )


def format_code(code: str, line_length: int) -> str:
    """`code` formatted by black, one top-level definition at a time."""
    return "\n\n".join(_format_piece(piece, line_length) for piece in _pieces(code))


def format_whole(code: str, line_length: int) -> str:
    """`code` formatted by black in one call (what `black` itself does to a file)."""
    return black.format_str(code, mode=mode(line_length))


@functools.lru_cache(maxsize=1024)
def _format_piece(piece: str, line_length: int) -> str:
    """One piece; the same text recurs (the runtime in every module, the rules)."""
    return black.format_str(piece, mode=mode(line_length))


def _pieces(code: str) -> list[str]:
    """`code` cut before each top-level `def` or `class` (its decorators and the
    comment lines right above it included)."""
    lines = code.splitlines(keepends=True)
    starts = []
    for node in ast.parse(code).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1
            while start > 0 and lines[start - 1].startswith("#"):
                start -= 1
            starts.append(start)
    bounds = [0, *(s for s in starts if s > 0), len(lines)]
    pieces = ["".join(lines[a:b]) for a, b in itertools.pairwise(bounds)]
    return [piece for piece in pieces if piece.strip()]
