"""Format generated code with black, in a pinned and explicit mode.

A generated module is formatted one top-level definition at a time: black's spacing
between module-level definitions is fixed (two blank lines), so the pieces joined with
it are what black makes of the whole text.

Each piece goes through black once. `black.format_str` runs its formatting pass a
second time whenever the first changed anything (always, for generated code), to
settle trailing commas that the first pass added; that doubles the cost of
formatting, the largest single cost of a conversion. Where the first pass gives a
fixed point of black, the second returns it unchanged, so one pass is the same text.
That it is a fixed point is what the guard checks on everything the tests generate
(`check_generated(..., fixed_point=True)`, tests/conftest.py), on whole modules with
`format_whole`, which is black as its users run it.

Code generation writes the module statement by statement, so it knows where the
definitions start: it cuts a `Cut` into `pieces` there without parsing the module
again, and formats them with `format_pieces` (a run of differentiators may be
formatted in a forked process, `s2sgrad.pipeline`).
"""

from __future__ import annotations

import ast
import functools
import itertools
from collections.abc import Callable, Iterable

import black
from black.mode import Mode, TargetVersion

from s2sgrad.lines import split_lines

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
    """`code` formatted by black, one top-level definition at a time (a `Cut` text is
    cut where it says, without parsing it)."""
    return "\n\n".join(format_pieces(pieces(code), line_length))


class Cut(str):
    """Module text that knows where its top-level definitions start, as `pieces`
    finds them with `ast` (`starts`: line indices of each `def` or `class`, or of its
    first decorator): a caller that wrote the text statement by statement knows that
    already, and the module need not be parsed again to be cut. Line indices count
    lines as Python does (`s2sgrad.lines.split_lines`)."""

    starts: tuple[int, ...]

    def __new__(cls, text: str, starts: Iterable[int]) -> Cut:
        made = super().__new__(cls, text)
        made.starts = tuple(starts)
        return made


def cut(text: str, starts: Iterable[int]) -> str:
    """`text` as a `Cut` at `starts` (counted in `\n`s); the plain text (`format_code`
    parses it) where it holds a `\r`, which Python counts as a line break too, or a
    start is not a definition's line."""
    if "\r" in text:
        return text
    made = Cut(text, starts)
    lines = split_lines(text)
    if all(0 <= i < len(lines) and lines[i].startswith(_HEADS) for i in made.starts):
        return made
    return text


#: How the first line of a top-level definition starts.
_HEADS = ("@", "def ", "async ", "class ")


def definition_starts(code: str) -> list[int]:
    """The line indices where `ast` finds the top-level definitions of `code` (a
    decorated one's first decorator)."""
    return [
        min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1
        for node in ast.parse(code).body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    ]


def format_pieces(pieces: Iterable[str], line_length: int) -> tuple[str, ...]:
    """Each piece formatted once; joined with `"\n\n"`, they are black's module.

    A piece is one top-level `def` or `class` with the comment lines right above it
    and the statements after it up to the next (the first piece: what comes before
    the first definition), as `pieces` cuts them.
    """
    return tuple(_format_piece(piece, line_length) for piece in pieces)


def format_whole(code: str, line_length: int) -> str:
    """`code` formatted by black in one call (what `black` itself does to a file)."""
    return black.format_str(code, mode=mode(line_length))


@functools.lru_cache(maxsize=1024)
def _format_piece(piece: str, line_length: int) -> str:
    """One piece, one pass; the same text recurs (the runtime, the rules)."""
    return _format_once(piece, mode=_modes(line_length))


@functools.lru_cache(maxsize=8)
def _modes(line_length: int) -> Mode:
    """One `Mode` per line length: black compares modes on every call it caches."""
    return mode(line_length)


#: black's formatting pass without its second, settling pass (see the module
#: docstring); the whole of `black.format_str` where a black lacks it.
_format_once: Callable[..., str] = getattr(black, "_format_str_once", black.format_str)


def pieces(code: str) -> list[str]:
    """`code` cut before each top-level `def` or `class` (its decorators and the
    comment lines right above it included): where a `Cut` says, else where `ast`
    finds them."""
    lines = split_lines(code, keepends=True)  # as `ast` numbers them
    found = code.starts if isinstance(code, Cut) else definition_starts(code)
    starts = []
    for start in found:
        while start > 0 and lines[start - 1].startswith("#"):
            start -= 1
        starts.append(start)
    bounds = [0, *(s for s in starts if s > 0), len(lines)]
    cuts = ["".join(lines[a:b]) for a, b in itertools.pairwise(bounds)]
    return [piece for piece in cuts if piece.strip()]
