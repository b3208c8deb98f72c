"""Temporaries bound in the branches of an `if` are saved and promoted (issue 24, point 3).

What broke: a temporary whose computation went through an `if` that bound values
backward's VJP reads (`mask` under `if causal:`, a value rebound inside a branch) was
recomputed in backward, and `s2sgrad review` gave a reason that was not true ("backward
would read `mask` where a branch of forward rebinds it": backward never reads `mask`,
the VJP of `masked_fill` does). Now forward keeps each such value where the branch
computes it (None on the other paths) and the VJP, an `if` on the same test, reads it
there. Each case is checked on the text (saved and promoted, nothing recomputed) and
against torch.autograd through the closure's own forward at orders 1 to 3, pure and
mixed (tests/oracle.py), in float64, with a parameter broadcast against the batch.
"""

from __future__ import annotations

import re
import sys
from typing import Any

import libcst as cst
import pytest
import torch
from oracle import (
    assert_same,
    closure_and_op,
    derivatives,
    function,
    import_pair,
    leaves,
    mypy_strict,
)

from s2sgrad import transform
from s2sgrad.autodiff.simplify import first_contributions
from s2sgrad.diagnostics import TransformError
from s2sgrad.header import Origin
from s2sgrad.options import Options
from s2sgrad.review.model import review

F64 = torch.float64

SOURCE = """
import torch


def attention(q, k, v, causal: bool = False):
    scores = q @ k.transpose(-2, -1)
    if causal:
        mask = torch.ones(scores.shape[-2], scores.shape[-1], dtype=torch.bool).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
    p = torch.softmax(scores, dim=-1)
    def backward(g):
        gp = g @ v.transpose(-2, -1)
        gs = p * (gp - (gp * p).sum(-1, keepdim=True))
        return gs @ k, gs.transpose(-2, -1) @ q, p.transpose(-2, -1) @ g, None
    return p @ v, backward


def gated(x, w, gate: bool = True):
    h = x * w
    if gate:
        s = torch.sigmoid(h)
        h = s * h
    y = torch.tanh(h)
    def backward(g):
        gh = g * (1 - torch.tanh(h) ** 2)
        if gate:
            gh = gh * (s + s * (1 - s) * (x * w))
        return gh * w, gh * x, None
    return y, backward


def nested(x, w, p: bool, q: bool):
    h = x * w
    if p:
        t = h.exp()
        if q:
            t = t.sin()
        h = t * h
    y = h * h
    def backward(g):
        gh = 2 * g * h
        if p:
            h0 = x * w
            e = h0.exp()
            dt = e.cos() * e if q else e
            gh = gh * (dt * h0 + t)
        return gh * w, gh * x, None, None
    return y, backward


def rank_gate(x, w):
    h = x * w
    if x.dim() > 2:
        s = torch.sigmoid(h)
        h = s * s
    y = h.exp()
    def backward(g):
        gh = g * y
        if x.dim() > 2:
            gh = gh * 2 * s * s * (1 - s)
        return gh * w, gh * x
    return y * 1.0, backward


def activation(x, w, kind: str = "tanh"):
    h = x * w
    if kind == "tanh":
        a = torch.tanh(h)
        d = 1 - a * a
        a = 2.0 * a
        d = 2.0 * d
    elif kind == "sigmoid":
        a = torch.sigmoid(h)
        d = a * (1 - a)
    else:
        a = h * 0.5
        d = torch.full_like(h, 0.5)
    y = a * a
    def backward(g):
        gh = 2 * g * a * d
        return gh * w, gh * x, None
    return y, backward


def signed(x, w):
    h = x * w
    if h.sum() > 0:
        h = torch.tanh(h)
    y = h * h
    def backward(g):
        gh = 2 * g * h
        if (x * w).sum() > 0:
            gh = gh * (1 - h * h)
        return gh * w, gh * x
    return y, backward


def coin(x, p: float = 0.5):
    h = x.exp()
    if torch.rand(()) < p:
        h = h * 2.0
    def backward(g):
        return g * h, None
    return h * 1.0, backward
"""

