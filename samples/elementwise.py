"""Elementwise binary ops with broadcasting and hand-written gradients."""
import torch


def mul(a: torch.Tensor, b: torch.Tensor):
    """Broadcasting elementwise product a * b."""
    def backward(grad):
        return (grad * b).sum_to_size(a.shape), (grad * a).sum_to_size(b.shape)
    return a * b, backward


def scaled_mul(x: torch.Tensor, y: torch.Tensor, alpha: float = 1.0):
    """Multiply and scale (x and y have the same shape)."""
    t = x * y
    def backward(grad):
        return grad * y * alpha, grad * x * alpha, None
    return t * alpha, backward


def div(a: torch.Tensor, b: torch.Tensor):
    """Broadcasting elementwise quotient a / b; the gradient reuses the output."""
    out = a / b
    def backward(grad):
        grad_a = grad / b
        return grad_a.sum_to_size(a.shape), (-grad_a * out).sum_to_size(b.shape)
    return out, backward
