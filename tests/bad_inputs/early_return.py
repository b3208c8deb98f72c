# expect: S2S101 8:9
import torch


def scale(x: torch.Tensor, k: float):
    """x * k, with a shortcut for k == 1."""
    if k == 1.0:
        return x, None
    def backward(grad):
        return grad * k, None
    return x * k, backward