#: name -> (function, tensors (one set per row of cases), the other arguments).
CASES: dict[str, tuple[str, tuple[tuple[int, ...], ...], tuple[Any, ...]]] = {
    # k and v shared by every batch row: their gradients come back unreduced.
    "attention_causal": ("attention", ((2, 4, 3), (5, 3), (5, 6)), (True,)),
    "attention_full": ("attention", ((2, 4, 3), (5, 3), (5, 6)), (False,)),
    "gated_on": ("gated", ((2, 3), (3,)), (True,)),
    "gated_off": ("gated", ((2, 3), (3,)), (False,)),
    "nested_both": ("nested", ((2, 3), (3,)), (True, True)),
    "nested_outer_only": ("nested", ((2, 3), (3,)), (True, False)),
    "nested_inner_only": ("nested", ((2, 3), (3,)), (False, True)),
    "nested_neither": ("nested", ((2, 3), (3,)), (False, False)),
    "rank_gate_3d": ("rank_gate", ((2, 3, 4), (4,)), ()),
    "rank_gate_2d": ("rank_gate", ((3, 4), (4,)), ()),
    "elif_tanh": ("activation", ((2, 3), (3,)), ("tanh",)),
    "elif_sigmoid": ("activation", ((2, 3), (3,)), ("sigmoid",)),
    "elif_else": ("activation", ((2, 3), (3,)), ("linear",)),
}


@pytest.fixture(scope="module")
def text() -> str:
    return transform(SOURCE, "branches.py")


@pytest.fixture(scope="module")
def modules(text: str) -> tuple[dict[str, Any], dict[str, Any]]:
    return closure_and_op(SOURCE, text, "branches")


def inputs(shapes: tuple[tuple[int, ...], ...], seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, dtype=F64, generator=gen) for shape in shapes]


def test_nothing_is_recomputed(text):
    """Every temporary of every case is saved; none is recomputed in backward."""
    assert "Recomputed" not in text
    assert "_recompute" not in text


@pytest.mark.parametrize(
    ("name", "promoted"),
    [
        ("attention", ["p"]),
        ("gated", ["h", "s"]),
        ("nested", ["h", "t"]),
        ("rank_gate", ["y", "s"]),
        ("activation", ["a", "d"]),
        ("signed", ["h"]),
        ("coin", ["h"]),
    ],
)
def test_temporaries_through_a_branch_are_promoted(text, name, promoted):
    """The captured temporaries are extra outputs whose gradients backward takes."""
    backward = function(text, f"{name}_backward")
    signature = backward[: backward.index('"""')]
    for temp in promoted:
        assert f"grad_{temp}: Grad = None" in signature, (temp, backward)


def test_attention_keeps_the_mask_where_the_branch_binds_it(text):
    """The issue's example: `p` is saved, `mask` is None where `causal` is False,
    and backward sends the gradient through `masked_fill` under the same test."""
    forward = function(text, "attention_forward")
    assert "    mask = None  # unless a branch below binds it" in forward
    assert forward.index("mask = None") < forward.index("if causal:")
    backward = function(text, "attention_backward")
    assert "if causal:" in backward
    assert "masked_fill((~mask), 0.0)" in backward
    code = [line.split("#")[0] for line in backward.splitlines()]
    assert not any("q @ k" in line for line in code)  # its VJP reads q and k
    assert not any("softmax" in line for line in code)  # `p` is saved


def test_a_value_rebound_in_its_branch_is_snapshotted_inside_it(text):
    """`a = torch.tanh(h)`, then `a = 2.0 * a`, in the `tanh` branch: the tanh's value
    is taken right after it, in that branch, and is None on the other paths."""
    forward = function(text, "activation_forward")
    lines = [line.strip() for line in forward.splitlines()]
    default = next(i for i, line in enumerate(lines) if line.startswith("a_0 = None"))
    taken = lines.index("a_0 = a  # read by the generated VJP")
    assert default < lines.index('if kind == "tanh":') < taken
    assert lines[taken - 1] == "a = torch.tanh(h)"


