"""Differentiators with several outputs and one gradient per output."""
import torch


def mean_var(x: torch.Tensor, dim: int = -1):
    """Mean and biased variance along dim (both keepdim)."""
    n = x.shape[dim]
    mean = x.mean(dim, keepdim=True)
    xc = x - mean
    var = (xc * xc).mean(dim, keepdim=True)
    def backward(grad_mean, grad_var):
        return (grad_mean + 2.0 * grad_var * xc) / n, None
    return (mean, var), backward


def sincos(x: torch.Tensor):
    """sin(x) and cos(x); backward reads both outputs."""
    s = torch.sin(x)
    c = torch.cos(x)
    def backward(grad_s, grad_c):
        return grad_s * c - grad_c * s
    return (s, c), backward
