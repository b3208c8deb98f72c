"""Hypothesis strategies that write random, valid differentiators as source text.

`programs()` draws a `Program`: the source of one module-level differentiator such as

    def f(x: torch.Tensor, y: torch.Tensor, alpha: float, *, flag: bool = False):
        t1 = x * y
        m2 = t1 > 0.0
        if flag:
            t3 = torch.tanh(t1)
        else:
            t3 = t1 * alpha
        t4 = torch.where(m2, t3, y)
        def backward(grad):
            g_t3 = torch.where(m2, grad, 0.0).sum_to_size(t3.shape)
            ...
            return g_x, g_y, None, None
        return t4, backward

over a random expression DAG: elementwise arithmetic with broadcasting, unary functions,
reductions (over a literal dim or an `int` parameter `dim`), softmax, matrix products,
layout changes, `sum_to_size`, `torch.where` on a constant mask (named or inline),
`clamp`, `.detach()` constants, `float` parameter `alpha` (also through `math.*`),
`bool` parameter `flag` (`if`/`else` binding the same temporary, `if` without `else`, a
conditional expression), one to three outputs (some written inside the `return`, an
input returned as-is, the same value twice), keyword-only parameters (a tensor too),
0-d and broadcast-shaped inputs (a bias (d,) or (1, d) beside (n, d), often an operand
of the same op as a bigger parameter), and a scalar parameter (`s: torch.Tensor | float`,
or `s: float` that backward returns a gradient for) given a number or a 0-d tensor. A post-pass makes some programs rebind names
(`t = f(t)`, a parameter too, `t += b`) where late binding keeps them right, and joins
some statements into tuple assignments. Some temporaries and parameters take names the
generated code uses itself (`ctx`, `output`, `grad_x`, `x_shape`, `x_0`...).

Closures as others write them (issue 11) are drawn too: a list parameter
(`List[torch.Tensor]`, `list[...]`, `Sequence[...]`, `tuple[torch.Tensor, ...]`) of
random length, zero to four, read whole (`torch.stack`, `torch.cat`, `sum`) or per
element, with per-element metadata (`[e.shape[0] for e in xs]`); list outputs
(`torch.split`, `unbind`) whose backward takes the list of gradients; lists of
temporaries filled in a loop by `append`, by index or by `insert`; forward-side
construction of constants (a fresh tensor filled by an item store, `mul_`, `fill_`,
`index_fill_`); values of other kinds from torch calls that backward captures
(`torch.ops.aten._size_if_not_equal`'s `int[]?`, a bool, an int); and the flat
multi-output return `return a, b, backward`.

The closure's `backward` is written here as source, by reverse mode over the DAG from a
hand-written reference formula per op (the `vjp` templates below); nothing is computed by
torch at generation time. It reads forward values (inputs, temporaries, outputs, their
`.shape`/`.size(d)`/`.numel()`), so every kind of capture shows up. It is straight-line:
one local accumulator per value (`g_<name>`), conditional expressions for the `flag`
branches, and a final `return` with one entry per parameter (None for non-tensors).
Some parameters get their gradient unreduced, as PyTorch allows: in the shape of the
broadcast result that read them (`g_y = -g_t2` for `t2 = x - y`, y (d,), x (n, d)), and
of the inner differentiator's unreduced return; where two contributions of different
shapes meet, the unreduced one is summed first (`Reduced`), as the reference must be
right; a scalar's is reduced with `.sum()` (a number has no `.shape`).

Shapes are tracked statically, so every drawn program runs, and values stay bounded
(`exp` of `tanh`, denominators `1 + b * b` or `exp(tanh(b))`, `sqrt`/`log` of `1 + a * a`).

Categorical choices (which op, which spelling, which operand) come from a `random.Random`
seeded by a drawn integer: hypothesis's own draws are strongly biased towards the first
option of a list here, which made some ops almost never appear. The sizes (number of
inputs, of statements) and the presence of `alpha`/`flag` are hypothesis draws, so
shrinking still removes statements (choices are consumed statement by statement).
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import re
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch
from hypothesis import strategies as st

Shape = tuple[int, ...]
T = TypeVar("T")


def broadcast(*shapes: Shape) -> Shape | None:
    """The broadcast shape of `shapes`, or None when they do not broadcast."""
    try:
        return tuple(torch.broadcast_shapes(*shapes))
    except RuntimeError:
        return None


class Chooser:
    """Uniform categorical choices from a seed (see the module docstring)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def choice(self, options: Sequence[T]) -> T:
        return options[self.rng.randrange(len(options))]

    def coin(self, p: float = 0.5) -> bool:
        return self.rng.random() < p

    def int(self, low: int, high: int) -> int:
        return self.rng.randint(low, high)


# --------------------------------------------------------------------------------------
# The program model.
# --------------------------------------------------------------------------------------


@dataclasses.dataclass
class Value:
    """A named value of forward: a parameter, a temporary or a constant."""

    name: str
    shape: Shape
    differentiable: bool
    mask: bool = False  # a bool tensor: only ever the condition of a `torch.where`
    listed: bool = False  # a list of tensors of this shape (a list parameter, `hs`)


# vjp(g, out, operand names) -> one contribution per operand, as source. g is the name
# of the incoming gradient; out the name of the op's result, None when the op is written
# inside the `return` (the op then never reads it).
Vjp = Callable[[str, "str | None", list[str]], "list[str] | list[str | None]"]


@dataclasses.dataclass
class Op:
    expr: str  # the forward expression
    shape: Shape
    operands: list[Value]  # in the positions `vjp` answers for
    vjp: Vjp
    # The result is a fresh tensor that autograd does not save (so `t += ...` later on
    # it is safe for the reference autograd too).
    fresh: bool = True
    # Lines written before / after `t = expr` ({t} is the result's name): a size or a
    # flag a torch call returns, which the vjp reads.
    before: list[str] = dataclasses.field(default_factory=list)
    after: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Node:
    """A forward value computed from others: `name = op`, or if/else of two ops."""

    name: str | None  # None: computed inside the `return` statement
    shape: Shape
    ops: list[Op]  # one op, or two (flag true, flag false) over the same operands
    start: int = -1  # its lines in the forward body: [start, end)
    end: int = -1
    accumulate: bool = False  # meant to become `t += ...` (see _Builder.rebind)
    opaque: bool = False  # a loop: never renamed
    # An output that is a list of tensors (`torch.split(t, 1)`): its vjp gets the list
    # of gradients; `pieces` is how many.
    listed: bool = False
    pieces: int = 0

    @property
    def operands(self) -> list[Value]:
        return self.ops[0].operands


@dataclasses.dataclass
class Param:
    name: str
    # "tensor", "tensors" (a list of them), "float", "bool", "int", or "scalar": a
    # number or a 0-d tensor (`s: torch.Tensor | float`, or `s: float` that backward
    # returns a gradient for), given a tensor when `value` is None.
    kind: str
    shape: Shape = ()  # of the tensor, or of each element of a list
    keyword_only: bool = False
    value: Any = None  # the argument, for non-tensor parameters
    count: int = 0  # the number of elements of a list
    spelling: str = "List[torch.Tensor]"  # a list's (or a scalar's) annotation

    def annotation(self) -> str:
        if self.kind in ("tensors", "scalar"):
            return self.spelling
        return {"tensor": "torch.Tensor", "float": "float", "bool": "bool", "int": "int"}[self.kind]

    @property
    def tensors(self) -> bool:
        """A tensor or a list of them, whatever the argument (not a scalar)."""
        return self.kind in ("tensor", "tensors")

    @property
    def takes_tensor(self) -> bool:
        """The argument is one tensor that wants a gradient (a scalar given a tensor too)."""
        return self.kind == "tensor" or (self.kind == "scalar" and self.value is None)


@dataclasses.dataclass
class Program:
    """A drawn differentiator: its source and how to call it."""

    name: str
    source: str
    params: list[Param]
    n_outputs: int
    seed: int  # of the input tensors and cotangents
    loss_outputs: list[int]  # the outputs a loss uses (the others get no gradient)
    # The importable name the source module must have (it defines a helper the generated
    # module imports), or None.
    module_name: str | None = None
    # Per output: whether it is a list of tensors (its gradient arrives as a list).
    listed_outputs: list[bool] = dataclasses.field(default_factory=list)

    def __repr__(self) -> str:  # hypothesis prints this for a failing example
        values = {p.name: p.value for p in self.params if not p.tensors and not p.takes_tensor}
        shapes = {
            p.name: (p.shape if p.kind != "tensors" else [p.shape] * p.count)
            for p in self.params
            if p.tensors or p.takes_tensor
        }
        return (
            f"Program(seed={self.seed}, loss_outputs={self.loss_outputs}, "
            f"shapes={shapes}, values={values}, source=\n{self.source})"
        )

    def inputs(self) -> tuple[list[Any], dict[str, Any], list[torch.Tensor]]:
        """(args, kwargs, tensors): float64 tensors requiring grad, from `seed`."""
        gen = torch.Generator().manual_seed(self.seed)
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        tensors = []
        for p in self.params:
            if p.takes_tensor:
                v: Any = torch.randn(p.shape, generator=gen, dtype=torch.float64)
                v.requires_grad_()
                tensors.append(v)
            elif p.kind == "tensors":
                items = [
                    torch.randn(p.shape, generator=gen, dtype=torch.float64).requires_grad_()
                    for _ in range(p.count)
                ]
                tensors += items
                v = tuple(items) if p.spelling.startswith("tuple") else items
            else:
                v = p.value
            if p.keyword_only:
                kwargs[p.name] = v
            else:
                args.append(v)
        return args, kwargs, tensors

    def weights(self, shapes: list[Shape], salt: int) -> list[torch.Tensor]:
        """Deterministic random cotangents of the given shapes."""
        gen = torch.Generator().manual_seed(self.seed * 7919 + salt)
        return [torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes]


