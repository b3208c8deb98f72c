"""Differentiators whose backward reads a temporary computed in forward."""
import torch


def add_mul(a: torch.Tensor, b: torch.Tensor):
    """(a + b) * b; the gradient w.r.t. b reuses the temporary t = a + b."""
    t = a + b
    def backward(grad):
        return grad * b, grad * (t + b)
    return t * b, backward


def squared_distance(x: torch.Tensor, y: torch.Tensor):
    """Sum of squared differences ||x - y||^2; backward reads the difference d."""
    d = x - y
    def backward(grad):
        g = 2.0 * grad * d
        return g, -g
    return (d * d).sum(), backward
