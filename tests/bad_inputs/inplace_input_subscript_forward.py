# expect: S2S103 7:5
import torch


def zero_first_sum(x: torch.Tensor):
    """Sum of x without its first entry."""
    x[0] = 0
    def backward(grad):
        return grad.expand_as(x)
    return x.sum(), backward
