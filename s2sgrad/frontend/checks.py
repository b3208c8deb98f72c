"""Check a differentiator against the input language (DESIGN section 1).

Takes the forward `FunctionDef`, the name of its backward and a `Locator`; returns the
diagnostics for every construct outside the language. Checks that need scopes (undefined
names, mutation of captured values) live in `scopes.py`. An empty list means the
structure is one the later stages can translate faithfully.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from s2sgrad.diagnostics import Diagnostic
from s2sgrad.frontend.locate import Locator


def final_return(forward: cst.FunctionDef) -> cst.Return | None:
    """Return the function's last statement if it is a `return`."""
    body = forward.body.body
    if body and m.matches(body[-1], m.SimpleStatementLine(body=[m.Return()])):
        stmt = body[-1]
        assert isinstance(stmt, cst.SimpleStatementLine)
        ret = stmt.body[0]
        assert isinstance(ret, cst.Return)
        return ret
    return None


def returned_pair(
    forward: cst.FunctionDef,
) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
    """Return (RESULT, BACKWARD) of a final `return RESULT, BACKWARD`."""
    ret = final_return(forward)
    if (
        ret is None
        or not isinstance(ret.value, cst.Tuple)
        or len(ret.value.elements) != 2
    ):
        return None
    first, second = ret.value.elements
    if isinstance(first, cst.StarredElement) or isinstance(second, cst.StarredElement):
        return None
    return first.value, second.value


def nested_defs(forward: cst.FunctionDef) -> list[cst.FunctionDef]:
    return [s for s in forward.body.body if isinstance(s, cst.FunctionDef)]


def backward_name(forward: cst.FunctionDef) -> str | None:
    """Name the nested def that acts as backward, if the function is a differentiator."""
    defs = {d.name.value for d in nested_defs(forward)}
    pair = returned_pair(forward)
    if pair is not None and isinstance(pair[1], cst.Name) and pair[1].value in defs:
        return pair[1].value
    if "backward" in defs:
        return "backward"
    returned = _ReturnedNames()
    forward.body.visit(returned)
    hits = sorted(defs & returned.names)
    return hits[0] if hits else None


def is_lambda_backward(forward: cst.FunctionDef) -> bool:
    pair = returned_pair(forward)
    return pair is not None and isinstance(pair[1], cst.Lambda)


class _ReturnedNames(cst.CSTVisitor):
    def __init__(self) -> None:
        self.names: set[str] = set()

    def visit_Return(self, node: cst.Return) -> None:
        if node.value is not None:
            for name in m.findall(node.value, m.Name()):
                assert isinstance(name, cst.Name)
                self.names.add(name.value)


def check_structure(
    forward: cst.FunctionDef, backward: str, loc: Locator
) -> list[Diagnostic]:
    """Diagnose everything in `forward` that the translation cannot preserve."""
    found: list[Diagnostic] = []
    found += _check_signature(forward, loc)
    checker = _BodyChecker(forward, backward, loc)
    forward.body.visit(checker)
    found += checker.found
    defs = [d for d in nested_defs(forward) if d.name.value == backward]
    if len(defs) > 1:
        found.append(
            loc.error(
                "S2S111",
                defs[1],
                f"`{backward}` is defined more than once",
                "define backward once, as the last definition before the return",
            )
        )
    pair = returned_pair(forward)
    if pair is None or not m.matches(pair[1], m.Name(backward)):
        target = final_return(forward) or defs[0]
        found.append(
            loc.error(
                "S2S106",
                target,
                f"`{backward}` is not returned by `{forward.name.value}`",
                f"end the function with `return result, {backward}`",
            )
        )
        return found
    bw = defs[0]
    found += _check_backward_signature(bw, loc)
    n_out = len(pair[0].elements) if isinstance(pair[0], cst.Tuple) else 1
    n_grad = len(bw.params.params) + len(bw.params.posonly_params)
    if n_out != n_grad and not found:
        found.append(
            loc.error(
                "S2S107",
                bw,
                f"`{backward}` takes {n_grad} gradient(s) but `{forward.name.value}` "
                f"returns {n_out} output(s)",
                "give backward one gradient parameter per output",
            )
        )
    found += _check_gradient_count(forward, bw, loc)
    return found


def _check_signature(forward: cst.FunctionDef, loc: Locator) -> list[Diagnostic]:
    found = []
    if forward.asynchronous is not None:
        found.append(loc.error("S2S104", forward, "a differentiator cannot be `async`"))
    params = forward.params
    for star in (params.star_arg, params.star_kwarg):
        if isinstance(star, cst.Param):
            found.append(
                loc.error(
                    "S2S110",
                    star,
                    "a differentiator cannot take `*args` or `**kwargs`",
                    "name every parameter so each one gets a gradient slot",
                )
            )
    return found


