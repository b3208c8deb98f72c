# expect: S2S107 7:24
import torch


def mul(x: torch.Tensor, y: torch.Tensor):
    """x * y."""
    def backward(grad, grad_extra):
        return grad * y, grad * x
    return x * y, backward
