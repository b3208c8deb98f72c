# expect: S2S103 9:9
import torch


def masked_mul(x: torch.Tensor, w: torch.Tensor):
    """x * w, without gradient for the first row."""
    t = w.clone()
    def backward(grad):
        t[0] = 0
        return grad * t, grad * x
    return x * w, backward
