"""Check a differentiator against the input language (DESIGN section 1).

Takes the forward `FunctionDef`, the name of its backward and a `Locator`; returns the
diagnostics for every construct outside the language. Checks that need scopes (undefined
names, mutation of captured values) live in `scopes.py`. An empty list means the
structure is one the later stages can translate faithfully.

Each construct is reported once, where it is written: an early return is not also
reported as "backward is not returned", and a `backward` stored in another name is not
also reported as missing from the final return.
"""

from __future__ import annotations

import libcst as cst

from s2sgrad.cst import (
    assigned_name,
    calls_name,
    findall,
    is_name,
    nodes,
    sole,
    sole_target,
    walk,
)
from s2sgrad.diagnostics import Diagnostic
from s2sgrad.frontend.locate import Locator

_BLOCKS: dict[type[cst.CSTNode], str] = {
    cst.If: "an `if` block",
    cst.Else: "an `else` block",
    cst.For: "a `for` loop",
    cst.While: "a `while` loop",
    cst.With: "a `with` block",
    cst.Try: "a `try` block",
    cst.ExceptHandler: "an `except` block",
    cst.Finally: "a `finally` block",
    cst.Match: "a `match` block",
}


def final_return(forward: cst.FunctionDef) -> cst.Return | None:
    """Return the function's last statement if it is a `return`."""
    body = forward.body.body
    return sole(body[-1], cst.Return) if body else None


def closing_return(forward: cst.FunctionDef) -> cst.Return | None:
    """Return the last `return` statement written directly in the function's body.

    It is the final statement, or an earlier one followed by code that never runs.
    """
    for stmt in reversed(forward.body.body):
        ret = sole(stmt, cst.Return)
        if ret is not None:
            return ret
    return None


def returned_pair(
    forward: cst.FunctionDef,
) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
    """Return (RESULT, BACKWARD) of a final `return RESULT, BACKWARD`.

    The flat form PyTorch's own closures use, `return out1, out2, backward`, means
    `return (out1, out2), backward`: RESULT is then that tuple (a new node).
    """
    ret = final_return(forward)
    return _split_pair(ret)


def _split_pair(
    ret: cst.Return | None,
) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
    if (
        ret is None
        or not isinstance(ret.value, cst.Tuple)
        or len(ret.value.elements) < 2
        or any(isinstance(e, cst.StarredElement) for e in ret.value.elements)
    ):
        return None
    *outputs, last = ret.value.elements
    if len(outputs) == 1:
        return outputs[0].value, last.value
    if not isinstance(last.value, (cst.Name, cst.Lambda)):
        return None
    result = cst.Tuple(
        [e.with_changes(comma=cst.MaybeSentinel.DEFAULT) for e in outputs],
        lpar=[cst.LeftParen()],
        rpar=[cst.RightParen()],
    )
    return result, last.value


def nested_defs(forward: cst.FunctionDef) -> list[cst.FunctionDef]:
    return [s for s in forward.body.body if isinstance(s, cst.FunctionDef)]


def backward_name(forward: cst.FunctionDef) -> str | None:
    """Name the nested def that acts as backward, if the function is a differentiator."""
    defs = {d.name.value for d in nested_defs(forward)}
    if not defs:
        return None
    pair = returned_pair(forward)
    if pair is not None and isinstance(pair[1], cst.Name) and pair[1].value in defs:
        return pair[1].value
    if "backward" in defs:
        return "backward"
    if _factory(forward, defs):
        return None
    returned = _ReturnedNames()
    walk(forward.body, returned)
    hits = sorted(defs & returned.names)
    return hits[0] if hits else None


def _factory(forward: cst.FunctionDef, defs: set[str]) -> bool:
    """Whether `forward` is a factory: it ends by returning one of its nested defs
    alone (`return act`), one whose name does not say it is a backward. A
    differentiator returns its result beside its closure (section 1); a closure named
    `backward` returned alone is a differentiator that lost its result (S2S106)."""
    ret = final_return(forward)
    return (
        ret is not None
        and isinstance(ret.value, cst.Name)
        and ret.value.value in defs
        and not any(w in ret.value.value.lower() for w in ("backward", "grad", "bwd"))
    )


