"""The one frozen options object of a conversion, and its cache key.

Options are plain data: the CLI and the import hook build them (from flags and
`[tool.s2sgrad]`); the engine only reads them. A dataclass, which loads `inspect`: the
digest itself lives in `s2sgrad.header`, so that `convert --check` needs neither.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

from s2sgrad.header import options_key

Policy = Literal["promote", "first-order", "recompute"]
#: `compile`: off, on (a call torch.compile cannot handle runs eagerly, after one
#: warning), or "strict" (such a call is an error).
Compile = Literal[False, True, "strict"]


@dataclass(frozen=True)
class Options:
    """What changes the generated text, and nothing else."""

    policy: Policy = "promote"
    line_length: int = 88
    suffix: str = "_grad"
    #: Run f_forward/f_backward inductor-compiled (`--compile`, `compile = true`).
    compile: Compile = False
    #: Carry the parts of `s2sgrad.runtime` the module uses instead of importing it
    #: (`--standalone`, `standalone = true`): it then runs where s2sgrad is not installed.
    standalone: bool = False

    def key(self) -> str:
        """Return a stable digest of every option, for caches and the header (see
        `header.options_key`)."""
        return options_key(asdict(self))
