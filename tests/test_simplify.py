"""Each rewrite of the simplifier on its own, as before/after pairs (as black tests its
transforms), then the shape facts and the sliced closure end to end.

The random programs (tests/test_random_programs.py) check the same rewrites at orders
1-3 on code nobody wrote by hand.
"""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest
import torch

from s2sgrad import transform
from s2sgrad.autodiff.simplify import (
    first_contributions,
    fold,
    forward_copies,
    merge_repeats,
    simplify,
)
from s2sgrad.codegen.slicing import slice_closure
from s2sgrad.cst import module


def _body(code: str) -> list[cst.BaseStatement]:
    return list(cst.parse_module(textwrap.dedent(code).lstrip()).body)


def _code(body: list[cst.BaseStatement]) -> str:
    return module(body).code if body else ""


FOLD = [
    ("arithmetic on literals", "y = x ** (3 - 1)\n", "y = x ** 2\n"),
    ("a power of one", "y = 2 * x ** (1)\n", "y = 2 * x\n"),
    ("a power of one, bare", "y = x ** 1\n", "y = x\n"),
    ("a negative result keeps its parentheses", "y = a - (1 - 3)\n", "y = a - (-2)\n"),
    ("a double negation", "y = --g\n", "y = g\n"),
    ("a float power is no integer one", "y = x ** 1.0\n", "y = x ** 1.0\n"),
    ("an or settled by True", "y = a if d is None or True else b\n", "y = a\n"),
    ("an and settled by False", "y = a if d and False else b\n", "y = b\n"),
    ("a comparison of literals", "y = a if 1 == 1 else b\n", "y = a\n"),
    ("an unsettled test stays", "y = a if d else b\n", "y = a if d else b\n"),
    (
        "a settled if keeps the branch taken",
        """\
        if dim is None or True:
            g = a
        else:
            g = b
        """,
        "g = a\n",
    ),
    (
        "a settled false if without else goes",
        """\
        if not True:
            g = a
        """,
        "",
    ),
    (
        "a settled false if takes its elif",
        """\
        if False:
            g = a
        elif d:
            g = b
        """,
        "if d:\n    g = b\n",
    ),
]


@pytest.mark.parametrize(
    ("before", "after"), [p[1:] for p in FOLD], ids=[p[0] for p in FOLD]
)
def test_fold(before, after):
    (statement,) = _body(before)
    assert _code(fold(statement)) == textwrap.dedent(after)


FIRST = [
    (
        "the first contribution to a None accumulator is an assignment",
        """\
        grad_x = _accumulate(grad_x, g * 2)
        grad_x = _accumulate(grad_x, g * 3)
        """,
        {"grad_x"},
        """\
        grad_x = g * 2
        grad_x = _accumulate(grad_x, g * 3)
        """,
    ),
    (
        "an accumulator not known to be None is left alone",
        "grad_x = _accumulate(grad_x, g)\n",
        set(),
        "grad_x = _accumulate(grad_x, g)\n",
    ),
    (
        "inside a block it is replaced, after the block it may be set",
        """\
        if grad_t is not None:
            grad_x = _accumulate(grad_x, grad_t)
        grad_x = _accumulate(grad_x, g)
        """,
        {"grad_x"},
        """\
        if grad_t is not None:
            grad_x = grad_t
        grad_x = _accumulate(grad_x, g)
        """,
    ),
    (
        "an assignment in between ends what is known",
        """\
        grad_x = h
        grad_x = _accumulate(grad_x, g)
        """,
        {"grad_x"},
        """\
        grad_x = h
        grad_x = _accumulate(grad_x, g)
        """,
    ),
]


@pytest.mark.parametrize(
    ("before", "none", "after"), [p[1:] for p in FIRST], ids=[p[0] for p in FIRST]
)
def test_first_contributions(before, none, after):
    assert _code(first_contributions(_body(before), set(none))) == textwrap.dedent(
        after
    )


REPEATS = [
    (
        "the same contribution twice in a row is doubled",
        """\
        grad_x = _accumulate(grad_x, grad_mul * x)
        grad_x = _accumulate(grad_x, grad_mul * x)
        """,
        "grad_x = _accumulate(grad_x, 2.0 * (grad_mul * x))\n",
    ),
    (
        "an atom is doubled without parentheses",
        """\
        grad_x = _accumulate(grad_x, grad_t)
        grad_x = _accumulate(grad_x, grad_t)
        """,
        "grad_x = _accumulate(grad_x, 2.0 * grad_t)\n",
    ),
    (
        "different contributions stay",
        """\
        grad_x = _accumulate(grad_x, g * a)
        grad_x = _accumulate(grad_x, g * b)
        """,
        """\
        grad_x = _accumulate(grad_x, g * a)
        grad_x = _accumulate(grad_x, g * b)
        """,
    ),
    (
        "a contribution that reads its accumulator sees the first: not merged",
        """\
        grad_x = _accumulate(grad_x, grad_x * 2)
        grad_x = _accumulate(grad_x, grad_x * 2)
        """,
        """\
        grad_x = _accumulate(grad_x, grad_x * 2)
        grad_x = _accumulate(grad_x, grad_x * 2)
        """,
    ),
    (
        "into different accumulators: not merged",
        """\
        grad_x = _accumulate(grad_x, g)
        grad_y = _accumulate(grad_y, g)
        """,
        """\
        grad_x = _accumulate(grad_x, g)
        grad_y = _accumulate(grad_y, g)
        """,
    ),
]