def lambda_backward(forward: cst.FunctionDef) -> cst.Lambda | None:
    """Return the lambda returned as backward: `return out, lambda g: ...`, or
    `backward = lambda g: ...` in forward's body and `return out, backward`.

    A lambda bound to a name counts only when the name says so (`backward`,
    `grad_fn`): plain functions may well return a value and a key function.
    """
    pair = returned_pair(forward)
    if pair is None:
        return None
    if isinstance(pair[1], cst.Lambda):
        return pair[1]
    if (
        not isinstance(pair[1], cst.Name)
        or not any(w in pair[1].value.lower() for w in ("backward", "grad"))
        or pair[1].value in {d.name.value for d in nested_defs(forward)}
    ):
        return None
    for stmt in forward.body.body:
        # A line `<name> = lambda ...` alone.
        assign = sole(stmt, cst.Assign)
        if (
            assign is not None
            and is_name(assigned_name(assign), pair[1].value)
            and isinstance(assign.value, cst.Lambda)
        ):
            return assign.value
    return None


class _ReturnedNames(cst.CSTVisitor):
    """Names a function returns as such (`return f`, `return x, f`), not names only
    used in a returned expression (`return helper(x)`), in its own returns."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False

    def visit_Return(self, node: cst.Return) -> None:
        values = _returned_values(node)
        self.names.update(v.value for v in values if isinstance(v, cst.Name))


def check_nested_backward(forward: cst.FunctionDef, loc: Locator) -> list[Diagnostic]:
    """Diagnose a returned backward that is defined inside a block of forward.

    Such a function is not a differentiator by the rule of section 1, but it is
    clearly meant to be one: skipping it silently would drop it from the output.
    """
    pair = returned_pair(forward)
    if pair is not None and isinstance(pair[1], cst.Name):
        candidates = [pair[1].value]
    elif pair is None:
        # No final return of a pair: the returns of pairs may be inside the blocks
        # (`if sq: def backward...; return x * x, backward` and the same in `else`).
        names = set()
        for ret in findall(forward.body, cst.Return):
            inner = _split_pair(ret)
            if inner is not None and isinstance(inner[1], cst.Name):
                names.add(inner[1].value)
        candidates = sorted(names)
    else:
        return []
    hits = []
    for candidate in candidates:
        finder = _DefsInBlocks(candidate)
        walk(forward.body, finder)
        if finder.hit is not None:
            hits.append((candidate, *finder.hit))
    if not hits:
        return []
    name, node, block = hits[0]
    return [
        loc.error(
            "S2S116",
            node,
            f"`{name}` is defined inside {block}; a differentiator defines its "
            f"backward directly in its body",
            f"define one `{name}` at the top level of `{forward.name.value}`, before "
            "the final return, and branch inside it",
        )
    ]


class _DefsInBlocks(cst.CSTVisitor):
    """Find the first `def NAME` nested in a block (not in another function)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.blocks: list[str] = []
        self.hit: tuple[cst.FunctionDef, str] | None = None

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, cst.FunctionDef):
            if node.name.value == self.name and self.blocks and self.hit is None:
                self.hit = (node, self.blocks[-1])
            return False
        block = _BLOCKS.get(type(node))
        if block is not None:
            self.blocks.append(block)
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        if type(original_node) in _BLOCKS:
            self.blocks.pop()


def check_structure(
    forward: cst.FunctionDef, backward: str, loc: Locator
) -> list[Diagnostic]:
    """Diagnose everything in `forward` that the translation cannot preserve."""
    found: list[Diagnostic] = []
    found += _check_signature(forward, loc)
    closing = closing_return(forward)
    checker = _BodyChecker(forward, backward, closing, loc)
    walk(forward.body, checker)
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
    returned = _check_returned(forward, backward, closing, defs[0], checker, loc)
    if returned is not None:
        return found + returned
    pair = returned_pair(forward) or _closing_pair(closing)
    assert pair is not None
    bw = defs[0]
    found += _check_backward_signature(bw, loc)
    if not found:
        found += _check_arity(forward, pair[0], bw, loc)
    found += _check_gradient_count(forward, bw, loc)
    return found


