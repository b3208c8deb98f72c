"""Which values may be, hold or share memory with a named tensor.

The in-place judge (`s2sgrad/inplace.py`) asks it of forward's bindings, and the
scope analysis (`s2sgrad/frontend/scopes.py`) of module helpers' bodies, to learn
which helpers may hand an argument back (`return t`, `return [t]`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection

import libcst as cst

from s2sgrad import opfacts
from s2sgrad.cst import dotted, findall


def may_share(
    value: cst.BaseExpression,
    name: str,
    qualified: Callable[[cst.CSTNode], str | None],
    handing: Collection[str] = (),
) -> bool:
    """Whether `value` may be `name`'s tensor or share its memory.

    `qualified` gives a dotted callee's qualified name (`F.relu`:
    `torch.nn.functional.relu`); `handing` are the module helpers that may hand an
    argument back (`learn_helpers` finds them).
    """
    if isinstance(value, cst.Name):
        return value.value == name
    if isinstance(value, cst.Attribute) and value.attr.value in _METADATA:
        return False
    if isinstance(value, (cst.Subscript, cst.Attribute)):
        return may_share(value.value, name, qualified, handing)
    if isinstance(value, cst.IfExp):
        return may_share(value.body, name, qualified, handing) or may_share(
            value.orelse, name, qualified, handing
        )
    if isinstance(value, cst.BooleanOperation):  # `None or t` is `t`
        return may_share(value.left, name, qualified, handing) or may_share(
            value.right, name, qualified, handing
        )
    if isinstance(value, cst.NamedExpr):  # `(u := t)` is `t`
        return may_share(value.value, name, qualified, handing)
    if isinstance(value, (cst.List, cst.Tuple, cst.Set)):
        return any(may_share(e.value, name, qualified, handing) for e in value.elements)
    if isinstance(value, cst.Dict):
        return any(
            isinstance(e, cst.DictElement)
            and may_share(e.value, name, qualified, handing)
            for e in value.elements
        )
    if isinstance(value, (cst.ListComp, cst.GeneratorExp, cst.SetComp, cst.DictComp)):
        # `[t for t in (h, h2)]` holds `h`; `[g for _ in hs]` holds only `g`.
        carriers = {name}
        clause: cst.CompFor | None = value.for_in
        while clause is not None:
            if any(may_share(clause.iter, c, qualified, handing) for c in carriers):
                carriers |= {n.value for n in findall(clause.target, cst.Name)}
            clause = clause.inner_for_in
        elements = (
            [value.key, value.value] if isinstance(value, cst.DictComp) else [value.elt]
        )
        return any(
            may_share(e, c, qualified, handing) for e in elements for c in carriers
        )
    if isinstance(value, cst.BinaryOperation) and isinstance(
        value.operator, (cst.Multiply, cst.Add)
    ):
        # `[h] * 2` holds `h` twice; `[] + [h]` holds it too.
        return any(
            isinstance(side, (cst.List, cst.Tuple))
            and may_share(side, name, qualified, handing)
            for side in (value.left, value.right)
        )
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Name):
        # `narrow(t, ...)` after `from torch import narrow`: a torch function.
        torch_name = qualified(value.func)
        if torch_name is not None and torch_name.startswith("torch."):
            return any(
                may_share(a, name, qualified, handing)
                for a in shared_arguments(value, torch_name)
            )
    if isinstance(value, cst.Call) and not isinstance(value.func, cst.Attribute):
        # `list((h,))`, `max([h], ...)`, `(lambda a: a)(h)`, `nn.Identity()(h)`, a
        # module helper that may return its argument (`_wrap(h)` returning `[h]`),
        # `getattr(h, "view")(-1)`. Another call by name makes a new value (`y =
        # softsign(h); y /= 4`).
        if (
            isinstance(value.func, cst.Name)
            and value.func.value not in _HOLDERS
            and value.func.value not in handing
        ):
            return False
        return may_share(value.func, name, qualified, handing) or any(
            may_share(a.value, name, qualified, handing) for a in value.args
        )
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute):
        func = value.func
        dotted_name = qualified(func) if dotted(func) else None
        if dotted_name is not None and dotted_name.startswith("torch."):
            return any(
                may_share(a, name, qualified, handing)
                for a in shared_arguments(value, dotted_name)
            )
        if dotted_name is not None:
            # A library's callable s2sgrad knows nothing of may keep what it is
            # given (`types.SimpleNamespace(v=h)`, `copy.copy(h)`).
            return any(may_share(a.value, name, qualified, handing) for a in value.args)
        method = f"torch.Tensor.{func.attr.value}"
        return opfacts.may_share_memory(method) and may_share(
            func.value, name, qualified, handing
        )
    return False


def shared_arguments(call: cst.Call, qualified: str) -> list[cst.BaseExpression]:
    """The arguments of a call of the torch function `qualified` whose memory its
    result may share: the first positional one of a view or of an op that may
    return its input (`torch.narrow(t, ...)`); every one of an op that may share any
    (`torch.broadcast_tensors(a, t)`, the items of a list given too); none for an op
    that makes a new tensor, nor for `einsum` of two or more operands, which it
    contracts into a new tensor (only a lone operand comes back permuted, or as is).
    """
    if not opfacts.may_share_memory(qualified):
        return []
    if not opfacts.shares_any_argument(qualified):
        first = [a.value for a in call.args if a.keyword is None][:1]
        return first or [
            a.value
            for a in call.args
            if a.keyword is not None and a.keyword.value in _FIRST_KEYWORDS
        ]
    given = [e for a in call.args for e in _items(a.value)]
    operands = given[1:] if qualified.endswith(".einsum") else []
    if len(operands) > 1 and not any(a.star for a in call.args):
        return []
    return given


def _items(value: cst.BaseExpression) -> list[cst.BaseExpression]:
    if isinstance(value, (cst.List, cst.Tuple)):
        return [i for e in value.elements for i in _items(e.value)]
    return [value]


#: The keywords a torch function's first tensor goes by (`torch.reshape(input=t, ...)`).
_FIRST_KEYWORDS = frozenset({"input", "self", "tensor", "A"})

#: Methods that put their arguments into the list, set or dict they are called on
#: (`hs.append(h)`, `d.update(a=h)`): the container then holds them.
CONTAINER_ADDS = frozenset(
    {"append", "extend", "insert", "add", "update", "setdefault"}
)

#: Builtins whose result may hold, or be, one of their arguments' tensors.
_HOLDERS = frozenset(
    {
        "list",
        "tuple",
        "dict",
        "set",
        "frozenset",
        "zip",
        "enumerate",
        "reversed",
        "sorted",
        "iter",
        "next",
        "min",
        "max",
        "getattr",
    }
)
#: Attributes that are a tensor's metadata, not a view of its memory.
_METADATA = frozenset({"shape", "dtype", "device", "ndim", "requires_grad", "is_cuda"})
