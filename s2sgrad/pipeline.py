"""The engine: source text and options in, generated module text out.

Pure: reads no files and no environment. The CLI and the import hook both call
`convert`, so they produce byte-identical modules for the same input.
"""

from __future__ import annotations

import contextlib
import contextvars
import gc
from collections.abc import Iterator
from dataclasses import replace
from typing import NamedTuple

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from s2sgrad.autodiff.plan import differentiate, module_facts
from s2sgrad.autodiff.record import Differentiated
from s2sgrad.autodiff.vjp import Sibling
from s2sgrad.codegen import Layout, Part, assemble, collisions, generate, part, plan
from s2sgrad.cst import remembering
from s2sgrad.diagnostics import Diagnostic, TransformError
from s2sgrad.frontend import ParsedModule, checks, parse
from s2sgrad.frontend.compose import Composed, check_draws, compose
from s2sgrad.frontend.locate import Locator
from s2sgrad.frontend.model import Differentiator
from s2sgrad.header import Origin
from s2sgrad.inplace import backward_out_of_place, out_of_place
from s2sgrad.lift import (
    check_autograd_state,
    check_closed_over,
    check_detached,
    check_outputs,
    check_parameters,
    check_untracked_bindings,
    lift,
)
from s2sgrad.lines import split_lines
from s2sgrad.options import Options
from s2sgrad.processes import balanced_runs, fork_map
from s2sgrad.values import Evaluator, ModuleFacts, forward_values


def convert(source: str, origin: Origin, options: Options) -> str:
    """Return the generated module for `source`, or raise `TransformError`.

    Where `PROCESSES` allows more than one, a module of many differentiators has
    them lifted, differentiated, emitted and formatted in forked processes, each
    taking a run of them in source order; the text is the same byte for byte.
    """
    with remembering(), _fewer_collections():
        front = _front(source, origin, options)
        sources = [diff for diff, _ in front.judged]
        if collisions(front.parsed, sources):
            # Differentiation's errors come first, as `analyse` then `generate`
            # report them.
            generate(front.parsed, _differentiated(front, options), options, origin)
        layout = plan(front.parsed, sources, options, origin.display_path)
        processes = PROCESSES.get()
        parts = None
        if processes > 1 and len(sources) >= _FORK_FROM:
            parts = _parts_in_processes(front, options, layout, processes)
        if parts is None:
            parts = [part(layout, _differentiated(front, options))]
        return assemble(front.parsed, sources, parts, options, origin)


#: How many processes may convert one module: the CLI sets it to its `-j` where it
#: converts a single file in its own process (with several files, each worker
#: converts one, alone).
PROCESSES: contextvars.ContextVar[int] = contextvars.ContextVar(
    "s2sgrad processes", default=1
)
#: Fewer differentiators convert faster in this process than processes start.
_FORK_FROM = 8


def analyse(
    source: str, origin: Origin, options: Options
) -> tuple[ParsedModule, list[Differentiated]]:
    """Parse, lift and differentiate `source` (after `compose` writes the closures
    forward keeps from other differentiators as calls): the records `generate` takes.

    `s2sgrad review` shows these records beside the text generated from them. The
    stages ask about the same subtrees again: each is walked once (`remembering`).
    """
    with remembering(), _fewer_collections():
        front = _front(source, origin, options)
        return front.parsed, _differentiated(front, options)


#: The youngest generation's threshold while a module converts (Python's is 700).
_YOUNG_THRESHOLD = 50_000


@contextlib.contextmanager
def _fewer_collections() -> Iterator[None]:
    """Collect the youngest generation less often while a module converts.

    A conversion makes millions of short-lived objects beside trees that live to
    the end (libcst's nodes, their metadata), and at Python's default thresholds
    the collector spent a quarter of the time walking them: 2.9 s against 2.5 s
    for tests/corpus/ as one module, 6.4 s against 4.6 s for the benchmark input,
    at the same peak memory (turning the collector off gained no more, and took
    70 % more memory). The thresholds are restored afterwards: the import hook
    converts inside the user's process.
    """
    young, *older = gc.get_threshold()
    gc.set_threshold(max(young, _YOUNG_THRESHOLD), *older)
    try:
        yield
    finally:
        gc.set_threshold(young, *older)


class _Front(NamedTuple):
    """A module read, its forward functions judged: what each differentiator's own
    lifting and differentiation start from."""

    composed: Composed
    parsed: ParsedModule
    siblings: dict[str, Sibling]
    facts: ModuleFacts
    judged: list[tuple[Differentiator, Evaluator | None]]
    path: str


def _front(source: str, origin: Origin, options: Options) -> _Front:
    composed = compose(source, origin.where)
    parsed = _parse(source, composed, origin.where)
    if not parsed.differentiators:
        raise TransformError([_none_found(parsed, origin.where)])
    try:
        siblings, facts = module_facts(parsed)
        judged = _judge_forward(parsed, facts, origin.where, options.policy)
    except TransformError as exc:
        raise TransformError(composed.restore(exc.diagnostics)) from None
    return _Front(composed, parsed, siblings, facts, judged, origin.where)


