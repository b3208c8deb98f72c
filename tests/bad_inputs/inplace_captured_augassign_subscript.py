# expect: S2S103 8:9
import torch


def bias_mul(x: torch.Tensor, w: torch.Tensor):
    """x * w."""
    def backward(grad):
        w[0] += 1.0
        return grad * w, grad * x
    return x * w, backward
