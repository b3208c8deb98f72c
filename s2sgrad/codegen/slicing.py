"""Split a closure's backward into per-gradient slices guarded by `needs_input_grad`.

Takes the closure's statements and the variables that hold each parameter's gradient;
returns statements where the work only one gradient needs runs only when autograd asked
for that gradient, or None when the closure is not separable (control flow, rebinding,
a return that is not a tuple of one entry per parameter). Invariant: with every flag set
(or `needs_input_grad=None`, the default for direct callers) the sliced code computes
exactly what the closure computes.
"""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst
import libcst.matchers as m

from s2sgrad.autodiff.inline import bound_names, names_read

_SIMPLE = m.SimpleStatementLine(
    body=[m.Assign(targets=[m.AssignTarget(m.Name())]) | m.AnnAssign(target=m.Name())]
)


def slice_closure(
    statements: Sequence[cst.BaseStatement], results: Sequence[str], needs: str
) -> list[cst.BaseStatement] | None:
    """Return the closure sliced per gradient, or None when it is not separable."""
    if len(results) < 2 or not statements:
        return None
    final = statements[-1]
    if not m.matches(final, m.SimpleStatementLine(body=[m.Return(value=m.Tuple())])):
        return None
    assert isinstance(final, cst.SimpleStatementLine)
    ret = final.body[0]
    assert isinstance(ret, cst.Return) and isinstance(ret.value, cst.Tuple)
    entries = [e.value for e in ret.value.elements]
    body = list(statements[:-1])
    binds = [bound_names([s]) for s in body]
    if len(entries) != len(results) or not all(m.matches(s, _SIMPLE) for s in body):
        return None
    if sum(len(b) for b in binds) != len(set().union(*binds)):
        return None  # a name bound twice: slices would not be independent
    live = [i for i, e in enumerate(entries) if not m.matches(e, m.Name("None"))]
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
    for i in live:
        own = [s for k, s in enumerate(body) if owners[k] == {i}]
        if not m.matches(entries[i], m.Name(results[i])):
            own.append(
                cst.SimpleStatementLine(
                    [cst.Assign([cst.AssignTarget(cst.Name(results[i]))], entries[i])]
                )
            )
        if own:
            test = cst.parse_expression(f"{needs} is None or {needs}[{i}]")
            out.append(cst.If(test, cst.IndentedBlock(own)))
    return out
