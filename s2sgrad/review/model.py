"""The review of a module: what the engine decided for each differentiator, as plain data.

Takes source text, its `Origin`, the options and the label of the output file; returns
one `ReviewRecord` per differentiator. It runs the same parse -> lift -> differentiate ->
generate path as `s2sgrad convert` (`pipeline.analyse`), so what it shows is what
convert writes. Invariant: every capture of the closure appears once, with its kind, how
the autograd Function keeps it and how its gradient flows back; the context slots are in
the order of the tuple `f_forward` returns. Rendering lives in `text` and `page`.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Literal

from s2sgrad.autodiff.record import Differentiated
from s2sgrad.codegen import generate
from s2sgrad.codegen.function import CTX_API, uses_save_helpers
from s2sgrad.header import Origin
from s2sgrad.lift import Kind, Lifted, Saved
from s2sgrad.lines import split_lines
from s2sgrad.names import Names
from s2sgrad.options import Options
from s2sgrad.pipeline import analyse

How = Literal["generated VJP", "recompute", "saved only"]
Reader = Literal["closure", "generated VJP", "recompute"]


@dataclass(frozen=True)
class Snippet:
    """A piece of code and the line number of its first line in its file."""

    title: str
    first_line: int
    text: str


@dataclass(frozen=True)
class CaptureRecord:
    """One value backward reads from forward."""

    #: The name backward reads (`t`, or `x_shape` for metadata).
    name: str
    #: The forward name it comes from.
    source: str
    kind: Kind
    #: What forward computes for it (`x.shape` for metadata).
    expression: str
    #: Who reads it: `closure` (the user's backward) or the generated code.
    read_by: Reader
    #: Source line of the closure's first read; None for the generated code's reads.
    line: int | None
    #: Position in the context tuple; None when it is recomputed instead of saved.
    slot: int | None
    #: How the autograd Function keeps it: `ctx.save_for_backward`, `ctx.n`, and
    #: whether forward returns it as an extra output for `setup_context`.
    saved: str
    #: Forward returns it as an extra output, so that `setup_context` sees it.
    extra_output: bool
    promoted: bool
    recomputed: bool
    #: How its gradient flows back to the inputs, in words.
    gradient: str


@dataclass(frozen=True)
class TemporaryRecord:
    """How the gradient of one captured temporary reaches the inputs, and why."""

    name: str
    how: How
    why: str
    #: The keyword-only parameter of `f_backward` that takes its gradient.
    grad_param: str | None


@dataclass(frozen=True)
class ContextSlot:
    """One entry of the context tuple and where backward finds it."""

    index: int
    name: str
    kind: Kind
    #: `ctx.saved_tensors[i]` or `ctx.<attribute>`.
    location: str


@dataclass(frozen=True)
class ReviewRecord:
    """Everything `s2sgrad review` shows for one differentiator."""

    name: str
    path: str
    output: str
    policy: str
    first_line: int
    last_line: int
    #: The differentiator as written.
    source: Snippet
    #: `f_forward`, the recompute helper if any, and `f_backward`, as generated.
    generated: tuple[Snippet, ...]
    captures: tuple[CaptureRecord, ...]
    temporaries: tuple[TemporaryRecord, ...]
    #: `line N: statement` for each forward statement the generated VJP differentiates.
    vjp_statements: tuple[str, ...]
    context: tuple[ContextSlot, ...]
    first_order: bool


def review(
    source: str, origin: Origin, options: Options, output: str
) -> list[ReviewRecord]:
    """Return the review of every differentiator in `source`; raise `TransformError`."""
    parsed, records = analyse(source, origin, options)
    generated = _Generated(generate(parsed, records, options, origin), output)
    lines = split_lines(source)
    return [
        _record(item, item.lifted, generated, lines, options, origin)
        for item in records
    ]


class _Generated:
    """The generated module: its top-level functions and classes, by name."""

    def __init__(self, text: str, label: str) -> None:
        self.label = label
        self.lines = split_lines(text)
        module = ast.parse(text)
        self.functions = {
            n.name: n for n in module.body if isinstance(n, ast.FunctionDef)
        }
        self.classes = {n.name: n for n in module.body if isinstance(n, ast.ClassDef)}

    def snippet(self, name: str) -> Snippet:
        node = self.functions[name]
        assert node.end_lineno is not None
        text = "\n".join(self.lines[node.lineno - 1 : node.end_lineno]) + "\n"
        return Snippet(f"{self.label}: {name}", node.lineno, text)


def _record(
    item: Differentiated,
    closure: Lifted,
    generated: _Generated,
    lines: list[str],
    options: Options,
    origin: Origin,
) -> ReviewRecord:
    diff = item.source
    names = Names.of(diff.name)
    recompute = item.gradients.recompute if item.gradients else None
    wanted = [
        names.forward,
        *([recompute.function] if recompute else []),
        names.backward,
    ]
    first, last = diff.first_line, diff.last_line
    text = "\n".join(lines[first - 1 : last]) + "\n"
    policy = diff.pragmas.get("policy", options.policy)
    temporaries = _temporaries(item, closure, policy)
    attributes = {
        s.name: (f"saved_{s.name}" if s.name in CTX_API else s.name)
        for s in item.context
    }
    if uses_save_helpers(item):
        attributes["_save"] = "_save"
    return ReviewRecord(
        name=diff.name,
        path=origin.where,
        output=generated.label,
        policy=policy,
        first_line=first,
        last_line=last,
        source=Snippet(origin.where, first, text),
        generated=tuple(generated.snippet(n) for n in wanted),
        captures=_captures(item, closure, temporaries, attributes),
        temporaries=temporaries,
        vjp_statements=_vjp_statements(item),
        context=_context(item, attributes),
        first_order=item.first_order,
    )


def _temporaries(
    item: Differentiated, closure: Lifted, policy: str
) -> tuple[TemporaryRecord, ...]:
    """Say, for each captured temporary, how its gradient flows back and why."""
    incoming = dict(item.gradients.incoming) if item.gradients else {}
    plan = item.gradients.recompute if item.gradients else None
    reasons = dict(zip(plan.targets, plan.reasons, strict=True)) if plan else {}
    own = [s.name for s in closure.context if s.kind == "temporary"]
    added = [
        s.name for s in item.context if s.kind == "temporary" and s.name not in own
    ]
    records = []
    for name in [*own, *added]:
        if name in reasons:
            why = reasons[name].removeprefix(f"`{name}`: ")
            records.append(TemporaryRecord(name, "recompute", why, None))
        elif name in incoming:
            why = (
                "derivative rules cover the forward statements that compute it"
                if name in own
                else "the generated VJP reads it, so its own gradient must flow too"
            )
            records.append(TemporaryRecord(name, "generated VJP", why, incoming[name]))
        else:
            why = (
                f"the {policy} policy is set: backward is first-order only, so any "
                "second-order use raises instead of missing this dependence"
            )
            records.append(TemporaryRecord(name, "saved only", why, None))
    return tuple(records)


_GRADIENT = {
    "input": "autograd tracks the input itself",
    "output": "autograd tracks the output itself",
    "constant": "none: it depends on no differentiable input",
    "metadata": "none: only the metadata is kept, not the tensor",
}


def _gradient(saved: Saved, temporary: TemporaryRecord | None) -> str:
    if temporary is None and saved.kind == "input" and not saved.tensor:
        return "none: not known to be a tensor"
    if temporary is None:
        return _GRADIENT[saved.kind]
    if temporary.how == "generated VJP":
        return f"generated VJP: backward takes {temporary.grad_param}"
    if temporary.how == "recompute":
        return "recomputed in backward from saved inputs"
    return "first order only: saved, a second-order use raises"


def _captures(
    item: Differentiated,
    closure: Lifted,
    temporaries: tuple[TemporaryRecord, ...],
    attributes: dict[str, str],
) -> tuple[CaptureRecord, ...]:
    """List the closure's captures, then the values only the generated code reads."""
    temps = {t.name: t for t in temporaries}
    slots = {s.name: i for i, s in enumerate(item.context)}
    final = {s.name: s for s in item.context}
    plan = item.gradients.recompute if item.gradients else None
    recomputed = set(plan.targets) if plan else set()
    rows: list[tuple[Saved, Reader, int | None]]
    rows = [(final.get(s.name, s), "closure", s.line) for s in closure.context]
    own = {s.name for s in closure.context}
    for saved in item.context:
        if saved.name not in own:
            reader: Reader = (
                "recompute" if plan and saved.name in plan.args else "generated VJP"
            )
            rows.append((saved, reader, None))
    records = []
    for saved, reader, line in rows:
        gone = saved.name in recomputed
        extra = not gone and saved in item.extras
        kept = _kept(saved, gone, extra, attributes)
        records.append(
            CaptureRecord(
                name=saved.name,
                source=saved.source,
                kind=saved.kind,
                expression=saved.expression,
                read_by=reader,
                line=line,
                slot=slots.get(saved.name),
                saved=kept,
                extra_output=extra,
                promoted=saved.promoted,
                recomputed=gone,
                gradient=_gradient(saved, temps.get(saved.name)),
            )
        )
    return tuple(records)


