"""Hand-written `torch.autograd.Function`s for some sample ops: the baseline (c).

Each is what a PyTorch user would write by hand for the op, held to the same bar as the
generated code: right at every order of differentiation, so `backward` only uses saved
inputs and outputs (which autograd differentiates through) and recomputes any temporary
it needs from them, rather than saving a temporary (that would make the second-order
gradient silently wrong). They use `ctx.needs_input_grad` and
`set_materialize_grads(False)` like the generated Functions. `OPS` maps the sample's
`(module, function)` to a callable with the source function's signature that returns
what the source function's result is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


class Mul(torch.autograd.Function):
    @staticmethod
    def forward(a, b):
        return a * b

    @staticmethod
    def setup_context(ctx, inputs, output):
        a, b = inputs
        ctx.save_for_backward(a, b)
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, grad):
        if grad is None:
            return None, None
        a, b = ctx.saved_tensors
        grad_a = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_a = (grad * b).sum_to_size(a.shape)
        if ctx.needs_input_grad[1]:
            grad_b = (grad * a).sum_to_size(b.shape)
        return grad_a, grad_b


class Div(torch.autograd.Function):
    @staticmethod
    def forward(a, b):
        return a / b

    @staticmethod
    def setup_context(ctx, inputs, output):
        a, b = inputs
        ctx.save_for_backward(b, output)
        ctx.a_shape = a.shape
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, grad):
        if grad is None:
            return None, None
        b, out = ctx.saved_tensors
        grad_a = grad / b
        grad_b = None
        if ctx.needs_input_grad[1]:
            grad_b = (-grad_a * out).sum_to_size(b.shape)
        return grad_a.sum_to_size(ctx.a_shape), grad_b


class AddMul(torch.autograd.Function):
    """(a + b) * b; backward recomputes a + 2b instead of saving t = a + b."""

    @staticmethod
    def forward(a, b):
        return (a + b) * b

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, grad):
        if grad is None:
            return None, None
        a, b = ctx.saved_tensors
        grad_a = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_a = grad * b
        if ctx.needs_input_grad[1]:
            grad_b = grad * (a + 2 * b)
        return grad_a, grad_b


class SquaredDistance(torch.autograd.Function):
    @staticmethod
    def forward(x, y):
        d = x - y
        return (d * d).sum()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, grad):
        if grad is None:
            return None, None
        x, y = ctx.saved_tensors
        g = 2.0 * grad * (x - y)
        return g, (-g if ctx.needs_input_grad[1] else None)


class Softmax(torch.autograd.Function):
    @staticmethod
    def forward(x, dim):
        return torch.softmax(x, dim)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)
        ctx.dim = inputs[1]
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, grad):
        if grad is None:
            return None, None
        (y,) = ctx.saved_tensors
        return y * (grad - (grad * y).sum(ctx.dim, keepdim=True)), None


class LogSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(x, dim):
        return torch.log_softmax(x, dim)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)
        ctx.dim = inputs[1]
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, grad):
        if grad is None:
            return None, None
        (y,) = ctx.saved_tensors
        return grad - torch.exp(y) * grad.sum(ctx.dim, keepdim=True), None


class SinCos(torch.autograd.Function):
    @staticmethod
    def forward(x):
        return torch.sin(x), torch.cos(x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*output)
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, grad_s, grad_c):
        s, c = ctx.saved_tensors
        grad_x = None
        if grad_s is not None:
            grad_x = grad_s * c
        if grad_c is not None:
            grad_x = -grad_c * s if grad_x is None else grad_x - grad_c * s
        return grad_x


class LayerNorm(torch.autograd.Function):
    """Saves x and weight; backward recomputes the statistics (differentiably)."""

    @staticmethod
    def forward(x, weight, bias, eps):
        mean = x.mean(-1, keepdim=True)
        xc = x - mean
        rstd = torch.rsqrt((xc * xc).mean(-1, keepdim=True) + eps)
        return xc * rstd * weight + bias

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, weight, bias, eps = inputs
        ctx.save_for_backward(x, weight)
        ctx.eps = eps
        ctx.bias_shape = bias.shape
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, grad):
        if grad is None:
            return None, None, None, None
        x, weight = ctx.saved_tensors
        need_x, need_w, need_b, _ = ctx.needs_input_grad
        grad_x = grad_weight = grad_bias = None
        if need_x or need_w:
            xc = x - x.mean(-1, keepdim=True)
            rstd = torch.rsqrt((xc * xc).mean(-1, keepdim=True) + ctx.eps)
            x_hat = xc * rstd
            if need_x:
                g = grad * weight
                grad_x = rstd * (
                    g
                    - g.mean(-1, keepdim=True)
                    - x_hat * (g * x_hat).mean(-1, keepdim=True)
                )
            if need_w:
                grad_weight = (grad * x_hat).sum_to_size(weight.shape)
        if need_b:
            grad_bias = grad.sum_to_size(ctx.bias_shape)
        return grad_x, grad_weight, grad_bias, None


class RmsNorm(torch.autograd.Function):
    """Saves x and weight; backward recomputes rstd (differentiably)."""

    @staticmethod
    def forward(x, weight, eps):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * weight

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, weight, eps = inputs
        ctx.save_for_backward(x, weight)
        ctx.eps = eps
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, grad):
        if grad is None:
            return None, None, None
        x, weight = ctx.saved_tensors
        rstd = torch.rsqrt((x * x).mean(-1, keepdim=True) + ctx.eps)
        x_hat = x * rstd
        grad_x = grad_weight = None
        if ctx.needs_input_grad[0]:
            g = grad * weight
            grad_x = rstd * (g - x_hat * (g * x_hat).mean(-1, keepdim=True))
        if ctx.needs_input_grad[1]:
            grad_weight = (grad * x_hat).sum_to_size(weight.shape)
        return grad_x, grad_weight, None


def _layer_norm(x, weight, bias, *, eps=1e-5):
    return LayerNorm.apply(x, weight, bias, eps)


def _rms_norm(x, weight, *, eps=1e-6):
    return RmsNorm.apply(x, weight, eps)


#: (module, function) of the sample -> hand-written op with the same signature.
OPS: dict[tuple[str, str], Callable[..., Any]] = {
    ("elementwise", "mul"): Mul.apply,
    ("elementwise", "div"): Div.apply,
    ("temporary", "add_mul"): AddMul.apply,
    ("temporary", "squared_distance"): SquaredDistance.apply,
    ("softmax", "softmax"): lambda x, dim=-1: Softmax.apply(x, dim),
    ("softmax", "log_softmax"): lambda x, dim=-1: LogSoftmax.apply(x, dim),
    ("multi_output", "sincos"): SinCos.apply,
    ("normalization", "layer_norm"): _layer_norm,
    ("normalization", "rms_norm"): _rms_norm,
}
