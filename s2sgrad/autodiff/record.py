"""Autodiff's output record, `Differentiated`: what codegen and review read.

Each stage hands the next one frozen record of its own: `frontend.parse` gives a
`Differentiator`, `lift.lift` a `Lifted` (captures, kinds, the closure's context), and
`autodiff.plan.differentiate` a `Differentiated`, which keeps lift's record as lift
made it and adds what the generated code carries: the context as completed for the
generated VJP code, forward's statements with any snapshots, backward's body with
metadata read off saved tensors, and how the gradients of temporaries get back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import libcst as cst

from s2sgrad.frontend.model import Differentiator
from s2sgrad.lift import Lifted, Saved, extras_of
from s2sgrad.values import Value


@dataclass(frozen=True)
class Recompute:
    """Temporaries backward recomputes from saved inputs, with the reasons."""

    function: str
    #: Forward parameters the recomputation reads, and the backward names passed.
    params: tuple[str, ...]
    args: tuple[str, ...]
    statements: tuple[cst.BaseStatement, ...]
    #: Forward names returned, and the backward names they are bound to.
    returns: tuple[str, ...]
    targets: tuple[str, ...]
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class Gradients:
    """How backward carries the gradients of promoted temporaries."""

    #: (context entry, keyword-only gradient parameter) per promoted temporary.
    incoming: tuple[tuple[str, str], ...]
    #: The variables that hold each forward parameter's gradient.
    results: tuple[str, ...]
    #: Reverse-mode statements, run after the closure's own backward.
    blocks: tuple[cst.BaseStatement, ...]
    #: Accumulators that start at None.
    inits: tuple[str, ...]
    recompute: Recompute | None
    #: `line N: statement` for each forward statement the blocks differentiate.
    covered: tuple[str, ...] = ()


@dataclass(frozen=True)
class Differentiated:
    """A differentiator ready for code generation."""

    #: Lift's record, unchanged: the closure's own captures and context.
    lifted: Lifted
    #: The context the generated code carries (entries the VJP code reads added,
    #: promotion flags set, entries nothing reads any more dropped).
    context: tuple[Saved, ...]
    #: Backward's body, with metadata read off saved tensors where they are saved.
    backward_body: cst.BaseSuite
    #: Forward statements as emitted (with snapshots the VJP code reads).
    forward_statements: tuple[cst.BaseStatement, ...]
    #: None under the first-order policy or when no temporary is captured.
    gradients: Gradients | None
    #: Whether a temporary is saved without promotion, so double backward must raise.
    first_order: bool
    #: Names taken in the lifted functions; codegen allocates from these.
    taken: frozenset[str]

    @classmethod
    def as_lifted(cls, lifted: Lifted) -> Differentiated:
        """The record of a differentiator with nothing to differentiate."""
        return cls(
            lifted,
            lifted.context,
            lifted.backward_body,
            lifted.source.statements,
            None,
            lifted.first_order,
            lifted.taken,
        )

    @property
    def source(self) -> Differentiator:
        return self.lifted.source

    @property
    def values(self) -> Mapping[str, Value]:
        return self.lifted.values

    @property
    def results(self) -> tuple[str, ...]:
        return self.lifted.results

    @property
    def outputs(self) -> tuple[Value, ...]:
        return self.lifted.outputs

    @property
    def extras(self) -> tuple[Saved, ...]:
        """Context entries that forward must pass to `setup_context` as outputs."""
        return extras_of(self.context)
