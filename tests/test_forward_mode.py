"""Forward mode on generated ops: torch.func.jvp, jacfwd, hessian and forward_ad.

Every sample's op against the same transform applied to the closure's own forward
(float64); then the runtime's edges: list parameters, `None` among the arguments, several
outputs, an op without a forward-mode formula (the op's jvp transposes its backward),
the Function as torch.compile sees it (no `jvp`), the public `Function.apply` fallback,
and no input kept alive outside forward mode.
"""

import importlib
import linecache

import pytest
import torch
import torch.autograd.forward_ad as fwAD
from sample_cases import ATOL, CASES, RTOL, as_tuple, is_grad_tensor, prepare
from torch.func import hessian, jacfwd, jacrev, jvp

import s2sgrad.runtime
from s2sgrad import transform

PARAMS = [pytest.param(m, n, f, id=f"{m}.{n}[{i}]") for m, n, i, f in CASES]


def _close(a, b, what):
    torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL, msg=lambda m: f"{what}: {m}")


def _leaves(value):
    if isinstance(value, (tuple, list)):
        return [leaf for item in value for leaf in _leaves(item)]
    return [value]


def _pair(module, name, factory):
    """(closure forward, op), each a function of the differentiable tensors only, and
    those tensors (detached, float64)."""
    closure, args, kwargs, params = prepare(module, name, factory, seed=0)
    op = getattr(importlib.import_module(f"samples.{module}_grad"), name)
    where = [i for i, a in enumerate(args) if is_grad_tensor(a)]
    keys = [k for k, v in kwargs.items() if is_grad_tensor(v)]
    tensors = [args[i].detach() for i in where] + [kwargs[k].detach() for k in keys]

    def bind(f, first):
        def call(*xs):
            values, named = list(args), dict(kwargs)
            for i, x in zip(where, xs[: len(where)], strict=True):
                values[i] = x
            for k, x in zip(keys, xs[len(where) :], strict=True):
                named[k] = x
            out = f(*values, **named)
            return out[0] if first else out

        return call

    return bind(closure, True), bind(op, False), tensors


@pytest.mark.parametrize("module,name,factory", PARAMS)
def test_jvp_and_forward_ad_match_the_closure_forward(module, name, factory):
    ref, op, xs = _pair(module, name, factory)
    tangents = [torch.randn_like(x) for x in xs]
    want_out, want = jvp(ref, tuple(xs), tuple(tangents))
    got_out, got = jvp(op, tuple(xs), tuple(tangents))
    for a, b in zip(_leaves(got), _leaves(want), strict=True):
        _close(a, b, "torch.func.jvp tangent")
    for a, b in zip(_leaves(got_out), _leaves(want_out), strict=True):
        _close(a, b, "torch.func.jvp output")
    with fwAD.dual_level():
        duals = [fwAD.make_dual(x, t) for x, t in zip(xs, tangents, strict=True)]
        got = [fwAD.unpack_dual(o).tangent for o in as_tuple(op(*duals))]
    for a, b in zip(got, _leaves(want), strict=True):
        _close(a, b, "forward_ad tangent")


@pytest.mark.parametrize("module,name,factory", PARAMS)
def test_jacfwd_and_hessian_match_the_closure_forward(module, name, factory):
    ref, op, xs = _pair(module, name, factory)
    argnums = tuple(range(len(xs)))

    def loss(f):
        # A scalar of every output, curved so that the Hessian is not the forward's alone.
        return lambda *v: sum((o * o.sin()).sum() for o in as_tuple(f(*v)))

    for a, b in zip(
        _leaves(jacfwd(op, argnums=argnums)(*xs)),
        _leaves(jacfwd(ref, argnums=argnums)(*xs)),
        strict=True,
    ):
        _close(a, b, "jacfwd")
    for a, b in zip(
        _leaves(hessian(loss(op), argnums=argnums)(*xs)),
        _leaves(hessian(loss(ref), argnums=argnums)(*xs)),
        strict=True,
    ):
        _close(a, b, "hessian")


@pytest.mark.parametrize(
    "module,name,factory",
    [
        p
        for p in PARAMS
        if p.id in ("temporary.add_mul[same_shape]", "normalization.layer_norm[eps]")
    ],
)
def test_nested_forward_and_reverse_transforms(module, name, factory):
    ref, op, xs = _pair(module, name, factory)

    def scalar(f):
        return lambda x: (as_tuple(f(x, *xs[1:]))[0] ** 3).sum()

    _close(
        jacfwd(jacfwd(scalar(op)))(xs[0]), jacfwd(jacfwd(scalar(ref)))(xs[0]), "fwd-fwd"
    )
    _close(
        jacfwd(jacrev(jacrev(scalar(op))))(xs[0]),
        jacfwd(jacrev(jacrev(scalar(ref))))(xs[0]),
        "fwd-rev-rev",
    )
    with pytest.raises(NotImplementedError, match="use jacfwd over jacrev"):
        jacfwd(jacfwd(jacrev(scalar(op))))(xs[0])
    # Three forward levels: one is peeled, the outer two would see the Function's
    # jvp, which torch does not differentiate (silently wrong before it was refused).
    with pytest.raises(NotImplementedError, match="three levels deep"):
        jacfwd(jacfwd(jacfwd(scalar(op))))(xs[0])
    _close(
        jacfwd(jacrev(jacfwd(scalar(op))))(xs[0]),
        jacrev(jacrev(jacrev(scalar(ref))))(xs[0]),
        "fwd-rev-fwd",
    )
    # forward over reverse with forward_ad, through the op's own backward
    x = xs[0].clone().requires_grad_()
    t = torch.randn_like(x)
    found = []
    for f in (op, ref):
        with fwAD.dual_level():
            out = scalar(f)(fwAD.make_dual(x, t))
            (g,) = torch.autograd.grad(out, x, create_graph=True)
            found.append(fwAD.unpack_dual(g).tangent)
    _close(found[0], found[1], "forward over reverse")


