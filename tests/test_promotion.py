"""Promotion policies, recompute fallback, user rules and zero gradients (issue 3)."""

import re
import subprocess
import sys

import pytest
import torch

from s2sgrad import transform


def load(source, **options):
    ns = {}
    exec(compile(transform(source, "t.py", **options), "t_grad.py", "exec"), ns)
    return ns


def nth_grads(fn, args, order):
    """The order-th gradients of a fixed weighted sum of fn's result, by torch.autograd."""
    out = fn(*args)
    total = (out * torch.linspace(0.5, 1.5, out.numel(), dtype=out.dtype).reshape(out.shape)).sum()
    for _k in range(order):
        grads = torch.autograd.grad(total, args, create_graph=True, materialize_grads=True)
        total = sum((g * (i + 1.0)).sum() for i, g in enumerate(grads))
    return grads


CUBIC = '''
import torch

def square_prod(a, b):
    t = a * b
    def backward(grad):
        return grad * 2 * t * b, grad * 2 * t * a
    return t * t, backward
'''

TEMPORARY = '''
import torch

def add_mul(a, b):
    t = a + b
    def backward(grad):
        return grad * b, grad * (t + b)
    return t * b, backward
'''

NO_RULE = '''
import torch

def helper(x):
    return torch.special.erfcx(x)

def f(x):
    t = helper(x) * x
    def backward(grad):
        return grad * (t / x + x * (2 * x * helper(x) - 2 / 3.141592653589793 ** 0.5) + 1)
    return t + x, backward
'''

PRAGMA = '''
import torch

# s2sgrad: policy=recompute
def f(x):
    t = torch.sin(x)
    def backward(grad):
        return grad * 2 * t * torch.cos(x)
    return t * t, backward
'''


def _inputs(n=2, size=4, positive=False):
    torch.manual_seed(0)
    return tuple(
        (torch.rand(size, dtype=torch.float64) + 0.5 if positive else torch.randn(size, dtype=torch.float64)).requires_grad_()
        for _ in range(n)
    )


@pytest.mark.parametrize("policy", ["promote", "recompute"])
def test_policies_give_right_second_and_third_order(policy):
    ns = load(CUBIC, policy=policy)
    reference = {}
    exec(CUBIC, reference)
    args = _inputs()
    for order in (1, 2, 3):
        got = nth_grads(ns["square_prod"], args, order)
        expected = nth_grads(lambda a, b: reference["square_prod"](a, b)[0], args, order)
        for a, b in zip(got, expected, strict=True):
            torch.testing.assert_close(a, b)
    assert torch.autograd.gradgradcheck(ns["square_prod"], args)


def test_first_order_policy_is_first_order_only_and_smallest():
    text = transform(TEMPORARY, "t.py", policy="first-order")
    assert '@_FirstOrder("add_mul")' in text and "grad_t=None" not in text
    ns = load(TEMPORARY, policy="first-order")
    args = _inputs()
    assert torch.autograd.gradcheck(ns["add_mul"], args)
    out = ns["add_mul"](*args).sum()
    (ga, _) = torch.autograd.grad(out, args, create_graph=True)
    with pytest.raises(RuntimeError, match="`add_mul` was converted with policy=first-order"):
        torch.autograd.grad(ga.sum(), args)


def test_promote_policy_is_not_first_order_only_and_promotes_t():
    text = transform(TEMPORARY, "t.py")
    assert "_FirstOrder" not in text
    assert re.search(r"def add_mul_backward\(\s*ctx: Context,\s*grad: Grad,\s*\*,\s*grad_t: Grad = None,", text)
    assert ".mark_non_differentiable(" not in text


def test_call_without_rule_is_recomputed_with_a_comment():
    text = transform(NO_RULE, "t.py", "t")
    assert "def f_recompute(x: Tensor) -> Any:" in text
    assert "no derivative rule for `helper(x)`" in text
    assert "# Recomputed, not saved (right at every order), because" in text
    ns = {}
    exec(NO_RULE, ns)
    sys.modules.setdefault("t", type(sys)("t")).__dict__.update(ns)
    try:
        gen = {}
        exec(compile(text, "t_grad.py", "exec"), gen)
        (x,) = _inputs(1, positive=True)
        assert torch.autograd.gradcheck(gen["f"], (x,))
        assert torch.autograd.gradgradcheck(gen["f"], (x,))
    finally:
        del sys.modules["t"]


def test_pragma_overrides_the_policy_for_one_function():
    text = transform(PRAGMA, "t.py", policy="first-order")
    assert "def f_recompute(x: Tensor) -> Any:" in text
    assert "_FirstOrder" not in text
    ns = load(PRAGMA, policy="first-order")
    (x,) = _inputs(1)
    assert torch.autograd.gradgradcheck(ns["f"], (x,))


