# expect: S2S117 8:21
import torch


def mul(x: torch.Tensor, y: torch.Tensor):
    """x * y."""
    def backward(grad):
        gx = grad * scale
        scale = y
        return gx, grad * x
    return x * y, backward