def _closing_pair(
    closing: cst.Return | None,
) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
    return _split_pair(closing)


def _check_returned(
    forward: cst.FunctionDef,
    backward: str,
    closing: cst.Return | None,
    bw: cst.FunctionDef,
    checker: _BodyChecker,
    loc: Locator,
) -> list[Diagnostic] | None:
    """Check that forward ends with `return RESULT, backward`; None when it does."""
    name = forward.name.value
    if closing is None:
        if checker.early_returns:
            return []  # the early returns are the problem, already reported
        return [
            loc.error(
                "S2S106",
                bw,
                f"`{name}` defines `{backward}` but never returns it",
                f"end `{name}` with `return result, {backward}`",
            )
        ]
    value = closing.value
    for element in value.elements if isinstance(value, cst.Tuple) else ():
        if isinstance(element, cst.StarredElement):
            return [
                loc.error(
                    "S2S106",
                    element,
                    "the final return cannot unpack outputs with `*`",
                    f"list the outputs in one tuple: `return (out1, out2), {backward}`",
                )
            ]
    values = _returned_values(closing)
    code = cst.Module([]).code_for_node
    at = [i for i, v in enumerate(values) if is_name(v, backward)]
    if len(values) >= 2 and at and at[-1] == len(values) - 1:
        return None  # `return result, backward`, or flat: `return a, b, backward`
    if len(values) == 1 and at:
        return [
            loc.error(
                "S2S106",
                closing,
                f"`{name}` returns only `{backward}`; a differentiator returns its "
                f"result and `{backward}`",
                f"write `return result, {backward}`",
            )
        ]
    if at:
        rest = ", ".join(code(v) for i, v in enumerate(values) if i != at[0])
        return [
            loc.error(
                "S2S106",
                values[at[0]],
                f"`{backward}` must come last in the final return",
                f"write `return {rest}, {backward}`",
            )
        ]
    if checker.escapes:
        return []  # backward leaves through another name, already reported
    result = code(value) if value is not None else "result"
    return [
        loc.error(
            "S2S106",
            closing,
            f"`{name}` does not return `{backward}`",
            f"end `{name}` with `return {result}, {backward}`",
        )
    ]


def _returned_values(ret: cst.Return) -> list[cst.BaseExpression]:
    """The values a `return` lists: the tuple's elements, or its one value."""
    if isinstance(ret.value, cst.Tuple):
        return [e.value for e in ret.value.elements]
    return [] if ret.value is None else [ret.value]


def _check_signature(forward: cst.FunctionDef, loc: Locator) -> list[Diagnostic]:
    found = []
    name = forward.name.value
    if forward.decorators:
        decorator = forward.decorators[0]
        shown = cst.Module([]).code_for_node(decorator.decorator)
        found.append(
            loc.error(
                "S2S113",
                decorator,
                f"a differentiator cannot be decorated: the generated `{name}` would "
                f"silently lose `@{shown}`",
                f"remove the decorator, and apply it to the generated op if needed "
                f"(`{name} = {shown}({name})`)",
            )
        )
    if forward.asynchronous is not None:
        found.append(
            loc.error(
                "S2S104",
                forward,
                "a differentiator cannot be `async`",
                "remove `async`; autograd calls forward and backward synchronously",
            )
        )
    params = forward.params
    for star in (params.star_arg, params.star_kwarg):
        if isinstance(star, cst.Param):
            stars = "*" if star is params.star_arg else "**"
            found.append(
                loc.error(
                    "S2S110",
                    star,
                    f"a differentiator cannot take `{stars}{star.name.value}`",
                    "name every parameter so each one gets a gradient slot",
                )
            )
    return found


