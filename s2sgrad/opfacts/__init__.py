"""What torch's operators return and do, read from the generated table (`table.py`).

Every fact about a torch operator that s2sgrad uses lives here: the kinds of value each
overload returns, which operators carry no gradient, which may hand back their input
object, which are views, which draw random numbers, and the out-of-place twin of each
in-place operator. `build.py` writes the table from the installed torch's own schemas,
so this module needs no torch at conversion time.

Format of a signature: `overload|params->returns`. Params are `name:code`, with a `=`
when the parameter has a default, and a lone `*` before keyword-only ones. Codes: `T`
tensor, `i` int, `f` float, `b` bool, `n` any number, `s` str, `N` None, `o` another
object (dtype, device, generator...), `?` unknown; `X[]` is a list of X, `X?` is X or
None. A return code ending in `'` carries no gradient (an index, a mask). The returns
of an overload that gives a named tuple (`torch.return_types.max`) carry their field
names, as `values:T,indices:T'`.
"""

from __future__ import annotations

import difflib
import functools
from dataclasses import dataclass

from s2sgrad.opfacts import table

#: Python namespaces whose functions are the aten operators of the same name (with
#: the given prefix: `torch.linalg.norm` is `aten::linalg_norm`).
_NAMESPACES = {
    "torch.ops.aten.": "",
    "torch.Tensor.": "",
    "torch.nn.functional.": "",
    "torch.linalg.": "linalg_",
    "torch.special.": "special_",
    "torch.fft.": "fft_",
    "torch._C._VariableFunctions.": "",
    "torch._C._nn.": "",
    "torch._C._linalg.": "",
    "torch._C._special.": "",
    "torch._C._fft.": "",
    "torch.": "",
}

#: Python operators, as `operator.<name>`, and the aten operator each one calls.
OPERATORS = {
    "operator.add": "add",
    "operator.sub": "sub",
    "operator.mul": "mul",
    "operator.truediv": "div",
    "operator.floordiv": "floor_divide",
    "operator.mod": "remainder",
    "operator.pow": "pow",
    "operator.matmul": "matmul",
    "operator.neg": "neg",
    "operator.pos": "positive",
    "operator.abs": "abs",
    "operator.eq": "eq",
    "operator.ne": "ne",
    "operator.lt": "lt",
    "operator.le": "le",
    "operator.gt": "gt",
    "operator.ge": "ge",
    "operator.and_": "bitwise_and",
    "operator.or_": "bitwise_or",
    "operator.xor": "bitwise_xor",
    "operator.invert": "bitwise_not",
    "operator.getitem": "__getitem__",
}


#: torch functions that report autograd's mode (not operators: no schema has them).
GRAD_MODE_QUERIES = frozenset(
    {"torch.is_grad_enabled", "torch.is_inference_mode_enabled"}
)
#: Calls that switch grad mode where they are not a `with` block's manager.
GRAD_MODE_SETTERS = frozenset(
    {
        "torch.set_grad_enabled",
        "torch.autograd.set_grad_enabled",
        "torch.autograd.grad_mode.set_grad_enabled",
        "torch._C._set_grad_enabled",
        "torch.inference_mode",
        "torch.autograd.grad_mode.inference_mode",
        "torch._C._set_inference_mode",
    }
)


@dataclass(frozen=True)
class Param:
    name: str
    code: str
    keyword_only: bool
    has_default: bool


