# expect: S2S112 5:17
import torch


def softsign(x: Tensor):
    """x / (1 + |x|)."""
    d = 1 + torch.abs(x)
    def backward(grad):
        return grad / (d * d)
    return x / d, backward
