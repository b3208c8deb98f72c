"""The generated `_apply`: Function.apply without its per-call signature binding.

It reaches into private torch API (`_FunctionBase.apply`), so each of its paths is
pinned here: the fast path where it is safe, `Function.apply` under torch.func
transforms and torch.compile, and `Function.apply` when the private piece is missing.
"""

from __future__ import annotations

import pytest
import torch

import s2sgrad.runtime
from s2sgrad import transform

SOURCE = '''
import torch


def scale_add(x: torch.Tensor, y: torch.Tensor, alpha: float = 2.0):
    t = x * y
    def backward(g):
        return g * y * alpha + g, g * x * alpha, None
    return t * alpha + x, backward
'''


@pytest.fixture(params=["imported", "standalone"])
def generated(request):
    """The generated module's namespace, with `_runtime`: where its `_apply` and
    `_base_apply` live (s2sgrad.runtime, or the module itself when standalone)."""
    standalone = request.param == "standalone"
    namespace: dict[str, object] = {}
    text = transform(SOURCE, "t.py", standalone=standalone)
    exec(compile(text, "<generated>", "exec"), namespace)  # noqa: S102
    namespace["_runtime"] = namespace if standalone else vars(s2sgrad.runtime)
    return namespace


class _Counted:
    """Count the runtime's calls of torch's own `Function.apply` (`_torch_apply`) on
    one Function class or a subclass of it (forward mode's)."""

    def __init__(self, monkeypatch, runtime, function):
        self.calls = 0
        original = runtime["_torch_apply"]

        def apply(cls, *args):
            self.calls += issubclass(cls, function)
            return original(cls, *args)

        monkeypatch.setitem(runtime, "_torch_apply", apply)


def _inputs():
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    y = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    return x, y


def _reference(x, y):
    return (x * y) * 3.0 + x


def test_fast_path_skips_function_apply_and_keeps_every_order(generated, monkeypatch):
    assert generated["_runtime"]["_base_apply"] is not None
    counted = _Counted(monkeypatch, generated["_runtime"], generated["ScaleAddFunction"])
    x, y = _inputs()
    out = generated["scale_add"](x, y, 3.0)
    assert counted.calls == 0
    torch.testing.assert_close(out, _reference(x, y))
    (gx,) = torch.autograd.grad(out.sum(), x, create_graph=True)
    (gy,) = torch.autograd.grad(gx.sum(), y)
    torch.testing.assert_close(gy, torch.full_like(y, 3.0))


def test_without_the_private_api_it_is_function_apply(generated, monkeypatch):
    monkeypatch.setitem(generated["_runtime"], "_base_apply", None)
    counted = _Counted(monkeypatch, generated["_runtime"], generated["ScaleAddFunction"])
    x, y = _inputs()
    op = generated["scale_add"]
    assert torch.autograd.gradcheck(lambda a, b: op(a, b, 3.0), (x, y))
    assert torch.autograd.gradgradcheck(lambda a, b: op(a, b, 3.0), (x, y))
    assert counted.calls > 0


def test_under_torch_func_transforms_it_is_function_apply(generated, monkeypatch):
    counted = _Counted(monkeypatch, generated["_runtime"], generated["ScaleAddFunction"])
    op = generated["scale_add"]
    x, y = (t.detach() for t in _inputs())
    grad_x = torch.func.grad(lambda a: op(a, y, 3.0).sum())(x)
    torch.testing.assert_close(grad_x, 3.0 * y + 1)
    assert counted.calls > 0
    counted.calls = 0
    batched = torch.func.vmap(lambda a: op(a, y[0], 3.0))(x)
    torch.testing.assert_close(batched, _reference(x, y[0]))
    assert counted.calls > 0


def test_under_torch_compile_it_is_function_apply(generated):
    op = generated["scale_add"]
    x, y = _inputs()
    compiled = torch.compile(
        lambda a, b: op(a, b, 3.0), backend="eager", fullgraph=True
    )
    out = compiled(x, y)
    torch.testing.assert_close(out, _reference(x, y))
    gx, gy = torch.autograd.grad(out.sum(), (x, y))
    torch.testing.assert_close(gx, 3.0 * y + 1)
    torch.testing.assert_close(gy, 3.0 * x)


def test_apply_takes_arguments_by_name_as_torch_does(generated):
    function = generated["ScaleAddFunction"]
    x, y = _inputs()
    out = function.apply(x, alpha=3.0, y=y)
    torch.testing.assert_close(out, _reference(x, y))
    (gx,) = torch.autograd.grad(out.sum(), x, create_graph=True)
    (gy,) = torch.autograd.grad(gx.sum(), y)
    torch.testing.assert_close(gy, torch.full_like(y, 3.0))


class _Gate(torch.autograd.Function):
    """Pass `b`'s gradient on, and none to `a`."""

    @staticmethod
    def forward(a, b):
        return a * 0 + b

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, g):
        return None, g


@pytest.mark.parametrize("autocast", [False, True])
def test_no_gradient_downstream_leaves_the_inputs_grad_none(generated, autocast):
    """Where the op's output gets no gradient, its input gets none either (None, as
    through the closure), not zeros: an optimizer with weight decay would move it."""
    op = generated["scale_add"]
    x = torch.nn.Parameter(torch.ones(3, 4, dtype=torch.float64))
    y = torch.ones(3, 4, dtype=torch.float64)
    b = torch.nn.Parameter(torch.ones((), dtype=torch.float64))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = _Gate.apply(op(x, y, 3.0), b).sum()
    loss.backward()
    assert x.grad is None
    assert b.grad is not None


def test_a_non_strict_export_runs_the_op_once(generated):
    """Non-strict torch.export runs Python for real with `is_compiling()` true: the
    op's `apply` goes to torch's own there, not back to itself."""
    op = generated["scale_add"]

    class Model(torch.nn.Module):
        def forward(self, x, y):
            return op(x, y, 3.0)

    x, y = (t.detach() for t in _inputs())
    exported = torch.export.export(Model(), (x, y), strict=False)
    torch.testing.assert_close(exported.module()(x, y), _reference(x, y))
