"""Which forward values provably have the same shape, and which broadcast into which.

Takes the versioned forward program; returns `ShapeFacts`: each version's shape class.
Two versions share a class when the statements prove their shapes equal whatever the
inputs are: an elementwise op (torch's `pointwise` tag, arithmetic, comparisons) whose
tensor operands share a class, Python numbers aside, or broadcast into it; a shape-keeping
op (`softmax`, `clone`, `contiguous`, `to`); a name bound to another. A reduction with a
literal `keepdim=True` over literal dims gets a class of its own that broadcasts into its
operand's class, shared by every reduction of that class over the same dims.

The simplifier uses these facts to drop `sum_to_size` calls that cannot change anything
and to read a value's shape off a saved tensor of the same class instead of passing it
out of forward. Facts are only ever "proven equal": an unknown shape is a class of its
own, so a missing fact costs a line of code, never a wrong gradient.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import libcst as cst

from s2sgrad import opfacts
from s2sgrad.autodiff.program import Assign, Branch, Opaque, Program, Step, Version
from s2sgrad.cst import dotted
from s2sgrad.values import NUMBER, TENSOR

#: Ops that return a tensor of their first operand's shape (besides `pointwise` ones).
_SHAPE_KEEPING = frozenset(
    {
        "softmax",
        "log_softmax",
        "clone",
        "contiguous",
        "detach",
        "to",
        "type_as",
        "float",
        "double",
        "half",
        "cumsum",
        "cumprod",
        "flip",
        "roll",
        "zeros_like",
        "ones_like",
        "empty_like",
        "full_like",
        "rand_like",
        "randn_like",
        "dropout",
        "gelu",
        "softplus",
        "relu",
        "silu",
        "leaky_relu",
        "elu",
        "hardtanh",
        "normalize",
    }
)
#: Reductions that keep the reduced dims with `keepdim=True`.
_REDUCTIONS = frozenset(
    {"sum", "mean", "amax", "amin", "var", "std", "logsumexp", "norm", "prod"}
)
#: Where dim and keepdim stand among a reduction's positional operands (the tensor
#: first): `x.var(dim, unbiased, keepdim)`, `x.norm(p, dim, keepdim)`; others take
#: `(dim, keepdim)`.
_POSITIONS = {"var": (1, 3), "std": (1, 3), "norm": (2, 3)}
_ELEMENTWISE = (
    cst.Add,
    cst.Subtract,
    cst.Multiply,
    cst.Divide,
    cst.Power,
    cst.FloorDivide,
    cst.Modulo,
    cst.BitAnd,
    cst.BitOr,
    cst.BitXor,
)


@dataclass
class ShapeFacts:
    """Shape classes of the versions of one forward program."""

    #: version id -> class id.
    classes: dict[int, int] = field(default_factory=dict)
    #: class id -> the class it broadcasts into (a keepdim reduction of it).
    into: dict[int, int] = field(default_factory=dict)
    #: (class, reduced dims) -> the class of such reductions.
    reductions: dict[tuple[int, tuple[int, ...]], int] = field(default_factory=dict)
    count: int = 0

    def fresh(self) -> int:
        self.count += 1
        return self.count

    def of(self, version: Version) -> int:
        if version.id not in self.classes:
            self.classes[version.id] = self.fresh()
        return self.classes[version.id]

    def same(self, a: Version, b: Version) -> bool:
        """Whether the two values provably have the same shape."""
        return self.of(a) == self.of(b)


def shape_facts(program: Program, qualified: Mapping[cst.CSTNode, str]) -> ShapeFacts:
    """Compute the shape classes of `program`'s versions."""
    facts = ShapeFacts()
    for version in program.params.values():
        facts.of(version)
    _steps(program.steps, facts, qualified)
    return facts


def _steps(
    steps: Sequence[Step], facts: ShapeFacts, qualified: Mapping[cst.CSTNode, str]
) -> None:
    for step in steps:
        if isinstance(step, Assign):
            found = class_of(step.value, step.before, facts, qualified)
            facts.classes[step.target.id] = (
                found if found is not None else facts.fresh()
            )
        elif isinstance(step, Branch):
            _steps(step.body, facts, qualified)
            _steps(step.orelse, facts, qualified)
            for merged, a, b in step.merges:
                a = a or step.before.get(merged.name)
                b = b or step.before.get(merged.name)
                same = a is not None and b is not None and facts.same(a, b)
                facts.classes[merged.id] = facts.of(a) if same and a else facts.fresh()
        elif isinstance(step, Opaque):
            for version in step.created:
                facts.of(version)


def class_of(
    node: cst.BaseExpression,
    env: Mapping[str, Version],
    facts: ShapeFacts,
    qualified: Mapping[cst.CSTNode, str],
) -> int | None:
    """The shape class of an expression, or None when nothing is proven."""
    if isinstance(node, cst.Name):
        version = env.get(node.value)
        return facts.of(version) if version is not None else None
    if isinstance(node, cst.UnaryOperation):
        return class_of(node.expression, env, facts, qualified)
    if isinstance(node, cst.BinaryOperation) and isinstance(
        node.operator, _ELEMENTWISE
    ):
        return _broadcast([node.left, node.right], env, facts, qualified)
    if isinstance(node, cst.Comparison):
        operands = [node.left, *(c.comparator for c in node.comparisons)]
        return _broadcast(operands, env, facts, qualified)
    if isinstance(node, cst.Call):
        return _call_class(node, env, facts, qualified)
    return None


