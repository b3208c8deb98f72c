"""Split text into lines the way Python and libcst number them.

The one line splitter of s2sgrad: lines end at `\\n`, `\\r\\n` or `\\r` only.
`str.splitlines` also breaks at form feeds, vertical tabs and Unicode separators, which
would shift every line number after them. Light on purpose: the import hook uses it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_NEWLINE = re.compile(r"\r\n|\r|\n")
_KEEPING = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$")


def split_lines(source: str, keepends: bool = False) -> list[str]:
    """Split `source` into lines as Python numbers them.

    With `keepends`, each line keeps its terminator (for diffs and linecache).
    """
    if keepends:
        lines = _KEEPING.findall(source)
        return [line for line in lines if line]
    lines = _NEWLINE.split(source)
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def line_text(lines: Sequence[str], line: int) -> str:
    """Return line `line` (1-based) of `lines`, or "" when out of range."""
    return lines[line - 1] if 0 < line <= len(lines) else ""
