"""Abstract values of forward variables: what kind of value, does it carry a gradient?

Takes a differentiator's parameters and forward statements; returns, for every name the
forward binds, a `Value`: the kinds of Python value it may hold at run time (a tensor,
None, a number, a container of values, another object) and whether it depends on a
differentiable input. Lifting uses this to classify captures and to decide how each is
saved; autodiff uses it to decide which operands of a statement need a vector-Jacobian
product; codegen uses it to flatten lists of tensors into the autograd Function.

What a torch call returns comes from torch's own operator schemas (`s2sgrad.opfacts`);
Python's builtins and syntax are modelled here. Containers join everything put into
them (`append`, `extend`, `insert`, item stores, comprehensions), so a list of tensors
filled in a loop is known as one. The analysis is conservative where it matters: a value
is only non-differentiable or only a non-tensor when that is proven; anything else is
"unknown", which later stages handle in a way that is right whatever the value is.

Kinds do not tell an int from a bool; `integers` proves ints by syntax, where that
matters (`t[1]` is a view of `t`, `t[True]` a copy).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

import libcst as cst

from s2sgrad import opfacts
from s2sgrad.cst import (
    bound,
    bound_target,
    calls_name,
    dotted,
    is_name,
    nodes,
    statements,
    walk,
)
from s2sgrad.frontend.model import Differentiator, Helper, Param
from s2sgrad.sharing import shared_arguments

TENSOR, NONE, NUMBER, OTHER, SEQ = "tensor", "none", "number", "other", "seq"

#: `t += x` computes `t + x`: the binary operator of each augmented assignment.
AUG_TO_BINARY: dict[type[cst.BaseAugOp], type[cst.BaseBinaryOp]] = {
    cst.AddAssign: cst.Add,
    cst.SubtractAssign: cst.Subtract,
    cst.MultiplyAssign: cst.Multiply,
    cst.DivideAssign: cst.Divide,
    cst.PowerAssign: cst.Power,
    cst.MatrixMultiplyAssign: cst.MatrixMultiply,
    cst.FloorDivideAssign: cst.FloorDivide,
    cst.ModuloAssign: cst.Modulo,
}
_ALL = frozenset({TENSOR, NONE, NUMBER, OTHER, SEQ})


@dataclass(frozen=True)
class Value:
    """What is statically known of one forward value."""

    #: The kinds of Python value it may hold: tensor, none, number, other, seq.
    kinds: frozenset[str]
    #: Depends on a differentiable input.
    diff: bool = False
    #: For a container (`seq`): the join of its elements; None when nothing is known.
    item: Value | None = None
    #: For a container of known length (a tuple result): each element.
    items: tuple[Value, ...] | None = None
    #: For a container: `list`, `tuple` or `dict` when known.
    form: str | None = None
    #: For a named tuple of known items (`x.max(dim)`): the field name of each item.
    fields: tuple[str, ...] | None = None

    def join(self, other: Value) -> Value:
        kinds = self.kinds | other.kinds
        item = items = form = fields = None
        if SEQ in self.kinds and SEQ in other.kinds:
            item = _join_optional(self.element_or_none(), other.element_or_none())
            if (
                self.items is not None
                and other.items is not None
                and len(self.items) == len(other.items)
            ):
                items = tuple(
                    a.join(b) for a, b in zip(self.items, other.items, strict=True)
                )
            form = self.form if self.form == other.form else None
            fields = self.fields if self.fields == other.fields else None
        elif SEQ in self.kinds:
            item, items, form, fields = self.item, self.items, self.form, self.fields
        elif SEQ in other.kinds:
            item, items, form = other.item, other.items, other.form
            fields = other.fields
        return Value(kinds, self.diff or other.diff, item, items, form, fields)

    def element_or_none(self) -> Value | None:
        if self.items is not None:
            return _join_all(self.items) if self.items else BOTTOM
        return self.item

    def element(self) -> Value:
        """The join of the container's elements (unknown when nothing is known)."""
        found = self.element_or_none()
        return found if found is not None else top(self.diff)

    def with_diff(self, diff: bool) -> Value:
        return replace(self, diff=diff)

    def nondiff(self) -> Value:
        """The same kinds, carrying no gradient (elements included)."""
        item = self.item.nondiff() if self.item is not None else None
        items = (
            tuple(i.nondiff() for i in self.items) if self.items is not None else None
        )
        return Value(self.kinds, False, item, items, self.form, self.fields)

    @property
    def tensor(self) -> bool | None:
        """True: a tensor (or None in its place); False: never holds a tensor;
        None: anything else (a container of tensors, unknown)."""
        if TENSOR in self.kinds and self.kinds <= {TENSOR, NONE}:
            return True
        return False if not self.holds_tensor else None

    @property
    def holds_tensor(self) -> bool:
        """Whether a tensor may be in it, itself or inside a container."""
        if TENSOR in self.kinds:
            return True
        return SEQ in self.kinds and self.element().holds_tensor

    @property
    def tensor_list(self) -> bool:
        """A container whose elements are all tensors (`List[Tensor]`, `split`)."""
        if self.kinds != {SEQ} or self.form == "dict":
            return False
        element = self.element_or_none()
        return element is not None and element.tensor is True and bool(element.kinds)


def _joined(a: dict[str, Value], b: dict[str, Value]) -> dict[str, Value]:
    """The environments `a` and `b` joined: either may be what holds afterwards."""
    out = dict(a)
    for name, value in b.items():
        out[name] = out[name].join(value) if name in out else value
    return out


def _join_optional(a: Value | None, b: Value | None) -> Value | None:
    if a is None or b is None:
        return None
    return a.join(b)


def _join_all(values: Iterable[Value]) -> Value:
    out = BOTTOM
    for value in values:
        out = out.join(value)
    return out


def top(diff: bool = False) -> Value:
    """Nothing is known of the value."""
    return Value(_ALL, diff)


def seq(item: Value | None, form: str | None = None, diff: bool | None = None) -> Value:
    carried = item.diff if item is not None and diff is None else bool(diff)
    return Value(frozenset({SEQ}), carried, item, None, form)


def tuple_of(items: Iterable[Value], form: str | None = "tuple") -> Value:
    items = tuple(items)
    return Value(frozenset({SEQ}), any(i.diff for i in items), None, items, form)


BOTTOM = Value(frozenset())
SCALAR = Value(frozenset({NUMBER}))
OBJECT = Value(frozenset({OTHER}))
NONE_VALUE = Value(frozenset({NONE}))
CONST = Value(frozenset({TENSOR}))
DIFF = Value(frozenset({TENSOR}), True)
SIZES = seq(SCALAR, "tuple")

