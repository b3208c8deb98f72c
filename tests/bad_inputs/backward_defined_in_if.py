# expect: S2S116 8:9
import torch


def scaled(x: torch.Tensor, k: float):
    """k * x."""
    if k != 0:
        def backward(grad):
            return grad * k, None
    else:
        def backward(grad):
            return torch.zeros_like(grad), None
    return x * k, backward
