# expect: S2S101 10:13
import torch


def halve_until_small(x: torch.Tensor, limit: float):
    """Halve x until its norm is below limit."""
    factor = 1.0
    while True:
        if (x * factor).norm() < limit:
            return x * factor, None
        factor = factor / 2
    def backward(grad):
        return grad * factor, None
    return x * factor, backward