def _check_backward_signature(bw: cst.FunctionDef, loc: Locator) -> list[Diagnostic]:
    found = []
    params = bw.params
    if bw.decorators:
        found.append(
            loc.error("S2S113", bw.decorators[0], "backward cannot be decorated")
        )
    extra = [
        p for p in (params.star_arg, params.star_kwarg) if isinstance(p, cst.Param)
    ]
    extra += list(params.kwonly_params)
    extra += [p for p in params.params if p.default is not None]
    if extra:
        found.append(
            loc.error(
                "S2S110",
                extra[0],
                "backward takes only plain gradient parameters",
                "write one positional parameter per output, without defaults",
            )
        )
    return found


def _check_gradient_count(
    forward: cst.FunctionDef, bw: cst.FunctionDef, loc: Locator
) -> list[Diagnostic]:
    params = forward.params
    n_params = (
        len(params.posonly_params) + len(params.params) + len(params.kwonly_params)
    )
    returns = _OwnReturns()
    bw.body.visit(returns)
    found = []
    for ret in returns.returns:
        if isinstance(ret.value, cst.Tuple) and len(ret.value.elements) != n_params:
            found.append(
                loc.error(
                    "S2S108",
                    ret,
                    f"backward returns {len(ret.value.elements)} gradient(s) but "
                    f"`{forward.name.value}` has {n_params} parameter(s)",
                    "return one entry per forward parameter, None where there is no gradient",
                )
            )
    return found


class _OwnReturns(cst.CSTVisitor):
    """Collect the returns of one function body, not of functions nested in it."""

    def __init__(self) -> None:
        self.returns: list[cst.Return] = []

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False

    def visit_Return(self, node: cst.Return) -> None:
        self.returns.append(node)


class _BodyChecker(cst.CSTVisitor):
    """Find returns, generators, scope statements and escapes of backward."""

    def __init__(self, forward: cst.FunctionDef, backward: str, loc: Locator) -> None:
        self.loc = loc
        self.backward = backward
        self.final = final_return(forward)
        pair = returned_pair(forward)
        # The def's own name and the final `return result, backward` are the only
        # places backward's name may appear.
        self.allowed: set[cst.CSTNode] = {d.name for d in nested_defs(forward)}
        if pair is not None:
            self.allowed.add(pair[1])
        self.found: list[Diagnostic] = []
        self.function_depth = 0
        self.loop_depth = 0
        self.in_final = False

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if node.asynchronous is not None:
            self.found.append(
                self.loc.error("S2S104", node, "`async def` is not supported here")
            )
        self.function_depth += 1

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.function_depth -= 1

    def visit_Lambda(self, node: cst.Lambda) -> None:
        self.function_depth += 1

    def leave_Lambda(self, original_node: cst.Lambda) -> None:
        self.function_depth -= 1

    def visit_For(self, node: cst.For) -> None:
        if node.asynchronous is not None:
            self.found.append(
                self.loc.error("S2S104", node, "`async for` is not supported")
            )
        self.loop_depth += 1

    def leave_For(self, original_node: cst.For) -> None:
        self.loop_depth -= 1

    def visit_While(self, node: cst.While) -> None:
        self.loop_depth += 1

    def leave_While(self, original_node: cst.While) -> None:
        self.loop_depth -= 1

    def visit_With(self, node: cst.With) -> None:
        if node.asynchronous is not None:
            self.found.append(
                self.loc.error("S2S104", node, "`async with` is not supported")
            )

    def visit_Return(self, node: cst.Return) -> None:
        if self.function_depth > 0:
            return
        if node is self.final:
            self.in_final = True
            return
        where = "inside a loop" if self.loop_depth else "before the end of the function"
        self.found.append(
            self.loc.error(
                "S2S101",
                node,
                f"return {where}: a differentiator returns once, at the end",
                "compute the result in a variable and return it with backward at the end",
            )
        )

    def leave_Return(self, original_node: cst.Return) -> None:
        if original_node is self.final:
            self.in_final = False

    def visit_Yield(self, node: cst.Yield) -> None:
        self.found.append(
            self.loc.error(
                "S2S104", node, "`yield` is not supported in a differentiator"
            )
        )

    def visit_Await(self, node: cst.Await) -> None:
        self.found.append(
            self.loc.error(
                "S2S104", node, "`await` is not supported in a differentiator"
            )
        )

    def visit_Global(self, node: cst.Global) -> None:
        self.found.append(
            self.loc.error(
                "S2S102",
                node,
                "`global` is not supported in a differentiator",
                "pass the value as a parameter or return it",
            )
        )

    def visit_Nonlocal(self, node: cst.Nonlocal) -> None:
        self.found.append(
            self.loc.error(
                "S2S102",
                node,
                "`nonlocal` is not supported in a differentiator",
                "backward must not rebind forward's variables; use a local name",
            )
        )

    def visit_Name(self, node: cst.Name) -> None:
        if node.value != self.backward or node in self.allowed:
            return
        what = (
            "returned more than once"
            if self.in_final
            else "used before the final return"
        )
        self.found.append(
            self.loc.error(
                "S2S105",
                node,
                f"`{self.backward}` is {what}",
                f"do not call, store or pass backward; end with `return result, {self.backward}`",
            )
        )
