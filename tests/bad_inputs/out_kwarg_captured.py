# expect: S2S103 8:33
import torch


def product(x: torch.Tensor, y: torch.Tensor):
    """x * y."""
    def backward(grad):
        gx = torch.mul(grad, y, out=y)
        return gx, grad * x
    return x * y, backward
