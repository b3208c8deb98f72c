# expect: S2S101 10:9
import torch


def piecewise(x: torch.Tensor, mode: str):
    """Three modes of scaling."""
    if mode == "double":
        k = 2.0
    elif mode == "zero":
        return torch.zeros_like(x), None
    else:
        k = 1.0
    def backward(grad):
        return grad * k, None
    return x * k, backward
