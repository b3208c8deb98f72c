"""Closures written by an outside tester against torch's operations and indexing, and
what they found.

Each case converts and matches torch.autograd through the closure's own forward at
orders 1 to 3, pure and mixed, in float64 (tests/oracle.py). What they found: a
tensor operand passed by keyword (`torch.add(w, other=x)`, `clamp(min=x)`,
`pow(exponent=x)`, `masked_fill(mask=m)`, `where(c, input=x, other=w)`) was left out
of the op's broadcast shape, so the VJP of a promoted temporary dropped the reduction
of the smaller operand's gradient: from order 2 on a crash (`size [3, 4] is not
expandable to size [4]`), or, where a transpose came between, silently wrong numbers.
"""

from __future__ import annotations

import pytest
import torch
from oracle import assert_same, derivatives, import_pair, leaves

F64 = torch.float64
HEAD = "import torch\n\n\n"


def _r(*shape, seed=0, low=None):
    gen = torch.Generator().manual_seed(seed)
    values = torch.randn(*shape, generator=gen, dtype=F64) * 0.5
    return values.abs() + low if low is not None else values + 0.1


def _check(closures, generated, values):
    expected = derivatives(lambda *t: closures.f(*t)[0], leaves(values))
    assert_same(derivatives(generated.f, leaves(values)), expected)


#: h = op(w, <keyword>=x) for x (3, 4) and w (4,); backward reads e = exp(h), and
#: returns w's gradient reduced, as most closures do: {name: (h, grad x, grad w)},
#: in terms of ge, the gradient of h.
KEYWORD_OPERANDS = {
    "add_other": ("torch.add(w, other=x)", "ge", "ge.sum(0)"),
    "method_add_other": ("w.add(other=x)", "ge", "ge.sum(0)"),
    "sub_other": ("torch.sub(w, other=x)", "-ge", "ge.sum(0)"),
    "mul_other": ("torch.mul(w, other=x)", "ge * w", "(ge * x).sum(0)"),
    "div_other": ("torch.div(w, other=x)", "-ge * w / (x * x)", "(ge / x).sum(0)"),
    "pow_exponent": (
        "torch.pow(w, exponent=x)",
        "ge * h * torch.log(w)",
        "(ge * x * w ** (x - 1)).sum(0)",
    ),
    "clamp_min": (
        "torch.clamp(w, min=x)",
        "torch.where(w >= x, 0.0, ge)",
        "torch.where(w >= x, ge, 0.0).sum(0)",
    ),
    "method_clamp_max": (
        "w.clamp(max=x)",
        "torch.where(w <= x, 0.0, ge)",
        "torch.where(w <= x, ge, 0.0).sum(0)",
    ),
    "maximum_other": (
        "torch.maximum(w, other=x)",
        "torch.where(w > x, 0.0, ge)",
        "torch.where(w > x, ge, 0.0).sum(0)",
    ),
    "masked_fill_mask": (
        "w.masked_fill(mask=x > 0.3, value=0.0) + x",
        "ge",
        "torch.where(x > 0.3, 0.0, ge).sum(0)",
    ),
    "where_input_other": (
        "torch.where(x > 0.3, input=x, other=w)",
        "torch.where(x > 0.3, ge, 0.0)",
        "torch.where(x > 0.3, 0.0, ge).sum(0)",
    ),
}


def _keyword_source(h: str, gx: str, gw: str) -> str:
    return f"""
def f(x, w):
    h = {h}
    e = torch.exp(h)
    def backward(g):
        ge = 2.0 * g * e
        return {gx}, {gw}
    return e * 2.0, backward
"""


@pytest.mark.parametrize("case", sorted(KEYWORD_OPERANDS))
def test_a_tensor_passed_by_keyword_broadcasts(tmp_path, case):
    source = HEAD + _keyword_source(*KEYWORD_OPERANDS[case])
    closures, generated = import_pair(tmp_path, source, f"kw_{case}")
    _check(closures, generated, [_r(3, 4), _r(4, seed=1, low=0.5)])


TRANSPOSED = """
def f(x, w):
    a = w.transpose(0, 1)
    h = torch.add(a, other=x)
    e = torch.exp(h)
    def backward(g):
        ge = 2 * g * e
        return ge, ge.transpose(1, 2)
    return e * 2.0, backward
"""


def test_an_unreduced_gradient_through_a_transpose_by_keyword(tmp_path):
    """w's gradient is returned unreduced, (4, 4, 4) for (4, 4): autograd sums it. The
    VJP of `h` must sum `x`'s extra dim before the transpose, not after."""
    closures, generated = import_pair(tmp_path, HEAD + TRANSPOSED, "kw_transposed")
    _check(closures, generated, [_r(4, 4, 4), _r(4, 4, seed=1)])


# -- generated code that mypy --strict refused ------------------------------------------

TYPED = """
def permuted(x, w):
    h = (x * w).reshape(3, 2, 2).permute(2, 0, 1)
    e = torch.exp(h)
    def backward(g):
        ge = (g * e).permute(1, 2, 0).reshape(3, 4)
        return ge * w, ge * x
    return e, backward


def permuted_tuple(x, w):
    h = torch.permute((x * w).reshape(3, 2, 2), (2, 0, 1))
    e = torch.exp(h)
    def backward(g):
        ge = (g * e).permute(1, 2, 0).reshape(3, 4)
        return ge * w, ge * x
    return e, backward


def joined(x, w):
    a = x * w
    c = torch.cat([a, x], dim=-1)
    def backward(g):
        ge = g * 2.0 * c
        ga, gx = torch.split(ge, [4, 4], dim=-1)
        return ga * w + gx, ga * x
    return c * c, backward


def summed(x, w):
    s = (x * w).sum(1, dtype=torch.float64)
    def backward(g):
        gh = (2 * g * s)[:, None]
        return gh * w, gh * x
    return s * s, backward
"""