#: Forward's item store on a differentiable tensor, `t[i] = v`, is rewritten as
#: `t = _setitem(t, i, v)` (inplace.py), a helper of the generated module with no
#: derivative rule: what reads its result is recomputed under autograd.
SETITEM_NAME = "_setitem"
SETITEM = "s2sgrad._setitem"
MAYBE_TENSOR_OR_NONE = Value(frozenset({TENSOR, NUMBER, NONE}), True)
UNKNOWN = top()


# -- annotations -----------------------------------------------------------------------

_ANNOTATION_NAMES: dict[str, Value] = {
    "Tensor": CONST,
    "int": SCALAR,
    "float": SCALAR,
    "bool": SCALAR,
    "complex": SCALAR,
    "Number": SCALAR,
    "SymInt": SCALAR,
    "SymFloat": SCALAR,
    "str": OBJECT,
    "bytes": OBJECT,
    "None": NONE_VALUE,
    "NoneType": NONE_VALUE,
    "dtype": OBJECT,
    "device": OBJECT,
    "layout": OBJECT,
    "memory_format": OBJECT,
    "Generator": OBJECT,
    "slice": OBJECT,
    "Size": SIZES,
}
_SEQUENCES = {
    "List": "list",
    "list": "list",
    "Sequence": "list",
    "MutableSequence": "list",
    "Tuple": "tuple",
    "tuple": "tuple",
}
_MAPPINGS = {"Dict", "dict", "Mapping", "MutableMapping"}


def annotation_value(node: cst.BaseExpression) -> Value:
    """Read a type annotation: `torch.Tensor`, `List[torch.Tensor]`, `int | None`..."""
    if isinstance(node, cst.SimpleString):
        try:
            return annotation_value(cst.parse_expression(node.evaluated_value))  # type: ignore[arg-type]
        except (cst.ParserSyntaxError, TypeError):
            return UNKNOWN
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.BitOr):
        return annotation_value(node.left).join(annotation_value(node.right))
    if isinstance(node, (cst.Name, cst.Attribute)):
        name = _last(node)
        if name in _SEQUENCES:  # a bare `list`, `Sequence`
            return seq(UNKNOWN, _SEQUENCES[name])
        return _ANNOTATION_NAMES.get(name, UNKNOWN)
    if isinstance(node, cst.Subscript):
        head = _last(node.value)
        args = [e.slice.value for e in node.slice if isinstance(e.slice, cst.Index)]
        if head == "Optional" and len(args) == 1:
            return annotation_value(args[0]).join(NONE_VALUE)
        if head == "Union":
            return _join_all(annotation_value(a) for a in args)
        if head in _SEQUENCES:
            form = _SEQUENCES[head]
            if form == "tuple" and not any(isinstance(a, cst.Ellipsis) for a in args):
                return tuple_of((annotation_value(a) for a in args), "tuple")
            inner = [a for a in args if not isinstance(a, cst.Ellipsis)]
            return seq(annotation_value(inner[0]) if inner else UNKNOWN, form)
        if head in _MAPPINGS and len(args) == 2:
            return seq(annotation_value(args[1]), "dict")
    return UNKNOWN


def _last(node: cst.BaseExpression) -> str:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return node.attr.value
    return ""


def param_value(param: Param) -> Value:
    """Infer a parameter's value from its annotation, default and gradient slot.

    An unannotated parameter with a literal default takes the literal's kind; without
    a default it is a tensor when backward may return a gradient for it.
    """
    annotation = param.node.annotation
    default = param.node.default
    if annotation is not None:
        value = annotation_value(annotation.annotation)
        if default is not None and is_name(default, "None"):
            value = value.join(NONE_VALUE)  # `xs: List[Tensor] = None`: Optional
        if value.kinds != _ALL:
            return _differentiable(_tensor_too(value, param), param.gets_gradient)
    if default is not None and is_name(default, "None"):
        # `bias=None`: None, or what the caller passes instead: a tensor (it takes a
        # gradient) or a number; anything at all where it takes none.
        return MAYBE_TENSOR_OR_NONE if param.gets_gradient else UNKNOWN
    if default is not None and _is_literal(default):
        return _tensor_too(Evaluator({}, {}).expr(default), param)
    if param.gets_gradient:
        return DIFF  # as TorchScript reads an unannotated parameter: a tensor
    return UNKNOWN


def _tensor_too(value: Value, param: Param) -> Value:
    """A number parameter that backward returns a gradient for (`alpha: float`, or
    `alpha=1.0`) may be given a tensor that wants that gradient: it is a tensor or a
    number, decided at run time, as `alpha: torch.Tensor | float` is."""
    if param.gets_gradient and NUMBER in value.kinds and not value.holds_tensor:
        return value.join(Value(frozenset({TENSOR})))
    return value


def _differentiable(value: Value, diff: bool) -> Value:
    """Mark the tensors of a parameter's value as carrying a gradient."""
    if not diff or not value.holds_tensor:
        return value
    if SEQ in value.kinds:
        item = _differentiable(value.item, True) if value.item is not None else None
        items = (
            tuple(_differentiable(i, True) for i in value.items)
            if value.items is not None
            else None
        )
        return Value(value.kinds, True, item, items, value.form)
    return value.with_diff(True)


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


# -- codes of the op table -----------------------------------------------------------


def code_value(code: str, diff: bool, form: str | None = "tuple") -> Value:
    """The value an op returns, from its code in the op table (`T`, `i[]`, `T?`)."""
    nograd = code.endswith("'")
    code = code.rstrip("'")
    optional = code.endswith("?")
    code = code.rstrip("?")
    if code.endswith("[]"):
        value = seq(code_value(code[:-2], diff and not nograd), form)
    elif code == "T":
        value = Value(frozenset({TENSOR}), diff and not nograd)
    elif code in ("i", "f", "b", "n"):
        value = SCALAR
    elif code == "N":
        value = NONE_VALUE
    elif code in ("s", "o"):
        value = OBJECT
    else:
        value = top(diff)
    return value.join(NONE_VALUE) if optional else value


def _fits(code: str, value: Value) -> bool:
    """Whether an argument of that value may bind to a parameter of that code."""
    code = code.rstrip("'")
    if code.endswith("?") and NONE in value.kinds:
        return True
    code = code.rstrip("?")
    if code == "T":
        return TENSOR in value.kinds
    if code in ("i", "f", "b", "n"):
        return NUMBER in value.kinds
    if code.endswith("[]"):
        return bool(value.kinds & {SEQ, NUMBER})
    if code == "N":
        return NONE in value.kinds
    if code in ("s", "o"):
        return OTHER in value.kinds
    return True


