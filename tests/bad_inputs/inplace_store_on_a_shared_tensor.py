# expect: S2S123 10:5
import torch


def zero_first_row(x: torch.Tensor):
    """x * 2 with its first row zeroed, beside x * 2 as it was: `before` holds the
    same tensor, so writing the store out of place would change what it sees."""
    t = x * 2
    before = t
    t[0] = 0
    def backward(grad):
        return grad * 4
    return t + before, backward
