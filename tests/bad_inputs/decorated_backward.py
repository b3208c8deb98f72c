# expect: S2S113 7:5
import torch


def mul(x: torch.Tensor, y: torch.Tensor):
    """x * y."""
    @torch.no_grad()
    def backward(grad):
        return grad * y, grad * x
    return x * y, backward