# --------------------------------------------------------------------------------------
# Reference formulas. Templates use {a} {b} (operands), {g} (incoming gradient) and {o}
# (the op's own result: a template that reads it is used only for named results).
# --------------------------------------------------------------------------------------


def _p(s: str) -> str:
    return f"({s})"


def _fill(template: str, **fields: str | None) -> str:
    return template.format(**fields)


# name -> (forward spellings, vjp templates, the non-tensor parameter it needs or "")
UNARY: dict[str, tuple[list[str], list[str], str]] = {
    "neg": (["-{a}", "torch.neg({a})", "{a}.neg()"], ["-{g}"], ""),
    "square": (
        ["{a} ** 2", "{a} * {a}", "torch.pow({a}, 2)"],
        ["2.0 * {a} * {g}", "{g} * ({a} + {a})"],
        "",
    ),
    "cube": (["{a} ** 3", "{a} ** 3.0"], ["3.0 * {a} ** 2 * {g}", "{g} * 3.0 * {a} * {a}"], ""),
    "exp_tanh": (
        ["torch.exp(torch.tanh({a}))", "{a}.tanh().exp()"],
        [
            "{g} * torch.exp(torch.tanh({a})) * (1.0 - torch.tanh({a}) ** 2)",
            "{g} * {o} * (1.0 - torch.tanh({a}) ** 2)",
        ],
        "",
    ),
    "tanh": (
        ["torch.tanh({a})", "{a}.tanh()", "torch.nn.functional.tanh({a})"],
        ["{g} * (1.0 - {o} * {o})", "{g} * (1.0 - torch.tanh({a}) ** 2)"],
        "",
    ),
    "sigmoid": (
        ["torch.sigmoid({a})", "{a}.sigmoid()"],
        ["{g} * {o} * (1.0 - {o})", "{g} * torch.sigmoid({a}) * torch.sigmoid(-{a})"],
        "",
    ),
    "sin": (["torch.sin({a})", "{a}.sin()"], ["{g} * torch.cos({a})", "{a}.cos() * {g}"], ""),
    "cos": (["torch.cos({a})", "{a}.cos()"], ["-{g} * torch.sin({a})", "-({g} * {a}.sin())"], ""),
    "sqrt1p": (
        ["torch.sqrt(1.0 + {a} * {a})", "(1.0 + {a} ** 2).sqrt()"],
        ["{g} * {a} / {o}", "{g} * {a} / torch.sqrt(1.0 + {a} * {a})"],
        "",
    ),
    "log1p2": (
        ["torch.log(1.0 + {a} * {a})", "torch.log1p({a} ** 2)"],
        ["2.0 * {g} * {a} / (1.0 + {a} * {a})"],
        "",
    ),
    "scale_mul": (["2.5 * {a}", "{a} * 2.5"], ["2.5 * {g}", "{g} * 2.5"], ""),
    "scale_div": (["{a} / 4.0"], ["{g} / 4.0", "0.25 * {g}"], ""),
    "shift": (["{a} + 1.0", "1.0 - {a}"], [], ""),  # vjp depends on the spelling
    "alpha_mul": (["{a} * alpha", "alpha * {a}"], ["{g} * alpha", "alpha * {g}"], "alpha"),
    "alpha_add": (["{a} + alpha", "alpha - {a}"], [], "alpha"),  # vjp depends on the spelling
    "alpha_math": (["{a} * math.exp(alpha)", "math.sqrt(abs(alpha)) * {a}"], [], "alpha"),
    "flag_scale": (
        ["{a} * (2.0 if flag else 0.5)", "(2.0 if flag else 0.5) * {a}"],
        ["{g} * (2.0 if flag else 0.5)", "(2.0 if flag else 0.5) * {g}"],
        "flag",
    ),
    "clamp": (
        [
            "torch.clamp({a}, {lo}, {hi})",
            "{a}.clamp(min={lo}, max={hi})",
            "torch.clamp({a}, min={lo}, max={hi})",
        ],
        [
            "torch.where(({a} >= {lo}) & ({a} <= {hi}), {g}, 0.0)",
            "{g} * (({a} > {lo}) & ({a} < {hi}))",
        ],
        "",
    ),
}
_SPELLING_VJP = {
    "{a} + 1.0": "{g}",
    "1.0 - {a}": "-{g}",
    "{a} + alpha": "{g}",
    "alpha - {a}": "-{g}",
    "{a} * math.exp(alpha)": "{g} * math.exp(alpha)",
    "math.sqrt(abs(alpha)) * {a}": "math.sqrt(abs(alpha)) * {g}",
}


def unary_op(r: Chooser, a: Value, name: str, named: bool) -> Op:
    spellings, vjps, _ = UNARY[name]
    spelling = r.choice(spellings)
    lo = r.choice(["-0.5", "-1.0", "-0.25"])
    hi = r.choice(["0.5", "1.0", "0.75"])
    if spelling in _SPELLING_VJP:
        template = _SPELLING_VJP[spelling]
    else:
        template = r.choice([v for v in vjps if named or "{o}" not in v])

    def vjp(g: str, out: str | None, xs: list[str]) -> list[str]:
        return [_fill(template, a=xs[0], g=g, o=out, lo=lo, hi=hi)]

    fresh = name not in ("exp_tanh", "tanh", "sigmoid", "sqrt1p")  # these save their result
    return Op(_fill(spelling, a=a.name, lo=lo, hi=hi), a.shape, [a], vjp, fresh)


# Module-level helpers (no derivative rule: s2sgrad recomputes what they compute):
# name -> (definition, vjp template).
HELPERS = {
    "softsign": (
        "def softsign(v):\n    return v / (1.0 + torch.abs(v))\n",
        "{g} / (1.0 + torch.abs({a})) ** 2",
    ),
    "smooth": (
        "def smooth(v, s=2.0):\n    return torch.tanh(v * s) / s\n",
        "{g} * (1.0 - torch.tanh({a} * 2.0) ** 2)",
    ),
    "cube_loop": (
        "def cube_loop(v):\n    out = v\n    for _ in range(2):\n        out = out * v\n    return out\n",
        "3.0 * {g} * {a} * {a}",
    ),
}


def helper_op(r: Chooser, a: Value, name: str) -> Op:
    template = HELPERS[name][1]
    return Op(f"{name}({a.name})", a.shape, [a], lambda g, o, xs: [template.format(g=g, a=xs[0])])


BINARY = ["add", "sub", "mul", "div_sq", "div_exp"]


class Reduced(str):
    """A contribution summed to its operand's shape (the text), which backward may also
    return unreduced for a parameter, as PyTorch allows: `full`, the same before the
    sum, of shape `shape` (None: the shape of the op's result)."""

    full: str
    shape: Shape | None

    @classmethod
    def of(cls, text: str, full: str, shape: Shape | None = None) -> Reduced:
        made = cls(text)
        made.full, made.shape = full, shape
        return made


def _red(expr: str, x: str) -> Reduced:
    """Undo broadcasting: sum `expr` (of the op's result's shape) to operand `x`'s."""
    return Reduced.of(f"{_p(expr)}.sum_to_size({x}.shape)", expr)


def binary_op(r: Chooser, a: Value, b: Value, name: str, named: bool) -> Op:
    shape = broadcast(a.shape, b.shape)
    assert shape is not None
    vjp: Vjp
    if name == "add":
        expr = r.choice(["{a} + {b}", "torch.add({a}, {b})", "{a}.add({b})"])
        vjp = lambda g, o, xs: [_red(g, xs[0]), _red(g, xs[1])]  # noqa: E731
    elif name == "sub":
        expr = r.choice(["{a} - {b}", "torch.sub({a}, {b})", "{a}.sub({b})"])
        vjp = lambda g, o, xs: [_red(g, xs[0]), _red(f"-{g}", xs[1])]  # noqa: E731
    elif name == "mul":
        expr = r.choice(["{a} * {b}", "torch.mul({a}, {b})", "{a}.mul({b})"])
        vjp = lambda g, o, xs: [_red(f"{g} * {xs[1]}", xs[0]), _red(f"{g} * {xs[0]}", xs[1])]  # noqa: E731
    elif name == "div_sq":
        expr = r.choice(["{a} / (1.0 + {b} * {b})", "{a} / (1.0 + {b} ** 2)", "torch.div({a}, 1.0 + {b} * {b})"])

        def vjp(g: str, o: str | None, xs: list[str]) -> list[str]:
            x, y = xs
            d = f"(1.0 + {y} * {y})"
            return [_red(f"{g} / {d}", x), _red(f"-2.0 * {g} * {x} * {y} / {d} ** 2", y)]

    else:  # div_exp
        expr = r.choice(["{a} / torch.exp(torch.tanh({b}))", "{a} * torch.exp(-torch.tanh({b}))"])
        use_out = named and r.coin()

        def vjp(g: str, o: str | None, xs: list[str]) -> list[str]:
            x, y = xs
            e = f"torch.exp(torch.tanh({y}))"
            value = o if use_out and o is not None else f"{x} / {e}"
            return [_red(f"{g} / {e}", x), _red(f"-{g} * {value} * (1.0 - torch.tanh({y}) ** 2)", y)]

    return Op(expr.format(a=a.name, b=b.name), shape, [a, b], vjp)


