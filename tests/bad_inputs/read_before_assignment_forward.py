# expect: S2S117 7:19
import torch


def affine(x: torch.Tensor, w: torch.Tensor):
    """x * w + b, with b = w.mean()."""
    out = x * w + b
    b = w.mean()
    def backward(grad):
        return grad * w, grad * x
    return out, backward