def _operand_class(
    node: cst.BaseExpression,
    env: Mapping[str, Version],
    facts: ShapeFacts,
    qualified: Mapping[cst.CSTNode, str],
) -> int | None | bool:
    """A class, None (unknown), or False for a Python number (no shape of its own)."""
    if isinstance(node, (cst.Integer, cst.Float)):
        return False
    if isinstance(node, cst.UnaryOperation) and isinstance(
        node.expression, (cst.Integer, cst.Float)
    ):
        return False
    if isinstance(node, cst.Name) and node.value in env:
        value = env[node.value].value
        if value.kinds == {NUMBER}:
            return False
    return class_of(node, env, facts, qualified)


def _broadcast(
    operands: Sequence[cst.BaseExpression],
    env: Mapping[str, Version],
    facts: ShapeFacts,
    qualified: Mapping[cst.CSTNode, str],
) -> int | None:
    """The class of an elementwise op: the operands' class, numbers aside, where every
    other operand broadcasts into it."""
    classes = []
    for operand in operands:
        found = _operand_class(operand, env, facts, qualified)
        if found is None:
            return None
        if found is not False:
            classes.append(found)
    if not classes:
        return None
    for target in classes:
        if all(c == target or facts.into.get(c) == target for c in classes):
            return target
    return None


def _call_class(
    node: cst.Call,
    env: Mapping[str, Version],
    facts: ShapeFacts,
    qualified: Mapping[cst.CSTNode, str],
) -> int | None:
    func = node.func
    name = qualified.get(func) if dotted(func) else None
    positional = [a.value for a in node.args if a.keyword is None]
    keywords = {a.keyword.value: a.value for a in node.args if a.keyword is not None}
    if any(a.star for a in node.args):
        return None
    if name is not None and name.startswith("torch."):
        method, operands = name.rsplit(".", 1)[-1], positional
        if "input" in keywords:  # `torch.add(input=a, other=x)`
            operands = [keywords.pop("input"), *operands]
    elif isinstance(func, cst.Attribute):
        receiver = (
            env.get(func.value.value) if isinstance(func.value, cst.Name) else None
        )
        if receiver is not None and TENSOR not in receiver.value.kinds:
            return None
        name = f"torch.Tensor.{func.attr.value}"
        method, operands = func.attr.value, [func.value, *positional]
    else:
        return None
    if not operands:
        return None
    if method in _REDUCTIONS:
        return _reduction(node, method, operands, env, facts, qualified)
    if method in _SHAPE_KEEPING:
        return class_of(operands[0], env, facts, qualified)
    if method == "masked_fill":
        # The mask may broadcast x (the value is 0-d).
        mask = operands[1:2] or [keywords[k] for k in ("mask",) if k in keywords]
        return _broadcast([operands[0], *mask], env, facts, qualified) if mask else None
    if opfacts.is_pointwise(name):
        # Every operand broadcasts, passed by position or by keyword (`other=x`,
        # `min=lo`, `exponent=e`); a number or a string (`rounding_mode`) aside.
        given = [*operands, *(v for k, v in keywords.items() if k not in _OPTIONS)]
        tensors = [a for a in given if not isinstance(a, cst.SimpleString)]
        return _broadcast(tensors, env, facts, qualified)
    return None


#: Keywords of pointwise ops that are options, never a broadcast operand.
_OPTIONS = frozenset({"out", "dtype", "alpha", "rounding_mode", "approximate"})


def _reduction(
    node: cst.Call,
    method: str,
    operands: list[cst.BaseExpression],
    env: Mapping[str, Version],
    facts: ShapeFacts,
    qualified: Mapping[cst.CSTNode, str],
) -> int | None:
    """`x.mean(-1, keepdim=True)`: a class that broadcasts into x's, shared by the
    reductions of x over the same literal dims (over dims known only at run time, a
    class of its own). `method` is the op's own name however it was spelled
    (`torch.var`, `u.var`, or `var` imported from torch): where its `keepdim` sits."""
    dim_at, keep_at = _POSITIONS.get(method, (1, 2))
    keyword = {a.keyword.value: a.value for a in node.args if a.keyword is not None}
    keep = keyword.get("keepdim")
    dims = keyword.get("dim", operands[dim_at] if len(operands) > dim_at else None)
    if len(operands) > keep_at and keep is None:
        keep = operands[keep_at]
    if not (isinstance(keep, cst.Name) and keep.value == "True") or dims is None:
        return None
    literal = _dims(dims)
    base = class_of(operands[0], env, facts, qualified)
    if base is None:
        return None
    if literal is None:
        own = facts.fresh()
        facts.into[own] = base
        return own
    key = (base, literal)
    if key not in facts.reductions:
        facts.reductions[key] = facts.fresh()
        facts.into[facts.reductions[key]] = base
    return facts.reductions[key]


def _dims(node: cst.BaseExpression) -> tuple[int, ...] | None:
    """A literal dim or tuple of dims."""
    if isinstance(node, (cst.Tuple, cst.List)):
        found = [_dims(e.value) for e in node.elements]
        if any(f is None or len(f) != 1 for f in found):
            return None
        return tuple(sorted(f[0] for f in found if f))
    if isinstance(node, cst.Integer):
        return (int(node.value),)
    if (
        isinstance(node, cst.UnaryOperation)
        and isinstance(node.operator, cst.Minus)
        and isinstance(node.expression, cst.Integer)
    ):
        return (-int(node.expression.value),)
    return None
