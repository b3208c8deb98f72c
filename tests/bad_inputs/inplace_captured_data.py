# expect: S2S103 8:9
import torch


def clipped_mul(x: torch.Tensor, w: torch.Tensor):
    """x * w."""
    def backward(grad):
        w.data.clamp_(-1, 1)
        return grad * w, grad * x
    return x * w, backward
