"""Variance-based statistics with torch.var (a module that does not import math)."""
import torch


def standardize(x: torch.Tensor, eps: float = 1e-5):
    """(x - mean) / sqrt(var + eps) along the last dim (biased variance)."""
    mu = torch.mean(x, dim=-1, keepdim=True)
    v = torch.var(x, dim=-1, keepdim=True, correction=0)
    inv = torch.rsqrt(v + eps)
    y = (x - mu) * inv
    def backward(grad):
        return inv * (grad - grad.mean(-1, keepdim=True) - y * (grad * y).mean(-1, keepdim=True)), None
    return y, backward


def variance_penalty(x: torch.Tensor, y: torch.Tensor):
    """var(x * y)^2 over all elements, unbiased."""
    p = x * y
    v = p.var()
    def backward(grad):
        g = grad * 2.0 * v * 2.0 * (p - p.mean()) / (p.numel() - 1)
        return g * y, g * x
    return v * v, backward
