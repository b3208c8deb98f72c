# expect: S2S003 1:1
import torch


def mul(x: torch.Tensor, y: torch.Tensor):
    """x * y, differentiated by autograd."""
    return x * y


def relu(x: torch.Tensor):
    return x.clamp(min=0)
