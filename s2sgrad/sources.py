"""Where a source file lives: its importable name and how it is shown.

Light on purpose (no libcst, no black): the import hook asks these on every import.
"""

from __future__ import annotations

import os
from pathlib import Path


def module_name(path: Path) -> str:
    """Return the dotted name `path` is imported by, walking up `__init__.py` files."""
    parts = [path.stem]
    folder = path.resolve().parent
    while (folder / "__init__.py").is_file():
        parts.append(folder.name)
        folder = folder.parent
    return ".".join(reversed(parts))


def display_path(path: Path) -> str:
    """Return `path` relative to the working directory, with forward slashes."""
    return Path(os.path.relpath(path.resolve(), Path.cwd())).as_posix()
