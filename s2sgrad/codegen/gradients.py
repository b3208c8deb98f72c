"""The body of `f_backward`: the closure's own backward, then the generated VJP blocks.

Takes a `Differentiated` record; returns the statements after the context is unpacked. Without
promoted temporaries this is the closure's body as written (after any recomputation),
sliced per gradient when it computes each one on its own. With them, the closure's final
`return` becomes an assignment to one gradient variable per forward parameter, the
closure's part runs only when its output gradients arrive, and each VJP block adds the
gradient of a promoted temporary into those variables.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import libcst as cst

from s2sgrad.autodiff.record import Differentiated, Recompute
from s2sgrad.codegen import types
from s2sgrad.codegen.slicing import slice_closure
from s2sgrad.cst import (
    LineDropper,
    bound_target,
    findall,
    is_name,
    module,
    nodes,
    spelled,
    statements,
)
from s2sgrad.frontend.checks import own_returns
from s2sgrad.names import NameAllocator
from s2sgrad.values import NONE, param_value


def _comment(text: str) -> cst.EmptyLine:
    return cst.EmptyLine(comment=cst.Comment(f"# {text}"))


def recompute_call(plan: Recompute) -> list[cst.BaseStatement]:
    targets = ", ".join(plan.targets)
    call = cst.parse_statement(f"{targets} = {plan.function}({', '.join(plan.args)})\n")
    notes = [_comment("Recomputed, not saved (right at every order), because")]
    notes += [_comment(f"  {reason}") for reason in plan.reasons]
    return [call.with_changes(leading_lines=notes)]


@dataclass(frozen=True)
class BackwardBody:
    """f_backward's statements, and what its signature says about them."""

    statements: list[cst.BaseStatement]
    #: The `needs` keyword parameter (ctx.needs_input_grad), when the closure is sliced.
    needs: str | None
    #: Gradients may arrive as None (the closure's part is guarded).
    handles_none: bool
    #: The return annotation.
    returns: str


