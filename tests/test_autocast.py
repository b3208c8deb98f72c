"""Generated ops under `torch.autocast`, as the usual mixed-precision loop runs them.

The closure's own torch code is the reference: forward runs under the caller's
autocast state (CPU bfloat16 here; CUDA float16 where a GPU exists), backward runs in
the state forward ran in, whether the loop calls it inside the autocast region or
after it, gradients come back in their inputs' dtypes, and a double backward works.
Compared at bfloat16 tolerances, relative to the size of the values.
"""

from __future__ import annotations

import importlib

import pytest
import torch
from sample_cases import CASES, call_with, is_grad_tensor, load, prepare

PARAMS = [pytest.param(m, n, f, id=f"{m}.{n}[{i}]") for m, n, i, f in CASES]

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
LOW = {"cpu": torch.bfloat16, "cuda": torch.float16}


def _close(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    scale = 1.0 + float(b.detach().abs().max()) if b.numel() else 1.0
    torch.testing.assert_close(
        a.detach().float(),
        b.detach().float(),
        rtol=5e-2,
        atol=5e-2 * scale,
        msg=lambda m: f"{what}: {m}",
    )


def _run(fn, params, device, backward_inside):
    """Outputs, gradients (dtypes kept) and second-order gradients of `fn` under
    autocast, the first backward taken inside or after the autocast region."""
    tensors = [
        p.detach().float().to(device).requires_grad_() for p in params if is_grad_tensor(p)
    ]
    gen = torch.Generator().manual_seed(3)
    with torch.autocast(device, dtype=LOW[device]):
        outs = fn(tensors)
        outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
        outs = [o for o in outs if isinstance(o, torch.Tensor) and o.is_floating_point()]
        weights = [torch.randn(o.shape, generator=gen).to(device) for o in outs]
        loss = sum((o.float() * w).sum() for o, w in zip(outs, weights, strict=True))
        if backward_inside:
            grads = torch.autograd.grad(loss, tensors, create_graph=True, allow_unused=True)
    if not backward_inside:
        grads = torch.autograd.grad(loss, tensors, create_graph=True, allow_unused=True)
    grads = [torch.zeros_like(t) if g is None else g for t, g in zip(tensors, grads, strict=True)]
    penalty = sum((g.float() ** 2).sum() for g in grads)
    second = (
        torch.autograd.grad(penalty, tensors, allow_unused=True, materialize_grads=True)
        if penalty.requires_grad
        else [torch.zeros_like(t) for t in tensors]
    )
    return outs, grads, second, tensors


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backward_inside", [False, True], ids=["backward_after", "backward_inside"])
@pytest.mark.parametrize("module,name,factory", PARAMS)
def test_op_under_autocast_matches_the_closure(module, name, factory, backward_inside, device):
    closure = load(module, name)
    op = getattr(importlib.import_module(f"samples.{module}_grad"), name)
    _, _, _, params = prepare(module, name, factory, seed=0)
    got = _run(lambda ts: call_with(op, closure, params, ts), params, device, backward_inside)
    want = _run(
        lambda ts: call_with(lambda *a, **k: closure(*a, **k)[0], closure, params, ts),
        params, device, backward_inside,
    )
    for a, b in zip(got[0], want[0], strict=True):
        assert a.dtype == b.dtype, f"output dtype {a.dtype}, the closure's {b.dtype}"
        _close(a, b, "output")
    for a, b, t in zip(got[1], want[1], got[3], strict=True):
        assert a.dtype == t.dtype, f"gradient of dtype {a.dtype} for an input of {t.dtype}"
        _close(a, b, "gradient")
    for a, b in zip(got[2], want[2], strict=True):
        _close(a, b, "second order")
