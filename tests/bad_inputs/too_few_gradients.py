# expect: S2S108 8:9
import torch


def addcmul(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor, value: float = 1.0):
    """x + value * y * z."""
    def backward(grad):
        return grad, grad * value * z, grad * value * y
    return x + value * y * z, backward
