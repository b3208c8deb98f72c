"""Split a closure's backward into per-gradient slices guarded by `needs_input_grad`.

Takes the closure's statements, the variables that hold each parameter's gradient and
the flag that says whether each is asked for; returns statements where the work only
one gradient needs runs only when autograd asked for that gradient, or None when the
closure is not separable (control flow, a name bound twice or after a statement that
reads it, a return that is not a tuple of one entry per parameter). Invariant: with every flag set
(or `needs_input_grad=None`, the default for direct callers) the sliced code computes
exactly what the closure computes.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import libcst as cst

from s2sgrad.autodiff.inline import bound_names, names_read
from s2sgrad.cst import (
    binds_one_name,
    findall,
    is_name,
    module,
    nodes,
    sole,
)
from s2sgrad.values import CONTAINER_MUTATORS


@dataclass(frozen=True)
class Sliced:
    """The sliced closure, and the result variables it assigns on every path."""

    statements: list[cst.BaseStatement]
    assigned: frozenset[str]


def slice_closure(
    statements: Sequence[cst.BaseStatement],
    results: Sequence[str],
    guards: Sequence[str],
    width: int = 88,
    optional: Collection[int] = (),
) -> Sliced | None:
    """Return the closure sliced per gradient, or None when it is not separable.

    A gradient that is one expression on its own becomes `grad_a = e if need_a else
    None` where that fits in `width` columns, a block under `if need_a:` otherwise.
    A gradient that is a variable the others read too (`return 2.0 * d, d`) is
    gated last, where its parameter is in `optional` (may be None: autograd refuses
    a gradient for an input that is not a tensor).
    """
    if len(results) < 2 or not statements:
        return None
    final = statements[-1]
    ret = sole(final, cst.Return)
    if ret is None or not isinstance(ret.value, cst.Tuple):
        return None
    entries = [e.value for e in ret.value.elements]
    body = list(statements[:-1])
    binds = [bound_names([s]) for s in body]
    if len(entries) != len(results) or not all(binds_one_name(s) for s in body):
        return None
    if sum(len(b) for b in binds) != len(set().union(*binds)):
        return None  # a name bound twice: slices would not be independent
    if _order_matters([*body, *entries]):
        return None
    read_before: set[str] = set()
    for statement, bound in zip(body, binds, strict=True):
        if bound & read_before:
            return None  # rebinds what an earlier statement read: order matters
        read_before |= names_read(statement)
    live = [i for i, e in enumerate(entries) if not is_name(e, "None")]
    if len(live) < 2:
        return None
    owners: list[set[int]] = [set() for _ in body]
    for i in live:
        wanted = names_read(entries[i])
        for k in reversed(range(len(body))):
            if binds[k] & wanted:
                owners[k].add(i)
                wanted |= names_read(body[k])
    out = [s for k, s in enumerate(body) if len(owners[k]) != 1]
    # Shared statements are plain ones at the top: a result they bind is bound on
    # every path (`d` in `return 2.0 * d, d`).
    shared_binds = set().union(
        *(binds[k] for k in range(len(body)) if len(owners[k]) != 1)
    )
    assigned = shared_binds & set(results)
    for i in live:
        own = [s for k, s in enumerate(body) if owners[k] == {i}]
        if results[i] == "None":
            continue
        if not own and not is_name(entries[i], results[i]):
            line = cst.SimpleStatementLine(
                [
                    cst.Assign(
                        [cst.AssignTarget(cst.Name(results[i]))],
                        cst.IfExp(
                            test=cst.Name(guards[i]),
                            body=_bracketed(entries[i]),
                            orelse=cst.Name("None"),
                        ),
                    )
                ]
            )
            code = module([line]).code.rstrip("\n")
            if "\n" not in code and len(code) <= width:
                out.append(line)
                assigned.add(results[i])
                continue
        if not is_name(entries[i], results[i]):
            own.append(
                cst.SimpleStatementLine(
                    [cst.Assign([cst.AssignTarget(cst.Name(results[i]))], entries[i])]
                )
            )
        if own:
            out.append(cst.If(cst.Name(guards[i]), cst.IndentedBlock(own)))
    for i in live:
        shared = not any(owners[k] == {i} for k in range(len(body)))
        if i in optional and shared and is_name(entries[i], results[i]):
            out.append(
                cst.parse_statement(
                    f"{results[i]} = {results[i]} if {guards[i]} else None\n"
                )
            )
    return Sliced(out, frozenset(assigned))


#: Values that make an object a call may change, or consume (see `_makes_changeable`).
_CHANGEABLE = (
    cst.List,
    cst.Dict,
    cst.Set,
    cst.ListComp,
    cst.DictComp,
    cst.SetComp,
    cst.GeneratorExp,
)
#: Builtins whose call makes a container or an iterator: `list(xs)`, `iter(xs)`.
_MAKERS = frozenset({"list", "dict", "set", "iter", "reversed"})


def _makes_changeable(part: cst.CSTNode) -> bool:
    """Whether `part` is a line of one assignment of a list, dict or set (display,
    comprehension or builtin call), a generator, `iter(...)` or `reversed(...)`."""
    assign = sole(part, cst.Assign)
    if assign is None:
        return False
    value = assign.value
    func = value.func if isinstance(value, cst.Call) else None
    return isinstance(value, _CHANGEABLE) or (
        isinstance(func, cst.Name) and func.value in _MAKERS
    )


#: Container methods that are also out-of-place tensor methods: they change only a
#: list, set or dict that backward made.
_TENSOR_TOO = frozenset({"add", "sort"})


def _order_matters(parts: Sequence[cst.CSTNode]) -> bool:
    """Whether the statements may change state that another reads, so that running
    only some of them changes what the rest compute: `stack.pop()`, `next(it)`, an
    in-place tensor op, a walrus (which binds a name inside an expression that a
    slice may skip), or a call handed a list, dict or iterator that backward made
    (a helper may fill it, or consume it)."""
    changeable = {
        target.target.value
        for part in parts
        if _makes_changeable(part)
        for target in findall(part, cst.AssignTarget)
        if isinstance(target.target, cst.Name)
    }
    for part in parts:
        for found in nodes(part):
            if isinstance(found, cst.NamedExpr):
                return True
            if not isinstance(found, cst.Call):
                continue
            func = found.func
            if isinstance(func, cst.Name) and func.value == "next":
                return True
            if isinstance(func, cst.Attribute):
                method = func.attr.value
                if method.endswith("_") and not method.startswith("_"):
                    return True  # an in-place tensor op
                receiver = func.value
                made = isinstance(receiver, cst.Name) and receiver.value in changeable
                if method in CONTAINER_MUTATORS and (made or method not in _TENSOR_TOO):
                    return True  # `stack.pop()`; `t.add(1)` and `t.sort()` are not
            if any(
                isinstance(a.value, cst.Name) and a.value.value in changeable
                for a in found.args
            ):
                return True
    return False


def _bracketed(value: cst.BaseExpression) -> cst.BaseExpression:
    """`value` as the body of a conditional expression: lambdas and conditionals bind
    more loosely, so they get parentheses."""
    if isinstance(value, (cst.IfExp, cst.Lambda, cst.NamedExpr)) and not value.lpar:
        return value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return value
