# expect: S2S115 7:1
import torch

from .helpers import factor


def scale(x: torch.Tensor):
    """factor() * x."""
    k = factor()
    def backward(grad):
        return grad * k
    return x * k, backward
