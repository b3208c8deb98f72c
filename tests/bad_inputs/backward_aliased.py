# expect: S2S105 9:10
import torch


def aliased_sin(x: torch.Tensor):
    """sin(x)."""
    def backward(grad):
        return grad * torch.cos(x)
    bw = backward
    return torch.sin(x), bw
