"""Type annotations of generated code, so that generated modules pass `mypy --strict`.

Takes the kinds `values.py` inferred; returns annotation source text. Tensors are
`Tensor` (imported from torch), gradients `Grad` (an alias of `Tensor | None` that the module
defines, as `ALIASES` says), lists of tensors `list[...]` or `tuple[..., ...]`; where a
kind is not one of those (a number, an object, or unknown) the annotation is `Any`,
which is what it is to the type checker too. The user's own annotations are kept as
written.
"""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from s2sgrad.cst import bound_target, is_name
from s2sgrad.frontend.model import Param
from s2sgrad.values import NONE, Value, integers, param_value

TENSOR = "Tensor"
GRAD = "Grad"
GRADS = "Grads"
CONTEXT = "Context"
NEEDS = "Needs"

#: The type aliases a generated module defines where its code uses them, with what
#: each stands for; they keep signatures on one line, as a reader would write them.
ALIASES = {
    CONTEXT: ("tuple[Any, ...]", "what f_forward hands to f_backward"),
    GRAD: ("Tensor | None", "None stands for a gradient of zeros"),
    GRADS: ("tuple[Grad, ...]", "what f_backward returns: a gradient per parameter"),
    NEEDS: ("tuple[bool, ...] | None", "ctx.needs_input_grad; None asks for all"),
}


def of(value: Value) -> str:
    """The annotation of a value of these kinds."""
    if value.tensor is True:
        return GRAD if NONE in value.kinds else TENSOR
    if value.tensor_list:
        return f"tuple[{TENSOR}, ...]" if value.form == "tuple" else f"list[{TENSOR}]"
    if value.items and value.kinds == {"seq"}:
        return f"tuple[{', '.join(of(item) for item in value.items)}]"
    return "Any"


def of_result(outputs: tuple[Value, ...], multi: bool) -> str:
    """The annotation of a differentiator's result: one output, or a tuple of them."""
    if not multi:
        return of(outputs[0]) if outputs else "Any"
    return f"tuple[{', '.join(of(o) for o in outputs)}]"


def numbers_widened(
    function: cst.FunctionDef, ints: frozenset[str] = frozenset()
) -> cst.FunctionDef:
    """`function` with `total: Any = 0` where a name is first bound to a number
    literal and later to what may be a tensor (`total = total + x * w`), which
    `mypy --strict` rejects as a change of the name's type; the closure's own code
    does the same. A name bound to ints only (`values.integers`, counting `ints`,
    parameters annotated `int`) keeps its inferred `int`."""
    first: dict[str, cst.Assign] = {}
    count: dict[str, int] = {}
    for node in _assignments(function.body):
        targets = node.targets if isinstance(node, cst.Assign) else [node]
        for target in targets:
            for name in bound_target(target.target):
                count[name] = count.get(name, 0) + 1
                if name not in first and isinstance(node, cst.Assign):
                    first[name] = node
    numbers = {
        name: node
        for name, node in first.items()
        if count[name] > 1
        and len(node.targets) == 1
        and isinstance(node.targets[0].target, cst.Name)
        and _number_literal(node.value)
    }
    if not numbers:
        return function
    integral = integers(function.body, ints)
    widen = {id(node) for name, node in numbers.items() if name not in integral}
    if not widen:
        return function
    return cst.ensure_type(function.visit(_Widened(widen)), cst.FunctionDef)


def _assignments(
    node: cst.CSTNode,
) -> Iterator[cst.Assign | cst.AugAssign | cst.AnnAssign]:
    """The assignment statements of a function's body, in order, blocks included,
    nested functions and classes left out (they bind names of their own)."""
    for child in node.children:
        if isinstance(child, cst.SimpleStatementLine):
            for small in child.body:
                if isinstance(small, (cst.Assign, cst.AugAssign, cst.AnnAssign)):
                    yield small
        elif isinstance(child, (cst.FunctionDef, cst.ClassDef)):
            continue
        elif isinstance(
            child,
            (
                cst.BaseSuite,
                cst.BaseCompoundStatement,
                cst.Else,
                cst.ExceptHandler,
                cst.ExceptStarHandler,
                cst.Finally,
                cst.MatchCase,
            ),
        ):
            yield from _assignments(child)


def _number_literal(node: cst.BaseExpression) -> bool:
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        node = node.expression
    return isinstance(node, (cst.Integer, cst.Float))


class _Widened(cst.CSTTransformer):
    def __init__(self, assigns: set[int]) -> None:
        self.assigns = assigns

    def leave_Assign(
        self, original_node: cst.Assign, updated_node: cst.Assign
    ) -> cst.BaseSmallStatement:
        if id(original_node) not in self.assigns:
            return updated_node
        return cst.AnnAssign(
            updated_node.targets[0].target,
            cst.Annotation(cst.Name("Any")),
            updated_node.value,
        )


class _ShortTensor(cst.CSTTransformer):
    """`torch.Tensor` spelled `Tensor`, as the rest of the generated module spells it."""

    def leave_Attribute(
        self, original_node: cst.Attribute, updated_node: cst.Attribute
    ) -> cst.BaseExpression:
        if is_name(updated_node.value, "torch") and updated_node.attr.value == "Tensor":
            return cst.Name(TENSOR)
        return updated_node


def annotated(params: cst.Parameters, diff_params: tuple[Param, ...]) -> cst.Parameters:
    """The signature with an annotation on every parameter: the user's where given
    (with `torch.Tensor` spelled `Tensor`), inferred otherwise."""
    by_name = {p.name: p for p in diff_params}

    def one(param: cst.Param) -> cst.Param:
        if param.annotation is not None:
            annotation = param.annotation.visit(_ShortTensor())
            assert isinstance(annotation, cst.Annotation)
            return param.with_changes(annotation=annotation)
        if param.name.value not in by_name:
            return param
        text = _inferred(by_name[param.name.value])
        return param.with_changes(annotation=cst.Annotation(cst.parse_expression(text)))

    star = params.star_arg
    return params.with_changes(
        star_arg=one(star) if isinstance(star, cst.Param) else star,
        star_kwarg=one(params.star_kwarg) if params.star_kwarg else None,
        posonly_params=[one(p) for p in params.posonly_params],
        params=[one(p) for p in params.params],
        kwonly_params=[one(p) for p in params.kwonly_params],
    )


def _inferred(param: Param) -> str:
    """An annotation for a parameter the user left without one."""
    default = param.node.default
    if isinstance(default, cst.Integer):
        return "int"
    if isinstance(default, cst.Float):
        return "float"
    if isinstance(default, cst.Name) and default.value in ("True", "False"):
        return "bool"
    return of(param_value(param))
