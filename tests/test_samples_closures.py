"""Check every hand-written backward closure in samples/ against torch.autograd (orders 1 and 2)."""

import inspect

import pytest
import torch
from oracle import assert_same, closure_op, derivatives, leaves
from sample_cases import (
    ATOL,
    CASES,
    RTOL,
    SAMPLES_DIR,
    as_tuple,
    call_with,
    is_grad_tensor,
    prepare,
)

from s2sgrad.frontend import parse


def _run_closure(fn, args, kwargs, params, grads=None, grads_require_grad=False):
    out, backward = fn(*args, **kwargs)
    outs = as_tuple(out)
    if grads is None:
        grads = [torch.randn_like(o) for o in outs]
    if grads_require_grad:
        grads = [g.detach().clone().requires_grad_() for g in grads]
    got = backward(*grads)
    if len(params) == 1 and not isinstance(got, (tuple, list)):
        got = (got,)
    got = tuple(got)
    assert len(got) == len(params), f"backward returned {len(got)} entries for {len(params)} parameters"
    return outs, grads, got


def _reduced(g, like):
    """`g` summed to `like`'s shape where it is `like` broadcast, as autograd's engine
    sums a Function's gradient (a closure may return a broadcast parameter's gradient
    unreduced, as PyTorch allows); any other shape is left for `_close` to reject."""
    try:
        expandable = torch.broadcast_shapes(g.shape, like.shape) == g.shape
    except RuntimeError:  # shapes that do not broadcast
        expandable = False
    return g.sum_to_size(like.shape) if expandable else g


def _close(a, b, what):
    assert a.shape == b.shape, f"{what}: shape {tuple(a.shape)} != {tuple(b.shape)}"
    assert a.dtype == b.dtype, f"{what}: dtype {a.dtype} != {b.dtype}"
    torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize(
    "module,name,factory", [pytest.param(m, n, f, id=f"{m}.{n}[{i}]") for m, n, i, f in CASES]
)
def test_first_order(module, name, factory):
    fn, args, kwargs, params = prepare(module, name, factory, seed=0)
    outs, grads, got = _run_closure(fn, args, kwargs, params)
    tensors = [p for p in params if is_grad_tensor(p)]
    ref = torch.autograd.grad(outs, tensors, grads, allow_unused=True)
    ref_by_id = {id(t): g for t, g in zip(tensors, ref, strict=False)}
    pnames = list(inspect.signature(fn).parameters)
    for pname, p, g in zip(pnames, params, got, strict=False):
        if not is_grad_tensor(p):
            assert g is None, f"non-tensor parameter {pname} must get None"
            continue
        expected = ref_by_id[id(p)]
        if expected is None:
            assert g is None or not g.detach().any(), f"{pname}: expected no gradient"
        else:
            assert g is not None, f"{pname}: backward returned None"
            _close(_reduced(g.detach(), p), expected, pname)


@pytest.mark.parametrize(
    "module,name,factory", [pytest.param(m, n, f, id=f"{m}.{n}[{i}]") for m, n, i, f in CASES]
)
def test_second_order(module, name, factory):
    fn, args, kwargs, params = prepare(module, name, factory, seed=1)
    pnames = list(inspect.signature(fn).parameters)
    tensors = [p for p in params if is_grad_tensor(p)]
    names = [n for n, p in zip(pnames, params, strict=False) if is_grad_tensor(p)]

    outs, grads, got = _run_closure(fn, args, kwargs, params, grads_require_grad=True)
    got = [_reduced(g, p) for p, g in zip(params, got, strict=False) if is_grad_tensor(p)]
    weights = [torch.randn_like(t) for t in tensors]

    ref_outs, _ = fn(*args, **kwargs)
    ref = torch.autograd.grad(as_tuple(ref_outs), tensors, grads, create_graph=True, allow_unused=True)

    def weighted(gs):
        return sum((w * g).sum() for w, g in zip(weights, gs, strict=False) if g is not None)

    wrt = tensors + list(grads)
    wrt_names = names + [f"grad_out{i}" for i in range(len(grads))]
    d_got = torch.autograd.grad(weighted(got), wrt, allow_unused=True)
    d_ref = torch.autograd.grad(weighted(ref), wrt, allow_unused=True)
    for n, t, a, b in zip(wrt_names, wrt, d_got, d_ref, strict=False):
        a = torch.zeros_like(t) if a is None else a
        b = torch.zeros_like(t) if b is None else b
        _close(a, b, f"d2 w.r.t. {n}")


def _closure_as_op(fn, params):
    """fn as an op whose gradient is its own backward (see `oracle.closure_op`)."""
    positions = [i for i, p in enumerate(params) if is_grad_tensor(p)]

    def run(*tensors):
        out, backward = call_with(fn, fn, params, tensors)

        def vjp(grads):
            got = backward(*grads)
            got = tuple(got) if isinstance(got, (tuple, list)) else (got,)
            return [got[i] for i in positions]

        return out, vjp

    return closure_op(run)


@pytest.mark.parametrize(
    "module,name,factory", [pytest.param(m, n, f, id=f"{m}.{n}[{i}]") for m, n, i, f in CASES]
)
def test_orders_one_and_two_pure_and_mixed(module, name, factory):
    """The closure used as PyTorch uses it (its backward the op's gradient, autograd
    through that backward at order 2) equals autograd through its forward at orders 1
    and 2, in the pure shape and in the mixed one, where the output and its gradient are
    in one loss (a gradient penalty)."""
    fn, _, _, params = prepare(module, name, factory, seed=2)
    tensors = [p for p in params if is_grad_tensor(p)]
    got = derivatives(_closure_as_op(fn, params), leaves(tensors), orders=2)
    expected = derivatives(
        lambda *ts: call_with(fn, fn, params, ts)[0], leaves(tensors), orders=2
    )
    assert_same(got, expected, rtol=RTOL, atol=ATOL, what=f"{module}.{name}: ")


def _differentiators_in(path):
    return [d.name for d in parse(path.read_text(), str(path)).differentiators]


def test_every_sample_differentiator_is_checked():
    covered = {(m, n) for m, n, _, _ in CASES}
    present = {(p.stem, n) for p in sorted(SAMPLES_DIR.glob("*.py")) if p.stem != "__init__" and not p.stem.endswith("_grad")
               for n in _differentiators_in(p)}
    assert present, "no differentiators found"
    assert present == covered, f"missing: {present - covered}, stale: {covered - present}"
