# expect: S2S110 5:11
import torch


def total(*tensors: torch.Tensor):
    """The sum of all tensors."""
    def backward(grad):
        return tuple(grad for _ in tensors)
    return sum(tensors), backward
