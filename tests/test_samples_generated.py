"""The generated op of every sample against torch.autograd of the closure's own forward."""

import importlib

import pytest
import torch
from oracle import assert_same, derivatives, leaves
from sample_cases import (
    ATOL,
    CASES,
    RTOL,
    as_tuple,
    call_with,
    is_grad_tensor,
    load,
    prepare,
)

PARAMS = [pytest.param(m, n, f, id=f"{m}.{n}[{i}]") for m, n, i, f in CASES]


def generated(module, name):
    return importlib.import_module(f"samples.{module}_grad"), name


def op_of(module, name):
    gen, _ = generated(module, name)
    return getattr(gen, name)


def _close(a, b, what):
    torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("module,name,factory", PARAMS)
def test_op_matches_closure_forward_and_first_order(module, name, factory):
    closure = load(module, name)
    op = op_of(module, name)
    _, args, kwargs, params = prepare(module, name, factory, seed=0)
    ref_out, _ = closure(*args, **kwargs)
    out = op(*args, **kwargs)
    ref_outs, outs = as_tuple(ref_out), as_tuple(out)
    assert len(outs) == len(ref_outs)
    for a, b in zip(outs, ref_outs, strict=True):
        _close(a, b, "output")
    tensors = [p for p in params if is_grad_tensor(p)]
    grads = [torch.randn_like(o) for o in ref_outs]
    ref = torch.autograd.grad(ref_outs, tensors, grads, allow_unused=True, materialize_grads=True)
    got = torch.autograd.grad(outs, tensors, grads, allow_unused=True, materialize_grads=True)
    for i, (a, b) in enumerate(zip(got, ref, strict=True)):
        _close(a, b, f"gradient of tensor input {i}")


@pytest.mark.parametrize("module,name,factory", PARAMS)
def test_op_passes_gradcheck(module, name, factory):
    closure = load(module, name)
    op = op_of(module, name)
    _, _, _, params = prepare(module, name, factory, seed=1)
    tensors = tuple(p for p in params if is_grad_tensor(p))
    assert torch.autograd.gradcheck(lambda *ts: call_with(op, closure, params, ts), tensors)


@pytest.mark.parametrize("module,name,factory", PARAMS)
def test_lifted_pair_without_autograd_equals_closure_backward(module, name, factory):
    closure = load(module, name)
    gen, _ = generated(module, name)
    forward = getattr(gen, f"{name}_forward")
    backward = getattr(gen, f"{name}_backward")
    _, args, kwargs, params = prepare(module, name, factory, seed=2)
    ref_out, ref_backward = closure(*args, **kwargs)
    grads = [torch.randn_like(o) for o in as_tuple(ref_out)]
    expected = as_tuple(ref_backward(*grads))
    with torch.no_grad():
        result, ctx = forward(*args, **kwargs)
        got = as_tuple(backward(ctx, *grads))
    for a, b in zip(as_tuple(result), as_tuple(ref_out), strict=True):
        _close(a, b.detach(), "result")
    assert len(got) == len(expected)
    for i, (a, b) in enumerate(zip(got, expected, strict=True)):
        if b is None:
            assert a is None, f"entry {i}"
        else:
            assert not a.requires_grad
            _close(a, b.detach(), f"gradient entry {i}")


@pytest.mark.parametrize("module,name,factory", PARAMS)
def test_second_order_passes_gradgradcheck(module, name, factory):
    closure = load(module, name)
    op = op_of(module, name)
    _, _, _, params = prepare(module, name, factory, seed=3)
    tensors = tuple(p for p in params if is_grad_tensor(p))
    assert torch.autograd.gradgradcheck(lambda *ts: call_with(op, closure, params, ts), tensors)


@pytest.mark.parametrize("module,name,factory", PARAMS)
def test_orders_one_to_three_match_autograd_pure_and_mixed(module, name, factory):
    """Orders 1 to 3 of the op equal autograd through the closure's own forward, in the
    pure shape and in the mixed one, where the output and its gradients are in one loss
    (a gradient penalty) and the op's backward receives the output's gradient and its
    temporaries' gradients in one call: with a broadcast parameter, where the closure
    returns its gradient unreduced, the two meet at different shapes."""
    closure = load(module, name)
    op = op_of(module, name)
    _, _, _, params = prepare(module, name, factory, seed=4)
    tensors = [p for p in params if is_grad_tensor(p)]
    got = derivatives(lambda *ts: call_with(op, closure, params, ts), leaves(tensors))
    expected = derivatives(
        lambda *ts: call_with(closure, closure, params, ts)[0], leaves(tensors)
    )
    assert_same(got, expected, rtol=RTOL, atol=ATOL, what=f"{module}.{name}: ")