def _check_backward_signature(bw: cst.FunctionDef, loc: Locator) -> list[Diagnostic]:
    found = []
    params = bw.params
    name = bw.name.value
    if bw.decorators:
        found.append(
            loc.error(
                "S2S113",
                bw.decorators[0],
                f"`{name}` cannot be decorated",
                "remove the decorator: the generated code calls backward's body directly",
            )
        )
    extra: list[tuple[cst.Param, str]] = []
    if isinstance(params.star_arg, cst.Param):
        extra.append((params.star_arg, f"`*{params.star_arg.name.value}`"))
    extra += [
        (p, f"the keyword-only parameter `{p.name.value}`")
        for p in params.kwonly_params
    ]
    if isinstance(params.star_kwarg, cst.Param):
        extra.append((params.star_kwarg, f"`**{params.star_kwarg.name.value}`"))
    extra += [
        (p, f"a default for `{p.name.value}`")
        for p in (*params.posonly_params, *params.params)
        if p.default is not None
    ]
    if extra:
        param, what = min(extra, key=lambda e: loc.positions[e[0]].start.column)
        found.append(
            loc.error(
                "S2S110",
                param,
                f"`{name}` takes only plain gradient parameters, not {what}",
                "write one positional parameter per output, without a default",
            )
        )
    return found


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _check_arity(
    forward: cst.FunctionDef,
    result: cst.BaseExpression,
    bw: cst.FunctionDef,
    loc: Locator,
) -> list[Diagnostic]:
    """Check one gradient parameter of backward per output of forward, or fewer but
    some: as in TorchScript's closures (`topk` returns `values, indices, backward`
    with `def backward(grad_output)`), integer and bool outputs may go without one.
    Which outputs those are is known at run time, where the op checks the count."""
    n_out = len(result.elements) if isinstance(result, cst.Tuple) else 1
    grads = [*bw.params.posonly_params, *bw.params.params]
    if n_out == len(grads) or 0 < len(grads) < n_out:
        return []
    name, bname = forward.name.value, bw.name.value
    message = (
        f"`{bname}` takes {_plural(len(grads), 'gradient')} but `{name}` returns "
        f"{_plural(n_out, 'output')}"
    )
    hint = f"give `{bname}` one gradient parameter per output ({n_out})"
    if not grads and n_out > 1:
        hint += ", or one per floating-point output where the rest are integer or bool"
    if n_out == 1 and isinstance(result, cst.Name) and len(grads) > 1:
        shown = result.value
        hint = (
            f"`{shown}` is one output; to return {len(grads)} outputs, list them in "
            f"the return: `return (out1, out2), {bname}`"
        )
    target: cst.CSTNode = grads[n_out] if len(grads) > n_out else bw.name
    return [loc.error("S2S107", target, message, hint)]


