"""Where a source file lives: its importable name and how it is shown.

Light on purpose (no libcst, no black): the import hook asks these on every import, and
`s2sgrad convert --check` reads sources with them before it knows it must convert. What
only a bad source needs (its diagnostic, a dataclass) is imported when one is found.
"""

from __future__ import annotations

import codecs
import os
import re
from pathlib import Path

from s2sgrad.lines import split_lines

_CODING = re.compile(rb"^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)", re.MULTILINE)


def module_name(path: Path) -> str:
    """Return the dotted name `path` is imported by, walking up `__init__.py` files."""
    parts = [path.stem]
    folder = path.resolve().parent
    while (folder / "__init__.py").is_file():
        parts.append(folder.name)
        folder = folder.parent
    return ".".join(reversed(parts))


def source_label(path: Path) -> str:
    """Return `path` as generated text names it: relative to its project's root (the
    folder of its `pyproject.toml` or `.git`, as the configuration is found), with
    forward slashes, so that output is the same from any working directory; outside
    a project, relative to the working directory (`display_path`)."""
    from s2sgrad.config import marks_a_project, project_root

    root = project_root([path])
    if not marks_a_project(root):
        return display_path(path)
    return path.resolve().relative_to(root).as_posix()


def display_path(path: Path) -> str:
    """Return `path` relative to the working directory, with forward slashes."""
    return Path(os.path.relpath(path.resolve(), Path.cwd())).as_posix()


def decode_source(data: bytes, path: str) -> str:
    """Decode UTF-8 source bytes (a UTF-8 BOM is dropped), or raise S2S002.

    The diagnostic points at the first invalid byte, counting columns in characters,
    and shows its line with the undecodable bytes replaced by U+FFFD.
    """
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8) :]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        from s2sgrad.diagnostics import Diagnostic, TransformError

        before = split_lines(data[: exc.start].decode("utf-8") + "\n")
        line_start = exc.start - len(before[-1].encode("utf-8"))
        text = split_lines(data[line_start:].decode("utf-8", errors="replace"))[0]
        message = f"source is not valid UTF-8 (byte 0x{data[exc.start]:02x})"
        diagnostic = Diagnostic(
            "S2S002",
            message,
            path,
            len(before),
            len(before[-1]) + 1,
            text,
            _encoding_hint(data),
        )
        raise TransformError([diagnostic]) from None


def _encoding_hint(data: bytes) -> str:
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return "the file looks like UTF-16; save it as UTF-8"
    cookie = _CODING.search(b"\n".join(data.splitlines()[:2]))
    if cookie is not None:
        declared = cookie.group(1).decode("ascii", errors="replace")
        if declared.lower().replace("_", "-") not in ("utf-8", "utf8"):
            return (
                f"the file declares the encoding `{declared}`, but s2sgrad reads "
                "only UTF-8: save it as UTF-8 and drop the coding line"
            )
    return "save the file as UTF-8"