def test_a_test_that_backward_cannot_evaluate_again_is_kept_from_forward(text):
    """`h.sum() > 0` is forward's truth, kept (`bool(...)`): backward neither keeps
    the pre-branch tensor for it nor sums again; a draw is not drawn again."""
    forward = function(text, "signed_forward")
    assert "cond = bool(h.sum() > 0)" in forward and "if cond:" in forward
    assert "if cond:" in function(text, "signed_backward")
    forward = function(text, "coin_forward")
    assert "cond = bool(torch.rand(()) < p)" in forward
    assert "rand" not in function(text, "coin_backward")
    # A parameter, a value without tensor and metadata are evaluated again.
    assert "if causal:" in function(text, "attention_backward")
    assert "if x.dim() > 2:" in function(text, "rank_gate_backward")
    assert 'elif kind == "sigmoid":' in function(text, "activation_backward")


@pytest.mark.parametrize("case", sorted(CASES))
def test_op_equals_autograd_through_the_closure_at_orders_1_to_3(modules, case):
    closures, generated = modules
    name, shapes, rest = CASES[case]
    values = inputs(shapes)
    expected = derivatives(lambda *t: closures[name](*t, *rest)[0], leaves(values))
    got = derivatives(lambda *t: generated[name](*t, *rest), leaves(values))
    assert_same(got, expected, what=f"{case}: ")


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_a_test_on_forward_data_takes_the_branch_forward_took(modules, sign):
    closures, generated = modules
    x, w = inputs(((2, 3), (3,)))
    x = sign * x.abs() + sign
    w = w.abs() + 0.5
    expected = derivatives(lambda *t: closures["signed"](*t)[0], leaves([x, w]))
    got = derivatives(lambda *t: generated["signed"](*t), leaves([x, w]))
    assert_same(got, expected)


@pytest.mark.parametrize("seed", range(8))
def test_a_test_that_draws_is_not_drawn_again_in_backward(modules, seed):
    """Which branch ran decides the second order (`h` or `2 * h`); backward draws
    nothing, so it follows forward's draw whatever the random state is then."""
    closures, generated = modules
    (x,) = inputs(((3,),), seed)
    torch.manual_seed(seed)
    expected = derivatives(lambda t: closures["coin"](t)[0], leaves([x]))
    torch.manual_seed(seed)
    got = derivatives(lambda t: generated["coin"](t), leaves([x]))
    assert_same(got, expected)


@pytest.mark.parametrize("causal", [True, False])
def test_attention_passes_gradcheck_and_gradgradcheck(modules, causal):
    _, generated = modules
    values = leaves(inputs(((2, 4, 3), (5, 3), (5, 6))))

    def op(*t: torch.Tensor) -> torch.Tensor:
        return generated["attention"](*t, causal)

    assert torch.autograd.gradcheck(op, values)
    assert torch.autograd.gradgradcheck(op, values)


# -- regressions found on the way ------------------------------------------------------

SEMICOLON = """
import torch


def f(x):
    a = x.exp(); a = a.sin()
    def backward(g):
        return g * x.exp().cos() * x.exp() * x + g * a
    return a * x, backward
"""


def test_a_snapshot_lands_between_two_statements_of_one_line():
    """`a = x.exp(); a = a.sin()`: the exp's value was taken after the whole line,
    so the VJP read the sine's value for it (a wrong second order)."""
    text = transform(SEMICOLON, "semicolon.py")
    forward = function(text, "f_forward")
    assert re.search(r"a = x\.exp\(\)\n\s+a_0 = a .*\n\s+a = a\.sin\(\)", forward)
    closures: dict[str, Any] = {}
    exec(compile(SEMICOLON, "semicolon.py", "exec"), closures)
    generated: dict[str, Any] = {}
    exec(compile(text, "semicolon_grad.py", "exec"), generated)
    values = inputs(((3,),))
    expected = derivatives(lambda t: closures["f"](t)[0], leaves(values))
    assert_same(derivatives(generated["f"], leaves(values)), expected)


NESTED_MERGE = """
import torch


def nested_merge(x, p: bool, q: bool):
    t = x.exp()
    if p:
        if q:
            t = t * 2.0
        t = t.sin()
    def backward(g):
        e = x.exp()
        f = 2.0 if q else 1.0
        dt = torch.cos(f * e) * f * e if p else e
        return g * t + g * x * dt, None, None
    return t * x, backward
"""