def _check_gradient_count(
    forward: cst.FunctionDef, bw: cst.FunctionDef, loc: Locator
) -> list[Diagnostic]:
    params = forward.params
    names = [
        p.name.value
        for p in (*params.posonly_params, *params.params, *params.kwonly_params)
    ]
    n_params = len(names)
    returns = _OwnReturns()
    walk(bw.body, returns)
    name, bname = forward.name.value, bw.name.value
    hint = (
        f"return one entry per parameter of `{name}` ({', '.join(names)}), "
        "`None` where there is no gradient"
    )
    if not returns.returns and not returns.raises and not returns.yields:
        return [
            loc.error(
                "S2S108",
                bw.name,
                f"`{bname}` never returns the gradients",
                hint,
            )
        ]
    one_list = n_params == 1 and list_annotated(names_of(params)[0])
    found = []
    lists = _bound_to_sequences(bw) if n_params == 1 and not one_list else set()
    for ret in returns.returns:
        value = ret.value
        if value is not None and _unordered(value):
            shown = cst.Module([]).code_for_node(value)
            shown = shown if len(shown) <= 40 else shown[:37] + "..."
            found.append(
                loc.error(
                    "S2S108",
                    ret,
                    f"`{bname}` returns `{shown}`: autograd takes the gradients in "
                    f"order, one per parameter of `{name}`, and a dict or a set has no "
                    "such order",
                    hint,
                )
            )
            continue
        if one_list and not _holds_a_list(value):
            continue  # one list parameter's gradients, bare: any number of them
        if isinstance(value, cst.Name) and value.value in lists:
            found.append(
                loc.error(
                    "S2S108",
                    ret,
                    f"`{bname}` returns `{value.value}`, which it binds to a list or "
                    f"tuple, but `{name}` has one parameter: s2sgrad cannot tell its "
                    "one gradient in a sequence from the gradient itself",
                    f"return the gradient itself, or `({value.value}[0],)`",
                )
            )
            continue
        listed = isinstance(value, cst.Tuple) or (
            n_params > 1 and isinstance(value, cst.List)
        )
        starred = [
            e
            for e in getattr(value, "elements", ())
            if isinstance(e, cst.StarredElement)
        ]
        if listed and starred:
            shown = cst.Module([]).code_for_node(starred[0]).rstrip(", ")
            found.append(
                loc.error(
                    "S2S108",
                    ret,
                    f"`{bname}` returns `{shown}` among its gradients: s2sgrad reads "
                    f"one entry per parameter of `{name}` "
                    f"({_plural(n_params, 'parameter')}) and cannot count an unpacked "
                    "sequence",
                    hint,
                )
            )
            continue
        entries = (
            [e.value for e in value.elements]
            if isinstance(value, (cst.Tuple, cst.List)) and listed
            else [value] if n_params == 1 and value is not None else []
        )
        numbers = (
            [
                (param, entry)
                for param, entry in zip(names_of(params), entries, strict=True)
                if _number_literal(entry) and not _number_param(param)
            ]
            if len(entries) == n_params
            else []
        )  # else the count's own error, below
        if numbers:
            param, entry = numbers[0]
            shown = cst.Module([]).code_for_node(entry)
            found.append(
                loc.error(
                    "S2S108",
                    entry,
                    f"`{bname}` returns the number `{shown}` as the gradient of "
                    f"`{param.name.value}`: autograd takes a tensor or None there",
                    "return None where there is no gradient, or a tensor "
                    f"(`torch.zeros_like({param.name.value})`)",
                )
            )
            continue
        if (
            isinstance(value, (cst.Tuple, cst.List))
            and listed
            and len(value.elements) != n_params
        ):
            got = len(value.elements)
            found.append(
                loc.error(
                    "S2S108",
                    ret,
                    f"`{bname}` returns {_plural(got, 'gradient')} but `{name}` has "
                    f"{_plural(n_params, 'parameter')}",
                    hint,
                )
            )
        elif n_params > 1 and isinstance(
            value, (cst.BinaryOperation, cst.UnaryOperation)
        ):
            found.append(
                loc.error(
                    "S2S108",
                    ret,
                    f"`{bname}` returns one gradient but `{name}` has "
                    f"{_plural(n_params, 'parameter')}",
                    hint,
                )
            )
    return found


def _unordered(node: cst.BaseExpression) -> bool:
    """A dict or a set, displayed, comprehended or built by `dict(...)`/`set(...)`."""
    if isinstance(node, (cst.Dict, cst.DictComp, cst.Set, cst.SetComp)):
        return True
    return calls_name(node, "dict") or calls_name(node, "set")


def _number_literal(node: cst.BaseExpression) -> bool:
    """`0`, `0.0`, `-1`: a number written where a gradient goes."""
    if isinstance(node, cst.UnaryOperation):
        node = node.expression
    return isinstance(node, (cst.Integer, cst.Float, cst.Imaginary))


_NUMBER_TYPES = frozenset({"int", "float", "bool", "complex"})


def _number_param(param: cst.Param) -> bool:
    """A parameter that is a Python number: annotated as one, or, unannotated, with a
    number for its default. Its gradient is never handed to autograd."""
    if param.annotation is not None:
        annotation = param.annotation.annotation
        return is_name(annotation) and annotation.value in _NUMBER_TYPES
    return param.default is not None and _number_literal(param.default)


def _bound_to_sequences(bw: cst.FunctionDef) -> set[str]:
    """Names that backward binds to a list or tuple display or comprehension."""
    shapes = (cst.List, cst.Tuple, cst.ListComp)
    found = set()
    for node in nodes(bw.body):
        if isinstance(node, cst.Assign) and isinstance(node.value, shapes):
            targets = [t.target for t in node.targets]
        elif isinstance(node, cst.AnnAssign) and isinstance(node.value, shapes):
            targets = [node.target]
        else:
            continue
        found |= {t.value for t in targets if isinstance(t, cst.Name)}
    return found


