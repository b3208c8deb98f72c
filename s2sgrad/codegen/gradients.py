"""The body of `f_backward`: the closure's own backward, then the generated VJP blocks.

Takes a `Lifted` record; returns the statements after the context is unpacked. Without
promoted temporaries this is the closure's body as written (after any recomputation).
With them, the closure's final `return` becomes an assignment to one gradient variable
per forward parameter, the closure's part runs only when its output gradients arrive,
and each VJP block adds the gradient of a promoted temporary into those variables.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m

from s2sgrad.codegen.slicing import slice_closure
from s2sgrad.cst import as_compound_or_line, module, statements
from s2sgrad.lift import Lifted, Recompute
from s2sgrad.names import NameAllocator


def _comment(text: str) -> cst.EmptyLine:
    return cst.EmptyLine(comment=cst.Comment(f"# {text}"))


def recompute_call(plan: Recompute) -> list[cst.BaseStatement]:
    targets = ", ".join(plan.targets)
    call = cst.parse_statement(f"{targets} = {plan.function}({', '.join(plan.args)})\n")
    notes = [_comment("Recomputed from saved inputs (correct at every order):")]
    notes += [_comment(f"  {reason}") for reason in plan.reasons]
    return [call.with_changes(leading_lines=notes)]


@dataclass(frozen=True)
class BackwardBody:
    """f_backward's statements, and its `needs_input_grad` parameter when sliced."""

    statements: list[cst.BaseStatement]
    needs: str | None


def backward_body(lifted: Lifted) -> BackwardBody:
    """Return f_backward's statements after the context is unpacked."""
    grads = lifted.gradients
    user = statements(lifted.backward_body)
    prologue = recompute_call(grads.recompute) if grads and grads.recompute else []
    results = list(lifted.results)
    needs = NameAllocator(lifted.taken).fresh("needs_input_grad")
    sliced = slice_closure(user, results, needs)
    init = cst.parse_statement(f"{' = '.join(results)} = None\n")
    if grads is None or not grads.incoming:
        if sliced is None:
            return BackwardBody(prologue + user, None)
        ret = cst.parse_statement(f"return {', '.join(results)}\n")
        return BackwardBody([*prologue, init, *sliced, ret], needs)
    diff = lifted.source
    body = [*prologue, init]
    closure, bare = (sliced, False) if sliced else _closure_part(lifted, results, user)
    test = " or ".join(f"{g} is not None" for g in diff.grad_params)
    guard = cst.If(cst.parse_expression(test), cst.IndentedBlock(closure))
    body.append(
        guard.with_changes(
            leading_lines=[
                _comment(f"The closure `{diff.backward.name.value}`, as written.")
            ]
        )
    )
    if grads.inits:
        body.append(cst.parse_statement(f"{' = '.join(grads.inits)} = None\n"))
    blocks = list(grads.blocks)
    if blocks:
        first = as_compound_or_line(blocks[0])
        note = _comment("Gradients of the promoted temporaries, back to the inputs.")
        blocks[0] = first.with_changes(leading_lines=[note, *first.leading_lines])
    body += blocks
    returned = (
        results[0] if bare else ", ".join(results) + ("," if len(results) == 1 else "")
    )
    body.append(cst.parse_statement(f"return {returned}\n"))
    return BackwardBody(body, needs if sliced else None)


def _closure_part(
    lifted: Lifted, results: list[str], user: list[cst.BaseStatement]
) -> tuple[list[cst.BaseStatement], bool]:
    """Turn the closure's final return into assignments to the gradient variables."""
    returns = m.findall(module(user), m.Return())
    final = user[-1] if user else None
    if (
        len(returns) == 1
        and isinstance(final, cst.SimpleStatementLine)
        and isinstance(final.body[-1], cst.Return)
    ):
        ret = final.body[-1]
        assign = _assign(results, ret.value)
        head = list(final.body[:-1])
        line = [*head, *([assign] if assign else [])]
        bare = len(results) == 1 and not isinstance(ret.value, cst.Tuple)
        kept = [*user[:-1], final.with_changes(body=line)] if line else user[:-1]
        return kept or [cst.SimpleStatementLine([cst.Pass()])], bare
    return _nested(lifted, results, user), False


def _assign(results: list[str], value: cst.BaseExpression | None) -> cst.Assign | None:
    """Assign the closure's returned gradients to the result variables.

    Entries that already are the result variable, or `None` (the variables start at
    None), need no assignment.
    """
    if value is None or m.matches(value, m.Name("None")):
        return None
    if isinstance(value, cst.Tuple) and len(value.elements) == len(results):
        pairs = [
            (r, e.value)
            for r, e in zip(results, value.elements, strict=True)
            if not m.matches(e.value, m.Name(r) | m.Name("None"))
        ]
        if not pairs:
            return None
        if len(pairs) == 1:
            return cst.Assign([cst.AssignTarget(cst.Name(pairs[0][0]))], pairs[0][1])
        target = cst.Tuple(
            [cst.Element(cst.Name(r)) for r, _ in pairs], lpar=[], rpar=[]
        )
        values = cst.Tuple([cst.Element(v) for _, v in pairs], lpar=[], rpar=[])
        return cst.Assign([cst.AssignTarget(target)], values)
    if len(results) == 1:
        if m.matches(value, m.Name(results[0])):
            return None
        return cst.Assign([cst.AssignTarget(cst.Name(results[0]))], value)
    target = cst.Tuple([cst.Element(cst.Name(r)) for r in results], lpar=[], rpar=[])
    return cst.Assign([cst.AssignTarget(target)], value)


def _nested(
    lifted: Lifted, results: list[str], user: list[cst.BaseStatement]
) -> list[cst.BaseStatement]:
    """Keep a closure with several returns as a nested function and call it."""
    diff = lifted.source
    name = diff.backward.name.value
    nested = diff.backward.with_changes(body=cst.IndentedBlock(user), leading_lines=[])
    call = f"{name}({', '.join(diff.grad_params)})"
    n = len(results)
    if n == 1:
        tail = cst.parse_statement(f"{results[0]} = {call}\n")
    else:
        nones = ", ".join(["None"] * n)
        tail = cst.parse_statement(
            f"{', '.join(results)} = ({nones}) if (grads := {call}) is None else grads\n"
        )
    return [nested, tail]
