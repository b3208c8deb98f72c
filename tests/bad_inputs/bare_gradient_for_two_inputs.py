# expect: S2S108 8:9
import torch


def mul(x: torch.Tensor, y: torch.Tensor):
    """x * y."""
    def backward(grad):
        return grad * y
    return x * y, backward