def own_returns(body: cst.CSTNode) -> list[cst.Return]:
    """The returns of a function body, not of the functions nested in it."""
    returns = _OwnReturns()
    walk(body, returns)
    return returns.returns


def names_of(params: cst.Parameters) -> list[cst.Param]:
    """The parameters that take one argument each, in signature order."""
    return [*params.posonly_params, *params.params, *params.kwonly_params]


def _holds_a_list(value: cst.BaseExpression | None) -> bool:
    """Whether a returned tuple display has an element written as a list."""
    shapes = (cst.List, cst.Tuple, cst.ListComp, cst.GeneratorExp)
    return isinstance(value, cst.Tuple) and any(
        isinstance(e.value, shapes) for e in value.elements
    )


def list_annotated(param: cst.Param) -> bool:
    """Whether the parameter is annotated as a list of tensors."""
    from s2sgrad.values import annotation_value  # values reads frontend's records

    if param.annotation is None:
        return False
    return annotation_value(param.annotation.annotation).tensor_list


class _OwnReturns(cst.CSTVisitor):
    """Collect the returns and raises of one function body, not of nested functions."""

    def __init__(self) -> None:
        self.returns: list[cst.Return] = []
        self.raises: list[cst.Raise] = []
        self.yields: list[cst.Yield] = []

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False

    def visit_Return(self, node: cst.Return) -> None:
        self.returns.append(node)

    def visit_Raise(self, node: cst.Raise) -> None:
        self.raises.append(node)

    def visit_Yield(self, node: cst.Yield) -> None:
        self.yields.append(node)  # reported as S2S104