@pytest.mark.parametrize("q", [True, False])
def test_a_merge_of_an_inner_if_is_snapshotted_inside_the_outer_branch(q):
    """The value `t` has after `if q:` (read by `t.sin()`'s VJP) was taken after the
    outer `if`, where `t` is the sine: the second order was wrong, silently."""
    text = transform(NESTED_MERGE, "nested_merge.py")
    forward = function(text, "nested_merge_forward")
    assert re.search(
        r"\n        t_\d = t  # read by the generated VJP\n        t = t\.sin", forward
    )
    closures: dict[str, Any] = {}
    exec(compile(NESTED_MERGE, "nested_merge.py", "exec"), closures)
    generated: dict[str, Any] = {}
    exec(compile(text, "nested_merge_grad.py", "exec"), generated)
    values = inputs(((3,),))
    expected = derivatives(
        lambda t: closures["nested_merge"](t, True, q)[0], leaves(values)
    )
    got = derivatives(lambda t: generated["nested_merge"](t, True, q), leaves(values))
    assert_same(got, expected)


ONE_BRANCH_CONSTANT = """
import torch


def f(x, causal: bool = False):
    if causal:
        mask = torch.ones(x.shape[-1], x.shape[-1], dtype=torch.bool).tril()
        x = x.masked_fill(~mask, 0.0)
    def backward(g):
        if causal:
            g = g.masked_fill(~mask, 0.0)
        return g, None
    return x * 1.0, backward
"""


@pytest.mark.parametrize("causal", [True, False])
def test_a_capture_bound_in_one_branch_only_is_none_on_the_other_path(causal):
    """The context `(mask, causal)` read `mask` where `causal` is False: the
    generated forward raised UnboundLocalError, though the closure never reads it."""
    text = transform(ONE_BRANCH_CONSTANT, "one_branch.py")
    generated: dict[str, Any] = {}
    exec(compile(text, "one_branch_grad.py", "exec"), generated)
    x = torch.randn(3, 3, dtype=F64, requires_grad=True)
    (grad,) = torch.autograd.grad(generated["f"](x, causal).sum(), x)
    expected = torch.ones(3, 3, dtype=F64)
    torch.testing.assert_close(grad, expected.tril() if causal else expected)


RANDOM_TEST_REPLAYED = """
import torch


def _double(t):
    return t * 2


def f(x, p: float = 0.5):
    h = x.exp()
    if torch.rand(()) < p:
        h = _double(h)
    def backward(g):
        return g * h, None
    return h * 1.0, backward
"""


def test_a_recomputation_that_would_draw_in_an_if_test_is_refused():
    """A replay of `if torch.rand(()) < p:` would take a branch of its own: S2S121,
    as for a draw in a replayed statement (only statements were searched)."""
    with pytest.raises(TransformError) as error:
        transform(RANDOM_TEST_REPLAYED, "random_test.py")
    (diagnostic,) = error.value.diagnostics
    assert diagnostic.code == "S2S121"
    assert diagnostic.line == 11


def test_first_contributions_reach_into_each_side_of_an_if():
    """`acc = _accumulate(acc, e)` is `acc = e` on each side of an `if`/`else` where
    `acc` is None on entry: the transfers of a branch's VJP read as plain copies."""
    code = (
        "if causal:\n"
        "    grad_a = _accumulate(grad_a, grad_s)\n"
        "else:\n"
        "    grad_a = _accumulate(grad_a, grad_s * 2)\n"
        "grad_a = _accumulate(grad_a, grad_t)\n"
    )
    body = list(cst.parse_module(code).body)
    out = cst.Module(first_contributions(body, {"grad_a"})).code
    assert out == (
        "if causal:\n"
        "    grad_a = grad_s\n"
        "else:\n"
        "    grad_a = grad_s * 2\n"
        "grad_a = _accumulate(grad_a, grad_t)\n"
    )


# -- review ----------------------------------------------------------------------------

NO_RULE_IN_A_BRANCH = """
import torch


def _erfcx(t):
    return torch.special.erfcx(t)


def gated_erfcx(x, w, gate: bool = True):
    h = x * w
    if gate:
        mask = h > 0
        h = _erfcx(h).masked_fill(~mask, 0.0)
    y = h * h
    def backward(g):
        return 2 * g * h * w, None, None
    return y, backward
"""


