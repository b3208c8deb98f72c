# expect: S2S112 7:13
import torch


def softsign(x: torch.Tensor):
    """x / (1 + |x|)."""
    d = 1 + torhc.abs(x)
    def backward(grad):
        return grad / (d * d)
    return x / d, backward