def scalar_op(r: Chooser, a: Value, s: Value, named: bool) -> Op:
    """`a * s`, `s + a`... with the scalar parameter `s`: a number or a 0-d tensor,
    known at run time. Its contribution is reduced with `.sum()` (a number has no
    `.shape`), or left unreduced (`Reduced.full`) when backward returns it so."""
    kind = r.choice(["mul", "add", "sub", "rsub", "div_sq"])
    spellings = {
        "mul": ["{a} * {s}", "{s} * {a}", "torch.mul({a}, {s})"],
        "add": ["{a} + {s}", "{s} + {a}", "torch.add({a}, {s})"],
        "sub": ["{a} - {s}", "torch.sub({a}, {s})"],
        "rsub": ["{s} - {a}"],
        "div_sq": ["{a} / (1.0 + {s} * {s})", "{a} / (1.0 + {s} ** 2)"],
    }[kind]
    expr = r.choice(spellings).format(a=a.name, s=s.name)
    total = r.choice(["({e}).sum()", "torch.sum({e})"])

    def vjp(g: str, o: str | None, xs: list[str]) -> list[str]:
        x, y = xs
        if kind == "mul":
            to_a, to_s = f"{g} * {y}", f"{g} * {x}"
        elif kind == "add":
            to_a, to_s = g, g
        elif kind == "sub":
            to_a, to_s = g, f"-{g}"
        elif kind == "rsub":
            to_a, to_s = f"-{g}", g
        else:
            d = f"(1.0 + {y} * {y})"
            to_a, to_s = f"{g} / {d}", f"-2.0 * {g} * {x} * {y} / {d} ** 2"
        return [to_a, Reduced.of(total.format(e=to_s), to_s)]

    return Op(expr, a.shape, [a, s], vjp)


def reduction_op(r: Chooser, a: Value, dim_param: int | None = None) -> Op:
    """sum/mean over everything or one dim; over the `dim` parameter when it is given."""
    nd = len(a.shape)
    kinds = ["sum_all", "mean_all", "sum_keep", "sum_drop", "mean_keep", "mean_drop"]
    kind = r.choice(kinds + ["sum_to_size"] if nd else kinds)
    if kind == "sum_to_size":
        # To the same shape (torch then returns the operand itself), or to a shape with
        # some dims 1 and maybe fewer leading dims.
        target = tuple(1 if r.coin(0.4) else s for s in a.shape)
        while len(target) > 1 and target[0] == 1 and r.coin():
            target = target[1:]
        spelling = r.choice(["{a}.sum_to_size({s})", "{a}.sum_to_size(*{s})"] if len(target) > 1 else ["{a}.sum_to_size({s})"])
        text = str(target) if len(target) != 1 else f"({target[0]},)"
        if spelling.endswith("*{s})"):
            spelling, text = "{a}.sum_to_size({s})", ", ".join(str(d) for d in target)
        expr = spelling.format(a=a.name, s=text)
        return Op(expr, target, [a], lambda g, o, xs: [f"{g}.expand({xs[0]}.shape)"], fresh=False)
    fn = "sum" if kind.startswith("sum") else "mean"
    if (kind.endswith("all") and dim_param is None) or nd == 0:
        expr = r.choice([f"{{a}}.{fn}()", f"torch.{fn}({{a}})"]).format(a=a.name)
        scale = "" if fn == "sum" else r.choice([" / {x}.numel()", f" / {max(1, _numel(a.shape))}"])
        return Op(expr, (), [a], lambda g, o, xs: [f"{g}.expand({xs[0]}.shape){scale.format(x=xs[0])}"])
    if dim_param is not None:
        pos = dim_param % nd
        dim: int | str = "dim"
        if kind.endswith("all"):
            kind = fn + "_keep"
    else:
        dim = r.choice(list(range(-nd, nd)))
        pos = dim % nd
    keep = kind.endswith("keep")
    if keep:
        shape = tuple(1 if i == pos else s for i, s in enumerate(a.shape))
        spellings = [f"{{a}}.{fn}({dim}, keepdim=True)", f"torch.{fn}({{a}}, dim={dim}, keepdim=True)"]
    else:
        shape = tuple(s for i, s in enumerate(a.shape) if i != pos)
        spellings = [f"{{a}}.{fn}({dim})", f"torch.{fn}({{a}}, {dim})", f"{{a}}.{fn}(dim={dim})"]
    expr = r.choice(spellings).format(a=a.name)
    count = r.choice([f"{{x}}.shape[{dim}]", f"{{x}}.size({dim})", str(a.shape[pos])])
    unsqueeze = r.choice(
        [
            f"{{g}}.unsqueeze({dim})",
            f"torch.unsqueeze({{g}}, {dim})",
            f"{{g}}.unsqueeze({dim} % {{x}}.dim())",
            f"{{g}}.unsqueeze({dim} % {{x}}.ndim)",
        ]
    )

    def vjp(g: str, o: str | None, xs: list[str]) -> list[str]:
        x = xs[0]
        grad = g if keep else unsqueeze.format(g=g, x=x)
        full = f"{grad}.expand({x}.shape)"
        return [full if fn == "sum" else f"{full} / {count.format(x=x)}"]

    return Op(expr, shape, [a], vjp)


