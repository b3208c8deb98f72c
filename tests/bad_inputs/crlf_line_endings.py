# expect: S2S103 8:9
import torch


def mul(x: torch.Tensor, y: torch.Tensor):
    """x * y."""
    def backward(grad):
        y.zero_()
        return grad * y, grad * x
    return x * y, backward