EDGES = """
from typing import List, Optional

import torch


def combine(xs: List[torch.Tensor], scale: Optional[float], w: torch.Tensor, bias: Optional[torch.Tensor] = None):
    s = torch.stack(xs).sum(0) * w
    if bias is not None:
        s = s + bias
    t = s.tanh()
    k = 1.0 if scale is None else scale
    def backward(g):
        gs = g * k * (1 - t * t)
        gw = (gs * torch.stack(xs).sum(0)).sum_to_size(w.shape)
        return [gs * w for _ in xs], None, gw, (None if bias is None else gs.sum_to_size(bias.shape))
    return k * t, backward


def split_pair(x: torch.Tensor):
    a, b = x.sin(), x.exp()
    def backward(ga, gb):
        return ga * x.cos() + gb * b
    return a, b, backward


def far(x: torch.Tensor, y: torch.Tensor):
    d = torch.cdist(x, y)
    def backward(g):
        gd = g / d
        diff = x.unsqueeze(1) - y.unsqueeze(0)
        return (gd.unsqueeze(-1) * diff).sum(1), -(gd.unsqueeze(-1) * diff).sum(0)
    return d, backward
"""


@pytest.fixture(scope="module")
def edges():
    namespace = {"__name__": "edges_grad"}
    text = transform(EDGES, "edges.py")
    # as the import hook does, so that tracebacks and the runtime read its lines
    linecache.cache["edges_grad.py"] = (len(text), None, text.splitlines(True), "x")
    exec(compile(text, "edges_grad.py", "exec"), namespace)
    source = {"__name__": "edges"}
    exec(compile(EDGES, "edges.py", "exec"), source)
    return namespace, source


def _r(*shape):
    return torch.randn(*shape, dtype=torch.float64)


def test_lists_none_arguments_and_several_outputs(edges):
    gen, src = edges
    xs, w, bias = [_r(3), _r(3)], _r(3), _r(3)
    for scale, b in ((None, None), (2.0, bias)):

        def op(x0, x1, w, gen=gen, scale=scale, b=b):
            return gen["combine"]([x0, x1], scale, w, b)

        def ref(x0, x1, w, src=src, scale=scale, b=b):
            return src["combine"]([x0, x1], scale, w, b)[0]

        primals, tangents = (*xs, w), tuple(_r(3) for _ in range(3))
        _close(
            jvp(op, primals, tangents)[1], jvp(ref, primals, tangents)[1], "list jvp"
        )
        with fwAD.dual_level():
            duals = [
                fwAD.make_dual(p, t) for p, t in zip(primals, tangents, strict=True)
            ]
            got = fwAD.unpack_dual(op(*duals)).tangent
        _close(got, jvp(ref, primals, tangents)[1], "list forward_ad")
    x = _r(4)
    got = jacfwd(gen["split_pair"])(x)
    want = jacfwd(lambda v: src["split_pair"](v)[:2])(x)
    for a, b in zip(got, want, strict=True):
        _close(a, b, "two outputs")


def test_forward_mode_through_an_op_torch_has_no_forward_formula_for(edges):
    """The op's jvp is the transpose of its backward, so forward mode works where the
    closure's forward runs an op without a forward-mode formula (`torch.cdist`): the
    dot-product test against reverse mode through the closure's own forward."""
    gen, src = edges
    x, y = _r(3, 2), _r(4, 2)
    tx, ty, u = _r(3, 2), _r(4, 2), _r(3, 4)
    with pytest.raises(NotImplementedError):
        jvp(lambda a, b: src["far"](a, b)[0], (x, y), (tx, ty))
    _, tangent = jvp(gen["far"], (x, y), (tx, ty))
    _, pull = torch.func.vjp(lambda a, b: src["far"](a, b)[0], x, y)
    gx, gy = pull(u)
    _close((tangent * u).sum(), (gx * tx).sum() + (gy * ty).sum(), "<u, J t>")
    with fwAD.dual_level():
        out = gen["far"](fwAD.make_dual(x, tx), fwAD.make_dual(y, ty))
        _close(fwAD.unpack_dual(out).tangent, tangent, "forward_ad tangent")


