"""Collision-free names for generated code.

Generated names come from the user's names (`x_shape`, `grad_t`) and get a numeric
suffix only on collision, so a generated name never shadows a user's name.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


class NameAllocator:
    """Hand out names that are not taken, remembering each one given."""

    def __init__(self, taken: Iterable[str]) -> None:
        self.taken = set(taken)

    def fresh(self, wanted: str) -> str:
        name, n = wanted, 1
        while name in self.taken:
            name = f"{wanted}_{n}"
            n += 1
        self.taken.add(name)
        return name

    def release(self, name: str) -> None:
        """Give `name` back: whatever held it was renamed."""
        self.taken.discard(name)

    def child(self) -> NameAllocator:
        """Return an allocator for an inner scope that starts from these names."""
        return NameAllocator(self.taken)


@dataclass(frozen=True)
class Names:
    """Name the definitions generated for a differentiator `f`.

    They are `f_forward`, `f_backward`, `FFunction` and the op `f`.
    """

    forward: str
    backward: str
    function: str
    op: str

    @classmethod
    def of(cls, name: str) -> Names:
        stem = name.lstrip("_")
        camel = "".join(part[:1].upper() + part[1:] for part in stem.split("_"))
        prefix = "_" * (len(name) - len(stem))
        return cls(
            f"{name}_forward", f"{name}_backward", f"{prefix}{camel}Function", name
        )
