# expect: S2S112 9:24
import torch


def softsign(x: torch.Tensor):
    """x / (1 + |x|)."""
    d = 1 + torch.abs(x)
    def backward(grad):
        return grad / (denom * d)
    return x / d, backward
