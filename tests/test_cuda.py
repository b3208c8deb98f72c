"""The sample ops on a CUDA device, where one exists (skipped elsewhere; CI has none).

What runs on the CPU everywhere else, run on the GPU: orders 1 to 3 of every sample op
against autograd through the closure's own forward, pure and mixed, in float64 with the
samples' broadcast parameters; and a compiled op (`torch.compile(fullgraph=True)`,
inductor's GPU code) against the eager one. CUDA float16 autocast is in
tests/test_autocast.py, which takes the GPU as a second device.
"""

from __future__ import annotations

import importlib

import pytest
import torch
from oracle import assert_same, derivatives, leaves
from sample_cases import ATOL, CASES, RTOL, call_with, is_grad_tensor, prepare

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device on this machine"
)

PARAMS = [pytest.param(m, n, f, id=f"{m}.{n}[{i}]") for m, n, i, f in CASES]


def _on_gpu(params):
    return [p.detach().cuda() if isinstance(p, torch.Tensor) else p for p in params]


@pytest.mark.parametrize("module,name,factory", PARAMS)
def test_orders_one_to_three_on_the_gpu(module, name, factory):
    closure, _, _, params = prepare(module, name, factory, seed=4)
    op = getattr(importlib.import_module(f"samples.{module}_grad"), name)
    params = _on_gpu(params)
    tensors = [p for p in params if is_grad_tensor(p)]
    got = derivatives(lambda *ts: call_with(op, closure, params, ts), leaves(tensors))
    expected = derivatives(
        lambda *ts: call_with(closure, closure, params, ts)[0], leaves(tensors)
    )
    assert all(t.is_cuda for t in got.outputs)
    assert_same(got, expected, rtol=RTOL, atol=ATOL, what=f"{module}.{name}: ")


@pytest.mark.parametrize(
    "module,name", [("temporary", "squared_distance"), ("normalization", "rms_norm")]
)
def test_compiled_op_on_the_gpu(module, name):
    """fwd + bwd of the compiled op equal the eager op's, float32 on the GPU."""
    factory = next(f for m, n, _, f in CASES if (m, n) == (module, name))
    closure, _, _, params = prepare(module, name, factory, seed=5)
    op = getattr(importlib.import_module(f"samples.{module}_grad"), name)
    params = [p.float() if isinstance(p, torch.Tensor) else p for p in _on_gpu(params)]
    tensors = [p for p in params if is_grad_tensor(p)]
    compiled = torch.compile(op, fullgraph=True)
    eager_in, compiled_in = leaves(tensors), leaves(tensors)
    eager = call_with(op, closure, params, eager_in)
    got = call_with(compiled, closure, params, compiled_in)
    torch.testing.assert_close(got, eager)
    eager.sum().backward()
    got.sum().backward()
    for a, b in zip(compiled_in, eager_in, strict=True):
        torch.testing.assert_close(a.grad, b.grad)