def test_cli_policy_flag(tmp_path):
    (tmp_path / "ops.py").write_text(TEMPORARY)
    run = subprocess.run(
        [sys.executable, "-m", "s2sgrad", "convert", "ops.py", "--policy", "first-order", "--stdout"],
        cwd=tmp_path, capture_output=True, text=True,
    )
    assert run.returncode == 0, run.stderr
    assert '@_FirstOrder("add_mul")' in run.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "s2sgrad", "convert", "ops.py", "--policy", "nope"],
        cwd=tmp_path, capture_output=True, text=True,
    )
    assert bad.returncode == 2


SIBLINGS = '''
import torch

def softplus2(x):
    t = torch.exp(x)
    def backward(grad):
        return grad * t / (1 + t)
    return torch.log1p(t), backward


def composed(x, w):
    h = x * w
    s, _ = softplus2(h)
    def backward(grad):
        gh = grad * torch.sigmoid(h)
        return gh * w, gh * x + 0 * s
    return s * 2 - s, backward
'''


def test_a_differentiator_of_the_module_is_the_rule_for_calls_to_it():
    text = transform(SIBLINGS, "t.py")
    assert "softplus2_backward(softplus2_ctx, grad_s)" in text
    assert "s, _ = softplus2_forward(h)" in text
    ns = load(SIBLINGS)
    args = _inputs()
    assert torch.autograd.gradcheck(ns["composed"], args)
    assert torch.autograd.gradgradcheck(ns["composed"], args)


CLOSURE_CALL = '''
import torch

def scaled_sin(x, w):
    t = torch.sin(x) * w
    def backward(grad):
        return grad * torch.cos(x) * w, grad * torch.sin(x)
    return t, backward

def squared(x, w):
    u = scaled_sin(x, w)[0]
    def backward(grad):
        gx, gw = scaled_sin(x, w)[1](2 * grad * u)
        return gx, gw
    return u * u, backward
'''


CLOSURE_CALLS = '''
import torch

# s2sgrad: policy=recompute
def pair(x, *, scale: float = 2.0):
    s = torch.sin(x)
    c = torch.cos(x)
    def backward(gs, gc):
        return (gs * c - gc * s) * scale, None
    return (s * scale, c * scale), backward

def bare(x):
    t = torch.exp(x)
    def backward(grad):
        return grad * t
    return t, backward

def squared(a, b):
    u, v = pair(a, scale=3.0)[0]
    w = bare(b)[0]
    y = u * v * w
    def backward(grad):
        ga, _ = pair(a, scale=3.0)[1](grad * v * w, grad * u * w)
        gb = bare(b)[1](grad * u * v)
        return ga, gb
    return y, backward
'''


@pytest.mark.parametrize(
    "source, call",
    [
        (CLOSURE_CALL, "scaled_sin_backward(scaled_sin_forward(x, w)[1], 2 * grad * u)"),
        # two outputs, a keyword-only parameter, a recompute-policy sibling, a bare return
        (CLOSURE_CALLS, "pair_backward(pair_forward(a, scale=3.0)[1], grad * v * w, grad * u * w)"),
    ],
    ids=["one", "several"],
)
def test_backward_may_call_a_sibling_closure_at_every_order(source, call):
    """`g(x)[1](grad)` in backward recomputes g's context there: right at every order."""
    assert call in transform(source, "t.py")
    ns = load(source)
    exec(source, reference := {})
    args = _inputs()
    assert torch.autograd.gradcheck(ns["squared"], args)
    assert torch.autograd.gradgradcheck(ns["squared"], args)

    def closure_forward(x, w):
        return reference["squared"](x, w)[0]

    for order in (1, 2, 3):
        got = nth_grads(ns["squared"], args, order)
        want = nth_grads(closure_forward, args, order)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w)


MULTI = '''
import torch

def sin_cos_scaled(x, w):
    t = x * w
    s = torch.sin(t)
    c = torch.cos(t)
    def backward(grad_s, grad_c):
        g = 2 * grad_s * c - 3 * grad_c * s
        return g * w, g * x
    return (s * 2, c * 3), backward
'''


def test_missing_output_gradients_are_zeros_and_none_skips_work():
    ns = load(MULTI)
    x, w = _inputs()
    s, c = ns["sin_cos_scaled"](x, w)
    gx, gw = torch.autograd.grad(s.sum(), (x, w), create_graph=True)
    expected = torch.autograd.grad(torch.sin(x * w).sum() * 2, (x, w), create_graph=True)
    torch.testing.assert_close(gx, expected[0])
    second = torch.autograd.grad(gx.sum(), (x, w))
    reference = torch.autograd.grad(expected[0].sum(), (x, w))
    for a, b in zip(second, reference, strict=True):
        torch.testing.assert_close(a, b)
    ctx = ns["sin_cos_scaled_forward"](x.detach(), w.detach())[1]
    # Only a promoted gradient: the closure's part is skipped, nothing is None-multiplied.
    got = ns["sin_cos_scaled_backward"](ctx, None, None, grad_t=torch.ones(4, dtype=torch.float64))
    torch.testing.assert_close(got[0], w.detach())
    assert ns["sin_cos_scaled_backward"](ctx, None, None) == (None, None)


