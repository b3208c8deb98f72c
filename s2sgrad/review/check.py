"""Compare a generated module with the file on disk: `--check` and `--diff`.

Takes the text on disk (None when the file is missing) and the freshly generated text;
returns the status of the output and a unified diff whose labels are the output path
(no timestamps, so the diff is the same on every machine). Invariant: the diff is empty
exactly when the status is `unchanged`.
"""

from __future__ import annotations

import difflib
from typing import Literal

from s2sgrad.lines import split_lines

Status = Literal["unchanged", "stale", "missing"]


def status(on_disk: str | None, generated: str) -> Status:
    """Say whether the output on disk is up to date."""
    if on_disk is None:
        return "missing"
    return "unchanged" if on_disk == generated else "stale"


def unified_diff(on_disk: str | None, generated: str, label: str) -> str:
    """Return the unified diff that turns the file on disk into the generated text."""
    old = split_lines(on_disk or "", keepends=True)
    new = split_lines(generated, keepends=True)
    lines = difflib.unified_diff(old, new, fromfile=label, tofile=label)
    return "".join(_terminated(line) for line in lines)


def _terminated(line: str) -> str:
    """End every diff line with a newline, marking a file that lacks its last one."""
    if line.endswith("\n"):
        return line
    return line + "\n\\ No newline at end of file\n"
