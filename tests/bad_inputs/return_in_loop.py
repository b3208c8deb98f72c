# expect: S2S101 10:13
import torch


def first_positive(x: torch.Tensor):
    """Scale x by the first positive entry."""
    scale = torch.ones(())
    for value in x.flatten():
        if value > 0:
            return x * value, None
    def backward(grad):
        return grad * scale
    return x * scale, backward
