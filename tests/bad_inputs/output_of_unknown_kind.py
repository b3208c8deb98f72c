# expect: S2S124 10:12
import torch


def apply_twice(x: torch.Tensor, fn):
    """fn(fn(x)), for an fn that doubles."""
    y = fn(fn(x))
    def backward(grad):
        return grad * 4.0, None
    return y, backward
