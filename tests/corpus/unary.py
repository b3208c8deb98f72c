"""Unary elementwise functions."""
import math

import torch


def x_log_x(x: torch.Tensor):
    """x * log(x) for positive x; backward reads the logarithm."""
    lg = torch.log(x)
    def backward(grad):
        return grad * (lg + 1.0)
    return x * lg, backward


def log_sum_exp_pair(x: torch.Tensor, y: torch.Tensor):
    """log(exp(x) + exp(y)) computed naively; backward reads both exponentials and the sum."""
    ex = torch.exp(x)
    ey = y.exp()
    s = ex + ey
    def backward(grad):
        return grad * ex / s, grad * ey / s
    return torch.log(s), backward


def log1p_of_expm1(x: torch.Tensor):
    """log1p(expm1(x)^2)^2: backward reads u = expm1(x) and v = log1p(u^2)."""
    u = torch.special.expm1(x)
    v = torch.log1p(u * u)
    def backward(grad):
        return grad * 2.0 * v * 2.0 * u * (u + 1.0) / (1.0 + u * u)
    return v * v, backward


def normalize_rows(x: torch.Tensor, eps: float = 1e-6):
    """x / sqrt(sum(x^2) + eps) along the last dim, with rsqrt."""
    inv = torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)
    y = x * inv
    def backward(grad):
        return inv * (grad - y * (grad * y).sum(-1, keepdim=True)), None
    return y, backward


def smooth_distance(x: torch.Tensor, y: torch.Tensor):
    """2 * sqrt(||x - y||^2 + 1) along the last dim."""
    d = x - y
    n = torch.sqrt((d * d).sum(-1) + 1.0)
    def backward(grad):
        g = (2.0 * grad / n).unsqueeze(-1) * d
        return g, -g
    return n * 2.0, backward


def signed_magnitude(x: torch.Tensor, y: torch.Tensor):
    """|x| * sign(y) * y; sign is piecewise constant."""
    a = torch.abs(x)
    s = torch.sign(y)
    def backward(grad):
        return grad * torch.sign(x) * s * y, grad * a * s
    return a * s * y, backward


def sin_cos_product(x: torch.Tensor):
    """sin(x) * cos(x); backward reads both."""
    s = torch.sin(x)
    c = x.cos()
    def backward(grad):
        return grad * (c * c - s * s)
    return s * c, backward


def tanh_gate(x: torch.Tensor, y: torch.Tensor):
    """tanh(x) * sigmoid(y)."""
    t = torch.tanh(x)
    g = torch.sigmoid(y)
    def backward(grad):
        return grad * g * (1.0 - t * t), grad * t * g * (1.0 - g)
    return t * g, backward


def erf_gelu(x: torch.Tensor):
    """x * Phi(x), the normal CDF written with erf."""
    cdf = 0.5 * (1.0 + torch.erf(x * (1.0 / math.sqrt(2.0))))
    def backward(grad):
        pdf = torch.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
        return grad * (cdf + x * pdf)
    return x * cdf, backward


def relu_square(x: torch.Tensor, b: torch.Tensor):
    """relu(x + b)^2 with a broadcast bias b (n,)."""
    h = torch.relu(x + b)
    def backward(grad):
        g = 2.0 * grad * h
        return g, g.sum_to_size(b.shape)
    return h * h, backward


def clamp_product(x: torch.Tensor, lo: float = -0.5, hi: float = 0.5):
    """clamp(x, lo, hi) * max(x, 0), with torch.clamp and Tensor.clamp_min."""
    c = torch.clamp(x, min=lo, max=hi)
    p = x.clamp_min(0.0)
    def backward(grad):
        inside = ((x >= lo) & (x <= hi)).to(x.dtype)
        positive = (x > 0).to(x.dtype)
        return grad * (inside * p + c * positive), None, None
    return c * p, backward
