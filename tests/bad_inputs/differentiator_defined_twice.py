# expect: S2S119 12:1
import torch


def mul(x: torch.Tensor, y: torch.Tensor):
    """x * y."""
    def backward(grad):
        return grad * y, grad * x
    return x * y, backward


def mul(x: torch.Tensor, y: torch.Tensor):
    """x * y, scaled."""
    def backward(grad):
        return 2 * grad * y, 2 * grad * x
    return 2 * x * y, backward
