"""Closures an outside probe wrote across the torch API (201 rules, about 2,000
checks), and what it found in s2sgrad's derivative rules: each case converts and
matches torch.autograd through the closure's own forward at orders 1 to 3, pure and
mixed, in float64 (tests/oracle.py).

Why the tests missed them: each rule was checked on examples where its operands kept
their shapes and dtypes and held no special values. A cast to an integer dtype
passed the truncated gradient on (orders 2-3 wrong); a `masked_fill` mask that
broadcasts its input was taken to keep the input's shape, and its gradient was not
reduced (a crash at call time); `x ** 0` differentiated to `0 * x ** -1`, nan at 0;
a Python base of 0 raised math's ValueError in a double backward.
"""

from __future__ import annotations

import pytest
import torch
from oracle import assert_same, derivatives, import_pair, leaves

F64 = torch.float64


def _r(*shape, seed=0):
    return torch.randn(shape, dtype=F64, generator=torch.Generator().manual_seed(seed))


def _check(closures, generated, values, rest=()):
    def ref(*t):
        return closures.f(*t, *rest)[0]

    def got(*t):
        return generated.f(*t, *rest)

    assert_same(derivatives(got, leaves(values)), derivatives(ref, leaves(values)))


CAST = """import torch


def f(x: torch.Tensor, w: torch.Tensor):
    k = x.to(torch.int64)
    kf = k.to(x.dtype)
    t = (x - kf) * w
    def backward(g):
        return g * w, g * (x - kf)
    return t * 1.0, backward
"""

CASTS = {
    "to_int64": CAST,
    "to_bool": CAST.replace("torch.int64", "torch.bool"),
    "to_int64_times_one": CAST.replace("kf = k.to(x.dtype)", "kf = k * 1.0"),
    "type_as_int": CAST.replace(
        "k = x.to(torch.int64)\n    kf = k.to(x.dtype)",
        "k = x.type_as(torch.tensor([1]))\n    kf = k.type_as(x)",
    ),
    "view_as_int64": CAST.replace(
        "k = x.to(torch.int64)\n    kf = k.to(x.dtype)",
        "k = x.view(torch.int64)\n    kf = k.view(torch.float64)",
    ),
}


@pytest.mark.parametrize("case", sorted(CASTS))
def test_a_cast_to_an_integer_dtype_passes_no_gradient(tmp_path, case):
    """`w` broadcast, its gradient returned unreduced; the temporary `t` is promoted
    and its gradient goes back through the casts."""
    closures, generated = import_pair(tmp_path, CASTS[case], f"cast_{case}")
    _check(closures, generated, [_r(3, 4) * 3, _r(4, seed=1)])


MASKED = """import torch


def f(x: torch.Tensor, w: torch.Tensor, m: torch.Tensor):
    mf = x.masked_fill(m, 0.0)
    def backward(g):
        d = 2 * g * mf * (~m).to(g.dtype)
        return (d * w).sum(0), g * mf * mf, None
    return mf * mf * w, backward
"""


def test_a_masked_fill_whose_mask_broadcasts_its_input(tmp_path):
    """x (4,) filled under a (3, 4) mask is (3, 4): x's gradient is reduced, in
    reverse mode and in forward mode (`jacfwd`)."""
    closures, generated = import_pair(tmp_path, MASKED, "masked")
    m = torch.rand(3, 4, generator=torch.Generator().manual_seed(2)) > 0.5
    _check(closures, generated, [_r(4), _r(4, seed=1)], rest=(m,))
    w = _r(4, seed=1)
    jac = torch.func.jacfwd(lambda a: generated.f(a, w, m))(_r(4))
    ref = torch.func.jacrev(lambda a: closures.f(a, w, m)[0])(_r(4))
    torch.testing.assert_close(jac, ref)


POWER = """import torch


def f(x: torch.Tensor, w: torch.Tensor, k: int):
    p = torch.pow(x, k)
    q = p * x
    def backward(g):
        d = (k + 1) * x ** k
        return g * w * d, g * q, None
    return q * w, backward
"""


@pytest.mark.parametrize("k", [0, 1, 3])
def test_a_power_of_zero_where_the_base_is_zero(tmp_path, k):
    """PyTorch's derivative of x ** 0 is 0 (not `0 * x ** -1`, nan at x == 0)."""
    closures, generated = import_pair(tmp_path, POWER, f"power_{k}")
    x = _r(3, 4)
    x.view(-1)[::3] = 0.0
    _check(closures, generated, [x, _r(4, seed=1)], rest=(k,))


BASE = """import math
import torch


def f(x: torch.Tensor, w: torch.Tensor, base: float):
    s = base ** x
    t = s * w
    def backward(g):
        ds = s * math.log(base) if base > 0 else torch.zeros_like(s)
        return g * w * ds, g * s, None
    return t * 1.0, backward
"""


def test_a_python_base_of_zero_gives_numbers_at_every_order(tmp_path):
    """0.0 ** x for x > 0 is 0 whatever x: every derivative in x is 0. The rule took
    math.log(0) (a ValueError in the double backward); torch's own double backward
    gives nan there, so the orders past the first are compared with 0."""
    closures, generated = import_pair(tmp_path, BASE, "zero_base")
    values = [_r(3, 4).abs() + 0.5, _r(4, seed=1)]
    got = derivatives(lambda *t: generated.f(*t, 0.0), leaves(values))
    ref = derivatives(lambda *t: closures.f(*t, 0.0)[0], leaves(values))
    torch.testing.assert_close(got.outputs, ref.outputs)
    torch.testing.assert_close(got.pure[0], ref.pure[0])
    for gradients in [*got.pure[1:], *got.mixed]:
        torch.testing.assert_close(gradients[0], torch.zeros(3, 4, dtype=F64))
    positive = derivatives(lambda *t: generated.f(*t, 2.0), leaves(values))
    expected = derivatives(lambda *t: closures.f(*t, 2.0)[0], leaves(values))
    assert_same(positive, expected)