# -- the evaluator -------------------------------------------------------------------

#: Python builtins and what they return; None: depends on the arguments (see `_call`).
_BUILTINS: dict[str, Value | None] = {
    "len": SCALAR,
    "int": SCALAR,
    "float": SCALAR,
    "bool": SCALAR,
    "complex": SCALAR,
    "isinstance": SCALAR,
    "issubclass": SCALAR,
    "hasattr": SCALAR,
    "callable": SCALAR,
    "id": SCALAR,
    "hash": SCALAR,
    "ord": SCALAR,
    "any": SCALAR,
    "all": SCALAR,
    "str": OBJECT,
    "repr": OBJECT,
    "chr": OBJECT,
    "format": OBJECT,
    "type": OBJECT,
    "slice": OBJECT,
    "range": seq(SCALAR, "list"),
    "list": None,
    "tuple": None,
    "sorted": None,
    "reversed": None,
    "set": None,
    "dict": None,
    "enumerate": None,
    "zip": None,
    "min": None,
    "max": None,
    "sum": None,
    "abs": None,
    "round": None,
    "pow": None,
    "divmod": None,
    "getattr": None,
    "print": NONE_VALUE,
}

#: The methods of Python's numbers.
_NUMBER_METHODS = frozenset(
    name
    for kind in (int, float, complex)
    for name in dir(kind)
    if not name.startswith("_")
)

#: The methods of Python's lists, tuples, dicts and sets.
_CONTAINER_METHODS = frozenset(
    name
    for kind in (list, tuple, dict, set)
    for name in dir(kind)
    if not name.startswith("_")
)

#: List and dict methods that change their object, and where the new items are.
_ADDS_ITEM = {"append": 0, "insert": 1, "setdefault": 1}
_ADDS_ITEMS = {"extend": 0, "update": 0}
CONTAINER_MUTATORS = frozenset(
    {
        *_ADDS_ITEM,
        *_ADDS_ITEMS,
        "pop",
        "remove",
        "clear",
        "popitem",
        "discard",
        "reverse",
        "sort",
        "add",
    }
)


@dataclass(frozen=True)
class ModuleFacts:
    """What the module around a differentiator says about the calls it makes."""

    #: The result of each other differentiator: `g(x)` is `(result, closure)`.
    siblings: Mapping[str, Value] = field(default_factory=dict)
    #: Plain module-level functions, whose returns are read from their bodies.
    helpers: Mapping[str, Helper] = field(default_factory=dict)
    #: Module-level constants (`EPS = 1e-5`).
    constants: Mapping[str, Value] = field(default_factory=dict)


#: How deep helper calls are followed (a helper calling a helper...).
_HELPER_DEPTH = 4


