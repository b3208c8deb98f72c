"""Format generated code with black, in a pinned and explicit mode."""

from __future__ import annotations

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
    return black.format_str(code, mode=mode(line_length))
