"""What the header of a generated module records, and where the source lives.

Light on purpose (no libcst, no black): the import hook reads headers on every import.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

#: Bumped only when the generated text changes for the same input.
FORMAT_VERSION = 1
HASH_MARK = "# s2sgrad-source-sha256: "


@dataclass(frozen=True)
class Origin:
    """Where the source lives: as shown in the header, and as imported."""

    display_path: str
    module_name: str | None


def source_hash(source: str) -> str:
    """Return the sha256 of the source text, as the header records it."""
    return hashlib.sha256(source.encode("utf-8")).hexdigest()