@pytest.mark.parametrize(
    ("before", "after"), [p[1:] for p in REPEATS], ids=[p[0] for p in REPEATS]
)
def test_merge_repeats(before, after):
    assert _code(merge_repeats(_body(before))) == textwrap.dedent(after)


COPIES = [
    (
        "a temporary that only carries a value is dropped",
        """\
        grad_tanh = g * (1.0 - a * a)
        grad_h = grad_tanh
        """,
        (),
        "grad_h = g * (1.0 - a * a)\n",
    ),
    (
        "a temporary read again stays",
        """\
        grad_tanh = g * (1.0 - a * a)
        grad_h = grad_tanh
        grad_x = grad_tanh * 2
        """,
        (),
        """\
        grad_tanh = g * (1.0 - a * a)
        grad_h = grad_tanh
        grad_x = grad_tanh * 2
        """,
    ),
    (
        "a temporary that only carries a contribution is dropped",
        """\
        grad_x = grad_mean * 2 * x
        gx = _accumulate(gx, grad_x)
        """,
        (),
        "gx = _accumulate(gx, grad_mean * 2 * x)\n",
    ),
    (
        "a contribution's temporary read again stays",
        """\
        grad_x = grad_mean * 2 * x
        gx = _accumulate(gx, grad_x)
        gw = grad_x * 2
        """,
        (),
        """\
        grad_x = grad_mean * 2 * x
        gx = _accumulate(gx, grad_x)
        gw = grad_x * 2
        """,
    ),
    (
        "a name read after the blocks (a result) stays",
        """\
        grad_b = g * 2
        grad_a = grad_b
        """,
        ("grad_b",),
        """\
        grad_b = g * 2
        grad_a = grad_b
        """,
    ),
]


@pytest.mark.parametrize(
    ("before", "keep", "after"), [p[1:] for p in COPIES], ids=[p[0] for p in COPIES]
)
def test_forward_copies(before, keep, after):
    assert _code(forward_copies(_body(before), keep)) == textwrap.dedent(after)


def test_simplify_applies_every_rewrite_in_order():
    before = """\
    if grad_t is not None:
        grad_x = _accumulate(grad_x, grad_t * x ** (2 - 1))
        grad_x = _accumulate(grad_x, grad_t * x ** (2 - 1))
    """
    after = """\
    if grad_t is not None:
        grad_x = 2.0 * (grad_t * x)
    """
    assert _code(simplify(_body(before), {"grad_x"})) == textwrap.dedent(after)


# -- shape facts and slicing, end to end -----------------------------------------------

POINTWISE = """
import torch


def f(x: torch.Tensor, w: torch.Tensor):
    t = torch.tanh(x * 2.0 + 1)
    u = t * w
    def backward(g):
        return g * w * 2.0 * (1 - t * t), (g * t).sum_to_size(w.shape)
    return u, backward
"""


def _load(text: str) -> dict[str, object]:
    namespace: dict[str, object] = {}
    exec(compile(text, "<generated>", "exec"), namespace)  # noqa: S102
    return namespace


def test_elementwise_with_python_numbers_needs_no_sum_to_size():
    """t's gradient goes back to x through `x * 2.0 + 1` with no reduction (the shapes
    are x's), while `t * w` broadcasts and keeps its own."""
    text = transform(POINTWISE, "t.py")
    promoted = text.split("if grad_t is not None:", 1)[1].split("return", 1)[0]
    assert "sum_to_size" not in promoted, promoted
    op = _load(text)["f"]
    x = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(op, (x, w))
    assert torch.autograd.gradgradcheck(op, (x, w))


SHAPE_OFF_SAVED = """
import torch


def f(x: torch.Tensor, w: torch.Tensor):
    r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    y = x * r * w
    def backward(g):
        n = x.shape[-1]
        gx = r * (g * w - x * r * (g * w * x * r).sum(-1, keepdim=True) / n)
        return gx, (g * x * r).reshape(-1, n).sum(0)
    return y, backward
"""


def test_a_shape_is_read_off_a_saved_tensor_not_carried_beside_it():
    text = transform(SHAPE_OFF_SAVED, "t.py")
    forward = text.split("def f_forward", 1)[1].split("def f_backward", 1)[0]
    assert ".shape" not in forward.split("return", 1)[1], forward
    assert "n = x.shape[-1]" in text
    op = _load(text)["f"]
    x = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(op, (x, w))
    assert torch.autograd.gradgradcheck(op, (x, w))


def test_slices_are_conditional_expressions_where_they_fit():
    closure = _body("""\
        h = g * 2
        return h * a, h * b + "a long expression that does not fit on the line" * 3
        """)
    sliced = slice_closure(closure, ["grad_a", "grad_b"], ["need_a", "need_b"], 60)
    assert sliced is not None
    assert _code(sliced.statements) == textwrap.dedent("""\
        h = g * 2
        grad_a = h * a if need_a else None
        if need_b:
            grad_b = h * b + "a long expression that does not fit on the line" * 3
        """)
    assert sliced.assigned == {"grad_a"}


def test_slicing_keeps_a_read_before_the_rebinding_it_precedes():
    """`gy = grad` then `grad = grad * t`: slicing per gradient would run x's slice
    first and hand y the rebound gradient; such a closure stays as written."""
    closure = _body("""\
        gy = grad
        grad = grad * t
        return grad, gy
        """)
    assert slice_closure(closure, ["grad_x", "gy"], ["need_x", "need_y"]) is None
    independent = _body("""\
        gy = grad
        gx = grad * t
        return gx, gy
        """)
    assert slice_closure(independent, ["gx", "gy"], ["need_x", "need_y"]) is not None
