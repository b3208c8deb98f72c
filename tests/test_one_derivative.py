"""One derivative in every mode and at every order (DESIGN.md section 10).

The derivative of a generated op is the one the user's backward defines: reverse mode,
forward mode (`jvp` is the transpose of backward) and every nesting of them agree, also
where backward is deliberately not forward's derivative (a straight-through estimator,
a surrogate gradient). Under `policy=first-order` every second-order use raises one
error naming the policy and the function; first-order uses keep working.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.autograd.forward_ad as fwAD
from torch.func import hessian, jacfwd, jacrev, jvp, vjp, vmap

from s2sgrad import transform

SOURCE = """
import torch
import torch.nn.functional as F


def ste(x: torch.Tensor):
    \"\"\"Straight-through estimator: round forward, clipped identity backward.\"\"\"
    y = torch.round(x)
    def backward(g):
        return g * (x.abs() <= 1).to(g.dtype)
    return y, backward


def cube_surrogate(x: torch.Tensor, w: torch.Tensor):
    \"\"\"(x * w) ** 3 forward; backward deliberately uses 2 t where 3 t**2 is right.\"\"\"
    t = x * w
    def backward(g):
        gt = g * 2 * t
        return gt * w, (gt * x).sum_to_size(w.shape)
    return t ** 3, backward


def gated_mul(x: torch.Tensor, w: torch.Tensor):
    \"\"\"x * w, whose backward skips the gradients of inputs that do not require grad.\"\"\"
    need_x = x.requires_grad
    need_w = w.requires_grad
    y = x * w
    def backward(g):
        return (g * w if need_x else None), (g * x if need_w else None)
    return y, backward


def softplus_squared(x: torch.Tensor, w: torch.Tensor):
    \"\"\"softplus(x * w) ** 2 with its true derivative; backward reads the temporary t.\"\"\"
    t = F.softplus(x * w)
    def backward(g):
        gt = g * 2 * t * torch.sigmoid(x * w)
        return gt * w, (gt * x).sum_to_size(w.shape)
    return t ** 2, backward


def logsumexp(x: torch.Tensor):
    \"\"\"Backward reads saved temporaries only: nothing it reads requires grad.\"\"\"
    m = x.max(-1, keepdim=True).values
    e = torch.exp(x - m)
    s = e.sum(-1, keepdim=True)
    def backward(grad):
        return grad.unsqueeze(-1) * e / s
    return (m + torch.log(s)).squeeze(-1), backward
