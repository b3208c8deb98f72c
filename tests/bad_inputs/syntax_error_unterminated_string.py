# expect: S2S001 7:12
import torch


def mul(x: torch.Tensor, y: torch.Tensor):
    """x * y."""
    name = "mul
    def backward(grad):
        return grad * y, grad * x
    return x * y, backward