@dataclass(frozen=True)
class Signature:
    """One overload: its parameters and the codes of what it returns."""

    overload: str
    params: tuple[Param, ...]
    returns: tuple[str, ...]
    #: The field names of a named-tuple result (`values`, `indices`), else empty.
    fields: tuple[str, ...] = ()

    def knows(self, keywords: set[str]) -> bool:
        """Tell whether every keyword names a parameter of this overload."""
        return {_alias(k) for k in keywords} <= {_alias(p.name) for p in self.params}

    def accepts(self, positional: int, keywords: set[str]) -> bool:
        """Tell whether a call with that many positional arguments and these keywords
        binds to this overload (`self`/`input` are one name: Python spells it either).
        """
        plain = [p for p in self.params if not p.keyword_only]
        if positional > len(plain) or not self.knows(keywords):
            return False
        given = {_alias(k) for k in keywords}
        bound = {_alias(p.name) for p in plain[:positional]}
        if bound & given:
            return False
        missing = [
            p
            for p in self.params
            if not p.has_default and _alias(p.name) not in bound | given
        ]
        return not missing


#: Keyword spellings Python's argument parser takes for a schema's parameter: `input`
#: for `self`, and NumPy's names (`x.sum(axis=0, keepdims=True)`).
_SPELLINGS = {"input": "self", "axis": "dim", "keepdims": "keepdim"}


def _alias(name: str) -> str:
    return _SPELLINGS.get(name, name)


def _parse(text: str) -> Signature:
    overload, rest = text.split("|", 1)
    params_text, returns_text = rest.split("->", 1)
    params = []
    keyword = False
    for part in params_text.split(",") if params_text else []:
        if part == "*":
            keyword = True
            continue
        name, code = part.split(":", 1)
        default = code.endswith("=")
        params.append(Param(name, code.rstrip("="), keyword, default))
    named = [c.rpartition(":") for c in returns_text.split(",") if c]
    returns = tuple(code for _, _, code in named)
    fields = tuple(name for name, _, _ in named) if all(n for n, _, _ in named) else ()
    return Signature(overload, tuple(params), returns, fields if named else ())


def aten_name(qualified: str) -> str | None:
    """The aten operator a Python name calls, or None when it is not one."""
    if qualified in OPERATORS:
        return OPERATORS[qualified]
    entry = table.PYTHON.get(qualified)
    if entry is not None:
        return entry[1:] if entry.startswith("@") else None
    for prefix, aten_prefix in _NAMESPACES.items():
        if qualified.startswith(prefix):
            name = aten_prefix + qualified[len(prefix) :]
            if prefix == "torch.ops.aten.":
                name = name.split(".")[0]
            return name if name in table.ATEN else None
    return None


def near(qualified: str) -> str | None:
    """The known name of the same namespace spelled most like `qualified`
    (`torch.tahn`: `torch.tanh`), for a call that binds to nothing; None when none
    is close."""
    prefix, _, name = qualified.rpartition(".")
    known = _known_names(prefix + ".")
    # Two letters swapped (`tahn`) first: difflib rates `tan` nearer than `tanh`.
    swapped = [k for k in known if sorted(k) == sorted(name) and k != name]
    close = swapped or difflib.get_close_matches(name, known, n=1, cutoff=0.8)
    return f"{prefix}.{close[0]}" if close else None


@functools.lru_cache(maxsize=16)
def _known_names(prefix: str) -> list[str]:
    """The public names of one namespace the table knows (`torch.`: `tanh`...)."""
    if prefix == "torch.Tensor.":
        return sorted(table.TENSOR_METHODS | set(table.TENSOR_ATTRIBUTES))
    aten_prefix = _NAMESPACES.get(prefix)
    names = {q[len(prefix) :] for q in table.PYTHON if q.startswith(prefix)}
    if aten_prefix is not None and not prefix.startswith("torch.ops"):
        names |= {
            n[len(aten_prefix) :] for n in table.ATEN if n.startswith(aten_prefix)
        }
    return sorted(n for n in names if "." not in n and not n.startswith("_"))


def _base(qualified: str) -> str:
    """The name flags are kept under: the aten operator, else the method's own name."""
    return aten_name(qualified) or qualified.rsplit(".", 1)[-1]