"""

F64 = torch.float64


def _load(policy: str = "promote") -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": f"one_derivative_{policy}"}
    text = transform(SOURCE, "one_derivative.py", policy=policy)
    exec(compile(text, "one_derivative_grad.py", "exec"), namespace)
    return namespace


@pytest.fixture(scope="module")
def ops() -> dict[str, Any]:
    return _load()


@pytest.fixture(scope="module")
def first_order() -> dict[str, Any]:
    return _load("first-order")


def _close(a: Any, b: Any, what: str) -> None:
    torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10, msg=lambda m: f"{what}: {m}")


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    # Rows of x beside a broadcast w: a parameter shared across the batch.
    x = torch.randn(3, 4, dtype=F64, generator=gen) * 1.5
    w = torch.randn(4, dtype=F64, generator=gen)
    return x, w


def _flat(jacobians: Any) -> list[torch.Tensor]:
    if isinstance(jacobians, (tuple, list)):
        return [t for j in jacobians for t in _flat(j)]
    return [jacobians]


def test_straight_through_estimator_has_the_users_derivative_in_both_modes(ops):
    x, _ = _inputs()
    mask = (x.abs() <= 1).to(F64)
    expected = torch.diag_embed(mask.flatten()).reshape(3, 4, 3, 4)
    _close(jacrev(ops["ste"])(x), expected, "jacrev")
    _close(jacfwd(ops["ste"])(x), expected, "jacfwd: the user's mask, not round's 0")
    t = torch.randn_like(x)
    _close(jvp(ops["ste"], (x,), (t,))[1], mask * t, "jvp")
    with fwAD.dual_level():
        out = ops["ste"](fwAD.make_dual(x, t))
        _close(fwAD.unpack_dual(out).tangent, mask * t, "forward_ad")


@pytest.mark.parametrize("name", ["cube_surrogate", "softplus_squared"])
def test_forward_and_reverse_mode_agree_at_every_nesting(ops, name):
    x, w = _inputs()
    op = ops[name]
    both = (0, 1)
    for a, b in zip(
        _flat(jacfwd(op, argnums=both)(x, w)),
        _flat(jacrev(op, argnums=both)(x, w)),
        strict=True,
    ):
        _close(a, b, "jacfwd == jacrev")
    # jvp against vjp: <u, J t> == <J^T u, t>.
    t, s, u = torch.randn_like(x), torch.randn_like(w), torch.randn_like(x)
    _, tangent = jvp(op, (x, w), (t, s))
    _, pull = vjp(op, x, w)
    gx, gw = pull(u)
    _close((tangent * u).sum(), (gx * t).sum() + (gw * s).sum(), "<u, J t>")

    def loss(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (op(x, w) * x.sin()).sum()

    reverse = jacrev(jacrev(loss, argnums=both), argnums=both)(x, w)
    for a, b in zip(_flat(hessian(loss, argnums=both)(x, w)), _flat(reverse), strict=True):
        _close(a, b, "hessian (forward over reverse) == reverse over reverse")
    forward = jacfwd(jacfwd(loss, argnums=both), argnums=both)(x, w)
    for a, b in zip(_flat(forward), _flat(reverse), strict=True):
        _close(a, b, "forward over forward == reverse over reverse")


def test_requires_grad_read_in_forward_means_differentiated_under_torch_func(ops):
    """Inside the Function, torch.func and forward mode hand forward its inputs without
    `requires_grad`: a backward gated on it must still give its gradients there."""
    x, w = _inputs()
    w = w.expand(3, 4).contiguous()
    both = (0, 1)
    for f in (jacrev, jacfwd):
        jx, jw = f(ops["gated_mul"], argnums=both)(x, w)
        _close(jx, torch.diag_embed(w.flatten()).reshape(3, 4, 3, 4), f.__name__)
        _close(jw, torch.diag_embed(x.flatten()).reshape(3, 4, 3, 4), f.__name__)
    per_row = vmap(torch.func.grad(lambda v, u: ops["gated_mul"](v, u).sum()))(x, w)
    _close(per_row, w, "vmap of grad")
    t = torch.randn_like(x)
    with fwAD.dual_level():
        out = ops["gated_mul"](fwAD.make_dual(x, t), w)
        _close(fwAD.unpack_dual(out).tangent, t * w, "forward_ad")
    xs = x.clone().requires_grad_()
    (gx,) = torch.autograd.grad(ops["gated_mul"](xs, w).sum(), xs)
    _close(gx, w, "reverse mode, w not requiring grad")


def test_a_surrogate_keeps_its_own_derivative_not_the_forwards(ops):
    """jacfwd of cube_surrogate is 2 t w (the backward's), where forward's is 3 t**2 w."""
    x, w = _inputs()
    got = jacfwd(lambda v: ops["cube_surrogate"](v, w))(x)
    expected = torch.diag_embed((2 * x * w * w).flatten()).reshape(3, 4, 3, 4)
    _close(got, expected, "jacfwd")


def _second_order_uses(op: Any) -> dict[str, Any]:
    """Every way people take a second derivative through `op`, as thunks."""
    x0, w0 = _inputs()

    def leaves() -> tuple[torch.Tensor, torch.Tensor]:
        return x0.clone().requires_grad_(), w0.clone().requires_grad_()

    def loss(x: torch.Tensor) -> torch.Tensor:
        return op(x, w0).sum()

    def double_backward() -> None:
        x, w = leaves()
        (gx,) = torch.autograd.grad(op(x, w).sum(), x, create_graph=True)
        torch.autograd.grad(gx.sum(), (x, w))

    def gradient_penalty() -> None:
        x, w = leaves()
        out = op(x, w)
        (gx,) = torch.autograd.grad(out.sum(), x, create_graph=True)
        torch.autograd.grad(out.sum() + (gx**2).sum(), (x, w))

    def forward_over_reverse() -> None:
        x, w = leaves()
        with fwAD.dual_level():
            out = op(fwAD.make_dual(x, torch.randn_like(x)), w)
            torch.autograd.grad(out.sum(), w)

    def reverse_over_forward_ad() -> None:
        x, w = leaves()
        with fwAD.dual_level():
            out = op(fwAD.make_dual(x, torch.randn_like(x)), w)
            tangent = fwAD.unpack_dual((out**2).sum()).tangent
        torch.autograd.grad(tangent, (x, w))

    def reverse_over_jvp() -> None:
        x, w = leaves()
        t = torch.randn_like(x)
        _, tangent = jvp(lambda z: (op(z, w) ** 2).sum(), (x,), (t,))
        torch.autograd.grad(tangent, (x, w))

    return {
        "double backward": double_backward,
        "gradient penalty": gradient_penalty,
        "forward_ad over reverse": forward_over_reverse,
        "reverse over forward_ad": reverse_over_forward_ad,
        "reverse over torch.func.jvp": reverse_over_jvp,
        "hessian": lambda: hessian(loss)(x0),
        "jacrev over jacrev": lambda: jacrev(jacrev(loss))(x0),
        "jacfwd over jacfwd": lambda: jacfwd(jacfwd(loss))(x0),
    }


@pytest.mark.parametrize(
    "use", list(_second_order_uses(lambda x, w: x).keys()), ids=lambda u: u
)
def test_first_order_policy_refuses_every_second_order_use(first_order, use):
    thunk = _second_order_uses(first_order["softplus_squared"])[use]
    with pytest.raises(
        RuntimeError, match="`softplus_squared` was converted with policy=first-order"
    ):
        thunk()


@pytest.mark.parametrize(
    "use",
    [
        "double backward",
        "gradient penalty",
        "forward_ad over reverse",
        "forward_ad over reverse, create_graph",
    ],
)
def test_first_order_refuses_where_nothing_backward_reads_requires_grad(
    first_order, use
):
    """logsumexp's backward reads `e` and `s` only, saved without grad: the gradient it
    returned under `create_graph=True` was a constant, and a gradient penalty silently
    lost its second-order term (off by 0.14). There is no edge to hang the refusal on,
    so the backward itself refuses. Under forward mode (an outside probe) the
    gradient came back without a tangent, silently zero: `e` and `s` carry none,
    and the dual input is not saved."""
    op = first_order["logsumexp"]
    x = torch.randn(3, 4, dtype=F64, requires_grad=True)
    with pytest.raises(
        RuntimeError, match="`logsumexp` was converted with policy=first-order"
    ):
        if use.startswith("forward_ad"):
            with fwAD.dual_level():
                dual = fwAD.make_dual(x, torch.randn_like(x))
                out = op(dual)
                graph = use.endswith("create_graph")
                torch.autograd.grad(out.sum(), dual, create_graph=graph)
        else:
            out = op(x)
            (g,) = torch.autograd.grad(out.sum(), x, create_graph=True)
            loss = (g**2).sum()
            torch.autograd.grad(loss if use == "double backward" else out.sum() + loss, x)
    (g,) = torch.autograd.grad(op(x).sum(), x)  # a first derivative still works
    torch.testing.assert_close(g, torch.softmax(x, -1).detach())


VIEW_OF_INPUT = """import torch


def f(x, w):
    v = x.view(12)
    def backward(g):
        u = v.view(3, 4)
        return 2.0 * g * u * w * w, 2.0 * g * u * u * w
    return (x * w) ** 2, backward
"""


@pytest.mark.parametrize("leaf", [True, False], ids=["leaf", "non-leaf"])
def test_first_order_refuses_where_backward_reads_a_view_of_an_input(tmp_path, leaf):
    """An outside probe: backward reads `v`, a view of x, saved; only x requires grad.
    The saved view came back without history of its own, so the refusal hung on it
    had no path to x, and a second derivative was silently None (zeros)."""
    from oracle import import_pair

    _, generated = import_pair(tmp_path, VIEW_OF_INPUT, "view_fo", policy="first-order")
    x0, w = _inputs()
    x = x0.clone().requires_grad_()
    used = x if leaf else x * 1.0
    (g,) = torch.autograd.grad(generated.f(used, w).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="`f` was converted with policy=first-order"):
        torch.autograd.grad((g**2).sum(), x, allow_unused=True)
    (g,) = torch.autograd.grad(generated.f(x, w).sum(), x)  # first order still works
    _close(g, 2.0 * x0 * w * w, "first order")


def test_first_order_policy_answers_first_derivatives(first_order):
    x, w = _inputs()
    op = first_order["softplus_squared"]
    source: dict[str, Any] = {}
    exec(SOURCE, source)

    def reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return source["softplus_squared"](x, w)[0]

    both = (0, 1)
    for f in (jacrev, jacfwd):
        for a, b in zip(
            _flat(f(op, argnums=both)(x, w)),
            _flat(jacrev(reference, argnums=both)(x, w)),
            strict=True,
        ):
            _close(a, b, f.__name__)
    xs = x.clone().requires_grad_()
    ws = w.clone().requires_grad_()
    got = torch.autograd.grad(op(xs, ws).sum(), (xs, ws))
    expected = torch.autograd.grad(reference(xs, ws).sum(), (xs, ws))
    for a, b in zip(got, expected, strict=True):
        _close(a, b, "backward")
    per_row = vmap(torch.func.grad(lambda v: op(v, w).sum()))(x)
    _close(per_row, torch.func.grad(lambda v: reference(v, w).sum())(x), "vmap of grad")


@pytest.mark.parametrize("name", ["softplus_squared", "logsumexp"])
def test_first_order_forward_mode_of_inputs_that_require_grad(first_order, name):
    """An outside probe: forward mode through a first-order op whose inputs require
    grad, its tangent then differentiated by reverse mode, lost the second-order
    term silently (off by 1.3): the tangent read saved temporaries, constants to
    autograd. Now that refuses, where the tangent itself (a first derivative) and
    the primal's gradient stay right."""
    source: dict[str, Any] = {}
    exec(SOURCE, source)
    x0, w0 = _inputs()
    extra = (w0,) if name == "softplus_squared" else ()
    t = torch.randn_like(x0)

    def run(op: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = x0.clone().requires_grad_()
        with fwAD.dual_level():
            out = op(fwAD.make_dual(x, t), *extra)
            primal, tangent = fwAD.unpack_dual((out**2).sum())
        (g,) = torch.autograd.grad(primal, x)
        return primal.detach(), tangent.detach(), g

    got = run(first_order[name])
    expected = run(lambda *a: source[name](*a)[0])
    for a, b, what in zip(got, expected, ("value", "tangent", "gradient"), strict=True):
        _close(a, b, what)
    x = x0.clone().requires_grad_()
    with fwAD.dual_level():
        out = first_order[name](fwAD.make_dual(x, t), *extra)
        tangent = fwAD.unpack_dual((out**2).sum()).tangent
    with pytest.raises(RuntimeError, match=f"`{name}` was converted with policy="):
        torch.autograd.grad(tangent, x)


GRAD_OFF = """
import torch


def centered(x: torch.Tensor, w: torch.Tensor):
    \"\"\"The mean is a constant to backward: forward computes it under no_grad.\"\"\"
    with torch.no_grad():
        mu = x.mean(0)
    y = torch.sin(x - mu) * w
    def backward(g):
        return g * torch.cos(x - mu) * w, (g * torch.sin(x - mu)).sum(0)
    return y, backward


def scaled(x: torch.Tensor, w: torch.Tensor):
    \"\"\"A scale computed with grad mode set off, read by backward.\"\"\"
    z = x * w
    with torch.set_grad_enabled(False):
        scale = z.abs().amax() + 1.0
    def backward(g):
        gz = g * torch.cos(z / scale) / scale
        return gz * w, (gz * x).sum(0)
    return torch.sin(z / scale), backward


def frozen_slope(x: torch.Tensor, w: torch.Tensor):
    \"\"\"Backward's own block: the slope it reads is a constant to a double backward.\"\"\"
    def backward(g):
        with torch.no_grad():
            slope = torch.cos(x * w)
        return g * slope * w, (g * slope * x).sum(0)
    return torch.sin(x * w), backward


def flagged_mean(x: torch.Tensor, w: torch.Tensor, flag: bool = False):
    \"\"\"Grad mode by a flag only the call knows.\"\"\"
    with torch.set_grad_enabled(flag):
        mu = x.mean(0)
    y = torch.sin(x - mu) * w
    def backward(g):
        return g * torch.cos(x - mu) * w, (g * torch.sin(x - mu)).sum(0), None
    return y, backward


def live_slope(x: torch.Tensor, w: torch.Tensor):
    \"\"\"enable_grad() inside no_grad(): the slope is differentiated again.\"\"\"
    def backward(g):
        with torch.no_grad():
            with torch.enable_grad():
                slope = torch.cos(x * w)
        return g * slope * w, (g * slope * x).sum(0)
    return torch.sin(x * w), backward
"""


@pytest.mark.parametrize(
    "name", ["centered", "scaled", "frozen_slope", "flagged_mean", "live_slope"]
)
def test_a_grad_off_block_is_a_constant_to_forward_mode_through_backward(name):
    """An outside probe: a temporary computed under `torch.no_grad()` and recomputed
    in backward is a constant to a double backward, but `torch.no_grad()` stops no
    forward-mode tangent: `hessian` (jacfwd over jacrev) and the `jvp` of a gradient
    answered another second derivative than `jacrev(jacrev(...))` (off by 0.35).
    The generated block sets tangents as grad mode is (`_tangents_follow_grad()`):
    a second probe found a run-time `set_grad_enabled(flag)` and `enable_grad()`
    inside `no_grad()` off by 0.89 and 3.4 where tangents were only stopped. The
    (4,) weight is broadcast against the rows of x."""
    namespace: dict[str, Any] = {"__name__": "grad_off_grad"}
    exec(compile(transform(GRAD_OFF, "grad_off.py"), "grad_off_grad.py", "exec"), namespace)
    op = namespace[name]
    x, w = _inputs()
    both = (0, 1)

    def loss(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (op(x, w) * x.sin()).sum()

    reverse = jacrev(jacrev(loss, argnums=both), argnums=both)(x, w)
    for a, b in zip(_flat(hessian(loss, argnums=both)(x, w)), _flat(reverse), strict=True):
        _close(a, b, "hessian (forward over reverse) == reverse over reverse")
    t = torch.randn_like(x)
    xs = x.clone().requires_grad_()
    (g,) = torch.autograd.grad(loss(xs, w), xs, create_graph=True)
    (reverse_hvp,) = torch.autograd.grad((g * t).sum(), xs)
    _, forward_hvp = jvp(torch.func.grad(lambda v: loss(v, w)), (x,), (t,))
    _close(forward_hvp, reverse_hvp, "jvp of the gradient == double backward")