class _BodyChecker(cst.CSTVisitor):
    """Find returns, generators, scope statements and escapes of backward."""

    def __init__(
        self,
        forward: cst.FunctionDef,
        backward: str,
        closing: cst.Return | None,
        loc: Locator,
    ) -> None:
        self.loc = loc
        self.name = forward.name.value
        self.backward = backward
        self.final = closing
        self.dead_code = closing is not None and closing is not final_return(forward)
        # The def's own name and the direct elements of the final return are the
        # only places backward's name may appear.
        self.allowed: set[cst.CSTNode] = {d.name for d in nested_defs(forward)}
        if closing is not None:
            self.allowed.update(_returned_values(closing))
        self.found: list[Diagnostic] = []
        self.early_returns = 0
        self.escapes = 0
        self.stack: list[cst.CSTNode] = []
        self.functions: list[str] = []
        self.blocks: list[str] = []
        self.in_final = False
        self.in_rejected_return = False
        # Inside `async def` (already reported), `await` and friends are not news.
        self.async_depth = 1 if forward.asynchronous is not None else 0

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.stack.append(node)
        block = _BLOCKS.get(type(node))
        if block is not None and not self.functions:
            self.blocks.append(block)
        return super().on_visit(node)

    def on_leave(self, original_node: cst.CSTNode) -> None:
        super().on_leave(original_node)
        if type(original_node) in _BLOCKS and not self.functions:
            self.blocks.pop()
        self.stack.pop()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if node.asynchronous is not None:
            self.found.append(
                self.loc.error(
                    "S2S104",
                    node,
                    f"`async def {node.name.value}` is not supported in a "
                    "differentiator",
                    "remove `async`; autograd calls backward synchronously",
                )
            )
        self.functions.append(node.name.value)
        self.async_depth += node.asynchronous is not None

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.functions.pop()
        self.async_depth -= original_node.asynchronous is not None

    def visit_Lambda(self, node: cst.Lambda) -> None:
        self.functions.append("<lambda>")

    def leave_Lambda(self, original_node: cst.Lambda) -> None:
        self.functions.pop()

    def visit_For(self, node: cst.For) -> None:
        if node.asynchronous is not None and not self.async_depth:
            self.found.append(
                self.loc.error("S2S104", node, "`async for` is not supported")
            )

    def visit_With(self, node: cst.With) -> None:
        if node.asynchronous is not None and not self.async_depth:
            self.found.append(
                self.loc.error("S2S104", node, "`async with` is not supported")
            )

    def visit_Return(self, node: cst.Return) -> None:
        if self.functions:
            return
        if node is self.final:
            self.in_final = True
            if self.dead_code:
                self.found.append(
                    self.loc.error(
                        "S2S101",
                        node,
                        f"return before the end of `{self.name}`: the statements "
                        "after it never run",
                        f"make `return result, {self.backward}` the last statement",
                    )
                )
            return
        self.early_returns += 1
        self.in_rejected_return = True
        loops = [b for b in self.blocks if b.endswith("loop")]
        blocks = loops or self.blocks
        where = blocks[-1] if blocks else "the middle of the function"
        self.found.append(
            self.loc.error(
                "S2S101",
                node,
                f"early return inside {where}: a differentiator returns once, at "
                "the end",
                "assign the result to a variable and return it with backward at "
                "the end",
            )
        )

    def leave_Return(self, original_node: cst.Return) -> None:
        if not self.functions:
            self.in_final = False
            self.in_rejected_return = False

    def visit_Yield(self, node: cst.Yield) -> None:
        self.found.append(
            self.loc.error(
                "S2S104",
                node,
                "`yield` is not supported in a differentiator",
                "compute the values eagerly; a differentiator cannot be a generator",
            )
        )

    def visit_Await(self, node: cst.Await) -> None:
        if self.async_depth:
            return
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
        if (
            node.value != self.backward
            or node in self.allowed
            or self.in_rejected_return
        ):
            return
        self.escapes += 1
        message, hint = self._escape(node)
        self.found.append(self.loc.error("S2S105", node, message, hint))

    def _escape(self, node: cst.Name) -> tuple[str, str]:
        """Say how backward's name is used, for an S2S105 diagnostic."""
        bw = f"`{self.backward}`"
        only = f"backward may leave forward only as `return result, {self.backward}`"
        parent = self.stack[-2] if len(self.stack) > 1 else None
        grandparent = self.stack[-3] if len(self.stack) > 2 else None
        code = cst.Module([]).code_for_node
        if self.in_final:
            return (
                f"{bw} is returned more than once",
                f"return it once, as the second element: "
                f"`return result, {self.backward}`",
            )
        if self.backward in self.functions:
            return (
                f"{bw} refers to itself",
                "backward cannot call itself; move the recursive part into a "
                "module-level helper",
            )
        if self.functions:
            return (
                f"{bw} is used inside the nested function `{self.functions[-1]}`",
                only,
            )
        if isinstance(parent, cst.Call) and parent.func is node:
            return (
                f"{bw} is called inside forward",
                "forward must not run backward; autograd calls it when gradients "
                "are needed",
            )
        if isinstance(parent, cst.Arg) and isinstance(grandparent, cst.Call):
            return f"{bw} is passed to `{code(grandparent.func)}`", only
        if _is_target(node, parent):
            return (
                f"{bw} is rebound",
                "define backward once and return it unchanged",
            )
        if isinstance(parent, cst.Assign) and parent.value is node:
            targets = ", ".join(code(t.target) for t in parent.targets)
            return (
                f"{bw} is stored in `{targets}`",
                f"return {bw} itself: `return result, {self.backward}`",
            )
        return f"{bw} is used before the final return", only


def _is_target(node: cst.Name, parent: cst.CSTNode | None) -> bool:
    """Tell whether `node` is bound (assigned, deleted, loop target) by `parent`."""
    if isinstance(parent, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign)):
        return parent.target is node
    if isinstance(parent, (cst.For, cst.CompFor)):
        return parent.target is node
    if isinstance(parent, (cst.Del, cst.AsName, cst.NamedExpr)):
        return True
    return False