def _kept(saved: Saved, gone: bool, extra: bool, attributes: dict[str, str]) -> str:
    """Say how the autograd Function keeps a value, as `setup_context` does it."""
    if gone:
        return "not saved: recomputed in backward"
    if saved.storage == "unknown" or "_save" in attributes:
        where = "_save: save_for_backward if it is a tensor, else kept on ctx"
    elif saved.storage == "tensor":
        where = "ctx.save_for_backward"
    elif saved.storage == "tensors":
        where = "ctx.save_for_backward, element by element"
    else:
        where = f"ctx.{attributes.get(saved.name, saved.name)}"
    if saved.on is not None:
        return f"{where}, read off the {saved.on} in setup_context"
    if not extra:
        return where
    if saved.promoted:
        return f"extra output, {where}"
    return f"passed on from forward in a tuple, {where}"


def _context(
    item: Differentiated, attributes: dict[str, str]
) -> tuple[ContextSlot, ...]:
    slots = []
    tensors = 0
    helpers = "_save" in attributes
    for index, saved in enumerate(item.context):
        if helpers:
            location = f"_saved(ctx)[{index}]"
        elif saved.storage == "tensor":
            location = f"ctx.saved_tensors[{tensors}]"
            tensors += 1
        elif saved.storage == "tensors":
            location = f"ctx.saved_tensors[{tensors}:]"
        else:
            location = f"ctx.{attributes.get(saved.name, saved.name)}"
        slots.append(ContextSlot(index, saved.name, saved.kind, location))
    return tuple(slots)


def _vjp_statements(item: Differentiated) -> tuple[str, ...]:
    """Return `line N: statement` for each forward statement the generated VJP covers."""
    return item.gradients.covered if item.gradients else ()
