"""Closure-style rules for tests/test_checker.py: right ones, and each kind of wrong one.

A module on disk (not an exec'd string), as a user's would be: the checker reads its
source for the generated op and for the lines it reports.
"""


import torch


def swiglu(x: torch.Tensor, w: torch.Tensor, v: torch.Tensor):
    a = x @ w
    b = x @ v
    s = torch.sigmoid(a)
    silu = a * s
    out = silu * b

    def backward(g):
        db = g * silu
        da = g * b * (s + a * s * (1 - s))
        return da @ w.t() + db @ v.t(), x.t() @ da, x.t() @ db

    return out, backward


def swiglu_missing_term(x: torch.Tensor, w: torch.Tensor, v: torch.Tensor):
    a = x @ w
    b = x @ v
    s = torch.sigmoid(a)
    silu = a * s
    out = silu * b

    def backward(g):
        db = g * silu
        da = g * b * (s + a * s * (1 - s))
        gx = da @ w.t()  # forgot `+ db @ v.t()`
        return gx, x.t() @ da, x.t() @ db

    return out, backward


def mul_wrong_sign(x: torch.Tensor, y: torch.Tensor):
    def backward(g):
        return g * y, -g * x

    return x * y, backward


def bias_wrong_reduction(x: torch.Tensor, b: torch.Tensor):
    def backward(g):
        return g, g.sum(1)  # b broadcasts along dim 0: should be g.sum(0)

    return x + b, backward


def bias_unreduced(x: torch.Tensor, b: torch.Tensor):
    def backward(g):
        return g, g  # torch.autograd sums it to b's shape: right

    return x + b, backward


def exp_detached(x: torch.Tensor):
    y = torch.exp(x)

    def backward(g):
        return g * y.detach()

    return y, backward


def exp_data(x: torch.Tensor):
    y = torch.exp(x)

    def backward(g):
        return g * y.data

    return y, backward


def scaled_sum(xs: list[torch.Tensor], w: torch.Tensor, scale: float):
    total = torch.stack(xs).sum(0)
    out = total * w * scale

    def backward(g):
        gx = g * w * scale
        return [gx for _ in xs], (g * total * scale).sum_to_size(w.shape), None

    return out, backward


def scaled_sum_wrong_element(xs: list[torch.Tensor], w: torch.Tensor, scale: float):
    total = torch.stack(xs).sum(0)
    out = total * w * scale

    def backward(g):
        gx = g * w * scale
        grads = [gx for _ in xs]
        grads[-1] = gx * 2
        return grads, (g * total * scale).sum_to_size(w.shape), None

    return out, backward


def sincos(x: torch.Tensor):
    s, c = torch.sin(x), torch.cos(x)

    def backward(gs, gc):
        return gs * c - gc * s

    return s, c, backward


def sincos_wrong(x: torch.Tensor):
    s, c = torch.sin(x), torch.cos(x)

    def backward(gs, gc):
        return gs * c + gc * s

    return s, c, backward


def mul_listed(x: torch.Tensor, y: torch.Tensor):
    """x * y; backward lists its gradients in a list."""
    def backward(grad):
        return [grad * y, grad * x]
    return x * y, backward


def pair_product(xs: tuple[torch.Tensor, ...]):
    """a * b of a pair; backward returns the pair's gradients bare."""
    a, b = xs
    def backward(grad):
        return (grad * b, grad * a)
    return a * b, backward


def total(xs: list[torch.Tensor]):
    """The sum of a list; backward returns its gradients as a generator."""
    def backward(grad):
        return (grad for _ in xs)
    return torch.stack(xs).sum(0), backward


def dropout(x: torch.Tensor, p: float):
    """Draws its mask in forward: the op and the closure must draw the same one."""
    mask = torch.empty_like(x)
    mask.bernoulli_(1.0 - p)
    scale = 1.0 / (1.0 - p)

    def backward(grad):
        return grad * mask * scale, None

    return x * mask * scale, backward