def test_outside_forward_mode_the_op_keeps_no_inputs(edges):
    gen, _ = edges
    x = _r(4).requires_grad_()
    out = gen["split_pair"](x)[0]
    assert getattr(out.grad_fn, "s2sgrad jvp", None) is None
    assert (
        len(out.grad_fn.saved_tensors) == 2
    )  # x and b = x.exp(), which backward reads
    with fwAD.dual_level():
        dual = fwAD.make_dual(x, _r(4))
        out = gen["split_pair"](dual)[0]
        assert getattr(out.grad_fn, "s2sgrad jvp", None) is not None
        assert len(out.grad_fn.saved_tensors) == 2  # the same, for both modes
        (g,) = torch.autograd.grad(out.sum(), x)
    _close(g, x.detach().cos(), "backward beside forward mode")


def test_forward_mode_without_the_private_apply(edges, monkeypatch):
    gen, src = edges
    monkeypatch.setitem(vars(s2sgrad.runtime), "_base_apply", None)
    x, t = _r(4), _r(4)
    got = jvp(gen["split_pair"], (x,), (t,))[1]
    want = jvp(lambda v: src["split_pair"](v)[:2], (x,), (t,))[1]
    for a, b in zip(got, want, strict=True):
        _close(a, b, "fallback jvp")


def test_torch_compile_sees_the_function_without_jvp(edges):
    gen, _ = edges
    torch._dynamo.reset()
    compiled = torch.compile(gen["split_pair"], backend="eager", fullgraph=True)
    x = _r(4).requires_grad_()
    a, b = compiled(x)
    (g,) = torch.autograd.grad((a + b).sum(), x)
    _close(g, x.detach().cos() + x.detach().exp(), "compiled gradient")


# -- a backward that hides its incoming gradient from autograd -----------------------

HIDDEN = """import torch


def under_no_grad(x: torch.Tensor):
    y = x.clamp(min=0)
    def backward(grad):
        with torch.no_grad():
            gi = grad.clone()
            gi[x < 0] = 0
        return gi
    return y, backward


def detached(x: torch.Tensor):
    y = x.clamp(min=0)
    def backward(grad):
        return grad.detach() * (x >= 0)
    return y, backward


def through_data(x: torch.Tensor):
    y = x.clamp(min=0)
    def backward(grad):
        g = grad * 1.0
        return g.data * (x >= 0)
    return y, backward


def by_autograd(x: torch.Tensor):
    def backward(g):
        with torch.enable_grad():
            xx = x.detach().requires_grad_()
            (gx,) = torch.autograd.grad(torch.tanh(xx), (xx,), g)
        return gx
    return torch.tanh(x), backward


def mask_under_no_grad(x: torch.Tensor):
    y = x.clamp(min=0)
    def backward(grad):
        with torch.no_grad():
            m = x >= 0
        return grad * m
    return y, backward
"""


@pytest.mark.parametrize(
    "name", ["under_no_grad", "detached", "through_data", "by_autograd"]
)
def test_forward_mode_refuses_a_backward_that_hides_its_gradient(name, tmp_path):
    """Forward mode transposes backward by differentiating it in its incoming
    gradient; a backward that reads it under `torch.no_grad()` (or detached) hides
    that, and `jvp`/`jacfwd` answered zeros where reverse mode was right (a
    ReLU rule written the usual way). Forward mode raises, naming the op; reverse
    mode still matches the closure's forward."""
    namespace = {"__name__": "hidden_grad"}
    exec(compile(transform(HIDDEN, "hidden.py"), "hidden_grad.py", "exec"), namespace)
    source = {"__name__": "hidden"}
    exec(compile(HIDDEN, "hidden.py", "exec"), source)
    x = torch.tensor([-1.0, 0.5, 2.0], dtype=torch.float64)
    op, closure = namespace[name], source[name]
    jacobian = torch.autograd.functional.jacobian  # `.data`, `requires_grad_`: no vmap
    torch.testing.assert_close(jacobian(op, x), jacobian(lambda t: closure(t)[0], x))
    with pytest.raises(RuntimeError, match=f"forward mode through `{name}`"):
        jvp(op, (x,), (torch.ones_like(x),))
    with pytest.raises(RuntimeError, match=f"forward mode through `{name}`"):
        with fwAD.dual_level():
            op(fwAD.make_dual(x, torch.ones_like(x)))


def test_a_mask_made_under_no_grad_keeps_forward_mode():
    namespace = {"__name__": "hidden_grad"}
    exec(compile(transform(HIDDEN, "hidden.py"), "hidden_grad.py", "exec"), namespace)
    x = torch.tensor([-1.0, 0.5, 2.0], dtype=torch.float64)
    _, tangent = jvp(namespace["mask_under_no_grad"], (x,), (torch.ones_like(x),))
    torch.testing.assert_close(
        tangent, torch.tensor([0.0, 1.0, 1.0], dtype=torch.float64)
    )
