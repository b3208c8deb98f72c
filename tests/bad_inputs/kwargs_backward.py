# expect: S2S110 7:24
import torch


def mul(x: torch.Tensor, y: torch.Tensor):
    """x * y."""
    def backward(grad, **unused):
        return grad * y, grad * x
    return x * y, backward
