# expect: S2S106 10:12
import torch


def split_halves(x: torch.Tensor):
    """The two halves of x."""
    halves = x.chunk(2)
    def backward(grad_a, grad_b):
        return torch.cat([grad_a, grad_b])
    return *halves, backward