class Evaluator:
    """Evaluate expressions and statements over an environment of `Value`s."""

    def __init__(
        self,
        qualified: Mapping[cst.CSTNode, str],
        env: dict[str, Value],
        facts: ModuleFacts | None = None,
        depth: int = 0,
    ) -> None:
        self.qualified = qualified
        self.env = env
        self.facts = facts or ModuleFacts()
        self.siblings = self.facts.siblings
        self.depth = depth
        #: The join of the values `return` statements give (inside a helper).
        self.returned = BOTTOM
        #: Functions defined in the body evaluated here (`def act(t): ...`, `act =
        #: lambda t: ...`), by the name that holds each while it is not rebound.
        self.local_functions: dict[str, cst.FunctionDef | cst.Lambda] = {}

    # -- expressions ---------------------------------------------------------------
    def expr(self, node: cst.BaseExpression) -> Value:
        method = getattr(self, "_" + type(node).__name__, None)
        if method is not None:
            result: Value = method(node)
            return result
        return top(self._any_diff(node))

    def _any_diff(self, node: cst.CSTNode) -> bool:
        """Whether any name the node reads carries a gradient."""
        found = False
        for child in node.children:
            if isinstance(child, cst.Name):
                found = found or self.env.get(child.value, BOTTOM).diff
            else:
                found = found or self._any_diff(child)
        return found

    def _Name(self, node: cst.Name) -> Value:
        if node.value in ("True", "False"):
            return SCALAR
        if node.value == "None":
            return NONE_VALUE
        found = self.env.get(node.value)
        if found is None:
            return self.facts.constants.get(node.value, UNKNOWN)
        return found

    def _Integer(self, node: cst.CSTNode) -> Value:
        return SCALAR

    _Float = _Imaginary = _Integer

    def _SimpleString(self, node: cst.CSTNode) -> Value:
        return OBJECT

    _ConcatenatedString = _FormattedString = _Lambda = _SimpleString

    def _Ellipsis(self, node: cst.Ellipsis) -> Value:
        return OBJECT

    def _Attribute(self, node: cst.Attribute) -> Value:
        qualified = self.qualified.get(node) if dotted(node) else None
        if qualified is not None and qualified.startswith(("math.", "torch.")):
            if qualified.startswith("math."):
                return SCALAR
            return OBJECT  # torch.float64, torch.pi, torch.contiguous_format...
        base = self.expr(node.value)
        name = node.attr.value
        if base.kinds == {SEQ} and base.fields and name in base.fields:
            assert base.items is not None
            return base.items[base.fields.index(name)]  # `x.max(dim).values`
        code = opfacts.table.TENSOR_ATTRIBUTES.get(name)
        if TENSOR in base.kinds and code is not None:
            found = code_value(code, base.diff)
            if base.kinds == {TENSOR}:
                return found
            return found.join(top(base.diff))
        return top(base.diff)

    def _Subscript(self, node: cst.Subscript) -> Value:
        base = self.expr(node.value)
        index = self._index(node)
        out = BOTTOM
        if TENSOR in base.kinds:
            out = out.join(Value(frozenset({TENSOR}), base.diff))
        if SEQ in base.kinds:
            sliced = len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Slice)
            if sliced:
                out = out.join(seq(base.element(), base.form, base.diff))
            elif base.items is not None and index is not None:
                out = out.join(
                    base.items[index]
                    if -len(base.items) <= index < len(base.items)
                    else BOTTOM
                )
            else:
                out = out.join(base.element())
        if base.kinds - {TENSOR, SEQ, NONE}:
            out = out.join(top(base.diff))
        return out

    @staticmethod
    def _index(node: cst.Subscript) -> int | None:
        if len(node.slice) != 1 or not isinstance(node.slice[0].slice, cst.Index):
            return None
        value = node.slice[0].slice.value
        negative = False
        if isinstance(value, cst.UnaryOperation) and isinstance(
            value.operator, cst.Minus
        ):
            negative, value = True, value.expression
        if isinstance(value, cst.Integer):
            number = int(value.value, 0)
            return -number if negative else number
        return None

    def _Comparison(self, node: cst.Comparison) -> Value:
        operands = [self.expr(node.left)] + [
            self.expr(c.comparator) for c in node.comparisons
        ]
        identity = all(
            isinstance(c.operator, (cst.Is, cst.IsNot, cst.In, cst.NotIn))
            for c in node.comparisons
        )
        if identity or not any(TENSOR in o.kinds for o in operands):
            return SCALAR
        if any(o.tensor is True for o in operands):
            return CONST
        return CONST.join(SCALAR)

    def _UnaryOperation(self, node: cst.UnaryOperation) -> Value:
        inner = self.expr(node.expression)
        if isinstance(node.operator, cst.Not):
            return SCALAR
        if isinstance(node.operator, cst.BitInvert):
            return inner.nondiff()
        return inner

    def _BinaryOperation(self, node: cst.BinaryOperation) -> Value:
        left, right = self.expr(node.left), self.expr(node.right)
        diff = left.diff or right.diff
        if left.tensor is True or right.tensor is True:
            # With a tensor on either side, torch computes the result (or raises).
            nograd = isinstance(
                node.operator, (cst.FloorDivide, cst.BitAnd, cst.BitOr, cst.BitXor)
            )
            return Value(frozenset({TENSOR}), diff and not nograd)
        out = BOTTOM
        if TENSOR in left.kinds or TENSOR in right.kinds:
            nograd = isinstance(
                node.operator,
                (cst.FloorDivide, cst.BitAnd, cst.BitOr, cst.BitXor),
            )
            out = out.join(Value(frozenset({TENSOR}), diff and not nograd))
        if NUMBER in left.kinds and NUMBER in right.kinds:
            out = out.join(SCALAR)
        if SEQ in left.kinds and isinstance(node.operator, cst.Add):
            out = out.join(left.join(right) if SEQ in right.kinds else left)
        if SEQ in left.kinds and isinstance(node.operator, cst.Multiply):
            out = out.join(seq(left.element(), left.form))
        if SEQ in right.kinds and isinstance(node.operator, cst.Multiply):
            out = out.join(seq(right.element(), right.form))
        # `None + x` raises: only the other kinds can give a result.
        if (left.kinds | right.kinds) & {OTHER} or not out.kinds:
            out = out.join(top(diff))
        return out

    def _BooleanOperation(self, node: cst.BooleanOperation) -> Value:
        return self.expr(node.left).join(self.expr(node.right))

    def _IfExp(self, node: cst.IfExp) -> Value:
        return self.expr(node.body).join(self.expr(node.orelse))

    def _elements(self, node: cst.Tuple | cst.List | cst.Set) -> list[Value] | None:
        """Element values, or None when a `*starred` element hides their number."""
        values = []
        starred = False
        for element in node.elements:
            value = self.expr(element.value)
            if isinstance(element, cst.StarredElement):
                starred = True
                value = value.element()
            values.append(value)
        return None if starred else values

    def _Tuple(self, node: cst.Tuple) -> Value:
        values = self._elements(node)
        if values is None:
            return seq(_join_all(self._flat(node)), "tuple")
        return tuple_of(values, "tuple")

    def _List(self, node: cst.List) -> Value:
        values = self._elements(node)
        if values is None:
            return seq(_join_all(self._flat(node)), "list")
        return seq(_join_all(values), "list", any(v.diff for v in values))

    def _Set(self, node: cst.Set) -> Value:
        return seq(_join_all(self._flat(node)), "set")

    def _flat(self, node: cst.Tuple | cst.List | cst.Set) -> list[Value]:
        out = []
        for element in node.elements:
            value = self.expr(element.value)
            if isinstance(element, cst.StarredElement):
                value = value.element()
            out.append(value)
        return out

    def _Dict(self, node: cst.Dict) -> Value:
        values = [
            (
                self.expr(e.value)
                if isinstance(e, cst.DictElement)
                else self.expr(e.value).element()
            )
            for e in node.elements
        ]
        return seq(_join_all(values), "dict", any(v.diff for v in values))

    def _NamedExpr(self, node: cst.NamedExpr) -> Value:
        value = self.expr(node.value)
        self.bind(node.target, value)
        return value

    def _comprehension(self, node: cst.BaseComp | cst.DictComp) -> Value:
        saved = dict(self.env)
        comp: cst.CompFor | None = node.for_in
        while comp is not None:
            self.bind(comp.target, self.iterated(self.expr(comp.iter)))
            comp = comp.inner_for_in
        form: str | None = None
        if isinstance(node, cst.DictComp):
            element = self.expr(node.value)
            form = "dict"
        else:
            assert isinstance(node, (cst.ListComp, cst.SetComp, cst.GeneratorExp))
            element = self.expr(node.elt)
            form = {cst.ListComp: "list", cst.SetComp: "set"}.get(type(node))
        self.env = saved
        return seq(element, form)

    _ListComp = _SetComp = _GeneratorExp = _DictComp = _comprehension

    def iterated(self, value: Value) -> Value:
        """The value of each item a `for` over `value` binds."""
        out = BOTTOM
        if SEQ in value.kinds:
            out = out.join(value.element())
        if TENSOR in value.kinds:
            out = out.join(Value(frozenset({TENSOR}), value.diff))
        if value.kinds - {SEQ, TENSOR}:
            out = out.join(top(value.diff))
        return out

    def _Await(self, node: cst.Await) -> Value:
        return top(self._any_diff(node))

    def _Call(self, node: cst.Call) -> Value:
        args = [self.expr(a.value) for a in node.args]
        diff = any(a.diff for a in args)
        func = node.func
        # libcst names `torch.ones(...).tril` "torch.ones.tril": only a dotted name
        # is a module's function; anything else is a method of the receiver.
        qualified = self.qualified.get(func, "") if dotted(func) else ""
        if isinstance(func, cst.Name) and func.value in self.local_functions:
            return self._local_call(self.local_functions[func.value], node, args)
        if isinstance(func, cst.Name) and func.value not in self.env:
            if func.value in self.siblings:
                return tuple_of([self.siblings[func.value], OBJECT])
            helper = self.facts.helpers.get(func.value)
            if helper is not None:
                return self._helper(helper, node, args)
        if isinstance(func, cst.Name) and func.value in _BUILTINS and not qualified:
            return self._builtin(func.value, node, args)
        if isinstance(func, cst.Name) and qualified.startswith("builtins."):
            return self._builtin(func.value, node, args)
        if qualified.startswith("math."):
            return SCALAR
        if qualified.startswith("torch."):
            return self._torch(qualified, node, args, None)
        if qualified == SETITEM:
            return Value(frozenset({TENSOR}), args[0].diff or args[2].diff)
        if isinstance(func, cst.Attribute):
            receiver = self.expr(func.value)
            return self._method(func.attr.value, receiver, node, args)
        return top(diff)

    def _local_call(
        self, function: cst.FunctionDef | cst.Lambda, node: cst.Call, args: list[Value]
    ) -> Value:
        """What a function defined in this body returns: its body evaluated over the
        enclosing values (it reads them at call time) and its parameters."""
        helper = Helper(
            "<local>",
            cst.FunctionDef(
                cst.Name("_"),
                function.params,
                (
                    cst.IndentedBlock(
                        [cst.SimpleStatementLine([cst.Return(function.body)])]
                    )
                    if isinstance(function, cst.Lambda)
                    else function.body
                ),
            ),
            self.qualified,
        )
        return self._helper(helper, node, args, dict(self.env))

    def _helper(
        self,
        helper: Helper,
        node: cst.Call,
        args: list[Value],
        enclosing: dict[str, Value] | None = None,
    ) -> Value:
        """What a module-level helper returns for these arguments, from its body."""
        diff = any(a.diff for a in args)
        if self.depth >= _HELPER_DEPTH or any(a.star for a in node.args):
            return top(diff)
        params = helper.node.params
        if isinstance(params.star_arg, cst.Param) or params.star_kwarg:
            return top(diff)  # `*args`, `**kwargs` (a bare `*` only marks keywords)
        if any(a.star for a in node.args):
            return top(diff)  # `helper(*xs)`: which parameter gets what is not known
        ordered = [*params.posonly_params, *params.params, *params.kwonly_params]
        inner = Evaluator(helper.qualified_names, {}, self.facts, self.depth + 1)
        env: dict[str, Value] = dict(enclosing or {})
        for param in ordered:
            if param.default is not None:
                env[param.name.value] = inner.expr(param.default)
            elif param.annotation is not None:
                env[param.name.value] = annotation_value(param.annotation.annotation)
            else:
                env[param.name.value] = top(diff)
        positional = [v for a, v in zip(node.args, args, strict=True) if not a.keyword]
        for param, value in zip(ordered, positional, strict=False):
            env[param.name.value] = value
        for arg, value in zip(node.args, args, strict=True):
            if arg.keyword is not None:
                env[arg.keyword.value] = value
        inner.env = env
        inner.run(statements(helper.node.body))
        return inner.returned if inner.returned.kinds else top(diff)

    def _builtin(self, name: str, node: cst.Call, args: list[Value]) -> Value:
        fixed = _BUILTINS.get(name)
        if fixed is not None:
            return fixed
        diff = any(a.diff for a in args)
        stars = [a.star for a in node.args]
        if any(stars):
            # `zip(*rows)`, `max(*ts)`: a starred argument stands for its elements,
            # how many is not known.
            if "**" in stars or name not in ("zip", "min", "max"):
                return top(diff)
            spread = [
                self.iterated(v) if star else v
                for star, v in zip(stars, args, strict=True)
            ]
            if name == "zip":
                columns = _join_all(self.iterated(v) for v in spread)
                return seq(seq(columns, "tuple"), "list")
            return (
                SCALAR
                if all(v.kinds <= {NUMBER} for v in spread)
                else (_join_all(spread))
            )
        first = args[0] if args else BOTTOM
        if name in ("list", "tuple", "sorted", "reversed", "set"):
            form = {"list": "list", "sorted": "list", "tuple": "tuple"}.get(name)
            return seq(self.iterated(first) if args else BOTTOM, form)
        if name == "dict":
            return seq(top(diff), "dict")
        if name == "enumerate":
            return seq(tuple_of([SCALAR, self.iterated(first)]), "list")
        if name == "zip":
            return seq(tuple_of([self.iterated(a) for a in args]), "list")
        if name in ("min", "max", "sum", "abs", "round", "pow"):
            if all(a.kinds <= {NUMBER} for a in args):
                return SCALAR
            if name == "pow" and len(args) == 2:
                # `pow(u, 2)` is `u ** 2`: a tensor where either operand is one.
                base, exponent = node.args[0].value, node.args[1].value
                return self.expr(cst.BinaryOperation(base, cst.Power(), exponent))
            if name in ("abs", "round"):
                return first  # `abs(t)`, `round(t)`: a tensor for a tensor
            if name == "sum":
                # `sum(items, start)` adds the items to `start` (0 by default).
                element = self.iterated(first)
                if len(args) > 1 and (element.tensor is True or args[1].tensor is True):
                    return Value(frozenset({TENSOR}), element.diff or args[1].diff)
                if element.tensor is True:  # 0 for no items
                    return Value(frozenset({TENSOR, NUMBER}), element.diff)
                return element.join(args[1] if len(args) > 1 else SCALAR)
            if name in ("min", "max") and len(args) == 1:
                return self.iterated(first)
            if name in ("min", "max"):
                return _join_all(args)
        return top(diff)

    def _signature_args(
        self, node: cst.Call, args: list[Value], receiver: Value | None
    ) -> tuple[list[Value], dict[str, Value]] | None:
        positional: list[Value] = [] if receiver is None else [receiver]
        keywords: dict[str, Value] = {}
        for arg, value in zip(node.args, args, strict=True):
            if arg.star:
                return None
            if arg.keyword is None:
                positional.append(value)
            else:
                keywords[arg.keyword.value] = value
        return positional, keywords

    def _torch(
        self,
        qualified: str,
        node: cst.Call,
        args: list[Value],
        receiver: Value | None,
    ) -> Value:
        diff = any(a.diff for a in args) or bool(receiver and receiver.diff)
        if opfacts.no_gradient(qualified):
            diff = False
        form = "list" if qualified.startswith("torch.ops.") else "tuple"
        dispatched = opfacts.dispatch(qualified)
        if dispatched is not None:
            flag, default, if_true, if_false = dispatched
            chosen = _flag(node, flag, default, if_false)
            signatures: tuple[opfacts.Signature, ...] = (
                (if_true,) if chosen else (if_false,)
            )
            if chosen is None:
                signatures = (if_true, if_false)
        else:
            signatures = opfacts.signatures(qualified)
        if qualified == "torch.Tensor.type" and node.args:
            # `u.type(torch.float64)` casts, as `.to` does; only `u.type()` names it.
            return Value(frozenset({TENSOR}), diff)
        if not signatures:
            return top(diff)
        bound = self._signature_args(node, args, receiver)
        chosen_sigs = list(signatures)
        if bound is not None:
            positional, keywords = bound
            if keywords and not opfacts.keywords_known(qualified, set(keywords)):
                # A keyword that only Python's binding knows (`torch.nonzero(x,
                # as_tuple=True)` gives a tuple of tensors): what comes back is unknown.
                return top(diff)
            fitting = [
                s
                for s in signatures
                if s.accepts(len(positional), set(keywords))
                and _arguments_fit(s, positional, keywords)
            ]
            if fitting:
                # TorchScript's generic overloads (`add.t(t[] a, t[] b)`) fit anything:
                # the ones that name the kinds given win, as Python's binding picks.
                vague = [_vagueness(s, len(positional), set(keywords)) for s in fitting]
                chosen_sigs = [
                    s for s, v in zip(fitting, vague, strict=True) if v == min(vague)
                ]
        results = [_returned(s, diff, form) for s in chosen_sigs]
        return _join_all(results)

    def _method(
        self, name: str, receiver: Value, node: cst.Call, args: list[Value]
    ) -> Value:
        diff = receiver.diff or any(a.diff for a in args)
        out = BOTTOM
        tensor_method = name in opfacts.table.TENSOR_METHODS
        if TENSOR in receiver.kinds:
            tensor = Value(frozenset({TENSOR}), receiver.diff)
            out = out.join(self._torch(f"torch.Tensor.{name}", node, args, tensor))
        if SEQ in receiver.kinds and name in _CONTAINER_METHODS:
            if name in ("copy",):
                out = out.join(receiver)
            elif name in ("pop", "get"):
                out = out.join(receiver.element().join(NONE_VALUE))
            elif name == "setdefault":  # the value kept under the key: old or new
                added = args[1] if len(args) > 1 else NONE_VALUE
                out = out.join(receiver.element().join(added))
            elif name == "popitem":
                out = out.join(tuple_of([top(diff), receiver.element()]))
            elif name in ("index", "count"):
                out = out.join(SCALAR)
            elif name in ("keys", "values", "items"):
                out = out.join(seq(top(diff)))
            else:
                out = out.join(NONE_VALUE if name in CONTAINER_MUTATORS else top(diff))
        # None has no methods, a number and a container only a few: calling another
        # one raises, so only the other kinds can give a result. An object of unknown
        # kind that is called with a tensor method is taken for a tensor.
        others = receiver.kinds - {TENSOR, SEQ, NONE}
        if name not in _NUMBER_METHODS:
            others -= {NUMBER}
        if tensor_method and TENSOR in receiver.kinds:
            others -= {OTHER}
        if others:
            out = out.join(top(diff))
        return out

    # -- statements ----------------------------------------------------------------
    def run(self, body: Iterable[cst.BaseStatement]) -> None:
        for statement in body:
            self.statement(statement)

    def statement(self, node: cst.BaseStatement) -> None:
        if isinstance(node, cst.SimpleStatementLine):
            for small in node.body:
                self.small(small)
        elif isinstance(node, cst.If):
            self._branches(node)
        elif isinstance(node, (cst.For, cst.While)):
            if isinstance(node, cst.For):
                self.bind(node.target, self.iterated(self.expr(node.iter)))
            for _ in range(3):  # reach the fixpoint (containers nest one level)
                before = dict(self.env)
                self.run(statements(node.body))
                self._merge(before)
            if node.orelse is not None:
                self.run(statements(node.orelse.body))
        elif isinstance(node, (cst.FunctionDef, cst.ClassDef)):
            self.env[node.name.value] = OBJECT
            if isinstance(node, cst.FunctionDef) and not node.decorators:
                self.local_functions[node.name.value] = node
        elif isinstance(node, cst.With):
            for item in node.items:
                value = self.expr(item.item)
                if item.asname is not None:
                    self.bind(item.asname.name, value)
            self.run(statements(node.body))
        elif isinstance(node, cst.Try):
            # A handler starts from any state the body passed through; after the
            # statement, forward holds what the body and `else` left, or what one
            # of the handlers did.
            raised = dict(self.env)
            for statement in statements(node.body):
                self.run([statement])
                raised = _joined(raised, self.env)
            if node.orelse is not None:
                self.run(statements(node.orelse.body))
            ends = [self.env]
            for handler in node.handlers:
                self.env = dict(raised)
                if handler.name is not None:
                    self.bind(handler.name.name, OBJECT)
                self.run(statements(handler.body))
                ends.append(self.env)
            self.env = functools.reduce(_joined, ends)
            if node.finalbody is not None:
                self.run(statements(node.finalbody.body))

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
            declared = annotation_value(node.annotation.annotation)
            value = self.expr(node.value)
            if declared.kinds != _ALL:
                value = _differentiable(declared, value.diff)
            self.bind(node.target, value)
        elif isinstance(node, cst.AugAssign):
            value = self.expr(node.value)
            binary = AUG_TO_BINARY.get(type(node.operator))
            if isinstance(node.target, cst.Name):
                combined = (
                    self.expr(cst.BinaryOperation(node.target, binary(), node.value))
                    if binary is not None
                    else top(value.diff)
                )
                self.bind(node.target, combined)
            else:
                self._store(node.target, value)
        elif isinstance(node, cst.Expr):
            self.expr(node.value)
            if isinstance(node.value, cst.Call):
                self.mutation(node.value)
        elif isinstance(node, cst.Return):
            value = NONE_VALUE if node.value is None else self.expr(node.value)
            self.returned = self.returned.join(value)

    def mutation(self, call: cst.Call) -> None:
        """Join what an in-place call puts into its object (`hs.append(h)`), or into
        the tensor it writes through a part or `out=` (`t[:].copy_(v)`,
        `torch.mul(x, 2, out=t)`): a tensor forward made without a gradient carries
        one once a value that does is written into it."""
        func = call.func
        for arg in call.args:
            if arg.keyword is not None and arg.keyword.value == "out":
                others = [a for a in call.args if a is not arg]
                self._written(arg.value, any(self.expr(a.value).diff for a in others))
        if not isinstance(func, cst.Attribute):
            return
        if not isinstance(func.value, cst.Name):
            if opfacts.is_inplace(func.attr.value):
                args = [self.expr(a.value) for a in call.args]
                self._written(func.value, any(a.diff for a in args))
            return
        name = func.value.value
        if name not in self.env:
            return
        current = self.env[name]
        args = [self.expr(a.value) for a in call.args]
        method = func.attr.value
        added: Value | None = None
        if method in _ADDS_ITEM and len(args) > _ADDS_ITEM[method]:
            added = args[_ADDS_ITEM[method]]
        elif method in _ADDS_ITEMS and args:
            added = args[0].element()
        if SEQ in current.kinds and added is not None:
            grown = seq(current.element_or_none(), current.form).join(
                seq(added, current.form)
            )
            self.env[name] = current.join(grown)
        elif TENSOR in current.kinds and opfacts.is_inplace(method):
            diff = any(a.diff for a in args)
            if opfacts.no_gradient(f"torch.Tensor.{method}"):
                self.env[name] = current.nondiff()
            else:
                self.env[name] = current.with_diff(current.diff or diff)

    def _written(self, target: cst.BaseExpression, diff: bool) -> None:
        """A tensor written in place through `target` (`t[:]`, `t.T`, `out=t`):
        its name's value carries a gradient if what is written does."""
        name = self._base(target)
        if name is None or not diff:
            return
        current = self.env[name]
        if TENSOR in current.kinds and not current.diff:
            self.env[name] = current.with_diff(True)
        elif SEQ in current.kinds and not isinstance(target, cst.Name):
            # `rows[1].add_(v)`: the element written carries a gradient now.
            element = current.element()
            if element.holds_tensor and not element.diff:
                grown = seq(element.with_diff(True), current.form)
                self.env[name] = current.join(grown)

    def _base(self, target: cst.BaseExpression) -> str | None:
        """The name under `target`'s subscripts, attributes and views
        (`buf.select(0, 1)`, `torch.narrow(buf, ...)`), where forward binds it."""
        while True:
            if isinstance(target, (cst.Subscript, cst.Attribute)):
                target = target.value
            elif isinstance(target, cst.Call) and (inner := self._viewed(target)):
                target = inner
            else:
                break
        if isinstance(target, cst.Name) and target.value in self.env:
            return target.value
        return None

    def _viewed(self, call: cst.Call) -> cst.BaseExpression | None:
        """The tensor a call's result may be a view of: a view method's receiver, a
        torch view function's first argument (the first of several for one that
        may share any)."""
        func = call.func
        name = self.qualified.get(func) if dotted(func) else None
        if name is not None and name.startswith("torch."):
            shared = shared_arguments(call, name)
            return shared[0] if shared else None
        if isinstance(func, cst.Attribute):
            if opfacts.may_share_memory(f"torch.Tensor.{func.attr.value}"):
                return func.value
        return None

    def _store(self, target: cst.BaseExpression, value: Value) -> None:
        """`a[i] = v`: the container (or tensor) `a` now also holds `v`."""
        name = self._base(target)
        if name is None:
            return
        current = self.env[name]
        if SEQ in current.kinds and isinstance(target, cst.Subscript):
            self.env[name] = current.join(seq(value, current.form))
        else:
            self.env[name] = current.with_diff(current.diff or value.diff)

    def bind(
        self,
        target: cst.BaseExpression,
        value: Value,
        source: cst.BaseExpression | None = None,
    ) -> None:
        if isinstance(target, cst.Name):
            self.env[target.value] = value
            self.local_functions.pop(target.value, None)
            if isinstance(source, cst.Lambda):
                self.local_functions[target.value] = source
        elif isinstance(target, (cst.Tuple, cst.List)):
            elements = target.elements
            starred = any(isinstance(e, cst.StarredElement) for e in elements)
            for i, element in enumerate(elements):
                if isinstance(element, cst.StarredElement):
                    self.bind(element.value, seq(value.element(), "list"))
                elif (
                    not starred
                    and value.items is not None
                    and len(value.items) == len(elements)
                ):
                    self.bind(element.value, value.items[i])
                else:
                    self.bind(element.value, self.iterated(value))
        elif isinstance(target, (cst.Subscript, cst.Attribute)):
            self._store(target, value)
        elif isinstance(target, cst.StarredElement):
            self.bind(target.value, seq(value.element(), "list"))


