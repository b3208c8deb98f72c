# expect: S2S105 13:14
import torch


def register(fn):
    return fn


def logged_cos(x: torch.Tensor):
    """cos(x)."""
    def backward(grad):
        return -grad * torch.sin(x)
    register(backward)
    return torch.cos(x), backward
