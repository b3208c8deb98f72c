# expect: S2S103 8:9
import torch


def detach_mul(x: torch.Tensor, w: torch.Tensor):
    """x * w."""
    def backward(grad):
        w.data = grad.clone()
        return grad * w, grad * x
    return x * w, backward