def test_rules_and_unknown_outputs_give_code_mypy_accepts(tmp_path):
    """A literal permutation folds (`len((2, 0, 1)) == 1` was written out, and mypy
    cannot iterate its `int | tuple`); cat's VJP splits with the typed `torch.split`;
    the one gradient of an output of unknown kind is a `Tensor` (the Function returns
    early where it is None), not `Grad`."""
    from oracle import mypy_strict

    from s2sgrad import transform

    text = transform(HEAD + TYPED, "typed_ops.py", "typed_ops")
    assert "len((2, 0, 1))" not in text
    assert mypy_strict(tmp_path, "typed_ops_grad.py", text) == ""
    closures, generated = import_pair(tmp_path, HEAD + TYPED, "typed_ops")
    for name in ("permuted", "permuted_tuple", "joined", "summed"):
        expected = derivatives(
            lambda *t, n=name: getattr(closures, n)(*t)[0],
            leaves([_r(3, 4), _r(4, seed=1)]),
        )
        got = derivatives(getattr(generated, name), leaves([_r(3, 4), _r(4, seed=1)]))
        assert_same(got, expected)


# -- torch.nn.functional names torch's schemas do not give under their own name ---------

UNNAMED = {
    # F.logsigmoid is the builtin torch._C._nn.log_sigmoid; the others are Python
    # functions of one tensor without a return annotation.
    "logsigmoid": "torch.sigmoid(-u)",
    "softsign": "1.0 / (1.0 + u.abs()) ** 2",
    "tanhshrink": "torch.tanh(u) ** 2",
    "sigmoid": "torch.sigmoid(u) * (1.0 - torch.sigmoid(u))",
    "tanh": "1.0 - torch.tanh(u) ** 2",
}


@pytest.mark.parametrize("name", sorted(UNNAMED))
def test_functional_names_without_their_own_schema_convert(tmp_path, name):
    """Refused before as an output of unknown kind (S2S124 on `h * h`)."""
    source = f"""import torch
import torch.nn.functional as F


def f(x, w):
    u = x * w
    h = F.{name}(u)
    def backward(g):
        gu = 2.0 * g * h * ({UNNAMED[name]})
        return gu * w, gu * x
    return h * h, backward
"""
    closures, generated = import_pair(tmp_path, source, f"fn_{name}")
    _check(closures, generated, [_r(3, 4), _r(4, seed=1)])


# -- the same op under another spelling -------------------------------------------------

BARE_VAR = """import torch
from torch import var


def f(x, w):
    u = x * w
    v = var(u, 1, True, False)
    k = u.detach()
    m = k.sum(1, keepdim=True)
    e = torch.exp(k * v)
    def backward(g):
        gv = (g * e * m * k).sum(0)
        uu = x * w
        gu = gv[:, None] * 2.0 * (uu - uu.mean(1, keepdim=True)) / 3
        return gu * w, gu * x
    return e * m, backward
"""


def test_var_imported_by_name_keeps_its_positional_keepdim(tmp_path):
    """`var(u, 1, True, False)`: its third argument is `unbiased`, not `keepdim`, as
    for `torch.var`; the bare name was read with sum's positions, so `v` took `m`'s
    shape (order 2 wrong, order 3 a crash)."""
    closures, generated = import_pair(tmp_path, BARE_VAR, "bare_var")
    _check(closures, generated, [_r(4, 4), _r(4, seed=1)])


BUILTIN_POW = """import torch


def f(x, w):
    u = x * w
    h = pow(u, 2)
    def backward(g):
        gu = 4.0 * g * h * u
        return gu * w, gu * x
    return h * h, backward
"""


def test_builtin_pow_of_a_tensor_is_a_tensor(tmp_path):
    """Refused before: the output `h * h` was of unknown kind (S2S124)."""
    closures, generated = import_pair(tmp_path, BUILTIN_POW, "builtin_pow")
    _check(closures, generated, [_r(3, 4), _r(4, seed=1)])


SPREAD_AND_CAST = {
    # u.type(dtype) casts as .to does; the table gave the no-argument form's str.
    "type_cast": ("t = (x * w).type(torch.float64)", "t"),
    "stack_spread": ("t = torch.stack([*(x * w)])", "t"),
    "cat_spread": ("t = torch.cat([*(x * w).split(2, dim=1)], dim=1)", "t"),
    "stack_spread_unbind": ("t = torch.stack([*(x * w).unbind(-1)], -1)", "t"),
    "stack_repeated_list": ("t = x * torch.stack([w] * 4)", "t"),
    "cat_repeated_tuple": ("t = x * torch.cat((w[None],) * 4, 0)", "t"),
}


@pytest.mark.parametrize("case", sorted(SPREAD_AND_CAST))
def test_spread_repeated_and_cast_operands(tmp_path, case):
    """`[*u]` in stack/cat was bound as one operand (wrong order 2, crashes, an
    internal error); `[w] * 4` went through tensor multiplication (a crash);
    `u.type(torch.float64)` cut the gradient (wrong order 2)."""
    line, _ = SPREAD_AND_CAST[case]
    source = f"""import torch


def f(x, w):
    {line}
    s = torch.exp(t)
    def backward(g):
        gt = 2.0 * g * s
        return {_grads(case)}
    return 2.0 * s, backward
"""
    closures, generated = import_pair(tmp_path, source, f"sp_{case}")
    _check(closures, generated, [_r(4, 4), _r(4, seed=1)])


def _grads(case: str) -> str:
    if case in ("stack_repeated_list", "cat_repeated_tuple"):
        return "gt * w, (gt * x).sum(0)"
    return "gt * w, gt * x"