def _flag(
    node: cst.Call, flag: str, default: bool, signature: opfacts.Signature
) -> bool | None:
    """The value of a boolean argument of a call when it is a literal or left out."""
    names = [p.name for p in signature.params]
    at = names.index(flag) if flag in names else len(names)
    positional = [a for a in node.args if a.keyword is None]
    given = [a for a in node.args if a.keyword is not None and a.keyword.value == flag]
    if len(positional) > at:
        given.append(positional[at])
    if not given:
        return None if any(a.star for a in node.args) else default
    value = given[0].value
    if isinstance(value, cst.Name) and value.value in ("True", "False"):
        return value.value == "True"
    return None


def _arguments_fit(
    signature: opfacts.Signature,
    positional: list[Value],
    keywords: Mapping[str, Value],
) -> bool:
    plain = [p for p in signature.params if not p.keyword_only]
    for param, value in zip(plain, positional, strict=False):
        if not _fits(param.code, value):
            return False
    by_name = {("self" if p.name == "input" else p.name): p for p in signature.params}
    for key, value in keywords.items():
        named = by_name.get("self" if key == "input" else key)
        if named is not None and not _fits(named.code, value):
            return False
    return True


def _vagueness(
    signature: opfacts.Signature, positional: int, keywords: set[str]
) -> int:
    """How many of the arguments given bind to a parameter of unknown type."""
    plain = [p for p in signature.params if not p.keyword_only][:positional]
    named = [p for p in signature.params if p.name in keywords]
    return sum(p.code == "?" for p in plain + named)