def test_review_gives_the_true_reason_for_a_value_still_recomputed():
    """The reason names the statement without a rule, not the branch or `mask`."""
    (record,) = review(
        NO_RULE_IN_A_BRANCH, Origin("ops.py", "ops"), Options(), "ops_grad.py"
    )
    (temporary,) = record.temporaries
    assert (temporary.name, temporary.how) == ("h", "recompute")
    assert temporary.why == "line 13: no derivative rule for `_erfcx(h)`"


# -- compiled ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("p", "fullgraph"), [(False, False), (False, True), (True, True)]
)
def test_compiled_op_with_a_snapshot_that_a_branch_may_not_rebind(p, fullgraph):
    """`t_0 = t` before `if p: ... t = t.sin()`: where `p` is False the snapshot is
    the very tensor of the result's `t`, and torch.compile refused the same tensor
    as two outputs of a Function ('Placeholder node not found in env'). Forward now
    hands such a snapshot on as a view of itself. (torch.compile does not take a
    double backward, so this is the first order.)"""
    text = transform(NESTED_MERGE, "nested_merge.py")
    assert "t_0.view_as(t_0)" in text
    closures: dict[str, Any] = {}
    exec(compile(NESTED_MERGE, "nested_merge.py", "exec"), closures)
    generated: dict[str, Any] = {}
    exec(compile(text, "nested_merge_grad.py", "exec"), generated)
    x = torch.randn(3, dtype=F64, requires_grad=True)
    (expected,) = torch.autograd.grad(closures["nested_merge"](x, p, True)[0].sum(), x)
    compiled = torch.compile(
        lambda t: generated["nested_merge"](t, p, True), fullgraph=fullgraph
    )
    (grad,) = torch.autograd.grad(compiled(x).sum(), x)
    torch.testing.assert_close(grad, expected)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-n", "0", "-q"]))


# -- found by an outside probe of the tooling -------------------------------------------

HELPER_IN_A_BRANCH = """
import torch


def helper(h):
    return torch.sigmoid(h)


def gated(x, w, gate: bool = True):
    h = x * w
    if gate:
        s = helper(h)
        h = s * h
    def backward(g):
        gh = g
        if gate:
            gh = g * (s + s * (1 - s) * (x * w))
        return gh * w, gh * x, None
    return h * 1.0, backward
"""


@pytest.mark.parametrize("policy", ["promote", "recompute"])
@pytest.mark.parametrize("gate", [True, False])
def test_a_recomputed_value_bound_in_one_branch_is_none_on_the_other_path(
    tmp_path, policy, gate
):
    """`s` comes from a helper (no rule: recomputed), bound under `if gate:` only: the
    recompute function returned it unbound where `gate` is False (UnboundLocalError
    in every backward). It is None there now, as in forward's context."""
    closures, generated = import_pair(
        tmp_path, HELPER_IN_A_BRANCH, f"helper_branch_{policy}", policy=policy
    )
    values = inputs(((2, 3), (3,)))
    expected = derivatives(lambda *t: closures.gated(*t, gate)[0], leaves(values))
    got = derivatives(lambda *t: generated.gated(*t, gate), leaves(values))
    assert_same(got, expected)


EARLY_RETURN = """
import torch


def not_test(x, w, on: bool = False):
    h = x * w
    if not on:
        s = h.exp()
        h = s
    def backward(g):
        if not on:
            return g * s * w, g * s * x, None
        return g * w, g * x, None
    return h * 1.0, backward
"""


def test_a_closure_with_several_returns_kept_nested_is_typed(tmp_path):
    """The closure kept as a nested function (several returns) was an unannotated
    `def backward(g):`, which mypy --strict refuses (no-untyped-def, no-untyped-call).
    """
    text = transform(EARLY_RETURN, "early.py", "early")
    assert "def backward(g: Any) -> Any:" in text
    assert mypy_strict(tmp_path, "early_grad.py", text) == ""
    closures, generated = closure_and_op(EARLY_RETURN, text, "early")
    for on in (True, False):
        values = inputs(((2, 3), (3,)))
        expected = derivatives(
            lambda *t, on=on: closures["not_test"](*t, on)[0], leaves(values)
        )
        got = derivatives(
            lambda *t, on=on: generated["not_test"](*t, on), leaves(values)
        )
        assert_same(got, expected)
