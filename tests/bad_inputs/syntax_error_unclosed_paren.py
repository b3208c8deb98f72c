# expect: S2S001 7:20
import torch


def mul(x: torch.Tensor, y: torch.Tensor):
    """x * y."""
    out = torch.mul(x, y
    def backward(grad):
        return grad * y, grad * x
    return out, backward