def _numel(shape: Shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def softmax_op(r: Chooser, a: Value, named: bool, dim: str = "-1") -> Op:
    """softmax over the last dim, or over the `dim` parameter (dim="dim")."""
    spelling = r.choice(
        [
            "torch.softmax({a}, {d})",
            "torch.softmax({a}, dim={d})",
            "{a}.softmax({d})",
            "torch.nn.functional.softmax({a}, dim={d})",
        ]
    ).replace("{d}", dim)
    use_out = named and r.coin()

    def vjp(g: str, o: str | None, xs: list[str]) -> list[str]:
        s = o if use_out and o is not None else f"torch.softmax({xs[0]}, {dim})"
        return [f"{s} * ({g} - ({g} * {s}).sum({dim}, keepdim=True))"]

    return Op(spelling.format(a=a.name), a.shape, [a], vjp, fresh=False)


def layout_op(r: Chooser, a: Value) -> Op | None:
    nd = len(a.shape)
    choices = []
    if nd == 2:
        choices += ["t", "swap_reshape"]
    if nd >= 1:
        choices.append("flatten")
    if nd <= 2:
        choices.append("unsqueeze")
    if 1 in a.shape:
        choices.append("squeeze")
    if not choices:
        return None
    kind = r.choice(choices)
    if kind == "t":
        expr = r.choice(
            [
                "{a}.t()",
                "torch.t({a})",
                "{a}.transpose(0, 1)",
                "{a}.transpose(-1, -2)",
                "torch.transpose({a}, 0, 1)",
            ]
        )
        back = r.choice(["{g}.t()", "{g}.transpose(0, 1)", "{g}.transpose(-2, -1)"])
        shape: Shape = (a.shape[1], a.shape[0])
    elif kind == "swap_reshape":
        m, n = a.shape
        expr = r.choice(
            [
                f"{{a}}.reshape({n}, {m})",
                f"torch.reshape({{a}}, ({n}, {m}))",
                f"{{a}}.reshape(-1, {m})",
                "{a}.reshape({a}.shape[1], -1)",
                "{a}.reshape({a}.size(1), {a}.size(0))",
            ]
        )
        back = r.choice(["{g}.reshape({x}.shape)", f"{{g}}.reshape({m}, {n})"])
        shape = (n, m)
    elif kind == "flatten":
        expr = r.choice(["{a}.reshape(-1)", "{a}.flatten()", "torch.flatten({a})"])
        back = r.choice(["{g}.reshape({x}.shape)", "{g}.view({x}.shape)"])
        shape = (_numel(a.shape),)
    elif kind == "unsqueeze":
        dim = r.choice([0, -1])
        expr = r.choice([f"{{a}}.unsqueeze({dim})", f"torch.unsqueeze({{a}}, {dim})"])
        back = r.choice([f"{{g}}.squeeze({dim})", "{g}.reshape({x}.shape)"])
        shape = (1, *a.shape) if dim == 0 else (*a.shape, 1)
    else:  # squeeze a dimension of size 1
        dim = r.choice([i for i, s in enumerate(a.shape) if s == 1])
        expr = r.choice([f"{{a}}.squeeze({dim})", f"torch.squeeze({{a}}, {dim})"])
        back = r.choice([f"{{g}}.unsqueeze({dim})", "{g}.reshape({x}.shape)"])
        shape = tuple(s for i, s in enumerate(a.shape) if i != dim)
    return Op(expr.format(a=a.name), shape, [a], lambda g, o, xs: [back.format(g=g, x=xs[0])], fresh=False)


def matmul_op(r: Chooser, a: Value, b: Value) -> Op | None:
    """a @ b in one of three layouts, or None when the shapes fit none of them."""
    if len(a.shape) != 2:
        return None
    m, n = a.shape
    layouts = []
    if len(b.shape) == 2 and b.shape[1] == n:
        layouts.append("nt")
    if len(b.shape) == 2 and b.shape[0] == n:
        layouts.append("nn")
    if b.shape == (n,):
        layouts.append("mv")
    if not layouts:
        return None
    layout = r.choice(layouts)
    vjp: Vjp
    if layout == "nt":
        expr = r.choice(["{a} @ {b}.t()", "{a} @ {b}.transpose(0, 1)", "torch.matmul({a}, {b}.T)"])
        shape: Shape = (m, b.shape[0])
        vjp = lambda g, o, xs: [f"{g} @ {xs[1]}", f"{g}.t() @ {xs[0]}"]  # noqa: E731
    elif layout == "nn":
        expr = r.choice(["{a} @ {b}", "torch.matmul({a}, {b})", "torch.mm({a}, {b})"])
        shape = (m, b.shape[1])
        vjp = lambda g, o, xs: [f"{g} @ {xs[1]}.t()", f"{xs[0]}.t() @ {g}"]  # noqa: E731
    else:
        expr = r.choice(["{a} @ {b}", "torch.matmul({a}, {b})", "{a}.matmul({b})"])
        shape = (m,)
        vjp = lambda g, o, xs: [f"{g}.unsqueeze(-1) * {xs[1]}", f"{g} @ {xs[0]}"]  # noqa: E731
    return Op(expr.format(a=a.name, b=b.name), shape, [a, b], vjp)


def where_op(r: Chooser, mask: str, mask_shape: Shape, a: Value, b: Value | None) -> Op | None:
    """torch.where(mask, a, b), b None meaning a scalar; `mask` is a name or a comparison."""
    if b is None:
        shape = broadcast(mask_shape, a.shape)
        if shape is None:
            return None
        other = r.choice(["0.0", "1.5"])
        expr = r.choice([f"torch.where({mask}, {{a}}, {other})", f"{{a}}.where({mask}, {other})"])
        return Op(
            expr.format(a=a.name),
            shape,
            [a],
            lambda g, o, xs: [_red(f"torch.where({mask}, {g}, 0.0)", xs[0])],
        )
    shape = broadcast(mask_shape, a.shape, b.shape)
    if shape is None:
        return None
    expr = r.choice([f"torch.where({mask}, {{a}}, {{b}})", f"{{a}}.where({mask}, {{b}})"])
    zero = r.coin()

    def vjp(g: str, o: str | None, xs: list[str]) -> list[str]:
        other = f"torch.where({mask}, 0.0, {g})" if zero else f"{g} - torch.where({mask}, {g}, 0.0)"
        return [_red(f"torch.where({mask}, {g}, 0.0)", xs[0]), _red(other, xs[1])]

    return Op(expr.format(a=a.name, b=b.name), shape, [a, b], vjp)


# --------------------------------------------------------------------------------------
# The program strategy.
# --------------------------------------------------------------------------------------

PARAM_NAMES = [
    ["x", "y", "z"],
    ["a", "b", "c"],
    ["q", "k", "v"],
    ["inp", "weight", "bias"],
    # Names the generated code uses for its own purposes: they must not clash.
    ["ctx", "output", "inputs"],
    ["result", "needs_input_grad", "saved"],
]
# Temporaries sometimes take one of these names instead of t<N>: names the generated
# code could pick for its own variables. {p} is a tensor parameter's name.
LIST_ANNOTATIONS = [
    "List[torch.Tensor]",
    "list[torch.Tensor]",
    "Sequence[torch.Tensor]",
    "tuple[torch.Tensor, ...]",
]
CLASHING_NAMES = [
    "ctx", "output", "inputs", "result", "out", "shape", "dtype", "device", "grad",
    "needs_input_grad", "saved", "count", "apply", "forward", "cls",
    "grad_{p}", "{p}_shape", "{p}_0", "{p}_1", "{p}_numel", "{p}_like", "grad_{p}_1",
]


@dataclasses.dataclass
class Inner:
    """Another differentiator of the module, which the drawn one calls in forward.

    Its VJP in the caller's backward calls its closure, `<name>(...)[1](grad)`, directly
    or through a module-level helper `<name>_vjp(*params, grad)`.
    """

    name: str
    params: list[Param]
    shape: Shape  # of its (single) output
    returns: list[str]  # its backward's entries, "None" where it returns None
    bare: bool  # its backward returns a bare gradient (one parameter)
    # The shapes of those entries: a parameter's own, or a shape it broadcasts to where
    # the backward returns that gradient unreduced.
    return_shapes: list[Shape | None] = dataclasses.field(default_factory=list)

    def helper(self) -> str:
        names = [p.name for p in self.params]
        call = ", ".join(
            f"{p.name}={p.name}" if p.keyword_only else p.name for p in self.params
        )
        return (
            f"def {self.name}_vjp({', '.join(names)}, grad):\n"
            f'    """The backward of `{self.name}`, at the given inputs."""\n'
            f"    return {self.name}({call})[1](grad)\n"
        )


def call_op(r: Chooser, inner: Inner, operands: list[Value], args: list[str]) -> Op:
    """`inner(...)[0]`: operands for its tensor parameters, `args` for all of them."""
    call = ", ".join(
        f"{p.name}={a}" if p.keyword_only else a for p, a in zip(inner.params, args, strict=True)
    )
    expr = f"{inner.name}({call})[0]"
    positions = [i for i, p in enumerate(inner.params) if p.kind == "tensor"]

    # Half the time backward calls the inner closure itself, `inner(...)[1](g)`, which
    # the generated code turns into `inner_backward(inner_forward(...)[1], g)`.
    direct = r.coin()

    def vjp(g: str, o: str | None, xs: list[str]) -> list[str | None]:
        values = list(args)
        for i, x in zip(positions, xs, strict=True):
            values[i] = x
        if direct:
            given = ", ".join(
                f"{p.name}={v}" if p.keyword_only else v
                for p, v in zip(inner.params, values, strict=True)
            )
            helper = f"{inner.name}({given})[1]({g})"
        else:
            helper = f"{inner.name}_vjp({', '.join(values)}, {g})"
        found: list[str | None] = []
        for i, x in zip(positions, xs, strict=True):
            entry = helper if inner.bare else f"{helper}[{i}]"
            shape = inner.return_shapes[i] if inner.return_shapes else inner.params[i].shape
            if inner.returns[i] == "None":
                found.append(None)
            elif shape != inner.params[i].shape:  # unreduced: summed to the operand's
                found.append(Reduced.of(f"{_p(entry)}.sum_to_size({x}.shape)", entry, shape))
            else:
                found.append(entry)
        return found

    return Op(expr, inner.shape, operands, vjp, fresh=False)


def _either(t: str, f: str) -> str:
    """The contribution of an if/else on `flag`, unreduced too where both sides are."""
    text = f"{_p(t)} if flag else {_p(f)}"
    if isinstance(t, Reduced) and isinstance(f, Reduced) and t.shape == f.shape:
        return Reduced.of(text, f"{_p(t.full)} if flag else {_p(f.full)}", t.shape)
    return text


def _word(name: str) -> re.Pattern[str]:
    """`name` as a variable (not an attribute such as `.shape`, not part of a name)."""
    return re.compile(rf"(?<![.\w]){re.escape(name)}(?!\w)")


class _Builder:
    """Draws one program: forward statements, outputs, then the reverse-mode backward."""

    def __init__(
        self,
        r: Chooser,
        n_tensors: int,
        has_alpha: bool,
        has_flag: bool,
        has_dim: bool,
        base: Shape,
        inner: Inner | None = None,
        has_list: bool = False,
        has_scalar: bool = False,
    ) -> None:
        self.r = r
        self.has_alpha = has_alpha
        self.has_flag = has_flag
        self.dim_value: int | None = None
        self.inner = inner
        self.returns: list[str] = []
        self.bare = False  # backward returns a bare gradient
        self.helpers: set[str] = set()  # module-level helpers used
        self.listed_outputs: list[bool] = []
        names = r.choice(PARAM_NAMES)
        rows, cols = base
        family = [(rows, cols), (cols,), (1, cols), (rows, 1), (rows, cols), ()]
        self.params = [Param(names[i], "tensor", r.choice(family)) for i in range(n_tensors)]
        if inner is not None:  # shapes the inner differentiator takes, so calls fit
            shapes = [p.shape for p in inner.params if p.kind == "tensor"]
            for p, shape in zip(self.params, shapes, strict=False):
                p.shape = shape
        if has_alpha:
            self.params.append(Param("alpha", "float", value=r.choice([0.5, -1.25, 2.0, 0.75])))
        if has_flag:
            self.params.append(Param("flag", "bool", value=r.coin()))
        if has_dim:
            self.dim_value = r.choice([0, -1])
            self.params.append(Param("dim", "int", value=self.dim_value))
        self.scalar: Value | None = None  # the scalar parameter, an operand of `scalar_op`
        if has_scalar:  # a number or a 0-d tensor, known at run time
            scalar = Param(
                r.choice(["s", "scale", "beta"]),
                "scalar",
                value=None if r.coin() else r.choice([0.5, -1.5, 2.0]),
                spelling=r.choice(["torch.Tensor | float", "float"]),
            )
            self.params.append(scalar)
            self.scalar = Value(scalar.name, (), True)
        if has_list:  # a list of tensors of run-time length, maybe empty
            self.params.insert(
                r.int(0, n_tensors),
                Param(
                    r.choice(["xs", "parts", "items"]),
                    "tensors",
                    r.choice([(rows, cols), (cols,)]),
                    count=r.int(0, 4),
                    spelling=r.choice(LIST_ANNOTATIONS),
                ),
            )
        extras = [p for p in self.params if not p.tensors]
        if extras and r.coin():  # keyword-only, maybe a tensor too
            for p in extras:
                p.keyword_only = True
            if n_tensors > 1 and r.coin(0.3):
                self.params[n_tensors - 1].keyword_only = True
        elif extras and r.coin():  # mixed with the tensors, after the first
            rest = self.params[1:]
            r.rng.shuffle(rest)
            self.params = [self.params[0], *rest]
        # The signature lists positional parameters first, and backward returns in
        # the signature's order.
        self.params = [p for p in self.params if not p.keyword_only] + [
            p for p in self.params if p.keyword_only
        ]
        self.values = [
            Value(p.name, p.shape, True, listed=p.kind == "tensors")
            for p in self.params
            if p.tensors
        ]
        self.nodes: list[Node] = []
        self.lines: list[str] = []  # the forward body
        self.used_names = {p.name for p in self.params}
        # The parameters whose gradient backward returns unreduced where it can (in the
        # shape of the broadcast result that reads them, as PyTorch allows).
        self.unreduced = {p.name for p in self.params if p.kind in ("tensor", "scalar") and r.coin(0.7)}
        self.return_shapes: list[Shape | None] = []  # per parameter, of backward's entry
        self.counter = 0
        available = {"", "alpha" if has_alpha else "", "flag" if has_flag else ""}
        self.unary_names = [n for n, (_, _, needs) in UNARY.items() if needs in available]

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        if self.r.coin(0.12):
            p = self.r.choice([p.name for p in self.params if p.tensors])
            name = self.r.choice(CLASHING_NAMES).format(p=p)
            if name not in self.used_names:
                self.used_names.add(name)
                return name
        name = f"{prefix}{self.counter}"
        self.used_names.add(name)
        return name

    def pick(self, pred: Callable[[Value], bool] = lambda v: True, constants: bool = False) -> Value | None:
        """A value (differentiable unless `constants`), often a recent one (deep DAGs)."""
        pool = [
            v
            for v in self.values
            if not v.mask and not v.listed and pred(v) and (v.differentiable or constants)
        ]
        if not pool:
            return None
        if len(pool) > 1 and self.r.coin(0.6):
            return pool[-1 - self.r.int(0, min(2, len(pool) - 1))]
        return self.r.choice(pool)

    def op(self, named: bool) -> Op | None:
        """One op over existing values, or None when the drawn kind does not fit."""
        r = self.r
        kinds = ["unary"] * 3 + ["binary"] * 3 + ["reduce", "softmax", "layout", "matmul", "where", "where"]
        if self.scalar is not None:
            kinds += ["scalar"] * 3
        kind = r.choice(kinds + ["call"] * 6 if self.inner is not None else kinds)
        if kind == "call":
            return self.call()
        a = self.pick()
        assert a is not None
        if kind == "scalar":
            assert self.scalar is not None
            return scalar_op(r, a, self.scalar, named)
        if kind == "unary" and r.coin(0.15):  # a helper of the module
            helper = r.choice(sorted(HELPERS))
            self.helpers.add(helper)
            return helper_op(r, a, helper)
        if kind == "unary":
            return unary_op(r, a, r.choice(self.unary_names), named)
        if kind == "binary":
            fits: Callable[[Value], bool] = lambda v: broadcast(a.shape, v.shape) is not None  # noqa: E731
            params = {p.name for p in self.params}
            b = None
            if r.coin(0.3):  # a parameter: a bias (d,), (1, d) or 0-d beside (n, d)
                b = self.pick(lambda v: fits(v) and v.name in params and v.name != a.name)
            b = b or self.pick(fits, constants=True)
            assert b is not None  # a itself qualifies
            if r.coin():
                a, b = b, a
            return binary_op(r, a, b, r.choice(BINARY), named)
        over_dim = self.dim_value is not None and len(a.shape) > 0 and r.coin(0.6)
        if kind == "reduce":
            return reduction_op(r, a, self.dim_value if over_dim else None)
        if kind == "softmax":
            return softmax_op(r, a, named, "dim" if over_dim else "-1") if a.shape else None
        if kind == "layout":
            return layout_op(r, a)
        if kind == "matmul":
            b = self.pick(lambda v: len(v.shape) in (1, 2), constants=True)
            if b is None:
                return None
            if r.coin():
                a, b = b, a
            return matmul_op(r, a, b) if a.differentiable or b.differentiable else None
        # where: a mask compares some value (a constant: no gradient) with a threshold,
        # bound to a name (a constant capture) or written inline.
        src = self.pick(constants=True)
        assert src is not None
        comparison = f"{src.name} {r.choice(['>', '<', '>='])} {r.choice(['0.0', '0.25', '-0.5'])}"
        if r.coin():
            mask = self.fresh("m")
            self.lines.append(f"{mask} = {comparison}")
            self.values.append(Value(mask, src.shape, False, mask=True))
        else:
            mask = f"({comparison})"
        b = None if r.coin(0.3) else self.pick(constants=True)
        if r.coin():
            a, b = (b, a) if b is not None and b.differentiable else (a, b)
        return where_op(r, mask, src.shape, a, b)

    def call(self) -> Op | None:
        """A call of the inner differentiator on values of its parameters' shapes."""
        r = self.r
        inner = self.inner
        assert inner is not None
        operands = []
        args = []
        depends = False  # the result depends on a differentiable operand
        for p, entry in zip(inner.params, inner.returns, strict=True):
            if p.kind == "tensor":
                v = self.pick(lambda v, shape=p.shape: v.shape == shape, constants=True)
                if v is None:
                    return None
                operands.append(v)
                args.append(v.name)
                reached = entry != "None" and not entry.startswith("torch.zeros_like")
                depends = depends or (v.differentiable and reached)
            elif p.kind == "float":
                args.append("alpha" if self.has_alpha and r.coin() else repr(p.value))
            elif p.kind == "bool":
                args.append("flag" if self.has_flag and r.coin() else repr(p.value))
            else:  # int: its shapes depend on the value it was drawn with
                args.append(repr(p.value))
        if not depends:
            return None
        return call_op(r, inner, operands, args)

    def statement(self) -> None:
        r = self.r
        roll = r.int(0, 13)
        if roll == 10 and any(p.kind == "tensors" for p in self.params):
            self.list_statement()
            return
        if roll == 11 and r.coin(0.6):
            self.append_loop()
            return
        if roll == 12:
            if r.coin():
                self.item_store()
            else:
                self.construct()
            return
        if roll == 13:
            self.from_torch_call()
            return
        if roll == 0:  # a detached constant of a differentiable value
            src = self.pick()
            assert src is not None
            name = self.fresh("c")
            self.lines.append(f"{name} = {r.choice(['{v}.detach()', 'torch.detach({v})']).format(v=src.name)}")
            self.values.append(Value(name, src.shape, False))
            return
        if roll == 1 and self.has_flag:
            self.branch()
            return
        if roll == 2 and self.nodes and self.accumulate():
            return
        if roll == 3 and r.coin(0.5):  # a loop: reverse mode does not look inside
            a = self.pick()
            assert a is not None
            n = r.choice([2, 3, 4])
            name = self.fresh("t")
            start = len(self.lines)
            init = r.choice(["torch.zeros_like({a})", "0.0 * {a}"]).format(a=a.name)
            step = r.choice(["{t} = {t} + {a} * _step", "{t} = {a} * _step + {t}"])
            self.lines += [f"{name} = {init}", f"for _step in range({n}):", "    " + step.format(t=name, a=a.name)]
            factor = float(n * (n - 1) // 2)
            op = Op(f"{factor} * {a.name}", a.shape, [a], lambda g, o, xs: [f"{factor} * {g}"], fresh=True)
            self.nodes.append(Node(name, a.shape, [op], start, len(self.lines), opaque=True))
            self.values.append(Value(name, a.shape, True))
            return
        if roll == 4 and r.coin(0.3):  # computed without autograd: a constant
            a = self.pick()
            assert a is not None
            name = self.fresh("c")
            self.lines += ["with torch.no_grad():", f"    {name} = {a.name} * 2.0"]
            self.values.append(Value(name, a.shape, False))
            return
        op = None
        for _attempt in range(5):
            op = self.op(named=True)
            if op is not None and len(op.shape) <= 3:
                break
            op = None
        if op is None:
            a = self.pick()
            assert a is not None
            op = unary_op(r, a, "sin", True)
        self.add_node(op)

    def list_statement(self) -> None:
        """An op over a list of tensors: a sum (any length), `cat` or `stack` (not empty)."""
        r = self.r
        param = r.choice([p for p in self.params if p.kind == "tensors"])
        xs = next(v for v in self.values if v.name == param.name)
        count = param.count
        kinds = ["sum", "sum_start", "loop"] + (["cat", "stack"] if count else [])
        kind = r.choice(kinds)
        name = self.fresh("t")
        start = len(self.lines)
        vjp: Vjp
        if kind in ("sum", "sum_start", "loop"):
            a = self.pick(lambda v: broadcast(v.shape, xs.shape) == v.shape)
            if a is None:
                a = self.pick()
                assert a is not None
                if broadcast(a.shape, xs.shape) != a.shape:
                    return
            if kind == "sum":
                self.lines.append(f"{name} = {a.name} + sum(1.5 * e for e in {xs.name})")
            elif kind == "sum_start":
                self.lines.append(f"{name} = sum([e * 1.5 for e in {xs.name}], {a.name})")
            else:
                self.lines += [
                    f"{name} = {a.name} * 1.0",
                    f"for e in {xs.name}:",
                    f"    {name} = {name} + 1.5 * e",
                ]

            def vjp(g: str, o: str | None, vs: list[str]) -> list[str]:
                return [g, f"[(1.5 * {_p(g)}).sum_to_size(e.shape) for e in {vs[1]}]"]

            # `sum([], a)` is `a` itself: not a fresh tensor to write into.
            fresh = kind != "sum_start"
            op = Op(f"{a.name} + 1.5 * sum({xs.name})", a.shape, [a, xs], vjp, fresh)
            self.nodes.append(Node(name, a.shape, [op], start, len(self.lines), opaque=True))
            self.values.append(Value(name, a.shape, True))
            return
        if kind == "cat":
            sizes = self.fresh("sizes")
            self.lines += [
                f"{sizes} = [e.shape[0] for e in {xs.name}]" if xs.shape else f"{sizes} = [1 for e in {xs.name}]",
                f"{name} = torch.cat({xs.name}, 0)" if xs.shape else f"{name} = torch.stack({xs.name})",
            ]
            shape = ((xs.shape[0] * count, *xs.shape[1:]) if xs.shape else (count,))
            split = f"list({{g}}.split({sizes}, 0))"

            def vjp(g: str, o: str | None, vs: list[str]) -> list[str]:
                return [split.format(g=g)]

        else:
            self.lines.append(f"{name} = torch.stack({xs.name}) * 2.0")
            shape = (count, *xs.shape)

            def vjp(g: str, o: str | None, vs: list[str]) -> list[str]:
                return [f"list((2.0 * {_p(g)}).unbind(0))"]

        op = Op(name, shape, [xs], vjp, fresh=False)
        self.nodes.append(Node(name, shape, [op], start, len(self.lines), opaque=True))
        self.values.append(Value(name, shape, True))

    def append_loop(self) -> None:
        """A list of temporaries filled in a loop (append, by index or insert), which
        backward reads."""
        r = self.r
        a = self.pick()
        assert a is not None
        hs, name = self.fresh("hs"), self.fresh("t")
        n = r.choice([2, 3])
        start = len(self.lines)
        item = f"torch.tanh({a.name} * (i + 1.0))"
        style = r.choice(["append", "index", "insert"])
        if style == "append":
            self.lines += [f"{hs} = []", f"for i in range({n}):", f"    {hs}.append({item})"]
        elif style == "index":
            self.lines += [f"{hs} = [None] * {n}", f"for i in range({n}):", f"    {hs}[i] = {item}"]
        else:
            self.lines += [
                f"{hs} = []",
                f"for i in reversed(range({n})):",
                f"    {hs}.insert(0, {item})",
            ]
        self.lines.append(f"{name} = {r.choice(['sum({h})', '{h}[0] + sum({h}[1:])']).format(h=hs)}")

        def vjp(g: str, o: str | None, vs: list[str]) -> list[str]:
            return [f"{_p(g)} * sum((i + 1.0) * (1.0 - h * h) for i, h in enumerate({hs}))"]

        op = Op(f"sum({hs})", a.shape, [a], vjp, fresh=False)
        self.nodes.append(Node(name, a.shape, [op], start, len(self.lines), opaque=True))
        self.values.append(Value(name, a.shape, True))
        self.values.append(Value(hs, a.shape, True, listed=True))

    def item_store(self) -> None:
        """A differentiable temporary stored into by index in forward (`t = a * 1.5`,
        then `t[0] = 0.0` or `t[..., :1] = b[..., :1]`): written out of place, and
        what backward reads of it recomputed."""
        r = self.r
        a = self.pick(lambda v: len(v.shape) >= 1)
        if a is None:
            self.construct()
            return
        b = self.pick(lambda v: v.shape == a.shape and v.name != a.name)
        index, dim = r.choice([("0", 0), ("0:1", 0), ("..., :1", -1), ("-1:, ...", 0)])
        if index == "-1:, ...":
            row = f"torch.tensor([{a.shape[0] - 1}])"
        else:
            row = "torch.tensor([0])"
        kept = f"({{g}} * 1.5).index_fill({dim}, {row}, 0.0)"
        if r.coin(0.3):  # an in-place op on the part: `t[0].mul_(2.0)`
            doubled = f"({{g}} * 1.5) * 2.0 - {kept}"
            op = Op(
                f"{a.name} * 1.5",
                a.shape,
                [a],
                lambda g, o, xs: [doubled.format(g=g)],
                after=[f"{{t}}[{index}].mul_(2.0)"],
            )
            self.add_node(op, named=True)
            return
        if b is None or r.coin():
            stored, operands = r.choice(["0.0", "torch.zeros(())"]), [a]

            def vjp(g: str, o: str | None, xs: list[str]) -> list[str]:
                return [kept.format(g=g)]

        else:
            stored, operands = f"{b.name}[{index}]", [a, b]

            def vjp(g: str, o: str | None, xs: list[str]) -> list[str]:
                return [kept.format(g=g), f"{g} - {g}.index_fill({dim}, {row}, 0.0)"]

        op = Op(f"{a.name} * 1.5", a.shape, operands, vjp, after=[f"{{t}}[{index}] = {stored}"])
        self.add_node(op, named=True)

    def construct(self) -> None:
        """A constant built in place in forward: a fresh tensor filled by writes."""
        r = self.r
        a = self.pick(constants=True)
        assert a is not None
        name = self.fresh("c")
        kinds = ["store", "mul", "fill"] + (["index_fill"] if a.shape else [])
        kind = r.choice(kinds)
        if kind == "store":
            self.lines += [f"{name} = torch.zeros_like({a.name})", f"{name}[{a.name} > 0.0] = 1.5"]
        elif kind == "mul":
            self.lines += [f"{name} = torch.ones_like({a.name})", f"{name}.mul_(0.5)"]
        elif kind == "fill":
            self.lines += [f"{name} = torch.empty_like({a.name})", f"{name}.fill_(2.0)"]
        else:
            self.lines += [
                f"{name} = torch.full_like({a.name}, 0.25)",
                f"{name}.index_fill_(0, torch.tensor([0]), 1.0)",
            ]
        self.values.append(Value(name, a.shape, False))

    def from_torch_call(self) -> None:
        """An op whose vjp reads a value of another kind a torch call returned: an
        `int[]?` (`_size_if_not_equal`), a bool, an int."""
        r = self.r
        a = self.pick()
        assert a is not None
        kind = r.choice(["sizes", "flag", "count"])
        if kind == "sizes":
            b = self.pick(lambda v: broadcast(a.shape, v.shape) is not None, constants=True)
            assert b is not None
            shape = broadcast(a.shape, b.shape)
            assert shape is not None
            sa, sb = self.fresh("size"), self.fresh("size")
            after = [
                f"{sa} = torch.ops.aten._size_if_not_equal({a.name}.size(), {{t}}.size())",
                f"{sb} = torch.ops.aten._size_if_not_equal({b.name}.size(), {{t}}.size())",
            ]

            def vjp(g: str, o: str | None, vs: list[str]) -> list[str]:
                return [
                    f"torch.ops.aten._grad_sum_to_size({g} * {vs[1]}, {sa})",
                    f"torch.ops.aten._grad_sum_to_size({g} * {vs[0]}, {sb})",
                ]

            self.add_node(Op(f"{a.name} * {b.name}", shape, [a, b], vjp, after=after), named=True)
            return
        if kind == "flag":
            flag = self.fresh("is_float")
            factor = f"(2.0 if {flag} else 0.5)"
            op = Op(
                f"{a.name} * {factor}",
                a.shape,
                [a],
                lambda g, o, xs: [f"{g} * {factor}"],
                before=[f"{flag} = {r.choice(['torch.is_floating_point', 'torch.is_tensor'])}({a.name})"],
            )
            self.add_node(op)
            return
        count = self.fresh("n")
        op = Op(
            f"{a.name} / {count}",
            a.shape,
            [a],
            lambda g, o, xs: [f"{g} / {count}"],
            before=[
                f"{count} = "
                + r.choice(["torch.numel({a})", "{a}.dim()", "len({a}.shape)"]).format(a=a.name)
                + " + 1"
            ],
        )
        self.add_node(op)

    def accumulate(self) -> bool:
        """`t = t + b`, `t = t * 2.5`... on the last temporary, to become `t += b`."""
        r = self.r
        last = self.nodes[-1]
        if last.name is None or not all(op.fresh for op in last.ops):
            return False
        a = next(v for v in self.values if v.name == last.name)
        kind = r.choice(["+", "-", "*", "/", "alpha"] if self.has_alpha else ["+", "-", "*", "/"])
        vjp: Vjp
        if kind in "+-":
            b = self.pick(lambda v: broadcast(a.shape, v.shape) == a.shape, constants=True)
            if b is None or b.name == a.name:
                return False
            expr = f"{a.name} {kind} {b.name}"
            sign = "" if kind == "+" else "-"
            vjp = lambda g, o, xs: [g, _red(f"{sign}{g}", xs[1])]  # noqa: E731
            op = Op(expr, a.shape, [a, b], vjp)
        else:
            factor = {"*": "2.5", "/": "4.0", "alpha": "alpha"}[kind]
            expr = f"{a.name} / 4.0" if kind == "/" else f"{a.name} * {factor}"
            back = "{g} / 4.0" if kind == "/" else f"{{g}} * {factor}"
            op = Op(expr, a.shape, [a], lambda g, o, xs: [back.format(g=g)])
        self.add_node(op)
        self.nodes[-1].accumulate = True
        return True

    def add_node(self, op: Op, named: bool = False) -> None:
        name = self.fresh("t")
        start = len(self.lines)
        self.lines += op.before
        if op.expr.endswith(")[0]") and self.inner is not None and self.r.coin():
            self.lines.append(f"{name}, _ = {op.expr[:-3]}")  # `u, _ = inner(...)`
        else:
            self.lines.append(f"{name} = {op.expr}")
        self.lines += [line.format(t=name) for line in op.after]
        node = Node(name, op.shape, [op], start, len(self.lines), opaque=named)
        self.nodes.append(node)
        self.values.append(Value(name, op.shape, True))

    def branch(self) -> None:
        """if/else on the flag binding the same temporary from the same operands."""
        r = self.r
        name = self.fresh("t")
        a = self.pick()
        assert a is not None
        if r.coin():
            ops = [unary_op(r, a, r.choice(self.unary_names), True) for _ in range(2)]
        else:
            b = self.pick(lambda v: broadcast(a.shape, v.shape) is not None, constants=True)
            assert b is not None
            ops = [binary_op(r, a, b, r.choice(BINARY), True) for _ in range(2)]
        style = r.choice(["block", "block", "ifexp", "no_else"])
        if style == "no_else":
            # One side keeps the operand: `t = a`, then `if flag: t = op(a)`.
            changed = unary_op(r, a, r.choice(self.unary_names), True)
            identity = Op(a.name, a.shape, [a], lambda g, o, xs: [g], fresh=False)
            keep_when = r.coin()  # the flag value for which t stays a
            ops = [identity, changed] if keep_when else [changed, identity]
            start = len(self.lines)
            test = "not flag" if keep_when else "flag"
            self.lines += [f"{name} = {a.name}", f"if {test}:", f"    {name} = {changed.expr}"]
            self.nodes.append(Node(name, a.shape, ops, start, len(self.lines)))
            self.values.append(Value(name, a.shape, True))
            return
        negate = r.coin()
        test, first, second = ("not flag", ops[1], ops[0]) if negate else ("flag", ops[0], ops[1])
        start = len(self.lines)
        if style == "ifexp":
            self.lines.append(f"{name} = ({first.expr}) if {test} else ({second.expr})")
        else:
            self.lines += [f"if {test}:", f"    {name} = {first.expr}", "else:", f"    {name} = {second.expr}"]
        self.nodes.append(Node(name, ops[0].shape, ops, start, len(self.lines)))
        self.values.append(Value(name, ops[0].shape, True))

    def outputs(self, single: bool = False) -> list[Node]:
        """The last temporary, maybe others, maybe one computed in the return itself."""
        r = self.r
        if single:
            return [self.nodes[-1]]
        consumed = {v.name for n in self.nodes for v in n.operands}
        sinks = [n for n in self.nodes[:-1] if n.name not in consumed]  # little dead code
        outputs = [self.nodes[-1]]
        others = sinks if sinks and r.coin(0.7) else self.nodes[:-1]
        if others and r.coin(0.4):
            extra = list(others)
            r.rng.shuffle(extra)
            outputs += extra[: r.int(1, min(2, len(extra)))]
            r.rng.shuffle(outputs)
        if len(outputs) < 3 and r.coin(0.08):  # an input returned as an output
            p = r.choice([p for p in self.params if p.kind == "tensor"])
            outputs.insert(r.int(0, len(outputs)), Node(p.name, p.shape, []))
        if len(outputs) < 3 and r.coin(0.05):  # the same output twice
            outputs.insert(r.int(0, len(outputs)), r.choice(outputs))
        if len(outputs) < 3 and r.coin(0.3):
            for _attempt in range(5):
                inline = self.op(named=False)
                if inline is not None:
                    node = Node(None, inline.shape, [inline])
                    self.nodes.append(node)
                    outputs.insert(r.int(0, len(outputs)), node)
                    break
        if r.coin(0.25):  # a list of tensors as one output
            listed = self.list_output()
            if listed is not None:
                outputs.insert(r.int(0, len(outputs)), listed)
        return outputs

    def list_output(self) -> Node | None:
        """`torch.split(t, 1)`, `t.unbind(0)`, `list(t.chunk(k))` of a temporary."""
        r = self.r
        a = self.pick(lambda v: bool(v.shape) and v.shape[0] >= 2)
        if a is None:
            return None
        n = a.shape[0]
        kind = r.choice(["split", "unbind", "chunk"])
        if kind == "split":
            expr = r.choice(["torch.split({a}, 1)", "{a}.split(1)", "torch.split({a}, 1, 0)"])
            back, pieces = "torch.cat({g})", n
        elif kind == "unbind":
            expr = r.choice(["{a}.unbind(0)", "torch.unbind({a})", "list({a}.unbind())"])
            back, pieces = "torch.stack({g})", n
        else:
            expr = r.choice(["list({a}.chunk({k}))", "torch.chunk({a}, {k})"])
            back, pieces = "torch.cat({g})", n
        op = Op(
            expr.format(a=a.name, k=n),
            a.shape,
            [a],
            lambda g, o, xs: [back.format(g=g)],
            fresh=False,
        )
        node = Node(None, a.shape, [op], listed=True, pieces=pieces)
        self.nodes.append(node)
        return node

    def backward(self, outputs: list[Node], grad_names: list[str]) -> list[str]:
        """Reverse mode over the nodes, as straight-line source."""
        body: list[str] = []
        acc: dict[str, str] = {}  # value name -> the local holding its gradient so far
        # value name -> the shape of that local: the value's own, or for a parameter in
        # `self.unreduced` a shape it broadcasts to (summed only where two meet).
        acc_shape: dict[str, Shape] = {}
        unnamed: dict[int, str] = {}
        for node, gname in zip(outputs, grad_names, strict=True):
            if node.name is None:
                unnamed[id(node)] = gname
            elif node.name in acc:  # the same value returned twice
                body.append(f"g_{node.name} = {acc[node.name]} + {gname}")
                acc[node.name] = f"g_{node.name}"
            else:
                acc[node.name] = gname  # an output's gradient starts as its parameter
                acc_shape[node.name] = node.shape
        for node in reversed(self.nodes):
            g = unnamed.get(id(node)) if node.name is None else acc.get(node.name)
            if g is None:
                continue  # dead: no gradient reaches it
            names = [v.name for v in node.operands]
            contribs = node.ops[0].vjp(g, node.name, names)
            if len(node.ops) == 2:
                other = node.ops[1].vjp(g, node.name, names)
                contribs = [_either(t, f) for t, f in zip(contribs, other, strict=True)]
            for operand, contrib in zip(node.operands, contribs, strict=True):
                if not operand.differentiable or contrib is None:
                    continue
                local = f"g_{operand.name}"
                text, shape = contrib, operand.shape
                if operand.name in self.unreduced and isinstance(contrib, Reduced):
                    text, shape = contrib.full, contrib.shape or node.shape
                if operand.listed and operand.name in acc:
                    body.append(
                        f"{local} = [p + q for p, q in zip({acc[operand.name]}, {contrib})]"
                    )
                elif operand.listed:
                    body.append(f"{local} = {contrib}")
                elif operand.name in acc and acc_shape[operand.name] == shape:
                    body.append(f"{local} = {acc[operand.name]} + {_p(text)}")
                elif operand.name in acc:  # unreduced where they meet: summed first
                    total = acc[operand.name]
                    if acc_shape[operand.name] != operand.shape:
                        total = self.reduce(total, operand)
                    body.append(f"{local} = {total} + {_p(contrib)}")
                    shape = operand.shape
                elif operand is not self.scalar and self.r.coin(0.1):
                    # start from zeros: backward then reads the value
                    body.append(f"{local} = torch.zeros_like({operand.name})")
                    body.append(f"{local} = {local} + {_p(text)}")
                    shape = broadcast(operand.shape, shape) or shape
                else:
                    body.append(f"{local} = {text}")
                acc[operand.name] = local
                acc_shape[operand.name] = shape
        returns = []
        self.return_shapes = []
        for p in self.params:
            if p.kind == "scalar" and p.name in acc:
                returns.append(acc[p.name])
            elif not p.tensors:
                returns.append("None")
            elif p.name in acc:
                returns.append(acc[p.name])
            elif p.kind == "tensors":  # no path to an output: a zero gradient
                zeros = f"[torch.zeros_like(e) for e in {p.name}]"
                returns.append(self.r.choice(["None", zeros]))
            else:  # no path to an output: a zero gradient, either spelling
                returns.append(self.r.choice(["None", f"torch.zeros_like({p.name})"]))
            self.return_shapes.append(acc_shape.get(p.name, p.shape))
        self.returns = returns
        if len(returns) == 1 and self.r.coin():
            self.bare = True
            body.append(f"return {returns[0]}")
        else:
            body.append(f"return {', '.join(returns)}{',' if len(returns) == 1 else ''}")
        return body

    def reduce(self, expr: str, operand: Value) -> str:
        """`expr` summed to the shape of parameter `operand` (a scalar has no `.shape`)."""
        if operand is self.scalar:
            return f"{_p(expr)}.sum()"
        return f"{_p(expr)}.sum_to_size({operand.name}.shape)"

    def rebind(self, body: list[str], result: str) -> tuple[list[str], str]:
        """Rename some temporaries to the name of their first operand (`t = f(t, ...)`).

        Only where the program stays right under late binding: nothing in forward reads
        the old value after the rebinding, and backward reads the old name only through
        `.shape`, which the new value shares. Some become augmented assignments (`t += b`),
        where in-place is also safe for the reference autograd: the old value is a fresh
        tensor that nothing else reads, and the op is `+`/`-`, or `*`/`/` by a non-tensor.
        """
        r = self.r
        renamed: dict[str, str] = {}
        params = {p.name for p in self.params}
        for node in self.nodes:
            if node.name is None or node.opaque or not node.operands or not (node.accumulate or r.coin(0.4)):
                continue
            first = node.operands[0]
            old = renamed.get(first.name, first.name)
            if not first.differentiable or first.shape != node.shape or old == node.name:
                continue
            new = node.name
            word_old = _word(old)
            later = "\n".join(self.lines[node.end :]) + "\n" + result
            if word_old.search(later):
                continue  # forward still reads the old value
            if re.search(rf"{_word(old).pattern}(?!\.shape)", "\n".join(body)):
                continue  # backward reads the old value
            word_new = _word(new)
            self.lines[node.start :] = [word_new.sub(old, line) for line in self.lines[node.start :]]
            body = [word_new.sub(old, line) for line in body]
            result = word_new.sub(old, result)
            renamed[new] = old
            node.name = old
            # An augmented assignment, where in-place is safe too.
            before = self.nodes[: self.nodes.index(node)]
            producer = next((n for n in reversed(before) if n.name == old), None)
            if (
                len(node.ops) == 1
                and old not in params
                and producer is not None
                and all(op.fresh for op in producer.ops)
                and (node.accumulate or r.coin(0.8))
            ):
                others = self.lines[: node.start] + self.lines[node.end :]
                reads = sum(len(word_old.findall(line)) for line in others)
                m = re.fullmatch(rf"{re.escape(old)} = {re.escape(old)} ([-+*/]) (.+)", self.lines[node.start])
                if m and reads == 1:  # its own definition only
                    operator, rest = m.groups()
                    scalar = re.fullmatch(r"-?[0-9.]+|alpha", rest) is not None
                    if operator in "+-" and not word_old.search(rest) or scalar:
                        self.lines[node.start] = f"{old} {operator}= {rest}"
        return body, result

    def unpack(self) -> None:
        """Join some consecutive independent assignments into one tuple assignment."""
        r = self.r
        simple = re.compile(r"(\w+) = (.+)")
        i = 0
        while i + 1 < len(self.lines):
            m1, m2 = simple.fullmatch(self.lines[i]), simple.fullmatch(self.lines[i + 1])
            if m1 and m2 and m1[1] != m2[1] and r.coin(0.25):
                if not _word(m1[1]).search(m2[2]):
                    self.lines[i : i + 2] = [f"{m1[1]}, {m2[1]} = {m1[2]}, {m2[2]}"]
            i += 1

    def signature(self) -> str:
        def one(p: Param) -> str:
            text = f"{p.name}: {p.annotation()}"
            if p.keyword_only and self.r.coin():
                text += {"float": " = 1.0", "bool": " = False", "int": " = -1", "scalar": " = 1.0"}.get(p.kind, "")
            return text

        positional = [one(p) for p in self.params if not p.keyword_only]
        keyword = [one(p) for p in self.params if p.keyword_only]
        return ", ".join(positional + (["*", *keyword] if keyword else []))


def build(
    r: Chooser,
    name: str,
    n_tensors: int,
    has_alpha: bool,
    has_flag: bool,
    has_dim: bool,
    n_statements: int,
    base: Shape,
    inner: Inner | None = None,
    single_output: bool = False,
    has_list: bool = False,
    has_scalar: bool = False,
) -> tuple[str, _Builder, int]:
    """One differentiator: (its source, the builder, its number of outputs)."""
    b = _Builder(r, n_tensors, has_alpha, has_flag, has_dim, base, inner, has_list, has_scalar)
    for _ in range(n_statements):
        b.statement()
    if not b.nodes:  # every statement was a constant
        a = b.pick()
        assert a is not None
        b.add_node(unary_op(r, a, r.choice(b.unary_names), True))
    outputs = b.outputs(single_output)
    n_out = len(outputs)
    # Gradient parameters must not shadow a forward name that backward reads.
    if n_out == 1:
        grad_names = [r.choice([n for n in ["grad", "grad_out", "g", "dy"] if n not in b.used_names])]
    else:
        style = r.choice(["grad{i}", "g{i}", "grad_{i}", "dout{i}"])
        grad_names = [style.format(i=i + 1) for i in range(n_out)]
    grad_names = [
        f"{g}s" if node.listed else g for g, node in zip(grad_names, outputs, strict=True)
    ]
    body = b.backward(outputs, grad_names)

    def render(node: Node) -> str:
        return node.name if node.name is not None else node.ops[0].expr

    flat = n_out > 1 and r.coin(0.3)  # `return a, b, backward`, as PyTorch writes it
    if n_out == 1:
        result = render(outputs[0])
    elif flat:
        result = ", ".join(render(n) for n in outputs)
    else:
        result = "(" + ", ".join(render(n) for n in outputs) + ")"
    b.listed_outputs = [node.listed for node in outputs]
    body, result = b.rebind(body, result)
    b.lines = [line for line in b.lines if not re.fullmatch(r"(\w+) = \1", line)]  # `a = a`
    b.unpack()
    src = [f"def {name}({b.signature()}):"]
    if b.helpers and r.coin(0.3):
        # The helpers defined inside forward itself, not at module level.
        for helper in sorted(b.helpers):
            src += ["    " + line for line in HELPERS[helper][0].splitlines()]
        b.helpers = set()
    src += ["    " + line for line in b.lines]
    src.append(f"    def backward({', '.join(grad_names)}):")
    src += ["        " + line for line in body]
    src.append(f"    return {result}, backward")
    return "\n".join(src) + "\n", b, n_out


@st.composite
def programs(draw: st.DrawFn) -> Program:
    """A random valid differentiator with a correct hand-written backward.

    Sometimes the module also defines a smaller differentiator that the drawn one calls
    in forward (`inner(a, b)[0]`, `u, _ = inner(a, b)`), and the helper `inner_vjp` its
    backward uses; then the program has a `module_name` to import the helper from.
    """
    n_tensors = draw(st.integers(1, 3))
    has_alpha = draw(st.booleans())
    has_flag = draw(st.booleans())
    has_dim = draw(st.booleans())
    n_statements = draw(st.integers(1, 6))
    has_list = draw(st.integers(0, 3)) == 0
    has_scalar = draw(st.integers(0, 2)) == 0
    r = Chooser(draw(st.integers(0, 2**32 - 1)))
    seed = draw(st.integers(0, 2**31 - 1))

    base = r.choice([(2, 3), (3, 4), (3, 3), (4, 2)])
    name = r.choice(["f", "op", "fused", "layer"])
    parts = ["import math", "from typing import List, Sequence", "", "import torch", "", ""]
    inner = None
    ib = None
    module_name = None
    if r.coin(0.2):
        inner_name = r.choice(["inner", "cell", "block"])
        text, ib, _ = build(
            r, inner_name, r.int(1, 2), r.coin(), r.coin(), r.coin(0.3), r.int(1, 3), base,
            single_output=True,
        )
        inner = Inner(
            inner_name, ib.params, ib.nodes[-1].shape, ib.returns, ib.bare, ib.return_shapes
        )
        parts += [text, "", inner.helper(), ""]
    text, b, n_out = build(
        r, name, n_tensors, has_alpha, has_flag, has_dim, n_statements, base, inner,
        has_list=has_list, has_scalar=has_scalar,
    )
    parts.append(text)
    source = "\n".join(parts)
    helpers = sorted(b.helpers | (ib.helpers if inner is not None else set()))
    if helpers:
        source = source.replace("\n\n\n", "\n\n\n" + "\n\n".join(HELPERS[h][0] for h in helpers) + "\n\n", 1)
    aliased = r.coin(0.25)
    if aliased:
        # Module-level aliases, as PyTorch's own decompositions write them.
        source = source.replace("torch.nn.functional.", "F.").replace("torch.ops.aten.", "aten.")
        source = source.replace(
            "import torch\n", "import torch\n\nF = torch.nn.functional\naten = torch.ops.aten\n", 1
        )
    if inner is not None or helpers or aliased:
        digest = hashlib.sha1(source.encode()).hexdigest()[:16]
        module_name = f"s2sgrad_hypothesis_{digest}"
    loss_outputs = [i for i in range(n_out) if r.coin(0.7)] or [r.int(0, n_out - 1)]
    return Program(
        name, source, b.params, n_out, seed, loss_outputs, module_name, b.listed_outputs
    )
