# expect: S2S001 7:23
import torch


def mul(x: torch.Tensor, y: torch.Tensor):
    """x * y."""
    def backward(grad)
        return grad * y, grad * x
    return x * y, backward
