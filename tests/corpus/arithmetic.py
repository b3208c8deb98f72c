"""Elementwise arithmetic: operators, torch functions and methods, scalars, broadcasting."""
import math

import torch


def shifted_product(a: torch.Tensor, b: torch.Tensor):
    """(a + b) * b; the gradient w.r.t. b reads the temporary t = a + b."""
    t = a + b
    def backward(grad):
        return grad * b, grad * (t + b)
    return t * b, backward


def affine_square(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor):
    """(x * w - b) ** 2 with w (n,) and b (1, n) broadcast against x (m, n)."""
    u = torch.sub(torch.mul(x, w), b)
    def backward(grad):
        g = 2.0 * grad * u
        return g * w, (g * x).sum_to_size(w.shape), (-g).sum_to_size(b.shape)
    return u * u, backward


def quotient_square(x: torch.Tensor, y: torch.Tensor):
    """(x / y) ** 2 for positive y; backward reads the quotient q."""
    q = torch.div(x, y)
    def backward(grad):
        g = 2.0 * grad * q / y
        return g, -g * q
    return q * q, backward


def power_mix(x: torch.Tensor, y: torch.Tensor):
    """x ** 3 + x ** y for positive x: an integer and a tensor exponent."""
    cube = x ** 3
    p = x ** y
    def backward(grad):
        return grad * (3.0 * cube / x + y * p / x), grad * p * torch.log(x)
    return cube + p, backward


def scalar_operands(x: torch.Tensor, alpha: float = 0.5):
    """alpha * 2**x * (1 - x / 4) + 2 * x: Python scalars on either side of operators."""
    s = 2.0 * x
    e = 2.0 ** x
    r = 1.0 - x / 4.0
    def backward(grad):
        return grad * (alpha * e * (math.log(2.0) * r - 0.25) + 2.0), None
    return alpha * e * r + s, backward


def negated_difference(x: torch.Tensor, y: torch.Tensor):
    """(y - x) * (-y) spelled with unary minus and torch.neg."""
    d = -(x - y)
    n = torch.neg(y)
    def backward(grad):
        return -grad * n, grad * (n - d)
    return d * n, backward


def accumulate_product(x: torch.Tensor, y: torch.Tensor):
    """t = x * y; t += x; the result t * t (backward reads the final t)."""
    t = x * y
    t += x
    def backward(grad):
        g = 2.0 * grad * t
        return g * (y + 1.0), g * x
    return t * t, backward


def scaled_accumulation(x: torch.Tensor, y: torch.Tensor):
    """t = x + y; t *= x (in place on the fresh temporary); the result t * t."""
    t = x + y
    t *= x
    def backward(grad):
        g = 2.0 * grad * t
        return g * (2.0 * x + y), g * x
    return t * t, backward


def paired_update(x: torch.Tensor, y: torch.Tensor):
    """a, b = 2x, y + 1 by tuple unpacking; the result a * b."""
    a, b = x * 2, y + 1
    def backward(grad):
        return 2.0 * grad * b, grad * a
    return a * b, backward


def exp_chain(x: torch.Tensor, y: torch.Tensor):
    """t1 = x * y, t2 = exp(t1): a chain whose links backward both reads."""
    t1 = torch.multiply(x, y)
    t2 = t1.exp()
    def backward(grad):
        g = grad * t2 * (1.0 + t1)
        return g * y, g * x
    return t1 * t2, backward


def method_arithmetic(x: torch.Tensor, y: torch.Tensor):
    """(x + y)(x - y) / y**2 for positive y, with tensor-method spellings."""
    s = x.add(y)
    d = x.subtract(y)
    y2 = torch.pow(y, 2)
    q = s.mul(d).divide(y2)
    def backward(grad):
        return grad * (s + d) / y2, grad * ((d - s) / y2 - 2.0 * q / y)
    return q, backward