def backward_body(
    record: Differentiated, line_length: int = 88, called: bool = False
) -> BackwardBody:
    """Return f_backward's statements after the context is unpacked; `called` says
    that another differentiator's backward calls this one's closure and computes with
    what it returns, as the closure wrote it, so it is typed `Any` (a `Grad` would
    make `gw1 + gw2` there a type error where the closure returns tensors)."""
    grads = record.gradients
    user = statements(record.backward_body)
    prologue = recompute_call(grads.recompute) if grads and grads.recompute else []
    results = list(record.results)
    names = NameAllocator(record.taken)
    needs = names.fresh("needs")
    params = [p.name for p in record.source.params]
    guards = [names.fresh(f"need_{p}") for p in params]
    guarded = grads is not None and bool(grads.incoming)
    optional = {
        i for i, p in enumerate(record.source.params) if NONE in param_value(p).kinds
    }
    found = slice_closure(
        user, results, guards, line_length - (8 if guarded else 4), optional
    )
    sliced = found.statements if found else None
    # Unguarded, a variable that the slices assign on every path needs no start value.
    skip = found.assigned if found and not guarded else frozenset()
    variables = [r for r in results if r != "None" and r not in skip]
    init = (
        [cst.parse_statement(f"{' = '.join(variables)} = None\n")] if variables else []
    )
    if variables and sliced is not None and _annotates(sliced):
        sliced = _Unannotated(set(variables)).run(sliced)
    built = types.GRADS if len(results) > 1 else types.GRAD
    if called or any(param_value(p).tensor_list for p in record.source.params):
        built = "tuple[Any, ...]" if len(results) > 1 else "Any"  # a list of them
    if sliced is not None:
        used = {g for g in guards if any(g in _names(s) for s in sliced)}
        targets = ", ".join(g if g in used else "_" for g in guards)
        line = f"{targets} = {needs} or (True,) * {len(guards)}"
        if len(guards) > 1 and len(line) + 4 > line_length:
            # black's one pass splits the targets and adds their trailing comma,
            # which its next pass would read as magic: written with it, one pass
            # gives black's fixed point (an outside probe's long parameter names).
            line = f"({targets},) = {needs} or (True,) * {len(guards)}"
        unpack = cst.parse_statement(line + "\n")
        prefix = [unpack]
    else:
        prefix = []
    if grads is None or not grads.incoming:
        if sliced is None:
            return BackwardBody(prologue + user, None, False, "Any")
        ret = cst.parse_statement(f"return {', '.join(results)}\n")
        body = [*prologue, *prefix, *init, *sliced, ret]
        return BackwardBody(body, needs, False, built)
    diff = record.source
    body = [*prologue, *prefix, *init]
    closure, bare = (sliced, False) if sliced else _closure_part(record, results, user)
    if variables and not sliced and _annotates(closure):
        closure = _Unannotated(set(variables)).run(closure)
    # The Function materializes the missing ones when any gradient arrives: the
    # closure runs with all of them, or with none.
    test = " and ".join(f"{g} is not None" for g in diff.grad_params)
    note = f"# the closure `{diff.backward.name.value}`, " + (
        "its in-place ops out of place" if diff.backward_rewritten else "as written"
    )
    if len(f"    if {test}:  {note}") <= line_length:
        trailing = cst.TrailingWhitespace(cst.SimpleWhitespace("  "), cst.Comment(note))
        guard = cst.If(
            cst.parse_expression(test), cst.IndentedBlock(closure, header=trailing)
        )
    else:  # on its own line, or black would wrap the test to make room for it
        guard = cst.If(
            cst.parse_expression(test),
            cst.IndentedBlock(closure),
            leading_lines=[cst.EmptyLine(comment=cst.Comment("# T" + note[3:]))],
        )
    body.append(guard)
    if grads.inits:
        body.append(cst.parse_statement(f"{' = '.join(grads.inits)} = None\n"))
    body += list(grads.blocks)
    returned = (
        results[0] if bare else ", ".join(results) + ("," if len(results) == 1 else "")
    )
    body.append(cst.parse_statement(f"return {returned}\n"))
    if bare:
        returns = types.GRAD
    else:  # a tuple, of one gradient too
        returns = types.GRADS if built == types.GRAD else built
    return BackwardBody(body, needs if sliced else None, True, returns)


def _annotates(block: Sequence[cst.BaseStatement]) -> bool:
    """Whether `block` holds an annotated binding, or a comment (`# type: T`)."""
    return any(
        type(n) is cst.AnnAssign
        or type(n) is cst.Comment
        and n.value.startswith("# type:")
        for s in block
        for n in nodes(s)
    )


class _Unannotated(LineDropper):
    """Backward's annotated bindings of the gradient variables the generated code
    starts at None (`gx: Tensor = g * w`, or `gx = g * w  # type: Tensor`) as plain
    ones: mypy --strict reads a second declaration of `gx` as a redefinition (an
    outside probe). The value is the same; `Grad` already types the variable. A
    declaration alone (`gx: Tensor`) binds nothing and goes."""

    def __init__(self, names: set[str]) -> None:
        super().__init__()
        self.names = names

    def leave_SimpleStatementLine(
        self,
        original_node: cst.SimpleStatementLine,
        updated_node: cst.SimpleStatementLine,
    ) -> cst.SimpleStatementLine:
        body = [self._plain(s) for s in updated_node.body if not self._declares(s)]
        if not body:
            return self.emptied_line(updated_node)
        comment = updated_node.trailing_whitespace.comment
        if comment is not None and comment.value.startswith("# type:"):
            if any(
                bound_target(t.target) & self.names
                for s in body
                if isinstance(s, cst.Assign)
                for t in s.targets
            ):
                trailing = cst.TrailingWhitespace()
                return updated_node.with_changes(
                    body=body, trailing_whitespace=trailing
                )
        return updated_node.with_changes(body=body)

    def _declares(self, statement: cst.BaseSmallStatement) -> bool:
        """`gx: Tensor` alone, which binds nothing."""
        return (
            isinstance(statement, cst.AnnAssign)
            and statement.value is None
            and isinstance(statement.target, cst.Name)
            and statement.target.value in self.names
        )

    def _plain(self, statement: cst.BaseSmallStatement) -> cst.BaseSmallStatement:
        if (
            isinstance(statement, cst.AnnAssign)
            and statement.value is not None
            and isinstance(statement.target, cst.Name)
            and statement.target.value in self.names
        ):
            return cst.Assign(
                [cst.AssignTarget(statement.target)],
                statement.value,
                statement.semicolon,
            )
        return statement


