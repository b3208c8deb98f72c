# expect: S2S101 10:9
import torch


def safe_div(x: torch.Tensor, y: torch.Tensor):
    """x / y, falling back to zeros."""
    try:
        out = x / y
    except RuntimeError:
        return torch.zeros_like(x), None
    def backward(grad):
        return grad / y, -grad * x / (y * y)
    return out, backward