def _differentiated(
    front: _Front, options: Options, start: int = 0, stop: int | None = None
) -> list[Differentiated]:
    """The records of the judged differentiators `start:stop`."""
    try:
        return [
            differentiate(
                lift(diff, options, front.facts, evaluator),
                options,
                front.parsed.lines,
                front.siblings,
                front.facts,
                front.path,
            )
            for diff, evaluator in front.judged[start:stop]
        ]
    except TransformError as exc:
        raise TransformError(front.composed.restore(exc.diagnostics)) from None


def _parts_in_processes(
    front: _Front, options: Options, layout: Layout, processes: int
) -> list[Part] | None:
    """The parts of the module made in `processes` forked processes, each a run of
    differentiators of about equal source length; None where no fork is to be had.

    A forked process has the module read and judged already, and sends back text
    only. A run that fails raises here, the earliest run's error first: the serial
    loop would have stopped at that differentiator.
    """
    lengths = [diff.last_line - diff.first_line + 1 for diff, _ in front.judged]
    runs = balanced_runs(lengths, processes * _RUNS_PER_PROCESS)
    return fork_map(_part_of_run, runs, (front, options, layout), processes)


#: Runs per process: shorter runs even out differentiators of unequal cost.
_RUNS_PER_PROCESS = 3


def _part_of_run(run: tuple[int, int], state: tuple[_Front, Options, Layout]) -> Part:
    front, options, layout = state
    return part(layout, _differentiated(front, options, *run))


def _parse(source: str, composed: Composed, path: str) -> ParsedModule:
    """Parse the source as `compose` rewrote it; the module record keeps the
    source's own text and lines (for the header's hash and the comments that quote
    it), and every diagnostic points into the source."""
    try:
        parsed = parse(composed.source, path)
    except TransformError as exc:
        raise TransformError(composed.merged(exc.diagnostics)) from None
    if composed.source is not source:
        parsed = replace(parsed, source=source, lines=tuple(split_lines(source)))
    problems = [*composed.problems, *check_draws(parsed, composed)]
    if problems:
        raise TransformError(sorted(problems, key=lambda d: (d.line, d.column)))
    return parsed


def differentiator_names(source: str, path: str) -> list[str]:
    """The names of `source`'s differentiators, in source order (errors raise)."""
    parsed = _parse(source, compose(source, path), path)
    return [diff.name for diff in parsed.differentiators]


def has_differentiators(source: str, path: str) -> bool:
    """Tell whether `source` defines differentiators (errors count as yes)."""
    try:
        return bool(parse(source, path).differentiators)
    except TransformError:
        return True


def _judge_forward(
    parsed: ParsedModule, facts: ModuleFacts, path: str, policy: str
) -> list[tuple[Differentiator, Evaluator | None]]:
    """Check what forward's values are: parameters and outputs of a known kind,
    in-place writes that can be kept or rewritten (which are); report every problem of
    the module. Each differentiator comes back with forward's values, for lift, unless
    its forward was rewritten (then lift evaluates the new one)."""
    found: list[Diagnostic] = []
    judged: list[tuple[Differentiator, Evaluator | None]] = []
    for diff in parsed.differentiators:
        evaluator = forward_values(diff, facts)
        unannotated = check_parameters(diff, path, parsed.lines)
        found += unannotated or check_outputs(diff, evaluator, path, parsed.lines)
        found += check_autograd_state(diff, path, parsed.lines)
        found += check_detached(diff, policy, path, parsed.lines)
        found += check_untracked_bindings(diff, path, parsed.lines)
        found += check_closed_over(diff, evaluator, path, parsed.lines)
        try:
            rewritten = out_of_place(diff, evaluator.env, path, parsed.lines)
        except TransformError as exc:
            found += exc.diagnostics
            continue
        forward_kept = rewritten is diff
        try:
            rewritten = backward_out_of_place(
                rewritten, evaluator.env, facts, path, parsed.lines
            )
        except TransformError as exc:
            found += exc.diagnostics
            continue
        judged.append((rewritten, evaluator if forward_kept else None))
    if found:
        raise TransformError(sorted(found, key=lambda d: (d.line, d.column)))
    return judged


def _none_found(parsed: ParsedModule, path: str) -> Diagnostic:
    """S2S003 for a module without differentiators; at a method that is shaped like
    one, if a class holds such a method (s2sgrad converts module-level functions)."""
    hint = (
        "a differentiator ends with `return result, backward` where backward is a "
        "nested def"
    )
    for stmt in parsed.module.body:
        if not isinstance(stmt, cst.ClassDef):
            continue
        for method in stmt.body.body:
            if isinstance(method, cst.FunctionDef) and checks.backward_name(method):
                positions = MetadataWrapper(parsed.module, unsafe_skip_copy=True)
                where = positions.resolve(PositionProvider)[method.name].start
                locator = Locator(path, parsed.source, {})
                return locator.at(
                    "S2S003",
                    where.line,
                    where.column + 1,
                    "no differentiators found",
                    f"`{stmt.name.value}.{method.name.value}` is a method: s2sgrad "
                    "converts module-level functions; define it at module level "
                    "(a class may still call it)",
                )
    return Diagnostic("S2S003", "no differentiators found", path, 1, 1, "", hint)
