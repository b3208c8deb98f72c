"""Abstract values of forward variables: is it a tensor, does it carry a gradient?

Takes a differentiator's parameters and forward statements; returns, for every name the
forward binds, a `Value` saying whether it is known to be a tensor and whether it depends
on a differentiable input. Lifting uses this to classify captures (temporary or constant,
`save_for_backward` or a `ctx` attribute); autodiff uses it to decide which operands of a
forward statement need a vector-Jacobian product.

The analysis is conservative where it matters for correctness: a value is only called
non-differentiable when the expression proves it (comparisons, `.detach()`, sizes,
integer conversions, factory functions, literals).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import libcst as cst

from s2sgrad.cst import statements
from s2sgrad.frontend.model import Param


@dataclass(frozen=True)
class Value:
    """What is statically known of one forward value."""

    #: True: a tensor (or None in its place); False: not a tensor; None: unknown.
    tensor: bool | None
    #: Depends on a differentiable input.
    diff: bool

    def join(self, other: Value) -> Value:
        if self.tensor or other.tensor:
            tensor: bool | None = True
        elif self.tensor is None or other.tensor is None:
            tensor = None
        else:
            tensor = False
        return Value(tensor, self.diff or other.diff)


SCALAR = Value(False, False)
CONST = Value(True, False)
DIFF = Value(True, True)
UNKNOWN = Value(None, False)

_SCALAR_ATTRIBUTES = {
    "shape",
    "ndim",
    "dtype",
    "device",
    "is_cuda",
    "requires_grad",
    "layout",
    "is_leaf",
}
_SCALAR_METHODS = {
    "size",
    "dim",
    "numel",
    "item",
    "tolist",
    "element_size",
    "stride",
    "nelement",
    "is_contiguous",
    "is_floating_point",
    "storage_offset",
    "get_device",
    "ndimension",
}
#: Ops whose results carry no gradient: comparisons, indices, masks (method or function).
_NO_GRADIENT = {
    "argmax",
    "argmin",
    "argsort",
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
    "isnan",
    "isinf",
    "isfinite",
    "nonzero",
    "logical_and",
    "logical_or",
    "logical_not",
    "logical_xor",
}
_CONST_METHODS = _NO_GRADIENT | {
    "detach",
    "long",
    "int",
    "bool",
    "byte",
    "short",
    "char",
    "new_zeros",
    "new_ones",
    "new_empty",
    "new_full",
    "new_tensor",
    "zero_",
}
_VIEW_ATTRIBUTES = {"T", "mT", "H", "mH", "real", "imag"}
_CONST_TORCH = _NO_GRADIENT | {
    "zeros",
    "ones",
    "empty",
    "full",
    "arange",
    "linspace",
    "logspace",
    "eye",
    "rand",
    "randn",
    "randint",
    "randperm",
    "tensor",
    "as_tensor",
    "zeros_like",
    "ones_like",
    "empty_like",
    "full_like",
    "rand_like",
    "randn_like",
    "randint_like",
    "tril_indices",
    "triu_indices",
    "bernoulli",
    "multinomial",
    "bucketize",
    "searchsorted",
}
_SCALAR_TORCH = {
    "finfo",
    "iinfo",
    "Size",
    "is_tensor",
    "numel",
    "is_floating_point",
    "result_type",
    "promote_types",
    "get_default_dtype",
    "device",
}
_SCALAR_BUILTINS = {
    "len",
    "int",
    "float",
    "bool",
    "str",
    "range",
    "isinstance",
    "tuple",
    "list",
    "dict",
    "set",
    "enumerate",
    "zip",
    "reversed",
    "sorted",
    "round",
    "divmod",
    "hasattr",
    "type",
}
#: Calls that return a tuple of tensors.
SEQUENCE_RESULTS = {
    "split",
    "chunk",
    "unbind",
    "tensor_split",
    "hsplit",
    "vsplit",
    "dsplit",
    "meshgrid",
    "broadcast_tensors",
}
#: Methods and functions returning (values, indices): only the values carry a gradient.
VALUES_INDICES = {
    "max",
    "min",
    "sort",
    "topk",
    "kthvalue",
    "median",
    "mode",
    "cummax",
    "cummin",
    "nanmedian",
}
_TENSOR_ANNOTATIONS = ("Tensor",)
_NUMBER_ANNOTATIONS = {"int", "float", "bool", "complex", "Number"}
_SCALAR_ANNOTATIONS = {
    "int",
    "float",
    "bool",
    "str",
    "complex",
    "bytes",
    "None",
    "tuple",
    "list",
    "dict",
    "Sequence",
    "Tuple",
    "List",
    "Size",
    "dtype",
    "device",
    "Number",
    "slice",
}


def param_value(param: Param) -> Value:
    """Infer a parameter's value from its annotation, default and gradient slot."""
    annotation = param.annotation or ""
    words = set(
        annotation.replace("[", " ")
        .replace("]", " ")
        .replace("|", " ")
        .replace(",", " ")
        .replace(".", " ")
        .split()
    )
    if any(word in annotation for word in _TENSOR_ANNOTATIONS):
        # `torch.Tensor | float`: a tensor or a Python number, known only at run time.
        tensor = None if words & _NUMBER_ANNOTATIONS else True
        return Value(tensor, param.gets_gradient)
    if words and words <= _SCALAR_ANNOTATIONS | {
        "Optional",
        "Union",
        "typing",
        "torch",
    }:
        return SCALAR
    default = param.node.default
    if default is not None and not _is_none(default) and _is_literal(default):
        return SCALAR
    if param.gets_gradient:
        return DIFF
    return UNKNOWN