SEPARABLE = '''
import torch

def bilinear(x, w):
    y = x @ w
    def backward(grad):
        gx = grad @ w.t()
        gw = x.t() @ grad
        return gx, gw
    return y, backward
'''


def test_gradients_nobody_asked_for_are_not_computed():
    text = transform(SEPARABLE, "t.py")
    assert "need_x, need_w = needs or (True,) * 2" in text
    assert "if need_w:" in text
    ns = load(SEPARABLE)
    x = torch.randn(3, 4, dtype=torch.float64)
    w = torch.randn(4, 2, dtype=torch.float64, requires_grad=True)
    ctx = ns["bilinear_forward"](x, w)[1]
    grad = torch.randn(3, 2, dtype=torch.float64)
    gx, gw = ns["bilinear_backward"](ctx, grad, needs=(False, True))
    assert gx is None
    torch.testing.assert_close(gw, x.t() @ grad)
    both = ns["bilinear_backward"](ctx, grad)
    torch.testing.assert_close(both[0], grad @ w.detach().t())
    (only_w,) = torch.autograd.grad(ns["bilinear"](x, w).sum(), (w,))
    torch.testing.assert_close(only_w, x.t() @ torch.ones(3, 2, dtype=torch.float64))


MATMULS = '''
import torch

def mlp(x, w1, w2):
    a = torch.tanh(x @ w1)
    def backward(grad):
        g_a = (grad @ w2.T) * (1 - a * a)
        return g_a @ w1.T, x.T @ g_a, a.T @ grad
    return a @ w2, backward
'''


@pytest.mark.slow
def test_compiled_backward_has_no_vjp_of_the_promoted_outputs():
    """Under torch.compile the promoted `a` gets a zeros gradient, not None; compile has
    no double backward, so the generated backward drops it there, and the traced
    backward graph has eager's 4 matmuls instead of 6 (two for the VJP of `a`)."""
    from torch._dynamo.backends.common import aot_autograd

    ns = load(MATMULS)
    assert "grad_a = None" in transform(MATMULS, "t.py")
    counted = []

    def backward_compiler(gm, example_inputs):
        counted.append(sum(1 for n in gm.graph.nodes if n.target in (torch.ops.aten.mm.default,)))
        return gm

    backend = aot_autograd(fw_compiler=lambda gm, _: gm, bw_compiler=backward_compiler)
    torch.manual_seed(0)
    x, w1, w2 = (torch.randn(*s, dtype=torch.float64, requires_grad=True) for s in ((5, 3), (3, 4), (4, 2)))
    torch._dynamo.reset()
    compiled = torch.compile(ns["mlp"], backend=backend, fullgraph=True)
    got = torch.autograd.grad(compiled(x, w1, w2).sum(), (x, w1, w2))
    want = torch.autograd.grad((torch.tanh(x @ w1) @ w2).sum(), (x, w1, w2))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
    assert counted == [4]
    # Eager double backward still flows through the promoted `a`.
    assert torch.autograd.gradgradcheck(ns["mlp"], (x, w1, w2))


ONLY_BACKWARD_READS = """
import torch

CALLS = []


def helper(x):
    CALLS.append(1)
    return torch.exp(x)


def f(x: torch.Tensor, w: torch.Tensor):
    t = torch.exp(x) * w
    u = helper(x)
    def backward(g):
        return g * (t + u * w) / 2, g * u  # w's unreduced (it is broadcast)
    return torch.exp(x) * w, backward
"""


@pytest.mark.parametrize("policy", ["promote", "recompute"])
def test_forward_leaves_out_what_only_backward_recomputes(tmp_path, policy):
    """A temporary backward recomputes, which nothing else in forward reads, is not
    computed in forward too: no dead work, and no name ruff calls unused (F841). The
    op stays right at orders 1-3 (pure and mixed: output and gradients in one loss),
    against the closure's own forward, with `w` broadcast and its gradient returned
    unreduced."""
    from oracle import assert_same, derivatives, function, import_pair, leaves

    closures, generated = import_pair(
        tmp_path, ONLY_BACKWARD_READS, f"dead_{policy}", policy=policy
    )
    text = (tmp_path / f"dead_{policy}_grad.py").read_text()
    forward = function(text, "f_forward")
    assert "helper(" not in forward, forward
    assert ("t = " in forward) == (policy == "promote"), forward
    lint = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--isolated", "--select", "F",
         str(tmp_path / f"dead_{policy}_grad.py")],
        capture_output=True, text=True,
    )
    assert lint.returncode == 0, lint.stdout
    x = torch.randn(3, 4, dtype=torch.float64)
    w = torch.randn(4, dtype=torch.float64)
    expected = derivatives(lambda a, b: closures.f(a, b)[0], leaves([x, w]))
    assert_same(derivatives(generated.f, leaves([x, w])), expected)