def check_sibling_closures(
    forward: cst.FunctionDef,
    backward: str,
    siblings: frozenset[str],
    loc: Locator,
) -> list[Diagnostic]:
    """Diagnose uses of another differentiator's closure other than calling it in backward.

    `g(x)[0]` and `y, _ = g(x)` take the result of a sibling `g`; its closure may be
    called in backward as `g(x)[1](grad)`, which becomes `g_backward(g_forward(x)[1],
    grad)`: the context is recomputed where backward runs, so its gradients at higher
    orders flow through `g_forward`. A closure kept in a name or captured from forward
    would be `g_forward`'s context tuple in the generated code, so it is rejected here.
    """
    if not siblings or not any(
        isinstance(n, cst.Call)
        and isinstance(n.func, cst.Name)
        and n.func.value in siblings
        for n in nodes(forward)
    ):
        return []  # every use below is of a call of a sibling

    def sibling(node: object) -> bool:
        """Whether `node` calls a sibling: `g(x)`."""
        return (
            isinstance(node, cst.Call)
            and is_name(node.func)
            and node.func.value in siblings
        )

    bw = next((d for d in nested_defs(forward) if d.name.value == backward), None)
    calls = findall(bw, cst.Call, lambda c: sibling(_second_of(c.func))) if bw else []
    called_in_backward = {id(c.func) for c in calls}
    found = []
    for node in findall(forward, cst.Subscript, lambda s: sibling(_second_of(s))):
        if id(node) in called_in_backward:
            continue
        assert isinstance(node.value, cst.Call)
        found.append(_sibling_closure_error(node, node.value, loc))
    kept: dict[str, cst.Call] = {}
    for assign in findall(
        forward, cst.Assign, lambda a: _two_targets(a) and sibling(a.value)
    ):
        assert isinstance(assign.value, cst.Call)
        target = assign.targets[0].target
        assert isinstance(target, cst.Tuple)
        second = target.elements[1].value
        if isinstance(second, cst.Name) and second.value != "_":
            kept[second.value] = assign.value
    for name, call in kept.items():
        uses = [c for c in findall(forward, cst.Call) if calls_name(c, name)]
        if uses:
            found.append(_sibling_closure_error(uses[0], call, loc, name))
    # `pair = g(x)`, then `pair[1]`: the same closure through the pair.
    for assign in findall(
        forward,
        cst.Assign,
        lambda a: assigned_name(a) is not None and sibling(a.value),
    ):
        assert isinstance(assign.value, cst.Call)
        target = assign.targets[0].target
        assert isinstance(target, cst.Name)
        through = [
            s
            for s in findall(forward, cst.Subscript)
            if is_name(_second_of(s), target.value)
        ]
        if through:
            found.append(_sibling_closure_error(through[0], assign.value, loc))
    return found


def _second_of(node: object) -> cst.BaseExpression | None:
    """`pair` where `node` is `pair[1]` or `pair[-1]` (the closure of a `(result,
    backward)` pair), else None."""
    if not isinstance(node, cst.Subscript) or len(node.slice) != 1:
        return None
    index = node.slice[0].slice
    if not isinstance(index, cst.Index):
        return None
    one = index.value
    if isinstance(one, cst.UnaryOperation) and isinstance(one.operator, cst.Minus):
        one = one.expression
    if isinstance(one, cst.Integer) and one.value == "1":
        return node.value
    return None


def _two_targets(assign: cst.Assign) -> bool:
    """Whether an assignment unpacks into two targets: `y, g = ...`."""
    target = sole_target(assign)
    return isinstance(target, cst.Tuple) and len(target.elements) == 2


def _sibling_closure_error(
    node: cst.CSTNode, call: cst.Call, loc: Locator, name: str | None = None
) -> Diagnostic:
    assert isinstance(call.func, cst.Name)
    sibling = call.func.value
    args = cst.Module([]).code_for_node(call)
    what = (
        f"`{name}`, the closure of `{sibling}`,"
        if name
        else f"the closure of `{sibling}`"
    )
    return loc.error(
        "S2S120",
        node,
        f"{what} is used other than called directly in backward",
        f"call it in backward as `{args}[1](grad)`; the generated code recomputes "
        f"`{sibling}`'s context there, so gradients stay right at every order",
    )