def _returned(signature: opfacts.Signature, diff: bool, form: str) -> Value:
    codes = signature.returns
    if len(codes) == 1:
        return code_value(codes[0], diff, form)
    if not codes:
        return NONE_VALUE
    found = tuple_of([code_value(c, diff, form) for c in codes], "tuple")
    return replace(found, fields=signature.fields or None)


def forward_values(diff: Differentiator, facts: ModuleFacts | None = None) -> Evaluator:
    """Run forward's statements; the evaluator's `env` holds every name's value at
    the end of forward, and it evaluates expressions there (the result)."""
    env = {p.name: param_value(p) for p in diff.params}
    evaluator = Evaluator(diff.qualified_names, env, facts)
    evaluator.run(diff.statements)
    return evaluator


def result_value(diff: Differentiator, facts: ModuleFacts) -> Value:
    """What a differentiator's result is: one value, or a tuple of its outputs."""
    evaluator = forward_values(diff, facts)
    if diff.tuple_result:
        return tuple_of(evaluator.expr(o) for o in diff.outputs)
    return evaluator.expr(diff.result)


class _Mutations(cst.CSTVisitor):
    """Names whose value a statement changes in place."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False

    def _base(self, node: cst.BaseExpression) -> None:
        while isinstance(node, (cst.Subscript, cst.Attribute)):
            node = node.value
        if isinstance(node, cst.Name):
            self.names.add(node.value)

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if isinstance(func, cst.Attribute):
            method = func.attr.value
            if method in CONTAINER_MUTATORS or opfacts.is_inplace(method):
                receiver = func.value
                if dotted(receiver) and not isinstance(receiver, cst.Name):
                    # `torch.relu_(t)`: a library function that writes its argument.
                    positional = [a for a in node.args if a.keyword is None]
                    if positional:
                        self._base(positional[0].value)
                else:
                    self._base(receiver)
        for arg in node.args:
            if arg.keyword is not None and arg.keyword.value == "out":
                self._base(arg.value)

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        self._stores(node.target)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._stores(node.target)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._stores(node.target)

    def visit_Del(self, node: cst.Del) -> None:
        self._stores(node.target)

    def _stores(self, target: cst.BaseExpression) -> None:
        if isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                self._stores(element.value)
        elif isinstance(target, (cst.Subscript, cst.Attribute)):
            self._base(target)


def writes(node: cst.CSTNode) -> set[str]:
    """The names a statement binds or changes in place (`hs.append(h)`, `m[i] = 0`,
    `mask.bernoulli_(p)`): what a later read of them depends on."""
    visitor = _Mutations()
    walk(node, visitor)
    return bound(node) | visitor.names


# -- ints, never bools -------------------------------------------------------------


def integers(root: cst.CSTNode, given: frozenset[str] = frozenset()) -> frozenset[str]:
    """The names `root` binds to ints only, never a bool: `t[1]` is a view of `t`
    where `t[True]` is a copy. A name is one where every binding is the counter of
    `for i in range(...)` or an int expression (`int_expression`) of such names;
    `given` are ints already (parameters annotated `int`). Any other binding, in a
    nested scope too, makes the name not one."""
    bindings: dict[str, list[cst.BaseExpression | None]] = {}

    def add(target: cst.BaseExpression, value: cst.BaseExpression | None) -> None:
        if isinstance(target, cst.Name):
            bindings.setdefault(target.value, []).append(value)
        else:
            for name in bound_target(target):
                bindings.setdefault(name, []).append(None)

    for node in nodes(root):
        if isinstance(node, cst.For):
            counter = calls_name(node.iter, "range")
            add(node.target, cst.Integer("0") if counter else None)
        elif isinstance(node, cst.Assign):
            for target in node.targets:
                add(target.target, node.value)
        elif isinstance(node, (cst.AnnAssign, cst.NamedExpr)):
            add(node.target, node.value)
        elif isinstance(node, cst.AugAssign):
            operator = _AUGMENTED_INT.get(type(node.operator))
            value = None
            if operator is not None:
                value = cst.BinaryOperation(node.target, operator, node.value)
            add(node.target, value)
        elif isinstance(node, cst.AsName):
            add(cst.Tuple([cst.Element(node.name)]), None)
        elif isinstance(node, cst.CompFor):
            add(cst.Tuple([cst.Element(node.target)]), None)
        elif isinstance(node, cst.Param):
            add(cst.Tuple([cst.Element(node.name)]), None)
        elif isinstance(node, (cst.FunctionDef, cst.ClassDef)):
            add(cst.Tuple([cst.Element(node.name)]), None)
    known = set(given - bindings.keys()) | set(bindings)
    changed = True
    while changed:
        changed = False
        for name in sorted(known & bindings.keys()):
            if not all(
                v is not None and int_expression(v, known) for v in bindings[name]
            ):
                known.discard(name)
                changed = True
    return frozenset(known)


#: Augmented assignments whose result is an int when both operands are.
_AUGMENTED_INT: dict[type[cst.BaseAugOp], cst.BaseBinaryOp] = {
    cst.AddAssign: cst.Add(),
    cst.SubtractAssign: cst.Subtract(),
    cst.MultiplyAssign: cst.Multiply(),
    cst.FloorDivideAssign: cst.FloorDivide(),
    cst.ModuloAssign: cst.Modulo(),
}
#: Tensor methods and attributes that give an int (sizes, counts).
_INT_METHODS = frozenset({"size", "dim", "numel", "ndimension", "nelement"})


def int_expression(node: cst.BaseExpression, ints: set[str] | frozenset[str]) -> bool:
    """Whether `node` is an int, never a bool: a literal, a name of `ints`, a size
    (`len(x)`, `x.shape[0]`, `x.size(0)`, `x.dim()`, `x.ndim`, `int(...)`), or `+ -
    * // %` of ints (`True + 1` is an int too, but a comparison or `not` is a bool)."""
    if isinstance(node, cst.Integer):
        return True
    if isinstance(node, cst.Name):
        return node.value in ints
    if isinstance(node, cst.UnaryOperation) and isinstance(
        node.operator, (cst.Minus, cst.Plus)
    ):
        return int_expression(node.expression, ints)
    if isinstance(node, cst.BinaryOperation):
        return (
            isinstance(node.operator, tuple(type(o) for o in _AUGMENTED_INT.values()))
            and int_expression(node.left, ints)
            and int_expression(node.right, ints)
        )
    if isinstance(node, cst.IfExp):
        return int_expression(node.body, ints) and int_expression(node.orelse, ints)
    if isinstance(node, cst.Attribute):
        return node.attr.value == "ndim"
    if isinstance(node, cst.Subscript):
        shape = isinstance(node.value, cst.Attribute) and is_name(
            node.value.attr, "shape"
        )
        return shape and all(
            isinstance(e.slice, cst.Index) and int_expression(e.slice.value, ints)
            for e in node.slice
        )
    if isinstance(node, cst.Call):
        func = node.func
        if isinstance(func, cst.Name):
            return func.value in ("len", "int") and func.value not in ints
        return isinstance(func, cst.Attribute) and func.attr.value in _INT_METHODS
    return False
