# expect: S2S123 8:5
import torch


def zero_first_row(x: torch.Tensor):
    """x * 2 with its first row zeroed."""
    t = x * 2
    t[0] = 0
    def backward(grad):
        mask = torch.ones_like(t)
        mask[0] = 0
        return grad * 2 * mask
    return t, backward