def _is_none(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Name) and node.value == "None"


def _is_literal(node: cst.BaseExpression) -> bool:
    if isinstance(
        node,
        (
            cst.Integer,
            cst.Float,
            cst.Imaginary,
            cst.SimpleString,
            cst.ConcatenatedString,
            cst.FormattedString,
        ),
    ):
        return True
    if isinstance(node, cst.Name):
        return node.value in {"True", "False", "None"}
    if isinstance(node, cst.UnaryOperation):
        return _is_literal(node.expression)
    if isinstance(node, (cst.Tuple, cst.List)):
        return all(_is_literal(e.value) for e in node.elements)
    return False


class Evaluator:
    """Evaluate expressions and statements over an environment of `Value`s."""

    def __init__(
        self, qualified: Mapping[cst.CSTNode, str], env: dict[str, Value]
    ) -> None:
        self.qualified = qualified
        self.env = env

    # -- expressions ---------------------------------------------------------------
    def expr(self, node: cst.BaseExpression) -> Value:
        method = getattr(self, "_" + type(node).__name__, None)
        if method is not None:
            result: Value = method(node)
            return result
        return self._join_children(node)

    def _join_children(self, node: cst.CSTNode) -> Value:
        value = SCALAR
        for child in node.children:
            if isinstance(child, cst.BaseExpression):
                value = value.join(self.expr(child))
            elif not isinstance(child, cst.BaseParenthesizableWhitespace):
                value = value.join(self._join_children(child))
        return value

    def _Name(self, node: cst.Name) -> Value:
        if node.value in ("True", "False", "None"):
            return SCALAR
        return self.env.get(node.value, UNKNOWN)

    def _Integer(self, node: cst.Integer) -> Value:
        return SCALAR

    _Float = _Imaginary = _SimpleString = _ConcatenatedString = _FormattedString = (
        _Integer
    )
    _Lambda = _Integer

    def _Attribute(self, node: cst.Attribute) -> Value:
        base = self.expr(node.value)
        if node.attr.value in _SCALAR_ATTRIBUTES:
            return SCALAR
        if node.attr.value in _VIEW_ATTRIBUTES or base.tensor:
            return base
        return Value(base.tensor, base.diff) if base.tensor is not None else UNKNOWN

    def _Subscript(self, node: cst.Subscript) -> Value:
        base = self.expr(node.value)
        return base if base.tensor is not False else Value(None, base.diff)

    def _Comparison(self, node: cst.Comparison) -> Value:
        value = self._join_children(node)
        return Value(value.tensor, False)

    def _UnaryOperation(self, node: cst.UnaryOperation) -> Value:
        inner = self.expr(node.expression)
        if isinstance(node.operator, cst.Not):
            return Value(inner.tensor, False)
        return inner

    def _IfExp(self, node: cst.IfExp) -> Value:
        return self.expr(node.body).join(self.expr(node.orelse))

    def _Tuple(self, node: cst.Tuple) -> Value:
        value = SCALAR
        for element in node.elements:
            value = value.join(self.expr(element.value))
        return Value(False, value.diff)

    _List = _Tuple

    def _Call(self, node: cst.Call) -> Value:
        args = SCALAR
        for arg in node.args:
            args = args.join(self.expr(arg.value))
        qualified = self.qualified.get(node.func, "")
        func = node.func
        if isinstance(func, cst.Name) and func.value in _SCALAR_BUILTINS:
            return Value(False, False) if not args.tensor else Value(None, args.diff)
        if qualified.startswith("math."):
            return SCALAR
        if qualified.startswith("torch.") and "." not in qualified[len("torch.") :]:
            name = qualified[len("torch.") :]
            if name in _SCALAR_TORCH:
                return SCALAR
            if name in _CONST_TORCH:
                return CONST
            return Value(True, args.diff)
        if qualified.startswith("torch."):
            return Value(True, args.diff)
        if isinstance(func, cst.Attribute):
            receiver = self.expr(func.value)
            name = func.attr.value
            if receiver.tensor is not False:
                if name in _SCALAR_METHODS:
                    return SCALAR
                if name in _CONST_METHODS:
                    return CONST
                if receiver.tensor:
                    return Value(True, receiver.diff or args.diff)
            return (
                receiver.join(args)
                if receiver.tensor is not False
                else Value(None, args.diff)
            )
        return Value(True if args.tensor else None, args.diff)

    # -- statements ----------------------------------------------------------------
    def run(self, statements: Iterable[cst.BaseStatement]) -> None:
        for statement in statements:
            self.statement(statement)

    def statement(self, node: cst.BaseStatement) -> None:
        if isinstance(node, cst.SimpleStatementLine):
            for small in node.body:
                self.small(small)
        elif isinstance(node, cst.If):
            self._branches(node)
        elif isinstance(node, (cst.For, cst.While)):
            if isinstance(node, cst.For):
                self.bind(node.target, self._iterated(node.iter))
            for _ in range(2):  # reach the fixpoint of a two-level lattice
                before = dict(self.env)
                self.run(statements(node.body))
                self._merge(before)
            if node.orelse is not None:
                self.run(statements(node.orelse.body))
        elif isinstance(node, cst.FunctionDef):
            self.env[node.name.value] = SCALAR
        elif isinstance(node, cst.ClassDef):
            self.env[node.name.value] = SCALAR
        elif isinstance(node, (cst.With, cst.Try)):
            for item in getattr(node, "items", ()):
                if item.asname is not None:
                    self.bind(item.asname.name, self.expr(item.item))
            self.run(statements(node.body))

    def _iterated(self, node: cst.BaseExpression) -> Value:
        value = self.expr(node)
        return Value(None, value.diff)

    def _branches(self, node: cst.If) -> None:
        before = dict(self.env)
        self.run(statements(node.body))
        after_body = self.env
        self.env = dict(before)
        if isinstance(node.orelse, cst.If):
            self._branches(node.orelse)
        elif isinstance(node.orelse, cst.Else):
            self.run(statements(node.orelse.body))
        for name, value in after_body.items():
            self.env[name] = self.env[name].join(value) if name in self.env else value

    def _merge(self, before: dict[str, Value]) -> None:
        for name, value in before.items():
            self.env[name] = self.env[name].join(value) if name in self.env else value

    def small(self, node: cst.BaseSmallStatement) -> None:
        if isinstance(node, cst.Assign):
            value = self.expr(node.value)
            for target in node.targets:
                self.bind(target.target, value, node.value)
        elif isinstance(node, cst.AnnAssign) and node.value is not None:
            declared = _annotated_tensor(node.annotation.annotation)
            value = self.expr(node.value)
            if declared is not None:
                value = Value(True, value.diff) if declared else SCALAR
            self.bind(node.target, value)
        elif isinstance(node, cst.AugAssign):
            value = self.expr(node.target).join(self.expr(node.value))
            self.bind(node.target, value)

    def bind(
        self,
        target: cst.BaseExpression,
        value: Value,
        source: cst.BaseExpression | None = None,
    ) -> None:
        if isinstance(target, cst.Name):
            self.env[target.value] = value
        elif isinstance(target, (cst.Tuple, cst.List)):
            parts = (
                source.elements if isinstance(source, (cst.Tuple, cst.List)) else None
            )
            for i, element in enumerate(target.elements):
                if parts is not None and len(parts) == len(target.elements):
                    item = self.expr(parts[i].value)
                else:
                    item = self._unpacked(value, source, i)
                self.bind(element.value, item)

    def _unpacked(
        self, value: Value, source: cst.BaseExpression | None, i: int
    ) -> Value:
        if isinstance(source, cst.Call) and i > 0:
            func = source.func
            name = (
                func.attr.value
                if isinstance(func, cst.Attribute)
                else (func.value if isinstance(func, cst.Name) else "")
            )
            if name in VALUES_INDICES:
                return CONST
        return Value(value.tensor if value.tensor else None, value.diff)


def _annotated_tensor(annotation: cst.BaseExpression) -> bool | None:
    """Read an assignment's annotation: a tensor (True), not one (False), or unknown."""
    text = cst.Module([]).code_for_node(annotation)
    if "Tensor" in text:
        return True
    if text.split("[")[0].split(".")[-1] in _SCALAR_ANNOTATIONS:
        return False
    return None


def forward_values(
    params: Iterable[Param],
    statements: Iterable[cst.BaseStatement],
    qualified: Mapping[cst.CSTNode, str],
) -> dict[str, Value]:
    """Return the value of every forward name at the end of the forward statements."""
    env = {p.name: param_value(p) for p in params}
    evaluator = Evaluator(qualified, env)
    evaluator.run(statements)
    return evaluator.env
