# expect: S2S110 7:27
import torch


def mul(x: torch.Tensor, y: torch.Tensor):
    """x * y."""
    def backward(grad, *, scale=1.0):
        return grad * y * scale, grad * x * scale
    return x * y, backward
