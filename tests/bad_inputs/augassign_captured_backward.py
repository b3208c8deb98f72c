# expect: S2S117 9:9
import torch


def accumulate(x: torch.Tensor, w: torch.Tensor):
    """x * w."""
    t = x * w
    def backward(grad):
        t += grad
        return grad * w, grad * x
    return t, backward