@functools.lru_cache(maxsize=4096)
def signatures(qualified: str) -> tuple[Signature, ...]:
    """The overloads a call of `qualified` may bind to; empty when unknown."""
    entry = table.PYTHON.get(qualified)
    if entry is not None and not entry.startswith("@"):
        return (_parse(entry),)
    name = aten_name(qualified)
    if name is None:
        return ()
    found = tuple(_parse(text) for text in table.ATEN[name])
    if qualified.startswith("torch.ops.aten.") and qualified.count(".") == 4:
        overload = qualified.rsplit(".", 1)[1]
        overload = "" if overload == "default" else overload
        found = tuple(s for s in found if s.overload == overload)
    return found


def dispatch(qualified: str) -> tuple[str, bool, Signature, Signature] | None:
    """For a `boolean_dispatch` function: the flag, its default, and both signatures."""
    entry = table.DISPATCH.get(qualified)
    if entry is None:
        return None
    flag, default, if_true, if_false = entry
    return flag, default, _parse(if_true), _parse(if_false)


def no_gradient(qualified: str) -> bool:
    """Tell whether no output of the operator ever carries a gradient."""
    return _base(qualified) in table.NOGRAD


def keywords_known(qualified: str, keywords: set[str]) -> bool:
    """Tell whether a call's keywords bind as s2sgrad reads the call: to a parameter of
    one of its overloads, or to a function written in Python (whose own signature
    takes them). A builtin given a keyword no schema has (`torch.nonzero(x,
    as_tuple=True)`) returns what its Python binding makes of it."""
    if qualified in table.WRAPPERS:
        return True
    return any(s.knows(keywords) for s in signatures(qualified))


def variadic(qualified: str) -> bool:
    """Tell whether a Python function takes its tensors as `*tensors`."""
    return qualified in table.VARIADIC


def detached_outputs(qualified: str) -> tuple[int, ...]:
    """The outputs that torch returns without a gradient although they hold
    floating-point values (`native_layer_norm`'s mean and rstd); empty for most ops."""
    name = aten_name(qualified)
    return table.DETACHED.get(name, ()) if name is not None else ()


def is_view(qualified: str) -> bool:
    """Tell whether the result may share memory with an input."""
    return _base(qualified) in table.VIEW


def returns_input(qualified: str) -> bool:
    """Tell whether the operator may return its input object itself."""
    return _base(qualified) in table.RETURNS_INPUT


def may_share_memory(qualified: str) -> bool:
    """Tell whether the result may be, or share memory with, a tensor argument: a
    view, an operator that may hand back its input, or a composite one that returns a
    view of an operand on some inputs (`einsum`, `dropout1d` in eval mode)."""
    base = _base(qualified)
    return base in table.VIEW or base in table.RETURNS_INPUT or base in table.SHARES


def shares_any_argument(qualified: str) -> bool:
    """Tell whether the result may share memory with a tensor argument other than
    the first (`einsum("ij->ji", x)`, `broadcast_tensors(a, b)[1]`)."""
    return _base(qualified) in table.SHARES


#: Modules besides torch whose every function draws random numbers (or seeds them).
_RANDOM_MODULES = ("random.", "numpy.random.", "secrets.")


def is_random(qualified: str) -> bool:
    """Tell whether the call draws random numbers: a torch operator that does
    (`torch.rand_like`, `Tensor.bernoulli_`), or a function of Python's `random`,
    NumPy's `numpy.random` or `secrets`."""
    if qualified.startswith(_RANDOM_MODULES):
        return True
    return qualified.startswith("torch.") and _base(qualified) in table.RANDOM


def is_pointwise(qualified: str) -> bool:
    return _base(qualified) in table.POINTWISE


def out_of_place(method: str) -> str | None:
    """The out-of-place twin of an in-place tensor method (`mul_` -> `mul`), or None."""
    twin = table.OUT_OF_PLACE.get(method)
    return twin if twin in table.TENSOR_METHODS else None


def is_inplace(method: str) -> bool:
    """Tell whether a tensor method of that name writes into its receiver."""
    return method in table.OUT_OF_PLACE or (
        method.endswith("_") and not method.endswith("__")
    )
