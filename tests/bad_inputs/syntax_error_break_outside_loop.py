# expect: S2S001 8:9
import torch


def mul(x: torch.Tensor, y: torch.Tensor):
    """x * y."""
    if x.numel() == 0:
        break
    def backward(grad):
        return grad * y, grad * x
    return x * y, backward
