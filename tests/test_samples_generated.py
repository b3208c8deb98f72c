"""The generated op of every sample against torch.autograd of the closure's own forward."""

import importlib
import inspect

import pytest
import torch
from sample_cases import ATOL, CASES, RTOL, as_tuple, is_grad_tensor, load, prepare

PARAMS = [pytest.param(m, n, f, id=f"{m}.{n}[{i}]") for m, n, i, f in CASES]


def generated(module, name):
    return importlib.import_module(f"samples.{module}_grad"), name


def op_of(module, name):
    gen, _ = generated(module, name)
    return getattr(gen, name)


def _close(a, b, what):
    torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL, msg=lambda m: f"{what}: {m}")


def _tensor_positions(params):
    return [i for i, p in enumerate(params) if is_grad_tensor(p)]


def _call_with(op, fn, params, tensors):
    """Call `op` with `params`, the differentiable ones replaced by `tensors`."""
    values = list(params)
    for i, t in zip(_tensor_positions(params), tensors, strict=True):
        values[i] = t
    sig = inspect.signature(fn)
    bound = sig.bind(*values[: len([p for p in sig.parameters.values() if p.kind != p.KEYWORD_ONLY])])
    kwargs = {
        name: values[i]
        for i, (name, p) in enumerate(sig.parameters.items())
        if p.kind == p.KEYWORD_ONLY
    }
    return op(*bound.args, **kwargs)


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
    assert torch.autograd.gradcheck(lambda *ts: _call_with(op, closure, params, ts), tensors)


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
    assert torch.autograd.gradgradcheck(lambda *ts: _call_with(op, closure, params, ts), tensors)