def _names(node: cst.CSTNode) -> set[str]:
    return spelled(node)


def _closure_part(
    record: Differentiated, results: list[str], user: list[cst.BaseStatement]
) -> tuple[list[cst.BaseStatement], bool]:
    """Turn the closure's final return into assignments to the gradient variables."""
    returns = findall(module(user), cst.Return)
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
    return _nested(record, results, user), False


def _assign(results: list[str], value: cst.BaseExpression | None) -> cst.Assign | None:
    """Assign the closure's returned gradients to the result variables.

    Entries that already are the result variable, or `None` (the variables start at
    None, and a parameter that never gets one has the literal None), need none.
    """
    if value is None or is_name(value, "None"):
        return None
    if isinstance(value, cst.Tuple) and len(value.elements) == len(results):
        pairs = [
            (r, e.value)
            for r, e in zip(results, value.elements, strict=True)
            if r != "None" and not (is_name(e.value, r) or is_name(e.value, "None"))
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
        if is_name(value, results[0]):
            return None
        return cst.Assign([cst.AssignTarget(cst.Name(results[0]))], value)
    named = [cst.Name(r) if r != "None" else cst.Name("_") for r in results]
    target = cst.Tuple([cst.Element(n) for n in named], lpar=[], rpar=[])
    return cst.Assign([cst.AssignTarget(target)], value)


def _sequence(value: cst.BaseExpression | None) -> bool:
    return isinstance(value, (cst.Tuple, cst.List))


def _nested(
    record: Differentiated, results: list[str], user: list[cst.BaseStatement]
) -> list[cst.BaseStatement]:
    """Keep a closure with several returns as a nested function and call it."""
    diff = record.source
    name = diff.backward.name.value
    # Typed as the closure wrote it, untyped: `Any` in, `Any` out (mypy --strict
    # refuses an unannotated def; the gradients it gets may be lists).
    params = diff.backward.params.with_changes(
        params=[
            p.with_changes(annotation=p.annotation or cst.Annotation(cst.Name("Any")))
            for p in diff.backward.params.params
        ]
    )
    nested = diff.backward.with_changes(
        params=params,
        returns=diff.backward.returns or cst.Annotation(cst.Name("Any")),
        body=cst.IndentedBlock(user),
        leading_lines=[],
    )
    call = f"{name}({', '.join(diff.grad_params)})"
    n = len(results)
    targets = ", ".join(r if r != "None" else "_" for r in results)
    if n == 1 and not any(_sequence(r.value) for r in own_returns(module(user))):
        tail = cst.parse_statement(f"{targets} = {call}\n")
    elif n == 1 and not diff.returns_tuples:  # now bare, now in a tuple
        return [
            nested,
            cst.parse_statement(f"{targets} = {call}\n"),
            cst.parse_statement(
                f"if isinstance({targets}, (tuple, list)):\n"
                f"    ({targets},) = {targets}\n"
            ),
        ]
    elif n == 1:
        tail = cst.parse_statement(
            f"({targets},) = (None,) if (grads := {call}) is None else grads\n"
        )
    else:
        nones = ", ".join(["None"] * n)
        tail = cst.parse_statement(
            f"{targets} = ({nones}) if (grads := {call}) is None else grads\n"
        )
    return [nested, tail]
