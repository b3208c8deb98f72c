# expect: S2S103 7:21
import torch


def add_into(x: torch.Tensor, y: torch.Tensor):
    """x + y, written into x."""
    torch.add(x, y, out=x)
    def backward(grad):
        return grad, grad
    return x, backward
