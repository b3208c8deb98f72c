# expect: S2S101 9:9
import torch


def frozen_scale(x: torch.Tensor, w: torch.Tensor):
    """x * w computed without recording a graph."""
    with torch.no_grad():
        out = x * w
        return out, None
    def backward(grad):
        return grad * w, grad * x
    return out, backward
